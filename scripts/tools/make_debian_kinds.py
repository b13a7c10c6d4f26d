"""A second labelled task on the same base: Debian package descriptions by kind of package.

The same package lists, rules and hash split as make_debian_task.py (functional sections:
admin, games, ...), but eight other sections, about what kind of package it is rather
than what the software does: devel, doc, fonts, libdevel, libs, localization, utils, x11.
Fine-tuned from the same pre-trained all-MiniLM-L6-v2 (a seeded 8-way classifier), with the
base recorded in the checkpoint's provenance (task_base.py), so `headprune tasks` can
compare this task with debian-sections and with the label-free fidelity task on the base.

Usage: python scripts/tools/make_debian_kinds.py [--cache DIR] [--epochs 2] [--seed 0] [--per-class 300]
Writes DIR/{train,dev,calib}.jsonl, DIR/model.safetensors, DIR/task.json (DIR: CACHE/debian-kinds),
and CACHE/minilm/model.safetensors (the base) when it is not there yet.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from scripts.tools.make_debian_task import MAX_LENGTH, build_rows, read_packages, train, write_jsonl
from scripts.tools.task_base import base_checkpoint, default_root, record_base

KINDS = ["devel", "doc", "fonts", "libdevel", "libs", "localization", "utils", "x11"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=default_root() / "debian-kinds")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--per-class", type=int, default=300)
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    splits = build_rows(read_packages(), args.per_class, KINDS)
    for name, rows in splits.items():
        write_jsonl(args.cache / f"{name}.jsonl", rows)
    print(f"wrote {', '.join(f'{n} {len(r)}' for n, r in splits.items())} rows to {args.cache}", file=sys.stderr)
    done = args.cache / (f"task-seed{args.seed}.json" if args.seed else "task.json")
    if done.is_file() and Path(json.loads(done.read_text())["checkpoint"]).is_file():
        print(f"cached: {done.read_text()}", file=sys.stderr)
        return
    base = base_checkpoint(args.cache.parent)
    summary = train(args.cache, args.epochs, args.seed, args.lr, KINDS, before_save=record_base(base))
    summary.update(sections=KINDS, rows={n: len(r) for n, r in splits.items()}, max_length=MAX_LENGTH, base=str(base))
    done.write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    print(json.dumps(summary, sort_keys=True))


if __name__ == "__main__":
    main()
