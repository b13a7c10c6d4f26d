"""Task-specific pruning from one base: per-task plans against one shared plan (BENCHMARKS.md, "Which recovery").

Three tasks share the pre-trained all-MiniLM-L6-v2 (CACHE/minilm/model.safetensors):
  sections  Debian descriptions by functional section (CACHE/debian-sections/model-on-base.safetensors:
            make_debian_task.py's seed-0 model, its base named by scripts/tools/task_base.py --stamp)
  kinds     Debian descriptions by kind of package (CACHE/debian-kinds/, make_debian_kinds.py)
  fidelity  the base itself, label-free: 1 - cosine to the unpruned embeddings
            (examples/minilm_calib.txt scores, compensates and trains; examples/minilm_heldout.txt evaluates)
For each --target-flops F: `headprune tasks` (fisher scores on heads and FFN neurons, 32 tokens)
writes each task's own plan and the shared plan (mean of normalised importance); every plan
is cut by `prune --compensate lstsq` on the task's calibration data and evaluated (dev
accuracy, or held-out fidelity against the unpruned base), then recovered by
`finetune --teacher auto --epochs 1` on the task's training data and evaluated again.

It drives each stage's options model and `run` in one process; artifacts go under --work
and are reused when present (a rerun fills in what is missing).

Usage (from the repository root):
  OMP_NUM_THREADS=1 nice -n 10 python -m scripts.benchmarks.tasks_one_base --work /tmp/tasks-bench \
      --targets 0.6 0.5 --json /tmp/tasks-bench/rows.json
  python -m scripts.benchmarks.tasks_one_base --tables-from /tmp/tasks-bench/rows.json
(--targets and --tasks split the work over processes sharing --work: give each its own --json,
then --tables-from all of them.)
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from scripts.benchmarks.debian_task import (
    DEBIAN_SECTIONS,
    HEADPRUNE_CACHE,
    LENGTH,
    ROOT,
    run_finetune,
    run_prune_lstsq,
)


def tasks() -> dict[str, dict]:
    sections, kinds = DEBIAN_SECTIONS, HEADPRUNE_CACHE / "debian-kinds"
    common = dict(seed=0, length=LENGTH)  # finetune's seed; the length of every stage
    return {
        "sections": dict(
            model=sections / "model-on-base.safetensors",
            calib=sections / "calib.jsonl",
            dev=sections / "dev.jsonl",
            train=sections / "train.jsonl",
            objective="classification",
            **common,
        ),
        "kinds": dict(
            model=kinds / "model.safetensors",
            calib=kinds / "calib.jsonl",
            dev=kinds / "dev.jsonl",
            train=kinds / "train.jsonl",
            objective="classification",
            **common,
        ),
        "fidelity": dict(
            model=HEADPRUNE_CACHE / "minilm" / "model.safetensors",
            calib=ROOT / "examples" / "minilm_calib.txt",
            dev=ROOT / "examples" / "minilm_heldout.txt",
            train=ROOT / "examples" / "minilm_calib.txt",
            objective="fidelity",
            **common,
        ),
    }


def quality(path: Path, t: dict) -> float:
    """Dev accuracy (%) or held-out fidelity (mean cosine to the unpruned base, x100)."""
    from headprune_cli import evaluate, load, read_data

    model = load(path)
    dev = read_data(t["dev"], model, max_length=LENGTH, need_labels=t["objective"] == "classification")
    reference = load(t["model"]) if t["objective"] == "fidelity" else None
    metric = "accuracy" if t["objective"] == "classification" else "fidelity"
    return 100 * next(m.value for m in evaluate(model, dev, t["objective"], reference=reference) if m.name == metric)


def cross_task(folder: Path, target: float) -> dict:
    from headprune_cli import run_stage

    if not (folder / "tasks.json").is_file():
        specs = [
            f"name={n},model={t['model']},data={t['calib']}" + (",objective=fidelity" if n == "fidelity" else "")
            for n, t in tasks().items()
        ]
        run_stage("tasks", task=specs, target_flops=target, method="fisher", max_length=LENGTH, output=folder)
    return json.loads((folder / "tasks.json").read_text())


def timed(fn, *args) -> tuple[object, float]:
    start = time.perf_counter()
    value = fn(*args)
    return value, time.perf_counter() - start


def run(work: Path, targets: list[float], sink, only: list[str] | None = None) -> list[dict]:
    rows = []
    for target in targets:
        folder = work / f"flops-{target}"
        art = cross_task(folder, target)
        for entry in [e for e in art["tasks"] if not only or e["name"] in only]:
            name, t = entry["name"], tasks()[entry["name"]]
            for which, plan in (("own", folder / f"plan-{name}.json"), ("shared", folder / f"plan-shared-{name}.json")):
                cut = run_prune_lstsq(t, plan, folder / f"{name}-{which}.lstsq.safetensors")
                tuned, seconds = timed(run_finetune, t, cut, folder / f"{name}-{which}.lstsq.kd1.safetensors")
                row = {
                    "target": target,
                    "task": name,
                    "plan": which,
                    "flops_kept": entry[which]["flops_kept"],
                    "heads_kept": entry["own"]["heads_kept"] if which == "own" else art["shared"]["heads_kept"],
                    "ffn_kept": entry["own"]["ffn_kept"] if which == "own" else art["shared"]["ffn_kept"],
                    "no_training": quality(cut, t),
                    "kd1": quality(tuned, t),
                    "finetune_s": round(seconds, 1),
                    "load": round(os.getloadavg()[0], 2),
                }
                rows.append(row)
                sink(row)
    return rows


def baselines() -> dict[str, float]:
    return {n: quality(t["model"], t) for n, t in tasks().items()}


def markdown(rows: list[dict], base: dict[str, float], work: Path) -> str:
    out = []
    for target in sorted({r["target"] for r in rows}, reverse=True):
        out += [
            f"At --target-flops {target}:",
            "",
            "| task | metric | unpruned | own plan: heads / FFN | shared plan: heads / FFN "
            "| own, no training | shared, no training | own, +1 epoch KD | shared, +1 epoch KD |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for name in base:
            own = next(r for r in rows if r["target"] == target and r["task"] == name and r["plan"] == "own")
            sh = next(r for r in rows if r["target"] == target and r["task"] == name and r["plan"] == "shared")
            metric = "fidelity x100" if name == "fidelity" else "dev accuracy %"
            out.append(
                f"| {name} | {metric} | {base[name]:.2f} | {own['heads_kept']} / {own['ffn_kept']} "
                f"| {sh['heads_kept']} / {sh['ffn_kept']} | {own['no_training']:.2f} | {sh['no_training']:.2f} "
                f"| {own['kd1']:.2f} | {sh['kd1']:.2f} |"
            )
        out.append("")
        art = json.loads((work / f"flops-{target}" / "tasks.json").read_text())
        out += [
            "| pair | Jaccard kept heads | Spearman head scores | Jaccard kept FFN | Spearman FFN scores |",
            "|---|---|---|---|---|",
        ]
        for p in art["pairs"]:
            out.append(
                f"| {p['a']} / {p['b']} | {p['jaccard_heads']:.3f} | {p['spearman_heads']:.3f} "
                f"| {p['jaccard_ffn']:.3f} | {p['spearman_ffn']:.3f} |"
            )
        only = ", ".join(f"{n} {c}" for n, c in art["heads"]["only_count"].items())
        out += ["", f"Heads every task keeps: {art['heads']['every_count']} of 72; only one task keeps: {only}.", ""]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/tasks-bench"))
    parser.add_argument("--targets", type=float, nargs="+", default=[0.6, 0.5])
    parser.add_argument("--tasks", nargs="+", help="Only these tasks (several processes can share --work).")
    parser.add_argument("--json", type=Path, help="Write the rows (and baselines) here as they come.")
    parser.add_argument("--tables-from", type=Path, nargs="+", help="Only print the tables from earlier --json files.")
    args = parser.parse_args()
    if args.tables_from:
        saved = [json.loads(p.read_text()) for p in args.tables_from]
        rows = [r for s in saved for r in s["rows"]]
        print(markdown(rows, saved[0]["baselines"], args.tables_from[0].parent))
        return
    args.work.mkdir(parents=True, exist_ok=True)
    base = baselines()
    rows: list[dict] = []

    def sink(row: dict) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.json:
            args.json.write_text(json.dumps({"baselines": base, "rows": rows}, indent=1) + "\n")

    run(args.work, args.targets, sink, args.tasks)
    print(markdown(rows, base, args.work))


if __name__ == "__main__":
    main()
