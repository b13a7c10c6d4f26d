"""Deep heads + FFN cuts without training: one-shot against `iterate --recover lstsq`.

Rows, per Debian-sections classifier (seed 0 and 1; dev.jsonl (471 rows) only evaluates;
32 tokens), `--method fisher --ffn` throughout, per FLOPs target T:
  one-shot/calib  score on calib.jsonl (233 rows) -> select --target-flops T
                  -> prune --compensate lstsq --data calib.jsonl (BENCHMARKS.md, "Which method" route)
  one-shot/train  the same with train.jsonl (1696 rows) for scoring and compensation
                  (prune reads its first 256 rows, the --samples default)
  iterate/train   iterate --recover lstsq --data train.jsonl --target-flops 0.8,0.7,..,T:
                  every round rescores the refit model (all 1696 rows) and refits the original
                  cut by all rounds' removals on the first 256 rows; dev.jsonl is its --eval-data,
                  with no floor, so it only reports
The artifacts are cached under --work by file name (debian_task.py): a rerun fills in what is missing.

Usage (from the repository root; the run it records: the deep-cuts BENCHMARKS section):
  OMP_NUM_THREADS=1 nice -n 10 python -m scripts.benchmarks.deep_cuts --work /tmp/deep_cuts \
      --seeds 0 1 --targets 0.4 0.3 --json /tmp/deep_cuts/rows.json
  python -m scripts.benchmarks.deep_cuts --tables-from /tmp/deep_cuts/rows.json
  python -m scripts.benchmarks.deep_cuts --demo --seeds 0 --work /tmp/deep_demo   # every path in seconds
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from scripts.benchmarks.debian_task import (
    checkpoint_accuracy,
    debian_task,
    row_sink,
    run_prune_lstsq,
    run_score,
    run_select,
    run_timed,
)

ROUTES = ("one-shot/calib", "one-shot/train", "iterate/train")


def on(t: dict, split: str) -> dict:
    """The task with `split` in the place of calib.jsonl: what run_score and run_prune_lstsq read."""
    return {**t, "calib": t[split]}


def schedule(target: float) -> list[float]:
    """0.8, 0.7, ... down to `target`: one round per tenth of the FLOPs."""
    steps = [round(0.8 - 0.1 * k, 2) for k in range(9)]
    return [s for s in steps if s > target + 1e-9] + [target]


def one_shot(t: dict, folder: Path, split: str, target: float) -> tuple[Path, dict]:
    """The cut and the wall seconds of its scoring (shared by every target) plus its prune."""
    task = on(t, split)
    scores = folder / f"scores-fisher-ffn-{split}.json"
    scoring = run_timed(scores, lambda: run_score(task, scores, "fisher", ffn=True))
    plan = run_select(scores, folder / f"plan-{split}-{target}.json", target_flops=target)
    out = folder / f"one-shot-{split}-{target}.safetensors"
    pruning = run_timed(out, lambda: run_prune_lstsq(task, plan, out))
    return out, {"wall_s": scoring["wall_s"] + pruning["wall_s"], "load": pruning["load"]}


def iterated(t: dict, folder: Path, target: float) -> tuple[Path, dict]:
    from headprune_cli import run_stage

    out = folder / f"iterate-train-{target}.safetensors"
    options = dict(
        checkpoint=t["model"],
        data=t["train"],
        eval_data=t["dev"],
        output=out,
        target_flops=",".join(map(str, schedule(target))),
        ffn=True,
        method="fisher",
        recover="lstsq",
        max_length=t["length"],
        seed=t["seed"],
    )
    return out, run_timed(out, lambda: run_stage("iterate", **options))


def measured(path: Path, t: dict, original_flops: float) -> dict:
    from headprune_cli import flops_per_token, load

    model = load(path)
    layout = model.headprune.layout
    return dict(
        flops=round(flops_per_token(model, t["length"]) / original_flops, 3),
        heads=sum(len(h) for h in layout.heads),
        neurons=sum(len(layout.kept_neurons(layer)) for layer in layout.layers),
    )


def rows_for(seed: int, work: Path, targets: list[float], sink, demo: bool = False) -> None:
    from headprune_cli import flops_per_token, load

    t = debian_task(seed, demo)
    folder = work / t["name"]
    folder.mkdir(parents=True, exist_ok=True)
    original = flops_per_token(load(t["model"]), t["length"])
    baseline = checkpoint_accuracy(t["model"], t)
    for target in targets:
        for route in ROUTES:
            kind, split = route.split("/")
            out, timing = iterated(t, folder, target) if kind == "iterate" else one_shot(t, folder, split, target)
            accuracy = checkpoint_accuracy(out, t)
            row = dict(model=t["name"], route=route, target=target, accuracy=round(accuracy, 2))
            row.update(measured(out, t, original), drop=round(accuracy - baseline, 2))
            sink({**row, "wall_s": round(timing["wall_s"]), "load": round(timing["load"], 1)})


def markdown(rows: list[dict]) -> str:
    lines = [
        "| model | route | target | FLOPs | heads kept | FFN neurons kept | dev accuracy | drop (points) "
        "| wall s (load) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['route']} | {r['target']} | {r['flops']:.3f} | {r['heads']} | {r['neurons']} "
            f"| {r['accuracy']:.2f} | {r['drop']:+.2f} | {r['wall_s']} ({r['load']}) |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, default=Path("/tmp/deep_cuts"))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--targets", type=float, nargs="+", default=[0.4, 0.3])
    p.add_argument("--demo", action="store_true", help="the bundled toy classifier: every path in seconds")
    p.add_argument("--json", type=Path)
    p.add_argument("--tables-from", type=Path, nargs="+")
    a = p.parse_args()
    if a.tables_from:
        print(markdown([row for path in a.tables_from for row in json.loads(path.read_text())]))
        return
    if any(not 0 < x < 0.8 for x in a.targets):
        p.error("--targets must lie in (0, 0.8): the rounds start at 0.8 of the FLOPs")
    rows, sink = row_sink(a.json)
    for seed in a.seeds:
        rows_for(seed, a.work, a.targets, sink, a.demo)
    print(markdown(rows))


if __name__ == "__main__":
    main()
