"""Greedy + lstsq against `search` judged after lstsq, on the Debian-sections classifiers.

Rows, per model (seed 0 and seed 1; calib.jsonl (233 rows) scores, searches and compensates,
dev.jsonl (471 rows) only evaluates; 32 tokens), fisher scores throughout:
  greedy  score --method fisher [--ffn --layers]  ->  select --ratio R | --target-flops F
  search  search --method fisher [--ffn --layers] --ratio R | --target-flops F --compensate lstsq --evaluations N
each cut by `prune --compensate lstsq --data calib.jsonl`, no training: --ratio 0.7 and 0.85 (heads),
--target-flops 0.5 over heads + FFN neurons + layers. Every output is evaluated on dev.jsonl.
debian_task.py has the task, the stage runs and the prune-and-evaluate row.

Usage (from the repository root; BENCHMARKS.md, "Which method" has the run it records):
  OMP_NUM_THREADS=1 nice -n 10 python -m scripts.benchmarks.search_compensated --work /tmp/search_comp \
      --seeds 0 1 --cuts ratio=0.85 ratio=0.7 target_flops=0.5 --json /tmp/search_comp/rows.json
  OMP_NUM_THREADS=1 nice -n 10 python -m scripts.benchmarks.search_compensated --work /tmp/search_comp \
      --seeds 0 --cuts ratio=0.85 --budgets 50 200 --json /tmp/search_comp/budget.json   # result vs budget
  python -m scripts.benchmarks.search_compensated --tables-from /tmp/search_comp/rows.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from scripts.benchmarks.debian_task import (
    checkpoint_accuracy,
    debian_task,
    plan_row,
    row_sink,
    run_score,
    run_search,
    run_select,
    run_timed,
)


def scores(t: dict, folder: Path, deep: bool) -> Path:
    if deep:
        return run_score(t, folder / "scores-fisher-ffn-layers.json", "fisher", layers=True, ffn=True)
    return run_score(t, folder / "scores-fisher.json", "fisher")


def greedy_plan(t: dict, folder: Path, kind: str, value: float) -> Path:
    out = folder / f"plan-greedy-fisher-{kind}-{value}.json"
    if not out.is_file():
        run_select(scores(t, folder, deep=kind != "ratio"), out, **{kind: value})
    return out


def search_plan(
    t: dict, folder: Path, kind: str, value: float, evaluations: int, compensation: str, judge: str | None = None
) -> tuple[Path, dict]:
    by = f"-{judge}" if judge else ""
    out = folder / f"plan-search-fisher-{compensation}{by}-{kind}-{value}-e{evaluations}.json"
    extra = dict(layers=True, ffn=True) if kind != "ratio" else {}
    options = dict(evaluations=evaluations, compensation=compensation, judge=judge, **{kind: value}, **extra)
    return out, run_timed(out, lambda: run_search(t, out, "fisher", **options))


def markdown(rows: list[dict]) -> str:
    lines = [
        "| model | route | cut | heads removed | layers dropped | FLOPs | dev accuracy | drop (points) | "
        "search: evaluations, restarts, held-out accuracy start -> best | search wall s (load) |",
        "|---|---|---|---:|---|---:|---:|---:|---|---:|",
    ]
    for r in rows:
        s = r.get("search")
        searched = ""
        if s:
            judged = (
                f"{100 * s['start_accuracy']:.2f} -> {100 * s['best_accuracy']:.2f}"
                if "best_accuracy" in s
                else f"loss {s['start_loss']:.4f} -> {s['best_loss']:.4f}"
            )
            searched = f"{s['evaluations']}, {s.get('restarts', 0)}, {judged}"
        wall = f"{r['wall_s']:.0f} ({r['load']:.1f})" if r.get("wall_s") else ""
        flops = f"{r['flops']:.3f}" if "flops" in r else ""
        lines.append(
            f"| {r['model']} | {r['route']} | {r['cut']} | {r.get('heads', '')} | {r.get('layers', '')} | {flops} | "
            f"{r['accuracy']:.2f} | {r['drop']:+.2f} | {searched} | {wall} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, default=Path("/tmp/search_comp"))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--cuts", nargs="+", default=["ratio=0.85", "ratio=0.7", "target_flops=0.5"])
    p.add_argument("--budgets", type=int, nargs="+", default=[100], help="search --evaluations, one row each")
    p.add_argument("--no-greedy", action="store_true")
    p.add_argument("--judge-compensation", default="lstsq", choices=["none", "bias", "lstsq"])
    p.add_argument("--judge", choices=["metric", "loss"], help="search --judge (default: its own)")
    p.add_argument("--json", type=Path)
    p.add_argument("--tables-from", type=Path, nargs="+")
    a = p.parse_args()
    if a.tables_from:
        print(markdown([r for f in a.tables_from for r in json.loads(f.read_text())]))
        return
    rows, sink = row_sink(a.json)

    for seed in a.seeds:
        t = debian_task(seed, demo=False)
        folder = a.work / t["name"]
        folder.mkdir(parents=True, exist_ok=True)
        baseline = checkpoint_accuracy(t["model"], t)
        sink(dict(model=t["name"], route="baseline", cut="-", accuracy=baseline, drop=0.0))
        for cut in a.cuts:
            kind, value = cut.split("=")[0], float(cut.split("=")[1])
            if not a.no_greedy:
                path = greedy_plan(t, folder, kind, value)
                sink(plan_row(t, "greedy (fisher)", kind, value, path, {}, folder, baseline, "lstsq"))
            for budget in a.budgets:
                path, timing = search_plan(t, folder, kind, value, budget, a.judge_compensation, a.judge)
                by = f", --judge {a.judge}" if a.judge else ""
                route = f"search (fisher, judged after {a.judge_compensation}{by}, {budget} evaluations)"
                sink(plan_row(t, route, kind, value, path, timing, folder, baseline, "lstsq"))
    print(markdown(rows))


if __name__ == "__main__":
    main()
