"""Recovery benchmark on the bundled example: baseline, pruned, recovered with CE, with KD.

Removes a fraction of the heads (default 40%) of examples/demo/model.safetensors by the
given scoring method on calib.jsonl, then recovers on train.jsonl with the default
recovery settings of `headprune finetune` (no best-epoch selection: the final weights
are measured, so the dev set is never used for choosing). Accuracy is on dev.jsonl.
Optionally also runs iterative pruning (schedule 0.1..ratio) with the same budget.

Usage: python -m scripts.benchmarks.recovery [--demo examples/demo] [--ratio 0.4] [--method taylor]
       [--epochs 3] [--iterative] [--json out.json]
Prints a Markdown table on stdout. scripts/benchmarks/suite.py calls recovery_rows().
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import torch

from headprune_cli import (
    Budget,
    FinetuneConfig,
    apply_plan,
    evaluate,
    info_of,
    iterative_prune,
    load,
    read_data,
    schedule_of,
    score_model,
    select,
)
from headprune_cli import train as finetune


def accuracy(model, dev) -> float:
    return next(m.value for m in evaluate(model, dev, "classification") if m.name == "accuracy")


def heads(model) -> int:
    return sum(len(h) for h in info_of(model).layout.heads)


def prune(model, calib, method: str, ratio: float, seed: int):
    table = score_model(model, calib, method, "classification", seed=seed)
    plan = select(table, "global", budget=Budget("heads", ratio))
    pruned = copy.deepcopy(model)
    apply_plan(pruned, plan.remove_heads, plan.remove_layers)
    return pruned


def recovery_rows(
    demo: Path,
    ratio: float = 0.4,
    method: str = "taylor",
    epochs: int = 3,
    lr: float | None = None,
    kd_weight: float = 0.5,
    seed: int = 0,
    iterative: bool = False,
    train_rows: int | None = None,
) -> list[dict]:
    """Baseline, pruned, recovered with CE and with KD (and iteratively): dev accuracy each.

    train_rows: use only the first N training rows (quick mode)."""
    base = load(demo / "model.safetensors")
    train, dev = read_data(demo / "train.jsonl", base), read_data(demo / "dev.jsonl", base)
    if train_rows:
        train = train.select(0, min(train_rows, len(train)))
    calib = read_data(demo / "calib.jsonl", base)
    rows = [("baseline", heads(base), accuracy(base, dev), 0.0)]
    pruned = prune(base, calib, method, ratio, seed)
    rows.append((f"pruned {ratio:.0%} ({method}), no recovery", heads(pruned), accuracy(pruned, dev), 0.0))
    cfg = FinetuneConfig(epochs=epochs, lr=lr, seed=seed)
    for name, teacher, kd in (("recovered: CE", None, 0.0), (f"recovered: KD (a={kd_weight})", base, kd_weight)):
        start = time.perf_counter()
        result = finetune(
            copy.deepcopy(pruned), train, FinetuneConfig(**{**cfg.__dict__, "kd_weight": kd}), teacher=teacher
        )
        rows.append(
            (
                f"{name}, {epochs} epochs of {len(train)} rows, lr {result.lr:g}",
                heads(result.model),
                accuracy(result.model, dev),
                time.perf_counter() - start,
            )
        )
    if iterative:
        start = time.perf_counter()
        schedule = [r for r in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6) if r < ratio] + [ratio]
        it = iterative_prune(
            base,
            train,
            calib,
            schedule=schedule_of(schedule),
            method=method,
            score_data=calib,
            finetune_config=FinetuneConfig(epochs=1, lr=lr, seed=seed),
            teacher=base if kd_weight else None,
        )
        rows.append(
            (
                f"iterative {schedule}, 1 epoch/round, KD",
                heads(it.model),
                accuracy(it.model, dev),
                time.perf_counter() - start,
            )
        )
    return [dict(zip(("model", "heads", "accuracy", "seconds"), r)) for r in rows]


def markdown(rows: list[dict]) -> str:
    lines = ["| model | heads | dev accuracy | vs baseline (points) | recovery time (s) |", "|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['heads']} | {r['accuracy'] * 100:.2f} | "
            f"{(r['accuracy'] - rows[0]['accuracy']) * 100:+.2f} | {r['seconds']:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo", type=Path, default=Path(__file__).resolve().parents[2] / "examples" / "demo")
    parser.add_argument("--ratio", type=float, default=0.4)
    parser.add_argument("--method", default="taylor")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--kd-weight", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--iterative", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(2)
    rows = recovery_rows(
        args.demo, args.ratio, args.method, args.epochs, args.lr, args.kd_weight, args.seed, args.iterative
    )
    print(markdown(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
