"""Greedy selection against `search` (no training), and greedy + one epoch of distillation
against `finetune --learn-gates` (one epoch), on the Debian-sections classifiers.

Rows, per model (seed 0 and seed 1 of scripts/make_debian_task.py; calib.jsonl (233 rows)
scores, searches and compensates, dev.jsonl (471 rows) only evaluates; 32 tokens):
  greedy  score --method taylor [--layers --layer-method loo]  ->  select --ratio R | --target-flops F
  search  search --method taylor [--layers --layer-method loo] --ratio R | --target-flops F --evaluations N
  search+rescore  search --rescore-layers --target-flops F (layers chosen by measured loss, one at a time)
each cut by `prune --compensate lstsq --data calib.jsonl`, no training, at --ratio 0.7 and 0.85
and --target-flops 0.5 (heads alone cannot reach 0.5 of the FLOPs, so that target scores
layers too: loo, the layer score for a cut that is not trained). Then at --ratio 0.85:
  greedy+kd  the greedy lstsq cut above  ->  finetune --teacher auto --epochs 1
  learned    finetune MODEL --learn-gates --ratio 0.85 --teacher auto --epochs 1
(train.jsonl, 1696 rows, batch 16, the same seed as the model, so both see the rows in the same order).
Every output is evaluated on dev.jsonl (accuracy is deterministic).

It drives the library functions the commands call (each stage's options model and `run`)
in one process, so the start-up of each command is paid once. Artifacts go under --work and
are reused when present: a rerun only fills in what is missing.

Usage (from the repository root; BENCHMARKS.md section 15 has the run it records):
  OMP_NUM_THREADS=1 nice -n 10 python -m scripts.benchmarks.search_learned --work /tmp/search_learned \
      --seeds 0 1 --rescore --json /tmp/search_learned/rows.json
  python -m scripts.benchmarks.search_learned --tables-from /tmp/search_learned/rows.json   # the tables only
  python -m scripts.benchmarks.search_learned --masked \
      --tables-from /tmp/search_learned/rows.json   # the plans as masks: loss vs accuracy
  python -m scripts.benchmarks.search_learned --demo --work /tmp/sl-demo   # every path on the bundled toy model
  python -m scripts.benchmarks.search_learned --demo --work /tmp/sl-layers --seeds 0 --no-learn --rescore \
      --cuts target_flops=0.6 target_flops=0.5 target_flops=0.4 \
      --compensation none   # layer choice: single pass vs rescored
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from scripts.benchmarks.debian_task import (
    checkpoint_accuracy,
    debian_task,
    row_sink,
    run_finetune,
    run_prune,
    run_score,
    run_search,
    run_select,
    run_timed,
)

CUTS = (("ratio", 0.7), ("ratio", 0.85), ("target_flops", 0.5))
LEARN_RATIO = 0.85


def scores(t: dict, folder: Path, layers: bool) -> Path:
    if layers:
        return run_score(t, folder / "scores-taylor-loo.json", "taylor", layers=True, layer_method="loo")
    return run_score(t, folder / "scores-taylor.json", "taylor")


def greedy_plan(t: dict, folder: Path, kind: str, value: float) -> tuple[Path, dict]:
    out = folder / f"plan-greedy-{kind}-{value}.json"
    if not out.is_file():
        run_select(scores(t, folder, layers=kind != "ratio"), out, **{kind: value})
    return out, {}


def search_plan(t: dict, folder: Path, kind: str, value: float, evaluations: int, rescore: bool) -> tuple[Path, dict]:
    out = folder / f"plan-search{'-rescore' if rescore else ''}-{kind}-{value}.json"
    extra = (
        {"rescore_layers": True} if rescore else ({"layers": True, "layer_method": "loo"} if kind != "ratio" else {})
    )
    return out, run_timed(out, lambda: run_search(t, out, "taylor", evaluations=evaluations, **{kind: value}, **extra))


def prune(t: dict, plan: Path, out: Path, compensation: str) -> Path:
    data = t["calib"] if compensation != "none" else None
    return run_prune(plan, out, compensation=compensation, data=data, max_length=t["length"])


def finetune(t: dict, source: Path, out: Path, learn: bool) -> Path:
    extra = dict(learn_gates=True, ratio=LEARN_RATIO, gates_out=out.with_suffix(".gates.json")) if learn else {}
    return run_finetune(t, source, out, **extra)


def plan_row(
    t, name, kind, value, plan_path: Path, timing: dict, folder: Path, baseline: float, compensation: str
) -> dict:
    plan = json.loads(plan_path.read_text())
    pruned = prune(
        t, plan_path, folder / (plan_path.stem.replace("plan-", "") + f".{compensation}.safetensors"), compensation
    )
    predicted = plan["predicted"]
    acc = checkpoint_accuracy(pruned, t)
    return dict(
        model=t["name"],
        route=name,
        cut=f"--{kind.replace('_', '-')} {value}",
        accuracy=acc,
        drop=acc - baseline,
        heads=sum(len(v) for v in plan["remove_heads"].values()),
        layers=plan["remove_layers"],
        flops=predicted["after"]["flops_per_token"] / predicted["before"]["flops_per_token"],
        compensation=compensation,
        search=plan.get("search"),
        wall_s=timing.get("wall_s"),
        load=timing.get("load"),
        checkpoint=str(pruned),
    )


def run_model(
    t: dict, work: Path, evaluations: int, learn: bool, rescore: bool, sink, cuts=CUTS, compensation="lstsq"
) -> None:
    folder = work / t["name"]
    folder.mkdir(parents=True, exist_ok=True)
    baseline = checkpoint_accuracy(t["model"], t)
    sink(dict(model=t["name"], route="baseline", cut="-", accuracy=baseline, drop=0.0))
    for kind, value in cuts:
        path, timing = greedy_plan(t, folder, kind, value)
        sink(plan_row(t, "greedy", kind, value, path, timing, folder, baseline, compensation))
        path, timing = search_plan(t, folder, kind, value, evaluations, rescore=False)
        sink(plan_row(t, "search", kind, value, path, timing, folder, baseline, compensation))
        if rescore and kind != "ratio":
            path, timing = search_plan(t, folder, kind, value, evaluations, rescore=True)
            sink(plan_row(t, "search --rescore-layers", kind, value, path, timing, folder, baseline, compensation))
    if learn:
        greedy_cut = folder / f"greedy-ratio-{LEARN_RATIO}.lstsq.safetensors"
        tuned = finetune(t, greedy_cut, folder / f"greedy-ratio-{LEARN_RATIO}.lstsq.kd1.safetensors", learn=False)
        acc = checkpoint_accuracy(tuned, t)
        sink(
            dict(
                model=t["name"],
                route="greedy + lstsq + 1 epoch KD",
                cut=f"--ratio {LEARN_RATIO}",
                accuracy=acc,
                drop=acc - baseline,
            )
        )
        learned = finetune(t, t["model"], folder / f"learned-ratio-{LEARN_RATIO}.safetensors", learn=True)
        acc = checkpoint_accuracy(learned, t)
        sink(
            dict(
                model=t["name"],
                route="learned (--learn-gates), 1 epoch",
                cut=f"--ratio {LEARN_RATIO}",
                accuracy=acc,
                drop=acc - baseline,
            )
        )


def masked(rows: list[dict], work: Path, demo: bool) -> str:
    """Each plan applied as masks (no compensation): dev accuracy and dev cross-entropy, beside
    the loss the search minimised on held-out calibration rows: does the loss track accuracy?"""
    import torch

    from headprune_cli import load
    from headprune_cli.data.readers import read_data
    from headprune_cli.model.surgery import HeadGates, removal_gates, skip_layers
    from headprune_cli.stages.objectives import evaluate
    from headprune_cli.stages.search.masked_loss import MaskedLoss

    lines = [
        "| model | route | cut | masked dev accuracy | masked dev loss | held-out calibration loss |",
        "|---|---|---|---:|---:|---:|",
    ]
    for name in dict.fromkeys(r["model"] for r in rows if "checkpoint" in r):
        t = debian_task(int(name.rsplit("-s", 1)[1]), demo)
        model = load(t["model"])
        dev, calib = (
            read_data(t["dev"], model, max_length=t["length"]),
            read_data(t["calib"], model, max_length=t["length"]),
        )
        dev_loss = MaskedLoss(model, dev, "classification", 32)
        held_loss = MaskedLoss(
            model, calib.select(len(calib) - round(len(calib) * 0.5), len(calib)), "classification", 32
        )
        for r in rows:
            if r["model"] != name or "checkpoint" not in r:
                continue
            plan = json.loads(
                (work / name / ("plan-" + Path(r["checkpoint"]).name.rsplit(".", 2)[0] + ".json")).read_text()
            )
            heads, layers = {int(k): v for k, v in plan["remove_heads"].items()}, plan["remove_layers"]
            with torch.no_grad(), HeadGates(model, removal_gates(model, heads)), skip_layers(model, layers):
                acc = 100 * next(m.value for m in evaluate(model, dev, "classification") if m.name == "accuracy")
            lines.append(
                f"| {name} | {r['route']} | {r['cut']} | {acc:.2f} | {dev_loss(heads, layers):.4f} | "
                f"{held_loss(heads, layers):.4f} |"
            )
    return "\n".join(lines)


def markdown(rows: list[dict]) -> str:
    lines = [
        "| model | route | cut | compensation | heads removed | layers dropped | FLOPs | dev accuracy | "
        "drop (points) | search: evaluations, held-out loss start -> best | search wall s (load) |",
        "|---|---|---|---|---:|---|---:|---:|---:|---|---:|",
    ]
    for r in rows:
        s = r.get("search")
        searched = f"{s['evaluations']}, {s['start_loss']:.4f} -> {s['best_loss']:.4f}" if s else ""
        if s and "rescored_layers" in s:
            searched += f" (rescored: dropped {s['rescored_layers']} in that order)"
        wall = f"{r['wall_s']:.0f} ({r['load']:.1f})" if r.get("wall_s") else ""
        flops = f"{r['flops']:.3f}" if "flops" in r else ""
        lines.append(
            f"| {r['model']} | {r['route']} | {r['cut']} | {r.get('compensation', '')} | "
            f"{r.get('heads', '')} | {r.get('layers', '')} | {flops} | "
            f"{r['accuracy']:.2f} | {r['drop']:+.2f} | {searched} | {wall} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, default=Path("/tmp/search_learned"))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--evaluations", type=int, default=100, help="search --evaluations (its default)")
    p.add_argument("--no-learn", action="store_true", help="skip the two training rows")
    p.add_argument("--rescore", action="store_true", help="also search --rescore-layers at the FLOPs target")
    p.add_argument("--demo", action="store_true", help="the bundled toy classifier instead (a smoke run of every path)")
    p.add_argument(
        "--cuts", nargs="+", help="instead of the issue's three: KIND=VALUE, e.g. target_flops=0.6 ratio=0.5"
    )
    p.add_argument("--compensation", default="lstsq", choices=["none", "bias", "lstsq"])
    p.add_argument("--json", type=Path)
    p.add_argument("--tables-from", type=Path, nargs="+")
    p.add_argument(
        "--masked", action="store_true", help="with --tables-from: each plan as masks, dev accuracy and loss"
    )
    a = p.parse_args()
    if a.tables_from:
        rows = [r for f in a.tables_from for r in json.loads(f.read_text())]
        print(masked(rows, a.work, a.demo) if a.masked else markdown(rows))
        return
    rows, sink = row_sink(a.json)

    for seed in a.seeds:
        cuts = [(c.split("=")[0], float(c.split("=")[1])) for c in a.cuts] if a.cuts else CUTS
        run_model(
            debian_task(seed, a.demo), a.work, a.evaluations, not a.no_learn, a.rescore, sink, cuts, a.compensation
        )
    print(markdown(rows))


if __name__ == "__main__":
    main()
