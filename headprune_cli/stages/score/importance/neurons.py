"""FFN neuron statistics, gathered in the same passes as the head scores (`score --ffn`).

A neuron is one input feature of a layer's down projection. Its mask m_j multiplies that
feature, so dL/dm_j = sum_t dL/dx_{t,j} x_{t,j}: a tensor hook on the down projection's
input gives it per token and per example in the heads' one backward pass, without a
[batch, seq, width] gate tensor per layer (at LLM widths that would be gigabytes).
Each method's `neurons()` turns the statistics into scores:
- gradient: mean_i |dL_i/dm_j| (never normalised: neurons and heads share one scale);
- fisher (Kwon et al. 2022): sum_i (dL_i/dm_j)^2, the same diagonal Fisher as the heads';
- taylor: mean_i sum_t |dL_i/dx_{t,j} x_{t,j}|;
- taylor-weight: sum over the column of the down projection of |dL/dW * W|;
- activation (Wanda-style, Sun et al. 2023, for a whole input channel): ||W_down[:, j]||_2
  times ||x_j||_2 over the calibration tokens. One forward pass, no gradients: a cheap,
  label-free score. (FLAP's fluctuation score needs the same statistics plus a variance;
  Wanda's product is the one that needs no baseline bias.)
- random: seeded uniform draws per original (layer, neuron).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from headprune_cli.model.arch import adapter_for
from headprune_cli.model.arch.base import is_conv1d
from headprune_cli.stages.score.importance.context import ScoreContext


def down_modules(model) -> list:
    adapter = adapter_for(model)
    return [adapter.ffn(block).down for block in adapter.layer_list(model)]


def widths(ctx: ScoreContext) -> list[int]:
    return [ctx.layout.ffn_width(layer) for layer in ctx.layout.layers]


class NeuronTaps:
    """Accumulates, per kept layer, |g|, g^2 and per-token |dL/dx * x| of the down projection's
    input features from a backward pass (g = the per-example mask gradient); with
    `squares`, also the sum of x^2 over real tokens (activation scores, forward only)."""

    def __init__(self, ctx: ScoreContext, squares: bool = False):
        self.ctx, self.squares = ctx, squares
        self.sums = {
            key: [torch.zeros(w, dtype=torch.float64, device=ctx.device) for w in widths(ctx)]
            for key in ("abs", "sq", "taylor", "x2")
        }
        self.mask: torch.Tensor | None = None  # [B, T] real tokens of the current batch

    @contextmanager
    def attached(self, mask: torch.Tensor):
        self.mask = mask
        handles = [
            down.register_forward_pre_hook(self._hook(pos)) for pos, down in enumerate(down_modules(self.ctx.model))
        ]
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()

    def _hook(self, pos: int):
        def hook(module, args):
            x = args[0]
            if self.squares:
                assert self.mask is not None  # attached() sets it before it registers this hook
                real = self.mask[..., None].to(x.dtype) if x.dim() == 3 else 1.0
                self.sums["x2"][pos] += (x.double() ** 2 * real).sum(dim=tuple(range(x.dim() - 1))).to(self.ctx.device)
            if x.requires_grad:
                return (_Tap.apply(x, lambda grad, saved: self._add(pos, grad, saved)), *args[1:])
            return None

        return hook

    def _add(self, pos: int, grad: torch.Tensor, x: torch.Tensor) -> None:
        # [B, T, W] per-token mask gradients, in ONE temporary: float32 holds the product of
        # two 16-bit floats exactly, so bf16/fp16 models need no float64 copies of grad and x
        # (at LLM widths each is megabytes per layer); sums run in float64 all the same.
        half = grad.dtype in (torch.bfloat16, torch.float16) and x.dtype == grad.dtype
        exact = torch.float32 if half else torch.float64
        term = grad.to(exact, copy=True).mul_(x)  # a copy: autograd still needs `grad`
        per_example = (term.sum(1, dtype=torch.float64) if term.dim() == 3 else term.double()).to(self.ctx.device)
        self.sums["abs"][pos] += per_example.abs().sum(0)
        self.sums["sq"][pos] += (per_example * per_example).sum(0)
        self.sums["taylor"][pos] += (
            term.abs_().sum(dim=tuple(range(term.dim() - 1)), dtype=torch.float64).to(self.ctx.device)
        )


class _Tap(torch.autograd.Function):
    """Identity on the down projection's input whose backward hands (dL/dx, x) to a callback.

    x is one of the Function's saved tensors, so under `--recompute` it is dropped after the
    forward and computed again with its block when the backward gets there: a tensor hook
    holding x instead would keep every layer's [B, T, width] input alive until the backward."""

    @staticmethod
    def forward(ctx, x, add):
        ctx.save_for_backward(x)
        ctx.add = add
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        ctx.add(grad, x.detach())
        return grad, None


def random_scores(ctx: ScoreContext) -> list[torch.Tensor]:
    """Uniform [0, 1) per ORIGINAL (layer, neuron): a cut model's neurons keep their draws."""
    gen = torch.Generator().manual_seed(ctx.seed * 7 + 1)
    layout = ctx.layout
    table = torch.rand(layout.num_layers, max(layout.num_ffn), generator=gen, dtype=torch.float64)
    return [table[layer, layout.kept_neurons(layer)].to(ctx.device) for layer in layout.layers]


def activation_stats(ctx: ScoreContext) -> dict[str, list[torch.Tensor]]:
    """sum of x^2 of every down-projection input feature over real tokens (one forward pass)."""
    taps = NeuronTaps(ctx, squares=True)
    with torch.no_grad():
        for _, _, batch in ctx.my_batches("scoring FFN neurons (activations)"):
            with taps.attached(batch["attention_mask"]):
                ctx.model(**{k: v for k, v in batch.items() if k != "labels"})
    return {"ffn_x2": ctx.reduce(taps.sums["x2"])}


def activation_neurons(ctx: ScoreContext) -> list[torch.Tensor]:
    """||W_down[:, j]||_2 * ||x_j||_2 per neuron: Wanda's product for a whole input channel."""
    out = []
    for down, x2 in zip(down_modules(ctx.model), activation_stats(ctx)["ffn_x2"]):
        w = down.weight.detach().double()
        column_norms = w.norm(dim=1) if is_conv1d(down) else w.norm(dim=0)
        out.append(column_norms.to(ctx.device) * x2.sqrt())
    return out
