"""The Debian-sections classifiers several benchmarks prune, and the stage runs they share.

scripts/tools/make_debian_task.py writes the task under $HEADPRUNE_CACHE (or
~/.cache/headprune), folder debian-sections/: train.jsonl (1696 rows), dev.jsonl (471 rows,
only evaluates), calib.jsonl (233 rows, scores and compensates), model.safetensors (the
seed-0 fine-tuned MiniLM) and model-seed{N}.safetensors (the other seeds); 32 tokens.
`--demo` runs use the bundled toy classifier in examples/demo/ instead.

The benchmarks drive each stage's options model and `run` in one process, so the start-up
of each command is paid once. The run_* helpers run a stage quietly and only when its output
file is missing: the work folders are caches keyed by file name, so a rerun fills in what is
missing. headprune itself loads on the first call, not at import (a script checks its
arguments first).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEADPRUNE_CACHE = Path(os.environ.get("HEADPRUNE_CACHE", Path.home() / ".cache" / "headprune"))
DEBIAN_SECTIONS = HEADPRUNE_CACHE / "debian-sections"
DEMO = ROOT / "examples" / "demo"
LENGTH = 32  # one-line descriptions: they fit 32 word pieces


def debian_checkpoint(seed: int) -> Path:
    """The fine-tuned Debian-sections classifier of `seed`."""
    return DEBIAN_SECTIONS / ("model.safetensors" if seed == 0 else f"model-seed{seed}.safetensors")


def debian_task(seed: int, demo: bool = False) -> dict:
    """Paths and settings of one classifier: name, model, calib, dev, train, seed, length."""
    folder, model = (DEMO, DEMO / "model.safetensors") if demo else (DEBIAN_SECTIONS, debian_checkpoint(seed))
    return dict(
        name=f"{'demo' if demo else 'debian'}-s{seed}",
        model=model,
        calib=folder / "calib.jsonl",
        dev=folder / "dev.jsonl",
        train=folder / "train.jsonl",
        seed=seed,
        length=LENGTH,
    )


def dev_accuracy(model, t: dict) -> float:
    """Dev accuracy (%) of a loaded classifier on the task's dev.jsonl."""
    from headprune_cli import evaluate, read_data

    dev = read_data(t["dev"], model, max_length=t["length"])
    return 100 * next(m.value for m in evaluate(model, dev, "classification") if m.name == "accuracy")


def checkpoint_accuracy(path: Path, t: dict) -> float:
    """Dev accuracy (%) of the checkpoint at `path`."""
    from headprune_cli import load

    return dev_accuracy(load(path), t)


def _on_calibration(t: dict, out: Path, method: str) -> dict:
    """What score and search share: the task's model scored by `method` on calib.jsonl at its length and seed."""
    return dict(
        checkpoint=t["model"], data=t["calib"], method=method, max_length=t["length"], seed=t["seed"], output=out
    )


def run_score(t: dict, out: Path, method: str, **options) -> Path:
    """`score MODEL --data calib.jsonl --method METHOD` at the task's length and seed, into `out`."""
    from headprune_cli import run_stage

    if not out.is_file():
        run_stage("score", **_on_calibration(t, out, method), **options)
    return out


def run_search(t: dict, out: Path, method: str, **options) -> Path:
    """`search MODEL --data calib.jsonl --method METHOD` at the task's length and seed, into the plan `out`."""
    from headprune_cli import run_stage

    if not out.is_file():
        run_stage("search", **_on_calibration(t, out, method), **options)
    return out


def run_select(scores: Path, out: Path, **options) -> Path:
    """`select SCORES [options]` into the plan `out`."""
    from headprune_cli import run_stage

    if not out.is_file():
        run_stage("select", scores=str(scores), output=out, **options)
    return out


def run_prune(plan: Path, out: Path, **options) -> Path:
    """`prune --plan PLAN [options]` into the checkpoint `out`."""
    from headprune_cli import run_stage

    if not out.is_file():
        run_stage("prune", plan=str(plan), output=out, **options)
    return out


def run_prune_lstsq(t: dict, plan: Path, out: Path) -> Path:
    """`prune --plan PLAN --compensate lstsq --data calib.jsonl` at the task's length."""
    return run_prune(plan, out, compensation="lstsq", data=t["calib"], max_length=t["length"])


def plan_row(
    t, name, kind, value, plan_path: Path, timing: dict, folder: Path, baseline: float, compensation: str
) -> dict:
    """One table row: `plan_path` pruned (compensated unless `compensation` is none) and judged on dev."""
    plan = json.loads(plan_path.read_text())
    data = t["calib"] if compensation != "none" else None
    out = folder / (plan_path.stem.replace("plan-", "") + f".{compensation}.safetensors")
    pruned = run_prune(plan_path, out, compensation=compensation, data=data, max_length=t["length"])
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


def run_finetune(t: dict, source: Path, out: Path, stage: str = "finetune", **options) -> Path:
    """`finetune SOURCE --data train.jsonl --teacher auto --epochs 1 [options]` at the task's
    length and seed, into `out` (`epochs=` in the options replaces the one epoch); `stage="learn"`
    runs learned-gate pruning with the same training settings."""
    from headprune_cli import run_stage

    if not out.is_file():
        run_stage(
            stage,
            checkpoint=source,
            data=t["train"],
            output=out,
            teacher="auto",
            max_length=t["length"],
            seed=t["seed"],
            **{"epochs": 1, **options},
        )
    return out


def run_timed(out: Path, make: Callable[[], object]) -> dict:
    """Calls `make` (which writes `out`) unless `out` is there; returns the wall seconds and the
    load average of the call that wrote it, kept beside it in OUT.time.json."""
    record = out.with_suffix(".time.json")
    if not out.is_file():
        start = time.perf_counter()
        make()
        record.write_text(json.dumps({"wall_s": time.perf_counter() - start, "load": os.getloadavg()[0]}))
    return json.loads(record.read_text())


def row_sink(path: Path | None, shown: Callable[[dict], dict] = lambda row: row):
    """(rows, sink): each row sunk is kept, printed as a JSON line (through `shown`) and, with
    `path`, the whole list rewritten there, so a run stopped midway keeps what it measured."""
    rows: list[dict] = []

    def sink(row: dict) -> None:
        rows.append(row)
        print(json.dumps(shown(row)), flush=True)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(rows, indent=1))

    return rows, sink
