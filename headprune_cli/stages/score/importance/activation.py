"""activation: Wanda-style scores (Sun et al. 2023) for whole heads, from one forward pass.

A head's score is the norm of its slice of the output projection's weights times the norm
of its input to that projection over the calibration tokens, ||W_o[:, head]||_F *
||x_head||_2: how much the head's output can move the layer's output. No gradients and no
labels, so it scores any model on plain text at forward-pass cost. With `--ffn` the same
product scores every FFN neuron (neurons.py).
"""

from __future__ import annotations

import torch

from headprune_cli.model.arch import adapter_for
from headprune_cli.model.arch.base import is_conv1d
from headprune_cli.stages.score.importance.context import ScoreContext
from headprune_cli.stages.score.importance.neurons import activation_neurons
from headprune_cli.stages.score.importance.protocol import Importance


class Activation(Importance):
    name = "activation"

    def heads(self, ctx: ScoreContext) -> list[torch.Tensor]:
        adapter = adapter_for(ctx.model)
        views = [adapter.attention(block) for block in adapter.layer_list(ctx.model)]
        squares = [torch.zeros(len(h), dtype=torch.float64, device=ctx.device) for h in ctx.layout.heads]
        mask: dict[str, torch.Tensor] = {}

        def hook(pos: int, head_dim: int):
            def record(module, args):
                x = args[0].double()
                real = mask["m"][..., None].double() if x.dim() == 3 else 1.0
                per_head = (x * x * real).reshape(*x.shape[:-1], -1, head_dim).sum(-1)
                squares[pos] += per_head.sum(dim=tuple(range(per_head.dim() - 1))).to(ctx.device)

            return record

        handles = [v.o.register_forward_pre_hook(hook(pos, v.head_dim)) for pos, v in enumerate(views)]
        try:
            with torch.no_grad():
                for _, _, batch in ctx.my_batches("scoring (activations)"):
                    mask["m"] = batch["attention_mask"]
                    ctx.model(**{k: v for k, v in batch.items() if k != "labels"})
        finally:
            for handle in handles:
                handle.remove()
        squares = ctx.reduce(squares)
        out = []
        for view, x2, heads in zip(views, squares, ctx.layout.heads):
            w = view.o.weight.detach().double()
            w = w if is_conv1d(view.o) else w.T  # [in, out]: heads split the input features
            norms = w.reshape(len(heads), view.head_dim, -1).pow(2).sum(dim=(1, 2)).sqrt()
            out.append(norms.to(ctx.device) * x2.sqrt())
        return out

    def neurons(self, ctx: ScoreContext) -> list[torch.Tensor]:
        return activation_neurons(ctx)
