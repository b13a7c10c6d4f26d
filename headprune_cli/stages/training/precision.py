"""bf16 autocast for the training forward passes (`finetune --autocast`).

With float32 weights (a float32 model, or `--dtype float32` master weights for a bf16 one),
autocast runs the matrix products in bfloat16, where a GPU has bf16 units, for about half
the activation memory and several times the speed, while weights, gradients and AdamW
state stay float32. By default it is on where the device computes bf16 natively (a CUDA
GPU that reports bf16 support) and off elsewhere: a CPU can autocast (asked with
`--autocast`) but gains little, and the default there keeps float32 results bit-stable.
Only the forward passes run under it; the backward follows the dtypes they chose, and a
recomputed block (`--recompute`) restores the same autocast state.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from headprune_cli.errors import UsageError


def autocast_dtype(device: torch.device, requested: bool | None) -> torch.dtype | None:
    """torch.bfloat16 when the forward passes should autocast to it, else None."""
    native = device.type == "cuda" and torch.cuda.is_bf16_supported()
    if requested is None:
        return torch.bfloat16 if native else None
    if not requested:
        return None
    if not (native or device.type == "cpu"):
        raise UsageError(f"--autocast: {device} cannot compute in bfloat16; drop --autocast")
    return torch.bfloat16


def autocasting(device: torch.device, dtype: torch.dtype | None):
    """The context the forward passes run in."""
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else nullcontext()
