"""Layer scores, written beside head scores with --layers.

- cosine (block influence, as in ShortGPT): 1 - cosine similarity between a block's input
  and output hidden states, averaged over real tokens and examples. A block that barely
  changes its input scores near 0.
- loo: the exact loss change when the block is skipped (made an identity), averaged over
  examples; signed like head loo.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from headprune_cli.data.readers import Dataset, batches
from headprune_cli.errors import DataError
from headprune_cli.model.arch import adapter_for
from headprune_cli.model.arch.base import hidden_states_in
from headprune_cli.model.layout import info_of
from headprune_cli.model.surgery import HeadGates, NeuronGates, apply_plan, skip_layers
from headprune_cli.stages.objectives import check_finite, embed, per_example_loss
from headprune_cli.stages.score.importance.context import ScoreContext
from headprune_cli.stages.score.importance.protocol import Importance


class BlockInfluence(Importance):
    name = "cosine"

    def layers(self, ctx: ScoreContext) -> torch.Tensor:
        blocks = adapter_for(ctx.model).layer_list(ctx.model)
        sums = torch.zeros(len(blocks), dtype=torch.float64, device=ctx.device)
        seen: dict[int, torch.Tensor] = {}

        def hook(pos):
            def record(module, args, kwargs, output):
                hidden_in = hidden_states_in(args, kwargs)
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


class LayerLeaveOneOut(Importance):
    name = "loo"

    def layers(self, ctx: ScoreContext) -> torch.Tensor:
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


def attention_loss(ctx: ScoreContext) -> torch.Tensor:
    """Per layer: the exact loss change when ALL its heads are removed (gated to 0), averaged
    over examples. Joint selection splits it among the layer's heads in proportion to their
    scores, which puts any head method on the loss scale of `loo`/`refit` layer scores."""
    return _whole_block_loss(ctx, HeadGates, ctx.head_counts(), "scoring attention blocks")


def ffn_loss(ctx: ScoreContext) -> torch.Tensor:
    """Per layer: the exact loss change when ALL its FFN neurons are removed (gated to 0):
    what puts neuron scores on the layers' loss scale, as attention_loss does for heads."""

    widths = [ctx.layout.ffn_width(layer) for layer in ctx.layout.layers]
    return _whole_block_loss(ctx, NeuronGates, widths, "scoring FFN blocks")


def _whole_block_loss(ctx: ScoreContext, gating, counts: list[int], description: str) -> torch.Tensor:
    """Per layer, the mean loss change when every unit `gating` gates in that layer is 0."""
    diffs = torch.zeros(len(counts), dtype=torch.float64, device=ctx.device)
    with torch.no_grad():
        for number, _, batch in ctx.my_batches(description):
            out = embed(ctx.model, batch)
            base = per_example_loss(out, batch, ctx.objective, out).double()
            for pos in range(len(counts)):
                gates = [
                    torch.full((n,), 0.0 if i == pos else 1.0, dtype=ctx.dtype, device=ctx.device)
                    for i, n in enumerate(counts)
                ]
                with gating(ctx.model, gates):
                    removed = per_example_loss(embed(ctx.model, batch), batch, ctx.objective, out).double()
                check_finite(removed, f"batch {number}")
                diffs[pos] += (removed - base).sum()
    (diffs,) = ctx.reduce([diffs])
    return diffs / len(ctx.dataset)


class LayerRefit(Importance):
    """Loss after removing the block AND a short refit, minus the loss before (ShortGPT's
    question asked the way recovery answers it; cf. Kim et al. 2024, Shortened LLaMA, whose
    loss-based criterion beats cosine once the model is retrained).

    The calibration set is split in half: each block is dropped from a copy of the model,
    the copy trains for REFIT_STEPS steps on the first half (distilling from the unpruned
    model at the deep-cut recovery rate, finetune.default_lr), and the loss is measured on
    the second half against the unpruned model's loss there. A block whose work the others
    can take over scores low even when removing it outright hurts."""

    name = "refit"
    REFIT_STEPS = 12
    BATCH = 16

    def layers(self, ctx: ScoreContext) -> torch.Tensor:
        from headprune_cli.stages.training.train import FinetuneConfig, finetune  # noqa: PLC0415 (keeps numpy, safetensors out of this module's import)

        n = len(ctx.dataset)
        if n < 4:
            raise DataError(f"--layer-method refit needs at least 4 calibration examples (got {n})")
        fit, held = ctx.dataset.select(0, n // 2), ctx.dataset.select(n // 2, n)
        base, reference = self._held_loss(ctx, ctx.model, held, None)
        out = torch.zeros(len(ctx.layout.layers), dtype=torch.float64, device=ctx.device)
        advance = ctx.progress("scoring layers (drop + refit)", len(out))
        # Distil with the objective's own targets: labels only where classification has them.
        kd = 1.0 if ctx.objective == "fidelity" or info_of(ctx.model).task == "embedding" else 0.5
        rows = fit if kd < 1.0 else self._distil_rows(ctx, fit)
        for pos, layer in enumerate(ctx.layout.layers):
            student = copy.deepcopy(ctx.model)
            apply_plan(student, {}, [layer])
            torch.manual_seed(ctx.seed)
            cfg = FinetuneConfig(steps=self.REFIT_STEPS, batch_size=self.BATCH, seed=ctx.seed, kd_weight=kd)
            finetune(student, rows, cfg, teacher=ctx.model)
            loss, _ = self._held_loss(ctx, student, held, reference)
            out[pos] = loss - base
            advance()
        return out

    @staticmethod
    def _distil_rows(ctx: ScoreContext, fit: Dataset) -> Dataset:
        """Rows for pure distillation; a classifier's recovery checks for labels, so it gets
        the unpruned model's own predictions (unused by the loss at distillation weight 1)."""
        if info_of(ctx.model).task != "classification":
            return Dataset(fit.input_ids, fit.attention_mask, None, fit.token_type_ids)
        with torch.no_grad():
            labels = [
                embed(ctx.model, {k: v.to(ctx.device) for k, v in b.items()}).argmax(-1).cpu()
                for b in batches(fit, ctx.batch_size)
            ]
        return Dataset(fit.input_ids, fit.attention_mask, torch.cat(labels), fit.token_type_ids)

    def _held_loss(self, ctx: ScoreContext, model, held, reference):
        """Mean loss over the held-out half, and the per-batch outputs (the reference)."""
        total, outs = torch.zeros(1, dtype=torch.float64, device=ctx.device), list[torch.Tensor]()
        sub = ScoreContext(model, held, ctx.objective, ctx.batch_size, ctx.seed)
        model.eval()
        with torch.no_grad():
            for number, _, batch in sub.my_batches("held-out loss"):
                out = embed(model, batch)
                ref = out if reference is None else reference[len(outs)]
                loss = per_example_loss(out, batch, ctx.objective, ref).double()
                check_finite(loss, f"batch {number}")
                total += loss.sum()
                outs.append(out)
        (total,) = sub.reduce([total])
        return float(total) / len(held), outs
