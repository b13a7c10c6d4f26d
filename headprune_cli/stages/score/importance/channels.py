"""Statistics of the input channels of every output and down projection, from one forward pass.

A head is a slice of its layer's output-projection input channels, an FFN neuron one
down-projection input channel, so the published activation-based LLM pruning methods all
read the same per-channel sums over the calibration tokens (padding left out):
- `sum`, `sq`, `tokens`: sum x, sum x^2 and the token count (FLAP's fluctuation, Wanda-sp's norm);
- `head_norm`, `neuron_abs`: per example, the mean over its tokens of each head's output norm
  ||o_{t,h}||_2 and of each neuron's |x_{t,j}|, squared and summed over examples (Minitron's
  aggregation: mean over the sequence, L2 over the batch).
Float64 sums, reduced once over torchrun processes; cached on the ScoreContext so that a
method scoring heads and neurons passes over the data once.
"""

from __future__ import annotations

import torch

from headprune_cli.model.arch import adapter_for
from headprune_cli.model.arch.base import is_conv1d
from headprune_cli.stages.score.importance.context import ScoreContext


def out_in(module) -> torch.Tensor:
    """A projection's weight as [out, in] in float64 (GPT-2's Conv1D stores [in, out])."""
    w = module.weight.detach().double()
    return w.T if is_conv1d(module) else w


def channel_stats(ctx: ScoreContext) -> dict[str, list[torch.Tensor]]:
    """Per kept layer: {"o": ..., "down": ...} sums (see the module docstring), cached on ctx."""
    if "channels" in ctx.cache:
        return ctx.cache["channels"]
    adapter = adapter_for(ctx.model)
    blocks = adapter.layer_list(ctx.model)
    views = [adapter.attention(block) for block in blocks]
    downs = [adapter.ffn(block).down for block in blocks] if ctx.ffn else []
    sums: dict[str, list[torch.Tensor]] = {}
    for side, modules in (("o", [v.o for v in views]), ("down", downs)):
        widths = [out_in(m).shape[1] for m in modules]
        for key in ("sum", "sq"):
            sums[f"{side}_{key}"] = [torch.zeros(w, dtype=torch.float64, device=ctx.device) for w in widths]
    sums["head_norm"] = [torch.zeros(len(h), dtype=torch.float64, device=ctx.device) for h in ctx.layout.heads]
    sums["neuron_abs"] = [torch.zeros_like(s) for s in sums.get("down_sum", [])]
    tokens = torch.zeros(1, dtype=torch.float64, device=ctx.device)
    mask: dict[str, torch.Tensor] = {}

    def hook(side: str, pos: int, head_dim: int):
        def record(module, args):
            x = args[0].detach().double().to(ctx.device)
            real = mask["m"][..., None] if x.dim() == 3 else torch.ones(*x.shape[:-1], 1, dtype=x.dtype)
            sums[f"{side}_sum"][pos] += (x * real).reshape(-1, x.shape[-1]).sum(0)
            sums[f"{side}_sq"][pos] += (x * x * real).reshape(-1, x.shape[-1]).sum(0)
            per_token = x.reshape(*x.shape[:-1], -1, head_dim).norm(dim=-1) if side == "o" else x.abs()
            counts = real.sum(-2).clamp(min=1) if x.dim() == 3 else real
            mean = (per_token * real).sum(-2) / counts if x.dim() == 3 else per_token  # [examples, units]
            key = "head_norm" if side == "o" else "neuron_abs"
            sums[key][pos] += (mean * mean).sum(0)

        return record

    handles = [v.o.register_forward_pre_hook(hook("o", pos, v.head_dim)) for pos, v in enumerate(views)]
    handles += [d.register_forward_pre_hook(hook("down", pos, 1)) for pos, d in enumerate(downs)]
    try:
        with torch.no_grad():
            for _, _, batch in ctx.my_batches("scoring (channel statistics)"):
                mask["m"] = batch["attention_mask"].double().to(ctx.device)
                tokens += mask["m"].sum()
                ctx.model(**{k: v for k, v in batch.items() if k != "labels"})
    finally:
        for handle in handles:
            handle.remove()
    keys = sorted(sums)
    flat = ctx.reduce([tokens, *(t for key in keys for t in sums[key])])
    out, offset = {"tokens": [flat[0]]}, 1
    for key in keys:
        out[key] = flat[offset : offset + len(sums[key])]
        offset += len(sums[key])
    ctx.cache["channels"] = out
    return out


def variance(stats: dict[str, list[torch.Tensor]], side: str) -> list[torch.Tensor]:
    """Per layer, the sample variance of every input channel over the calibration tokens."""
    n = stats["tokens"][0]
    return [
        ((sq - s * s / n) / (n - 1).clamp(min=1)).clamp(min=0)
        for s, sq in zip(stats[f"{side}_sum"], stats[f"{side}_sq"])
    ]
