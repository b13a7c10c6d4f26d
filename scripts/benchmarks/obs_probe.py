"""Probe (not a stage): FFN neurons chosen for the refit (OBS) inside the fisher plan's counts.

The fisher plan of `score --ffn | select --target-flops T` fixes how many heads and neurons
each layer loses; here each layer's removed neurons are re-chosen by greedy optimal brain
surgeon on the down projection: remove, one at a time, the neuron whose removal raises the
token-weighted reconstruction error of the layer's FFN output least once the kept neurons
are refit (error ||W_j||^2 / [H^-1]_jj, then the OBS update of W and H^-1), on the unpruned
model's activations over the lstsq rows. Then the usual lstsq compensation and dev accuracy.

  OMP_NUM_THREADS=1 nice -n 10 python -m scripts.benchmarks.obs_probe --seeds 0 1 --targets 0.4 --json /tmp/obs.json
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

from scripts.benchmarks.debian_task import debian_task
from scripts.benchmarks.deep_probe import dev_loss


def ffn_grams(model, batches) -> dict[int, tuple]:
    """Per layer: (H = sum_t w_t a_t a_t^T over the down projection's inputs, W0 [N, out])."""
    import torch

    from headprune_cli.model.arch import adapter_for
    from headprune_cli.stages.prune.streams import token_weights

    adapter = adapter_for(model)
    layers = model.headprune.layout.layers
    grams: dict[int, torch.Tensor] = {}
    hooks, mask = [], {}

    def hook_for(layer):
        def hook(module, inputs, output):
            a, y = inputs[0], output
            keep = mask["m"].bool()
            a, y = a[keep].double(), y[keep].double()
            w = token_weights((y * y).sum(-1))
            g = (a * w[:, None]).T @ a
            grams[layer] = grams.get(layer, 0) + g

        return hook

    for layer, block in zip(layers, adapter.layer_list(model)):
        hooks.append(adapter.ffn(block).down.register_forward_hook(hook_for(layer)))
    model.eval()
    with torch.no_grad():
        for b in batches:
            mask["m"] = b["attention_mask"]
            model(**{k: v for k, v in b.items() if k != "labels"})
    for h in hooks:
        h.remove()
    out = {}
    for layer, block in zip(layers, adapter.layer_list(model)):
        out[layer] = (grams[layer], adapter.ffn(block).down.weight.detach().double().T.clone())
    return out


def obs_remove(gram, w0, count: int, damp: float = 0.01) -> list[int]:
    """Greedy OBS: the `count` input positions whose removal the refit of the rest absorbs best."""
    import torch

    n = len(gram)
    h = gram + damp * float(torch.diagonal(gram).mean()) * torch.eye(n, dtype=torch.float64)
    hinv = torch.linalg.inv(h)
    w = w0.clone()
    alive = torch.ones(n, dtype=torch.bool)
    removed = []
    for _ in range(count):
        cost = (w * w).sum(1) / torch.diagonal(hinv)
        cost[~alive] = float("inf")
        j = int(cost.argmin())
        d = hinv[j, j]
        w -= hinv[:, j : j + 1] @ w[j : j + 1] / d
        hinv -= hinv[:, j : j + 1] @ hinv[j : j + 1, :] / d
        w[j] = 0
        alive[j] = False
        removed.append(j)
    return sorted(removed)


def run(seed: int, target: float, rows: int) -> list[dict]:
    import torch

    from headprune_cli import load
    from headprune_cli.data.readers import batches, read_data
    from headprune_cli.stages.budget import Budget
    from headprune_cli.stages.prune.stage import Compensation, cut
    from headprune_cli.stages.score.importance import score_model
    from headprune_cli.stages.select.chains import Constraints, Selection
    from headprune_cli.stages.select.strategies import select

    torch.set_num_threads(1)
    t = debian_task(seed)
    original = load(t["model"])
    scoring = read_data(t["train"], original, max_length=32, need_labels=True)
    calib = list(batches(read_data(t["train"], original, max_length=32, samples=rows, need_labels=False), 16))
    comp = Compensation("lstsq", calib, 0.1)
    table = score_model(original, scoring, "fisher", ffn=True, seq_len=32, normalize=False)
    plan = select(table, budget=Budget("flops", target), constraints=Constraints())
    grams = ffn_grams(original, calib)
    kept = original.headprune.layout
    obs_ffn = {}
    for layer, removed in plan.remove_ffn.items():
        positions = obs_remove(*grams[layer], len(removed))
        neurons = kept.kept_neurons(layer)
        obs_ffn[layer] = sorted(neurons[p] for p in positions)
    out = []
    for name, ffn in (("fisher", plan.remove_ffn), ("fisher counts + OBS neurons", obs_ffn)):
        model = copy.deepcopy(original)
        cut(model, Selection("probe", plan.remove_heads, [], remove_ffn=ffn), comp)
        loss, agree, acc = dev_loss(model, original, t)
        closs, _, cacc = dev_loss(model, original, t, "calib")
        swapped = sum(len(set(ffn[k]) - set(plan.remove_ffn[k])) for k in ffn)
        out.append(
            dict(
                seed=seed,
                target=target,
                route=name,
                dev_accuracy=acc,
                dev_loss=loss,
                agreement=agree,
                calib_accuracy=cacc,
                calib_loss=closs,
                swapped=swapped,
            )
        )
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--targets", type=float, nargs="+", default=[0.4])
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--json", type=Path, required=True)
    a = p.parse_args()
    rows = []
    for seed in a.seeds:
        for target in a.targets:
            for row in run(seed, target, a.rows):
                print(json.dumps(row), flush=True)
                rows.append(row)
                a.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
