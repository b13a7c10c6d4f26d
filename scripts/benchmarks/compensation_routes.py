"""Compensation of the heads+FFN routes on all-MiniLM-L6-v2, fidelity only (no timing):
none / lstsq (every kept column refit) / diagonal (one scale per kept neuron), held out.

Reads the scores that scripts/benchmarks/ffn_routes.py wrote for the `minilm` task under
--work (one file per route), selects each route at each FLOPs target with the selection
code of this tree (selection.select, as `select --target-flops F`), compensates on the
calibration half (stages.compensation.compensate, the call `prune --compensate lstsq`
makes; the diagonal fit is the library's `ffn_fit="diag"`), cuts (surgery.apply_plan) and
prints the held-out fidelity (mean cosine to the unpruned embeddings x 100).

`--energy` first prints where each layer's FFN output energy sits on the calibration
half (the share of its largest output dimension, and of the tokens that carry it), and
the share the fisher 0.6 plan's removed neurons carried: what an unweighted refit chases.

    OMP_NUM_THREADS=1 nice -n 10 python -m scripts.benchmarks.compensation_routes --work /tmp/ffn_routes --ridges 0.1,1
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import torch

from headprune_cli.stages.budget import Budget

ROUTES = {
    "heads+layers": "scores-heads+layers.json",
    "heads+ffn/fisher": "scores-heads+ffn-fisher.json",
    "heads+ffn/taylor": "scores-heads+ffn-taylor.json",
    "heads+ffn+layers": "scores-heads+ffn+layers.json",
}


def energy(base, batches, remove_ffn) -> None:
    from headprune_cli.model.arch import adapter_for

    adapter = adapter_for(base)
    downs = [adapter.ffn(block).down for block in adapter.layer_list(base)]
    seen: dict[int, list] = {pos: [] for pos in range(len(downs))}
    hooks = [
        d.register_forward_hook(lambda m, a, o, pos=pos: seen[pos].append((a[0].detach(), o.detach())))
        for pos, d in enumerate(downs)
    ]
    with torch.no_grad():
        for batch in batches:
            base(**batch)
    for h in hooks:
        h.remove()
    for pos, down in enumerate(downs):
        x = torch.cat([xi[b["attention_mask"].bool()] for (xi, _), b in zip(seen[pos], batches)]).double()
        y = torch.cat([yi[b["attention_mask"].bool()] for (_, yi), b in zip(seen[pos], batches)]).double()
        dims = (y * y).sum(0)
        top = int(dims.argmax())
        removed = torch.tensor(remove_ffn.get(pos, []), dtype=torch.long)
        part = x[:, removed] @ down.weight.detach().double()[:, removed].T
        first = torch.cat([_first_tokens(b["attention_mask"]) for b in batches])  # [CLS] of every text
        tokens = y[:, top] ** 2
        print(
            f"layer {pos}: dimension {top} holds {float(dims[top] / dims.sum()):.1%} of the FFN output energy, "
            f"the first token of each text ({float(first.float().mean()):.1%} of the tokens) "
            f"{float(tokens[first].sum() / tokens.sum()):.1%} of that; "
            f"the removed neurons' share of the output energy: {float((part * part).sum() / (y * y).sum()):.1%}"
        )


def _first_tokens(mask: torch.Tensor) -> torch.Tensor:
    """Over the real tokens of a batch (row by row, as mask-indexing orders them): True at each text's first."""
    first = torch.zeros_like(mask, dtype=torch.bool)
    first[torch.arange(len(mask)), mask.long().argmax(1)] = True
    return first[mask.bool()]


def main() -> None:
    from headprune_cli import load
    from headprune_cli.artifacts.schema import read_artifact
    from headprune_cli.data.readers import batches, read_data
    from headprune_cli.model.surgery import apply_plan
    from headprune_cli.stages.objectives import evaluate
    from headprune_cli.stages.prune.compensation import compensate
    from headprune_cli.stages.score.table import ScoreTable
    from headprune_cli.stages.select.strategies import select

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/ffn_routes"))
    parser.add_argument("--targets", default="0.6,0.5")
    parser.add_argument("--ridges", default="0.1")
    parser.add_argument("--routes", default=",".join(ROUTES))
    parser.add_argument("--energy", action="store_true")
    args = parser.parse_args()
    work = args.work / "minilm"
    base = load(work / "model.safetensors")
    calib = read_data(work / "calib.txt", base, max_length=128, need_labels=False)
    held = read_data(work / "held_out.txt", base, max_length=128, need_labels=False)
    cal_batches = [{k: v for k, v in b.items() if k != "labels"} for b in batches(calib, 16)]  # prune's default batch
    ridges = [float(r) for r in args.ridges.split(",")]
    fits = [("none", "full", 0.1)] + [(m, f, r) for r in ridges for m, f in (("lstsq", "full"), ("lstsq", "diag"))]
    tables = {
        route: ScoreTable.from_scores(read_artifact(str(work / ROUTES[route]), ("scores",))[0])
        for route in args.routes.split(",")
    }
    if args.energy:
        energy(base, cal_batches, select(tables["heads+ffn/fisher"], budget=Budget("flops", 0.6)).remove_ffn)
    print(
        "| route | target | layers dropped | heads removed | FFN neurons removed | FLOPs | none | "
        + " | ".join(f"{'lstsq' if f == 'full' else 'diagonal'} (ridge {r:g})" for _, f, r in fits[1:])
        + " |"
    )
    print("|---|---:|---|---:|---:|---:|" + "---:|" * len(fits))
    for target in (float(t) for t in args.targets.split(",") if t.strip()):  # --targets "": the energy only
        for route, table in tables.items():
            sel = select(table, budget=Budget("flops", target))
            cells = []
            for method, fit, ridge in fits:
                model = copy.deepcopy(base)
                compensate(
                    model,
                    sel.remove_heads,
                    sel.remove_layers,
                    cal_batches,
                    method=method,
                    ridge=ridge,
                    remove_ffn=sel.remove_ffn,
                    ffn_fit=fit,
                )
                apply_plan(model, sel.remove_heads, sel.remove_layers, remove_ffn=sel.remove_ffn)
                cells.append(f"{100 * evaluate(model, held, 'fidelity', reference=base)[0].value:.2f}")
            before, after = sel.predicted["before"]["flops_per_token"], sel.predicted["after"]["flops_per_token"]
            print(
                f"| {route} | {target:g} | {sel.remove_layers or '-'} | {sum(map(len, sel.remove_heads.values()))} | "
                f"{sum(map(len, sel.remove_ffn.values()))} | {after / before:.3f} | " + " | ".join(cells) + " |",
                flush=True,
            )


if __name__ == "__main__":
    main()
