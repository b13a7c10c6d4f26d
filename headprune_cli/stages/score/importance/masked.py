"""loo and entropy: scores from forward passes only.

- loo: the exact leave-one-out loss change L(model without head h) - L(model), averaged
  over examples. Heads are masked with per-example gates on copies of the batch, several
  heads per forward; the unmasked losses come from one forward of the same shape, so a head
  that cannot change the output scores exactly 0.
  Signed: a head whose removal lowers the loss scores below 0 and is pruned first.
- entropy: attention entropy H = -sum_k p_k log p_k of each head, averaged over real query
  tokens and examples. A focused head has low entropy; the score is -H (nats) so that
  higher = more important, like every other method.
"""

from __future__ import annotations

import torch

from headprune_cli.model.surgery import HeadGates
from headprune_cli.stages.objectives import check_finite, embed, per_example_loss
from headprune_cli.stages.score.importance.context import ScoreContext
from headprune_cli.stages.score.importance.protocol import Importance

COPIES_PER_FORWARD = 8  # batch copies (one masked head each) in one loo forward


def _repeat(batch: dict, copies: int) -> dict:
    return {k: torch.cat([v] * copies) for k, v in batch.items()}


def replica_losses(ctx: ScoreContext, big: dict, size: int, masks: list, reference=None):
    """Per-example losses [copies, size] of the repeated batch, copy r with head masks[r] gated to 0."""
    copies = len(big["input_ids"]) // size
    gates = [torch.ones(size * copies, n, dtype=ctx.dtype, device=ctx.device) for n in ctx.head_counts()]
    for r, mask in enumerate(masks):
        if mask is not None:
            gates[mask[0]][r * size : (r + 1) * size, mask[1]] = 0.0
    with torch.no_grad(), HeadGates(ctx.model, gates):
        out = embed(ctx.model, big)
        losses = per_example_loss(out, big, ctx.objective, out if reference is None else reference)
    return out, losses.double().view(copies, size)


class LeaveOneOut(Importance):
    name = "loo"

    def heads(self, ctx: ScoreContext) -> list[torch.Tensor]:
        heads = [(pos, h) for pos, n in enumerate(ctx.head_counts()) for h in range(n)]
        copies = min(COPIES_PER_FORWARD, len(heads))
        diffs = torch.zeros(len(heads), dtype=torch.float64, device=ctx.device)
        for number, _, batch in ctx.my_batches("scoring (leave-one-out)"):
            size = len(batch["input_ids"])
            big = _repeat(batch, copies)
            # The unmasked losses come from a forward of the very same shape, so that a copy
            # whose masked head cannot change anything reproduces them bit for bit.
            reference, base = replica_losses(ctx, big, size, [None] * copies)
            check_finite(base, f"batch {number}")
            for first in range(0, len(heads), copies):
                chunk = heads[first : first + copies]
                _, losses = replica_losses(ctx, big, size, chunk + [None] * (copies - len(chunk)), reference)
                check_finite(losses, f"batch {number}")
                diffs[first : first + len(chunk)] += (losses - base).sum(1)[: len(chunk)]
        (diffs,) = ctx.reduce([diffs / len(ctx.dataset)])
        return list(diffs.split(ctx.head_counts()))


class Entropy(Importance):
    name = "entropy"

    def heads(self, ctx: ScoreContext) -> list[torch.Tensor]:
        sums = [torch.zeros(n, dtype=torch.float64, device=ctx.device) for n in ctx.head_counts()]
        with eager_attention(ctx.model), torch.no_grad():
            for number, _, batch in ctx.my_batches("scoring (entropy)"):
                inputs = {k: v for k, v in batch.items() if k != "labels"}
                attentions = ctx.model(**inputs, output_attentions=True).attentions
                mask = batch["attention_mask"].double()
                for pos, probs in enumerate(attentions):
                    probs = probs.double().to(ctx.device)  # [B, H, Tq, Tk]
                    entropy = -torch.special.xlogy(probs, probs).sum(-1)
                    check_finite(entropy, f"batch {number}")
                    per_example = (entropy * mask[:, None, :]).sum(-1) / mask.sum(-1, keepdim=True).clamp(min=1)
                    sums[pos] += per_example.sum(0)
        sums = ctx.reduce(sums)
        return [-s / len(ctx.dataset) for s in sums]


class eager_attention:
    """Hugging Face models return attention weights only with the eager implementation."""

    def __init__(self, model):
        self.model = model
        self.saved = getattr(getattr(model, "config", None), "_attn_implementation", None)

    def __enter__(self):
        if hasattr(self.model, "set_attn_implementation") and self.saved not in (None, "eager"):
            self.model.set_attn_implementation("eager")

    def __exit__(self, *exc):
        if hasattr(self.model, "set_attn_implementation") and self.saved not in (None, "eager"):
            self.model.set_attn_implementation(self.saved)
