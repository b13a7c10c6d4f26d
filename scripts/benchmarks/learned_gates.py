"""Learned gates that reach their target against greedy + distillation, on the Debian classifiers.

Per model (seed 0 and seed 1 of scripts/tools/make_debian_task.py; 32 tokens; calib.jsonl
(233 rows) scores and compensates, train.jsonl (1696 rows) trains, dev.jsonl (471 rows) only
evaluates), at each cut (--ratio R or --target-flops F):
  greedy+kd  score --method fisher (calib) -> select CUT -> prune --compensate lstsq --data calib
             -> finetune --teacher auto --epochs 1
  learned    learn MODEL CUT --teacher auto --epochs 1 (its defaults, or --set)
both with batch 16 and the model's seed, so both see the rows in the same order. The learned row
also records the gates' report: the expected share removed when they closed, the share the
closing removed, the target, the extra steps, and the trace (expected vs target vs lambdas).

It drives each stage's options model and `run` in one process. Artifacts go under --work and are
reused when present. Usage (BENCHMARKS.md "Which method" has the run it records):
  OMP_NUM_THREADS=1 nice -n 10 python -m scripts.benchmarks.learned_gates --work /tmp/lg --seeds 0 1 \
      --cuts ratio=0.85 --json /tmp/lg/rows.json
  python -m scripts.benchmarks.learned_gates --tables-from /tmp/lg/rows.json
Heads, FFN neurons and layers under one FLOPs budget (BENCHMARKS.md "Which method"):
  ... --cuts target_flops=0.5 --greedy-ffn --set gate_ffn=true gate_layers=true --tag=-ffn-layers
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from scripts.benchmarks.debian_task import (
    checkpoint_accuracy,
    debian_task,
    row_sink,
    run_finetune,
    run_prune_lstsq,
    run_score,
    run_select,
)


def greedy_kd(t: dict, folder: Path, kind: str, value: float, ffn: bool = False, epochs: int = 1) -> Path:
    """score --method fisher [--ffn] -> select CUT -> prune --compensate lstsq -> finetune --teacher auto --epochs E."""
    unit = "-ffn" if ffn else ""
    scores = run_score(t, folder / f"scores-fisher{unit}.json", "fisher", **({"ffn": True} if ffn else {}))
    plan = run_select(scores, folder / f"plan-greedy{unit}-{kind}-{value}.json", **{kind: value})
    cut = run_prune_lstsq(t, plan, folder / f"greedy{unit}-{kind}-{value}.lstsq.safetensors")
    return run_finetune(t, cut, folder / f"greedy{unit}-{kind}-{value}.lstsq.kd{epochs}.safetensors", epochs=epochs)


def learned(t: dict, folder: Path, kind: str, value: float, overrides: dict, tag: str) -> tuple[Path, dict]:
    out = folder / f"learned{tag}-{kind}-{value}.safetensors"
    gates = out.with_suffix(".gates.json")
    run_finetune(t, t["model"], out, stage="learn", gates_out=gates, **{kind: value}, **overrides)
    return out, json.loads(gates.read_text())["config"]["gates"]


def run_model(
    t: dict, work: Path, cuts, overrides: dict, tag: str, greedy: bool, sink, greedy_ffn: bool = False
) -> None:
    epochs = overrides.get("epochs", 1)  # --set epochs=N trains both routes N epochs
    folder = work / t["name"]
    folder.mkdir(parents=True, exist_ok=True)
    baseline = checkpoint_accuracy(t["model"], t)
    sink(dict(model=t["name"], route="baseline", cut="-", accuracy=baseline, drop=0.0))
    for kind, value in cuts:
        cut = f"--{kind.replace('_', '-')} {value}"
        if greedy:
            start = time.perf_counter()
            acc = checkpoint_accuracy(greedy_kd(t, folder, kind, value, greedy_ffn, epochs), t)
            sink(
                dict(
                    model=t["name"],
                    route=f"greedy (fisher{' heads+FFN' if greedy_ffn else ''}) + lstsq + {_epochs(epochs)} KD",
                    cut=cut,
                    accuracy=acc,
                    drop=acc - baseline,
                    wall_s=time.perf_counter() - start,
                    load=os.getloadavg()[0],
                )
            )
        start = time.perf_counter()
        out, report = learned(t, folder, kind, value, overrides, tag)
        acc = checkpoint_accuracy(out, t)
        sink(
            dict(
                model=t["name"],
                route=f"learned gates, {_epochs(epochs)}{(' ' + tag) if tag else ''}",
                cut=cut,
                accuracy=acc,
                drop=acc - baseline,
                gates=report,
                overrides=overrides,
                wall_s=time.perf_counter() - start,
                load=os.getloadavg()[0],
            )
        )


def _epochs(n: int) -> str:
    return "1 epoch" if n == 1 else f"{n} epochs"


def markdown(rows: list[dict]) -> str:
    lines = [
        "| model | route | cut | dev accuracy | drop (points) | expected share at closing | closed share | "
        "target | closed at step (extra) | wall s (load) |",
        "|---|---|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in rows:
        g = r.get("gates")
        cells = (
            [
                f"{g['expected_at_close']:.3f}",
                f"{g['closed']:.3f}",
                f"{g['target']:.3f}",
                f"{g['closed_at_step']} ({g['extra_steps']})",
            ]
            if g
            else ["", "", "", ""]
        )
        wall = f"{r['wall_s']:.0f} ({r['load']:.1f})" if r.get("wall_s") else ""
        lines.append(
            f"| {r['model']} | {r['route']} | {r['cut']} | {r['accuracy']:.2f} | {r['drop']:+.2f} | "
            + " | ".join(cells)
            + f" | {wall} |"
        )
    return "\n".join(lines)


def trace(rows: list[dict], every: int = 8) -> str:
    """The gate phase of each learned row: expected share vs target vs the multipliers."""
    out = []
    for r in rows:
        if not r.get("gates"):
            continue
        out.append(f"{r['model']} {r['cut']} {r['route']}: step expected/target lambda1 lambda2")
        steps = r["gates"]["trace"]
        picks = steps[::every] + ([steps[-1]] if (len(steps) - 1) % every else [])
        out.append(
            "  "
            + "; ".join(
                f"{s['step']}: {s['expected_sparsity']:.3f}/{s['target']:.3f} {s['lambda1']:+.2f} {s['lambda2']:+.2f}"
                for s in picks
            )
        )
    return "\n".join(out)


def _value(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, default=Path("/tmp/learned_gates"))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--cuts", nargs="+", default=["ratio=0.85"], help="KIND=VALUE, e.g. ratio=0.85 target_flops=0.5")
    p.add_argument("--set", nargs="*", default=[], help="learn option overrides for the learned row, NAME=VALUE")
    p.add_argument("--tag", default="", help="names the learned row's files (for runs with --set)")
    p.add_argument("--no-greedy", action="store_true")
    p.add_argument("--greedy-ffn", action="store_true", help="score the greedy route with --ffn (heads + FFN neurons)")
    p.add_argument("--json", type=Path)
    p.add_argument("--tables-from", type=Path, nargs="+")
    a = p.parse_args()
    if a.tables_from:
        rows = [r for f in a.tables_from for r in json.loads(f.read_text())]
        print(markdown(rows) + "\n\n" + trace(rows))
        return
    overrides = {k: _value(v) for k, v in (item.split("=", 1) for item in a.set)}
    cuts = [(c.split("=")[0], float(c.split("=")[1])) for c in a.cuts]
    rows, sink = row_sink(a.json, lambda row: {k: v for k, v in row.items() if k != "gates"})

    for seed in a.seeds:
        run_model(debian_task(seed, False), a.work, cuts, overrides, a.tag, not a.no_greedy, sink, a.greedy_ffn)
    print(markdown(rows) + "\n\n" + trace(rows))


if __name__ == "__main__":
    main()
