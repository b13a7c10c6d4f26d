"""Layer scores, written beside head scores with --layers.

- cosine (block influence, as in ShortGPT): 1 - cosine similarity between a block's input
  and output hidden states, averaged over real tokens and examples. A block that barely
  changes its input scores near 0.
- loo: the exact loss change when the block is skipped (made an identity), averaged over
  examples; signed like head loo.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from headprune_cli.model.arch import adapter_for
from headprune_cli.stages.objectives import check_finite, embed, per_example_loss
from headprune_cli.model.surgery import skip_layers
from headprune_cli.stages.importance.context import ScoreContext


class BlockInfluence:
    name = "cosine"

    def __call__(self, ctx: ScoreContext) -> torch.Tensor:
        blocks = adapter_for(ctx.model).layer_list(ctx.model)
        sums = torch.zeros(len(blocks), dtype=torch.float64, device=ctx.device)
        seen: dict[int, torch.Tensor] = {}

        def hook(pos):
            def record(module, args, kwargs, output):
                hidden_in = args[0] if args else kwargs["hidden_states"]
                hidden_out = output[0] if isinstance(output, tuple) else output
                seen[pos] = (1 - F.cosine_similarity(hidden_in.double(), hidden_out.double(), dim=-1)).to(ctx.device)

            return record

        handles = [b.register_forward_hook(hook(pos), with_kwargs=True) for pos, b in enumerate(blocks)]
        try:
            with torch.no_grad():
                for number, _, batch in ctx.my_batches("scoring layers (cosine)"):
                    seen.clear()
                    ctx.model(**{k: v for k, v in batch.items() if k != "labels"})
                    mask = batch["attention_mask"].double()
                    for pos, dist in seen.items():
                        check_finite(dist, f"batch {number}")
                        sums[pos] += ((dist * mask).sum(1) / mask.sum(1).clamp(min=1)).sum()
        finally:
            for handle in handles:
                handle.remove()
        (sums,) = ctx.reduce([sums])
        return sums / len(ctx.dataset)


class LayerLeaveOneOut:
    name = "loo"

    def __call__(self, ctx: ScoreContext) -> torch.Tensor:
        layers = ctx.layout.layers
        diffs = torch.zeros(len(layers), dtype=torch.float64, device=ctx.device)
        with torch.no_grad():
            for number, _, batch in ctx.my_batches("scoring layers (leave-one-out)"):
                out = embed(ctx.model, batch)
                base = per_example_loss(out, batch, ctx.objective, out).double()
                for pos, layer in enumerate(layers):
                    with skip_layers(ctx.model, [layer]):
                        skipped = per_example_loss(embed(ctx.model, batch), batch, ctx.objective, out).double()
                    check_finite(skipped, f"batch {number}")
                    diffs[pos] += (skipped - base).sum()
        (diffs,) = ctx.reduce([diffs])
        return diffs / len(ctx.dataset)
