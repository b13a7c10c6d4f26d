"""Fidelity of a pruned all-MiniLM-L6-v2 per importance method, with and without lstsq.

Fidelity = mean cosine between the pruned and the unpruned model's sentence embeddings
on held-out text (1.0 = identical). Scores and lstsq calibration use the first
--calibration lines of examples/minilm_text.txt; up to --held-out lines after them are
held out. Selection: `global`, --min-heads 1. Random is the mean over --seeds seeds.

    OMP_NUM_THREADS=2 /tmp/venv0/bin/python -m scripts.benchmarks.quality --threads 2

scripts/benchmarks/suite.py calls quality_rows() (smaller calibration/held-out sets unless --full).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time

import torch

from headprune_cli import (
    Budget,
    Constraints,
    ScoreTable,
    apply_plan,
    batches,
    compensate,
    embed,
    info_of,
    score_model,
    select,
)

from .common import minilm, split_text

METHODS = ("random", "taylor-weight", "gradient", "taylor", "fisher", "loo")


def fidelity(model, reference_embeddings, held_out) -> float:
    sims = []
    with torch.no_grad():
        for batch, ref in zip(held_out, reference_embeddings):
            sims.append(torch.nn.functional.cosine_similarity(embed(model, batch), ref, dim=-1))
    return float(torch.cat(sims).mean())


def pruned_fidelity(model, scores: dict, ratio: float, calib, reference, held_out) -> tuple[float, float]:
    layout = info_of(model).layout
    table = ScoreTable(heads=scores, num_heads=layout.num_heads, num_kv_heads=layout.num_kv_heads)
    plan = select(table, "global", budget=Budget("heads", ratio), constraints=Constraints(min_heads=1)).remove_heads
    out = []
    for method in ("none", "lstsq"):
        pruned = copy.deepcopy(model)
        compensate(pruned, plan, [], calib, method=method)
        apply_plan(pruned, plan, [])
        out.append(fidelity(pruned, reference, held_out))
    return out[0], out[1]


def quality_rows(model, calib_set, held_set, methods=METHODS, ratios=(0.3, 0.5), seeds: int = 5) -> tuple[dict, dict]:
    """{method: {ratio: (fidelity without, with lstsq)}} (random: mean over `seeds` seeds),
    and {method: seconds of one scoring run}."""
    calib, held_out = list(batches(calib_set, 32)), list(batches(held_set, 32))
    with torch.no_grad():
        reference = [embed(model, b) for b in held_out]
    rows, seconds = {}, {}
    for method in methods:
        start = time.time()
        results = {r: [] for r in ratios}
        for seed in range(seeds) if method == "random" else [0]:
            begin = time.perf_counter()
            scores = score_model(model, calib_set, method, "fidelity", batch_size=32, seed=seed).heads
            seconds[method] = time.perf_counter() - begin
            for ratio in ratios:
                results[ratio].append(pruned_fidelity(model, scores, ratio, calib, reference, held_out))
        rows[method] = {r: tuple(statistics.mean(v[i] for v in vals) for i in range(2)) for r, vals in results.items()}
        print(f"  quality {method}: {rows[method]} ({time.time() - start:.0f} s)", file=sys.stderr, flush=True)
    return rows, seconds


def markdown(rows: dict, ratios, seeds: int) -> str:
    lines = [
        "| method | " + " | ".join(f"{r:.0%} removed | {r:.0%} + lstsq" for r in ratios) + " |",
        "|---|" + "---:|" * (2 * len(ratios)),
    ]
    for method, by_ratio in rows.items():
        label = f"random (mean of {seeds} seeds)" if method == "random" else method
        lines.append(
            f"| {label} | " + " | ".join(f"{by_ratio[r][0]:.4f} | {by_ratio[r][1]:.4f}" for r in ratios) + " |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calibration", type=int, default=200, help="first N lines score and calibrate")
    parser.add_argument("--held-out", type=int, default=None, help="lines after them held out (default: all)")
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.3, 0.5])
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-length", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = minilm()
    calib_set, held_set = split_text(model, args.calibration, args.held_out, args.max_length)
    print(f"MiniLM-L6: {len(calib_set)} calibration / {len(held_set)} held-out sentences", file=sys.stderr)
    rows, _ = quality_rows(model, calib_set, held_set, args.methods, args.ratios, args.seeds)
    print(markdown(rows, args.ratios, args.seeds))


if __name__ == "__main__":
    main()
