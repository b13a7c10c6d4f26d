"""llm-pruner (Ma et al. 2023, LLM-Pruner): first-order Taylor importance of coupled structures.

Every weight's importance is |w * dL/dw| (the paper's element-wise first order, its
`param_first`), with dL/dw the gradient of the calibration loss summed over all batches;
a structure scores the sum over every weight that goes when it goes (the paper's `sum`
aggregation over the dependency group):
- a query head: its rows of Q, its columns of O, and its share (1 / group size) of the
  rows of its K and V head, which the group's query heads share;
- an FFN neuron: its rows of the up (and gate) projection and its column of the down
  projection.
Biases are left out (LLaMA-family projections have none). headprune's `taylor-weight`
scores only the output (or down) projection's slice, and `taylor` the head's output
activation, so neither is LLM-Pruner's group criterion. LLM-Pruner cuts the same ratio in
every layer but the first and last few; here the budget greedy places the cut.
"""

from __future__ import annotations

import torch

from headprune_cli.model.arch import adapter_for
from headprune_cli.model.arch.base import is_conv1d
from headprune_cli.stages.objectives import check_finite
from headprune_cli.stages.score.importance.context import ScoreContext, trainable_only
from headprune_cli.stages.score.importance.gradients import batch_losses
from headprune_cli.stages.score.importance.protocol import Importance


def _modules(ctx: ScoreContext):
    adapter = adapter_for(ctx.model)
    blocks = adapter.layer_list(ctx.model)
    return adapter, [adapter.attention(b) for b in blocks], [adapter.ffn(b) for b in blocks]


def weight_terms(ctx: ScoreContext) -> dict[int, torch.Tensor]:
    """|w * dL/dw| of every attention and FFN projection (by id of the module), cached on ctx."""
    if "llm-pruner" in ctx.cache:
        return ctx.cache["llm-pruner"]
    _, views, ffns = _modules(ctx)
    modules = {id(m): m for v in views for m in (v.q, v.k, v.v, v.o, v.fused_qkv) if m is not None}
    modules.update({id(m): m for f in ffns for m in (*f.ups, f.down)})
    weights = [m.weight for m in modules.values()]
    sums = [torch.zeros_like(w, dtype=torch.float64) for w in weights]
    with trainable_only(ctx.model, weights):
        for number, start, batch in ctx.my_batches("scoring (llm-pruner gradients)"):
            losses = batch_losses(ctx, batch, start)
            check_finite(losses, f"batch {number}")
            for total, grad in zip(sums, torch.autograd.grad(losses.sum(), weights)):
                total += grad.double()
    sums = ctx.reduce(sums)
    terms = {key: (g * m.weight.detach().double()).abs() for (key, m), g in zip(modules.items(), sums)}
    ctx.cache["llm-pruner"] = terms
    return terms


def _sliced(terms: dict[int, torch.Tensor], slices) -> float:
    """Sum of the terms in the given (module, "out" | "in", feature index) slices."""
    total = 0.0
    for module, side, index in slices:
        term = _as_out_in(terms[id(module)], module)
        total += float((term[index] if side == "out" else term[:, index]).sum())
    return total


class LlmPruner(Importance):
    name = "llm-pruner"

    def heads(self, ctx: ScoreContext) -> list[torch.Tensor]:
        terms = weight_terms(ctx)
        adapter, views, _ = _modules(ctx)
        out = []
        for view in views:
            scores = []
            for h in range(view.num_heads):
                alone = _sliced(terms, adapter.head_slices(view, [h], []))
                with_kv = _sliced(terms, adapter.head_slices(view, [h], [h // view.group_size]))
                scores.append(alone + (with_kv - alone) / view.group_size)
            out.append(torch.tensor(scores, dtype=torch.float64, device=ctx.device))
        return out

    def neurons(self, ctx: ScoreContext) -> list[torch.Tensor]:
        terms = weight_terms(ctx)
        _, _, ffns = _modules(ctx)
        out = []
        for ffn in ffns:
            rows = sum(_as_out_in(terms[id(up)], up).sum(1) for up in ffn.ups)
            out.append((rows + _as_out_in(terms[id(ffn.down)], ffn.down).sum(0)).to(ctx.device))
        return out


def _as_out_in(term: torch.Tensor, module) -> torch.Tensor:
    """A weight-shaped tensor as [out, in] (GPT-2's Conv1D stores [in, out])."""
    return term.T if is_conv1d(module) else term
