"""Kwon et al. 2022's mask rearrangement tried on a heads+FFN plan (BENCHMARKS section 14).

Per layer, with the plan's counts fixed, it swaps which heads and which neurons are removed
so that |sum over the removed units of g_i|^2, summed over examples i, falls (g_i: example
i's mask gradients; the block-diagonal Fisher's estimate of the loss the removal costs),
by the greedy of the paper's code: start from the lowest-Fisher units, then offer each next
unit and drop whichever member of the set then costs most. It writes the rearranged plan;
`headprune prune` and `report` take it from there. An experiment, not a stage: it did not
measure better (the section's one row), so nothing in headprune uses it.

  python -m scripts.benchmarks.rearrange_probe MODEL DATA.jsonl plan.json rearranged.json [--max-length 32]
"""

from __future__ import annotations

import argparse
import json

import torch

from headprune_cli.data.readers import read_data
from headprune_cli.model.checkpoint import load
from headprune_cli.model.surgery import HeadGates
from headprune_cli.stages.score.importance.context import ScoreContext, trainable_only
from headprune_cli.stages.score.importance.gradients import batch_losses
from headprune_cli.stages.score.importance.neurons import NeuronTaps


class _ExampleTaps(NeuronTaps):
    """Keeps every example's neuron-mask gradient per layer instead of summing them."""

    def __init__(self, ctx: ScoreContext):
        super().__init__(ctx)
        self.rows = [[] for _ in ctx.head_counts()]

    def _backward(self, pos: int, x: torch.Tensor):
        def hook(grad):
            self.rows[pos].append((grad.double() * x.double()).sum(1))

        return hook


def example_gradients(model, data, objective: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per kept layer, [examples, heads] and [examples, neurons] mask gradients."""
    ctx = ScoreContext(model, data, objective, batch_size=32, ffn=True)
    taps = _ExampleTaps(ctx)
    heads = [[] for _ in ctx.head_counts()]
    with trainable_only(model):
        for _, start, batch in ctx.my_batches("gradients"):
            size, seq = batch["input_ids"].shape
            gates = [torch.ones(size, seq, k, requires_grad=True) for k in ctx.head_counts()]
            with HeadGates(model, gates), taps.attached(batch["attention_mask"]):
                grads = torch.autograd.grad(batch_losses(ctx, batch, start).sum(), gates)
            for pos, g in enumerate(grads):
                heads[pos].append(g.double().sum(1))
    return [torch.cat(h) for h in heads], [torch.cat(n) for n in taps.rows]


def rearranged(removed: list[int], grads: torch.Tensor) -> list[int]:
    """The same number of units, chosen greedily to shrink |sum of their gradient columns|^2."""
    count = len(removed)
    if count in (0, grads.shape[1]):
        return removed
    columns = grads.T.contiguous()
    order = columns.pow(2).sum(1).argsort().tolist()
    chosen = order[:count]
    for unit in order[count:]:
        chosen.append(unit)
        vectors = columns[chosen]
        without_each = vectors.sum(0) - vectors
        del chosen[int(without_each.pow(2).sum(1).argmin())]
    return sorted(chosen)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("data")
    parser.add_argument("plan")
    parser.add_argument("output")
    parser.add_argument("--max-length", type=int, default=32)
    args = parser.parse_args()
    model = load(args.model).eval()
    data = read_data(args.data, model, max_length=args.max_length, need_labels=True)
    head_grads, neuron_grads = example_gradients(model, data, "classification")
    with open(args.plan) as handle:
        plan = json.load(handle)
    plan["remove_heads"] = {
        str(layer): new
        for layer, grads in enumerate(head_grads)
        if (new := rearranged(plan["remove_heads"].get(str(layer), []), grads))
    }
    plan["remove_ffn"] = {
        str(layer): new
        for layer, grads in enumerate(neuron_grads)
        if (new := rearranged(plan["remove_ffn"].get(str(layer), []), grads))
    }
    with open(args.output, "w") as out:
        json.dump(plan, out)


if __name__ == "__main__":
    main()
