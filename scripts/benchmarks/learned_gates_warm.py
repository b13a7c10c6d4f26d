"""Probe (measured, not shipped): learned heads + FFN gates whose log alpha starts from the
fisher ranking, greedy's order, instead of one value for every gate.

Each gate unit (a head, a neuron) is ranked by its fisher score per unit of FLOPs it saves (the
order `select` takes units in), and its log alpha starts at LO + (HI - LO) * rank in [0, 1], so
the Lagrangian closes greedy's first choices first; then `finetune --learn-gates --gate-ffn
--target-flops 0.5` runs as scripts/benchmarks/learned_gates.py runs it (one epoch, --teacher
auto, the model's seed). It reads the fisher `--ffn` scores that learned_gates.py --greedy-ffn
wrote under --work (BENCHMARKS.md section 28 has the rows):

  OMP_NUM_THREADS=1 python -m scripts.benchmarks.learned_gates_warm --work $WORK/lg28 --seed 0 --lo -2 --hi 6 \
      [--set closed_share=0.7 gate_lr=0.1]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from scripts.benchmarks.debian_task import checkpoint_accuracy, debian_task, run_finetune


def warm_start(scores, lo: float, hi: float):
    """A make_gates that starts every head and neuron gate from its rank in `scores`."""
    import torch

    import headprune_cli.stages.finetune.stage as finetune_stage

    real = finetune_stage.make_gates

    def make(model, budget, constraints, **options):
        gates = real(model, budget, constraints, **options)
        space = gates.space
        heads = [
            sum(scores.heads[layer][h] for h in hs) / float(space.head_price[u])
            for u, (layer, hs) in enumerate(space.head_units)
        ]
        neurons = []
        for layer, kept in zip(space.layers, space.neurons):
            by_neuron = dict(zip(scores.ffn_kept[layer], scores.ffn[layer]))
            neurons += [by_neuron[n] for n in kept]
        neurons = [v / p for v, p in zip(neurons, space.neuron_price.tolist())]
        values = torch.tensor(heads + neurons, dtype=torch.float64)
        rank = values.argsort().argsort().double() / (len(values) - 1)
        with torch.no_grad():
            gates.log_alpha[: len(values)] = (lo + (hi - lo) * rank).float()
        return gates

    finetune_stage.make_gates = make


def main() -> None:
    from headprune_cli.artifacts.schema import parse_artifact
    from headprune_cli.stages.score.table import ScoreTable

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lo", type=float, default=-2.0)
    p.add_argument("--hi", type=float, default=6.0)
    p.add_argument("--set", nargs="*", default=[], help="finetune option overrides, NAME=VALUE")
    a = p.parse_args()
    t = debian_task(a.seed)
    folder = a.work / t["name"]
    text = (folder / "scores-fisher-ffn.json").read_text()
    warm_start(ScoreTable.from_scores(parse_artifact(text, "scores", ("scores",))), a.lo, a.hi)
    overrides = {k: float(v) if "." in v else int(v) for k, v in (item.split("=", 1) for item in a.set)}
    tag = "".join(f"-{k}{v}" for k, v in overrides.items())
    out = folder / f"warm{a.lo}-{a.hi}{tag}.safetensors"
    run_finetune(t, t["model"], out, learn_gates=True, gate_ffn=True, target_flops=0.5, **overrides)
    accuracy, baseline = checkpoint_accuracy(out, t), checkpoint_accuracy(t["model"], t)
    print(json.dumps({"model": t["name"], "lo": a.lo, "hi": a.hi, "set": overrides, "accuracy": accuracy,
                      "drop": accuracy - baseline}))  # fmt: skip


if __name__ == "__main__":
    main()
