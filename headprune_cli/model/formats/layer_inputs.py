"""Statistics of linear layers' inputs over calibration text: what the weighted GGUF quantizers
need (gguf_imatrix: each column's mean square; gguf_gptq: the input second moment x x^T)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn


class _Enough(Exception):
    """Every hooked layer has seen this batch: the rest of the forward computes nothing needed."""


def input_means(
    model: nn.Module,
    batches: Iterable[dict],
    linears: dict[str, nn.Linear],
    statistic: Callable[[torch.Tensor], torch.Tensor],
) -> dict[str, torch.Tensor]:
    """Weight name -> `statistic` (a sum over its rows) of each of `linears`' inputs, divided by the
    number of real (unpadded) calibration tokens, from a forward of `model` per batch that stops
    once every one of `linears` has seen the batch (a pass for a few early layers costs a few
    layers, not the model)."""
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = {}
    mask: list[torch.Tensor] = []
    seen: set[str] = set()
    # q/k/v (and gate/up) read one tensor in turn: the first of them sums it, the others share.
    last: list = [None, ""]
    shared: dict[str, str] = {}

    def hook(name: str):
        def record(_module, inputs) -> None:
            if inputs[0] is last[0]:
                shared[name] = last[1]
            else:
                last[:] = [inputs[0], name]
                rows = _real_rows(inputs[0].detach().float(), mask[0])
                sums[name] = sums.get(name, 0) + statistic(rows)
                counts[name] = counts.get(name, 0) + rows.shape[0]
            seen.add(name)
            if len(seen) == len(linears):
                raise _Enough

        return record

    handles = [m.register_forward_pre_hook(hook(name)) for name, m in linears.items()]
    try:
        with torch.no_grad():
            for batch in batches:
                mask[:] = [batch["attention_mask"]]
                seen.clear()
                try:
                    model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
                except _Enough:
                    pass
    finally:
        last[:] = [None, ""]
        for handle in handles:
            handle.remove()
    means = {name: sums[name] / max(counts[name], 1) for name in sums}
    return means | {name: means[first] for name, first in shared.items()}


def _real_rows(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """x's token rows [tokens, features], padding left out (where x is [batch, sequence, features]
    with the batch's attention mask's shape)."""
    rows = x.reshape(-1, x.shape[-1])
    keep = mask.reshape(-1).bool() if x.dim() == 3 else None
    return rows[keep] if keep is not None and keep.numel() == rows.shape[0] else rows
