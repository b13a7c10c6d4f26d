"""Lottery tickets for heads on the Debian-sections classifiers: four recovery arms under one
training budget, at 50% and 75% of the heads removed.

Per model (seed 0: model.safetensors, fine-tuned from init-seed0/; seed 1:
model-seed1.safetensors, from init-seed1/), calib.jsonl scores (`score --method fisher`),
each plan is cut by `prune` (no compensation), and every arm then trains with the same
budget and loss: `finetune --teacher auto` (KD from the unpruned fine-tuned model, kd weight
0.5, plus the labels), --epochs 1, --batch-size 16, --lr 1e-4, the model's seed, 32 tokens,
on train.jsonl (1696 rows: 106 steps). Arms:
  kd          the fisher plan's pruned model, trained as it is (fine-tuned weights kept)
  rewind      the same kept heads, --rewind-to init-seedN/ (the pre-trained base it was fine-tuned from)
  reinit      the same kept heads, --reinit SEED (the model's own init)
  random      a random plan of the same size (select --strategy random --seed SEED), rewound as `rewind`
dev.jsonl (471 rows) only evaluates, before training ("start") and after it.

It drives the library functions the commands call, in one process; artifacts go under --work
and are reused when present.

Usage (from the repository root; BENCHMARKS.md, "Which recovery" has the run it records):
  OMP_NUM_THREADS=1 nice -n 10 python -m scripts.benchmarks.lottery --work /tmp/lottery --seeds 0 \
      --json /tmp/lottery/rows-s0.json
  python -m scripts.benchmarks.lottery --tables-from /tmp/lottery/rows-s0.json /tmp/lottery/rows-s1.json
  python -m scripts.benchmarks.lottery --demo --work /tmp/lottery-demo   # every path on the bundled toy model
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from scripts.benchmarks.debian_task import (
    DEBIAN_SECTIONS,
    checkpoint_accuracy,
    debian_task,
    dev_accuracy,
    run_finetune,
    run_prune,
    run_score,
    run_select,
    run_timed,
)

RATIOS = (0.5, 0.75)
ARMS = ("kd", "rewind", "reinit", "random")
LR, BATCH = 1e-4, 16  # and 1 epoch: run_finetune's


def task(seed: int, demo: bool) -> dict:
    """debian_task's paths, and `base`: the pre-trained model the classifier was fine-tuned from."""
    t = debian_task(seed, demo)
    return {**t, "base": t["model"] if demo else DEBIAN_SECTIONS / f"init-seed{seed}"}


def baseline(name: str) -> float:
    """Dev accuracy of an unpruned Debian classifier, as make_debian_task recorded it."""
    seed = int(name.rsplit("-s", 1)[1])
    record = DEBIAN_SECTIONS / ("task.json" if seed == 0 else f"task-seed{seed}.json")
    return 100 * json.loads(record.read_text())["dev_accuracy"]


def plan(t: dict, folder: Path, ratio: float, random: bool) -> Path:
    out = folder / f"plan-{'random' if random else 'fisher'}-{ratio}.json"
    if not out.is_file():
        extra = dict(strategy="random", seed=t["seed"]) if random else {}
        run_select(run_score(t, folder / "scores-fisher.json", "fisher"), out, ratio=ratio, **extra)
    return out


def reset(arm: str, t: dict) -> dict:
    """The finetune options that reset the weights in `arm`."""
    if arm in ("rewind", "random"):
        return {"rewind_to": t["base"]}
    return {"reinit": t["seed"]} if arm == "reinit" else {}


def start_accuracy(arm: str, pruned: Path, t: dict) -> float:
    """Dev accuracy of the arm's starting point (after the reset, before training)."""
    from headprune_cli import load, reinit, rewind

    model = load(pruned)
    options = reset(arm, t)
    if "rewind_to" in options:
        rewind(model, options["rewind_to"])
    if "reinit" in options:
        reinit(model, options["reinit"])
    return dev_accuracy(model, t)


def finetune(t: dict, source: Path, out: Path, arm: str) -> dict:
    return run_timed(out, lambda: run_finetune(t, source, out, batch_size=BATCH, lr=LR, **reset(arm, t)))


def rows_for(t: dict, work: Path) -> list[dict]:
    folder = work / t["name"]
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for ratio in RATIOS:
        for arm in ARMS:
            plan_path = plan(t, folder, ratio, random=arm == "random")
            pruned = run_prune(plan_path, folder / f"pruned-{plan_path.stem[5:]}.safetensors")
            out = folder / f"{arm}-{ratio}.safetensors"
            timing = finetune(t, pruned, out, arm)
            acc = checkpoint_accuracy(out, t)
            unpruned = baseline(t["name"]) if t["name"].startswith("debian") else checkpoint_accuracy(t["model"], t)
            removed = sum(len(v) for v in json.loads(plan_path.read_text())["remove_heads"].values())
            rows.append(
                dict(
                    model=t["name"],
                    ratio=ratio,
                    arm=arm,
                    heads_removed=removed,
                    start=start_accuracy(arm, pruned, t),
                    accuracy=acc,
                    drop=acc - unpruned,
                    wall_s=timing["wall_s"],
                    load=timing["load"],
                )
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def tables(rows: list[dict]) -> str:
    names = {
        "kd": "(a) pruned + KD",
        "rewind": "(b) rewound to base + KD",
        "reinit": "(c) re-initialised + KD",
        "random": "(d) random heads, rewound + KD",
    }
    out = []
    for model in sorted({r["model"] for r in rows}):
        unpruned = baseline(model) if model.startswith("debian") else None
        out += [
            f"\n{model} (unpruned: {unpruned:.2f})\n" if unpruned is not None else f"\n{model}\n",
            "| arm | heads removed | dev acc before training | dev acc after 1 epoch | "
            "drop vs baseline (pts) | train wall s (load) |",
            "|---|---|---|---|---|---|",
        ]
        for r in (r for r in rows if r["model"] == model):
            drop = r["accuracy"] - unpruned if unpruned is not None else r["drop"]
            out.append(
                f"| {names[r['arm']]} @ {r['ratio']} | {r['heads_removed']} | {r['start']:.2f} | {r['accuracy']:.2f}"
                f" | {drop:+.2f} | {r['wall_s']:.0f} ({r['load']:.1f}) |"
            )
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/lottery"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--demo", action="store_true", help="the bundled toy model instead of the Debian task")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--tables-from", type=Path, nargs="+", help="print the tables of earlier --json files")
    args = parser.parse_args()
    if args.tables_from:
        print(tables([r for path in args.tables_from for r in json.loads(path.read_text())]))
        return
    rows = [r for seed in args.seeds for r in rows_for(task(seed, args.demo), args.work)]
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    print(tables(rows))


if __name__ == "__main__":
    main()
