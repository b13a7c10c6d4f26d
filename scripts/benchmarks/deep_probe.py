"""Probe of the deep-cut variants (issue #40), in memory: which data, ridge and round schedule
the retraining-free heads + FFN route wants at 0.4 and 0.3 of the FLOPs.

One row per Debian-sections classifier (seed 0, 1): `score_model(..., "fisher", ffn=True)` on
--score's split (calib.jsonl 233 rows, or train.jsonl 1696), `select` under the FLOPs budget,
lstsq compensation on the first --rows rows of --comp's split at --ridge, for each FLOPs
fraction of --schedule in turn (one entry: the one-shot route of `score | select | prune`):
  --mode chain  each round refits towards the model of the round before;
  --mode union  each round rescores the refit model, then refits the ORIGINAL cut by every
                round's removals (what `iterate --recover lstsq` ships; deep_cuts.py runs that).
Reports dev accuracy and drop, dev loss and agreement with the unpruned model's predictions,
and the same on calib.jsonl (held out when --score and --comp are train).

Usage (from the repository root; rows are appended to --json):
  OMP_NUM_THREADS=1 nice -n 10 python -m scripts.benchmarks.deep_probe --score train --comp train \
      --rows 256 --ridge 0.1 --schedule 0.8,0.7,0.6,0.5,0.4 --mode union --json /tmp/deep_probe.json
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

from scripts.benchmarks.debian_task import debian_task, dev_accuracy


def merge(a: dict, b: dict) -> dict:
    out = {int(k): sorted(set(v)) for k, v in a.items()}
    for k, v in b.items():
        out[int(k)] = sorted(set(out.get(int(k), [])) | set(v))
    return {k: v for k, v in out.items() if v}


def dev_loss(model, original, t: dict, split: str = "dev") -> tuple[float, float, float]:
    """Mean cross-entropy on `split`, % of its rows whose prediction equals the unpruned
    model's, and accuracy %."""
    import torch

    from headprune_cli.data.readers import batches, read_data
    from headprune_cli.stages.objectives import embed

    dev = read_data(t[split], model, max_length=t["length"])
    model.eval()
    original.eval()
    loss, agree, right = 0.0, 0, 0
    with torch.no_grad():
        for b in batches(dev, 32):
            labels = b.pop("labels")
            logits = embed(model, b)
            loss += float(torch.nn.functional.cross_entropy(logits, labels, reduction="sum"))
            agree += int((logits.argmax(-1) == embed(original, b).argmax(-1)).sum())
            right += int((logits.argmax(-1) == labels).sum())
    return loss / len(dev), 100 * agree / len(dev), 100 * right / len(dev)


def run(seed: int, score_split: str, comp_split: str, comp_rows: int, ridge: float, schedule: list[float], mode: str):
    import torch

    from headprune_cli import load
    from headprune_cli.data.readers import batches, read_data
    from headprune_cli.stages.budget import Budget
    from headprune_cli.stages.iterate.rounds import _cost
    from headprune_cli.stages.prune.stage import Compensation, cut
    from headprune_cli.stages.score.importance import score_model
    from headprune_cli.stages.select.chains import Constraints, Selection
    from headprune_cli.stages.select.strategies import select

    torch.set_num_threads(1)
    t = debian_task(seed)
    original = load(t["model"])
    flops = Budget("flops", 1.0)
    base_cost = _cost(original, flops, 32)
    scoring = read_data(t[score_split], original, max_length=32, need_labels=True)
    calib = read_data(t[comp_split], original, max_length=32, samples=comp_rows, need_labels=False)
    comp = Compensation("lstsq", list(batches(calib, 16)), ridge)
    current = copy.deepcopy(original)
    plan = Selection("union", {}, [], None, {})
    for target in schedule:
        table = score_model(current, scoring, "fisher", ffn=True, seq_len=32, normalize=False)
        keep = target * base_cost / _cost(current, flops, 32)
        chosen = select(table, budget=Budget("flops", keep), constraints=Constraints())
        if mode == "chain":
            cut(current, chosen, comp)
        else:
            plan = Selection(
                "union",
                merge(plan.remove_heads, chosen.remove_heads),
                [],
                None,
                merge(plan.remove_ffn, chosen.remove_ffn),
            )
            current = copy.deepcopy(original)
            cut(current, plan, comp)
    loss, agree, _ = dev_loss(current, original, t)
    calib_loss, calib_agree, calib_acc = dev_loss(current, original, t, "calib")
    return dict(
        calib_loss=calib_loss,
        calib_agreement=calib_agree,
        calib_accuracy=calib_acc,
        accuracy=dev_accuracy(current, t),
        dev_loss=loss,
        agreement=agree,
        flops=_cost(current, flops, 32) / base_cost,
        heads=sum(len(h) for h in current.headprune.layout.heads),
        neurons=sum(len(current.headprune.layout.kept_neurons(l)) for l in current.headprune.layout.layers),
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--score", default="calib")
    p.add_argument("--comp", default="calib")
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--ridge", type=float, default=0.1)
    p.add_argument("--schedule", default="0.4")
    p.add_argument("--mode", default="chain", choices=["chain", "union"])
    p.add_argument("--json", type=Path, required=True)
    a = p.parse_args()
    base = {0: 81.53, 1: 82.80}
    rows = json.loads(a.json.read_text()) if a.json.is_file() else []
    for seed in a.seeds:
        start = time.perf_counter()
        schedule = [float(x) for x in a.schedule.split(",")]
        r = run(seed, a.score, a.comp, a.rows, a.ridge, schedule, a.mode)
        row = dict(seed=seed, score=a.score, comp=a.comp, rows=a.rows, ridge=a.ridge, schedule=a.schedule, mode=a.mode)
        row.update(r, drop=round(r["accuracy"] - base[seed], 2), wall_s=round(time.perf_counter() - start))
        print(json.dumps(row), flush=True)
        rows.append(row)
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
