"""gradient, taylor, taylor-weight, fisher: all from ONE forward+backward per batch.

Every head gets a gate of 1 per token ([batch, seq, heads] gates, see surgery.HeadGates),
so one backward of the summed per-example losses gives, for every example i and token t,
dL_i/dgate_{t,h} = sum_d dL_i/do_{t,h,d} o_{t,h,d}; summed over t it is dL_i/dgate_h:
- gradient (Michel et al. 2019): mean_i |dL_i/dgate_h|, then divided by the L2 norm of
  its layer's scores (on by default, as in the paper; `normalize=False` turns it off);
- fisher (Kwon et al. 2022): sum_i (dL_i/dgate_h)^2;
- taylor (first-order Taylor on head outputs): mean_i sum_t |sum_d dL_i/do_{t,h,d} o_{t,h,d}|,
  the absolute value taken per token, so it differs from `gradient` (per example);
- taylor-weight: sum over the head's slice of the output projection of |G * W|, where G is
  dL/dW of the loss summed over the whole dataset.

Fidelity is 0 with a zero gradient at the unpruned model, so for it these methods
differentiate a seeded random projection L_i = v_i . f(x_i) (v_i ~ N(0, I), one per
example, seeded by (seed, example index)): E|v.J| is proportional to the sensitivity
||df/dgate|| and E(v.J)^2 is the Gauss-Newton diagonal of the squared distance.
Weight gradients are never computed (only gates need them), which keeps scoring no
slower than a plain forward+backward.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch

from headprune_cli.errors import UsageError
from headprune_cli.model.arch import adapter_for
from headprune_cli.model.arch.base import is_conv1d
from headprune_cli.model.surgery import HeadGates
from headprune_cli.runtime.recompute import recomputed_blocks
from headprune_cli.stages.lm_chunks import chunked_nll, head_off, wants_chunks
from headprune_cli.stages.objectives import check_finite, embed, outputs_of, per_example_loss
from headprune_cli.stages.score.importance.context import ScoreContext, trainable_only
from headprune_cli.stages.score.importance.neurons import NeuronTaps, down_modules
from headprune_cli.stages.score.importance.protocol import Importance


def _o_modules(model) -> list:
    adapter = adapter_for(model)
    return [adapter.attention(block).o for block in adapter.layer_list(model)]


def probe_loss(out: torch.Tensor, mask: torch.Tensor, seed: int, start: int) -> torch.Tensor:
    """Random projection of each example's output (fidelity's first-order surrogate)."""
    probes = []
    for i in range(out.shape[0]):
        gen = torch.Generator().manual_seed(seed * 1_000_003 + start + i)
        probes.append(torch.randn(out.shape[-1], generator=gen, dtype=torch.float32))
    v = torch.stack(probes).to(out.device)
    if out.dim() == 2:
        return (out.float() * v).sum(-1)
    weights = mask[:, : out.shape[1]].to(torch.float32)
    per_token = (out.float() * v[:, None, :]).sum(-1)
    return (per_token * weights).sum(1) / weights.sum(1).clamp(min=1.0)


def batch_losses(ctx: ScoreContext, batch: dict, start: int) -> torch.Tensor:
    if ctx.objective == "causal-lm" and wants_chunks(ctx.model, batch):  # no [batch, seq, vocab] logits
        with head_off(ctx.model) as head:
            hidden = outputs_of(ctx.model, batch)
        nll, count = chunked_nll(head, hidden, batch)
        return nll / count.clamp(min=1)
    out = embed(ctx.model, batch)
    if ctx.objective == "fidelity":
        return probe_loss(out, batch["attention_mask"], ctx.seed, start)
    return per_example_loss(out, batch, ctx.objective)


def gradient_stats(ctx: ScoreContext, weights: bool = False) -> dict[str, list[torch.Tensor]]:
    """Sums over examples of |g|, g^2, per-token Taylor terms, and with `weights` dL/dW_o;
    cached on ctx. dL/dW_o only when asked (taylor-weight): its float64 sums are a copy of
    every output projection at 4x the bf16 size, about a third of an LLM's checkpoint.
    With `ctx.ffn`, the same statistics of every FFN neuron come from the same backward
    (keys `ffn_abs`, `ffn_sq`, `ffn_taylor`, and `ffn_weight` for the down projections)."""
    cached = ctx.cache.get("gradients")
    if cached is not None and (not weights or "weight" in cached):
        return cached
    counts = ctx.head_counts()
    o_weights = [o.weight for o in _o_modules(ctx.model)] if weights else []
    down_weights = [d.weight for d in down_modules(ctx.model)] if weights and ctx.ffn else []
    taps = NeuronTaps(ctx) if ctx.ffn else None
    sums = {
        key: [torch.zeros(n, dtype=torch.float64, device=ctx.device) for n in counts] for key in ("abs", "sq", "taylor")
    }
    if weights:
        sums["weight"] = [torch.zeros_like(w, dtype=torch.float64) for w in o_weights]
    if weights and ctx.ffn:
        sums["ffn_weight"] = [torch.zeros_like(w, dtype=torch.float64) for w in down_weights]
    n = len(counts)
    with trainable_only(ctx.model, o_weights + down_weights), recomputed_blocks(ctx.model, ctx.recompute):
        for number, first, whole in ctx.my_batches("scoring (gradients)"):
            for start, batch in ctx.pieces(first, whole):  # a causal LM's long batch, a few rows at a time
                size, seq = batch["input_ids"].shape
                # One gate per token: its gradient is the per-token Taylor term sum_d dL/do * o,
                # and summed over tokens it is the per-example gate gradient dL_i/dgate.
                gates = [
                    torch.ones(size, seq, k, dtype=ctx.dtype, device=ctx.device, requires_grad=True) for k in counts
                ]
                # The hooks stay attached through the backward: with --recompute it runs each block's
                # forward again, and that must be the same gated graph.
                with HeadGates(ctx.model, gates), taps.attached(batch["attention_mask"]) if taps else nullcontext():
                    losses = batch_losses(ctx, batch, start)
                    check_finite(losses, f"batch {number}")
                    grads = torch.autograd.grad(losses.sum(), gates + o_weights + down_weights)  # taps' hooks fire here
                _add(sums, grads, n, len(o_weights), ctx.device)
    if taps is not None:
        for key in ("abs", "sq", "taylor"):
            sums[f"ffn_{key}"] = taps.sums[key]
    keys = tuple(sums)
    flat = ctx.reduce([t for key in keys for t in sums[key]])
    ctx.cache["gradients"] = {
        key: flat[i * n : (i + 1) * n] for i, key in enumerate(keys)
    }  # every key: one tensor per layer
    return ctx.cache["gradients"]


def _add(sums: dict, grads: tuple, n: int, o_count: int, device: torch.device) -> None:
    """Adds one pass's per-example gate statistics (and weight gradients) to the running sums."""
    for pos in range(n):
        per_token = grads[pos].double().to(device)  # [B, T, H]; layers may sit on other devices
        g = per_token.sum(1)  # [B, H]
        sums["abs"][pos] += g.abs().sum(0)
        sums["sq"][pos] += (g * g).sum(0)
        sums["taylor"][pos] += per_token.abs().sum(dim=(0, 1))
        if "weight" in sums:
            sums["weight"][pos] += grads[n + pos].double()
        if "ffn_weight" in sums:
            sums["ffn_weight"][pos] += grads[n + o_count + pos].double()


class Gradient(Importance):
    """Michel et al. 2019: E_i |dL_i/dgate_h|, per-layer L2-normalised by default."""

    name = "gradient"

    def __init__(self, normalize: bool = True):
        self.normalize = normalize

    def heads(self, ctx: ScoreContext) -> list[torch.Tensor]:
        scores = [s / len(ctx.dataset) for s in gradient_stats(ctx)["abs"]]
        if not self.normalize:
            return scores
        return [s / s.norm() if s.norm() > 0 else s for s in scores]

    def neurons(self, ctx: ScoreContext) -> list[torch.Tensor]:
        """mean_i |dL_i/dm_j|, never normalised: neurons and heads share one scale."""
        return [s / len(ctx.dataset) for s in gradient_stats(ctx)["ffn_abs"]]

    def settings(self) -> dict[str, Any]:
        return {"normalize": self.normalize}

    def check(self, ffn: bool) -> None:
        if ffn and self.normalize:
            raise UsageError(
                "--ffn with gradient needs --no-normalize: per-layer normalisation would put heads "
                "and neurons on different scales"
            )


class Fisher(Importance):
    """Kwon et al. 2022: sum_i (dL_i/dgate_h)^2 (empirical Fisher diagonal of the gates)."""

    name = "fisher"

    def heads(self, ctx: ScoreContext) -> list[torch.Tensor]:
        return list(gradient_stats(ctx)["sq"])

    def neurons(self, ctx: ScoreContext) -> list[torch.Tensor]:
        return list(gradient_stats(ctx)["ffn_sq"])


class Taylor(Importance):
    """First-order Taylor on head outputs, |dL/do . o| per token, averaged over examples."""

    name = "taylor"

    def heads(self, ctx: ScoreContext) -> list[torch.Tensor]:
        return [s / len(ctx.dataset) for s in gradient_stats(ctx)["taylor"]]

    def neurons(self, ctx: ScoreContext) -> list[torch.Tensor]:
        return [s / len(ctx.dataset) for s in gradient_stats(ctx)["ffn_taylor"]]


class TaylorWeight(Importance):
    """|dL/dW * W| summed over each head's slice of the output projection."""

    name = "taylor-weight"

    def heads(self, ctx: ScoreContext) -> list[torch.Tensor]:
        stats = gradient_stats(ctx, weights=True)
        scores = []
        for o, grad, n in zip(_o_modules(ctx.model), stats["weight"], ctx.head_counts()):
            term = (grad * o.weight.detach().double()).abs()
            # nn.Linear weight is [out, in]; GPT-2's Conv1D is [in, out]. Heads split `in`.
            term = term.T if is_conv1d(o) else term
            scores.append(term.reshape(term.shape[0], n, -1).sum(dim=(0, 2)) / len(ctx.dataset))
        return scores

    def neurons(self, ctx: ScoreContext) -> list[torch.Tensor]:
        out = []
        for down, grad in zip(down_modules(ctx.model), gradient_stats(ctx, weights=True)["ffn_weight"]):
            term = (grad * down.weight.detach().double()).abs()
            out.append((term.sum(1) if is_conv1d(down) else term.sum(0)) / len(ctx.dataset))  # [in, out] for Conv1D
        return out
