"""Layer distillation: the student's block outputs pulled towards the teacher's (CoFi, simplified).

CoFi (Xia et al. 2022) distils each student layer to a teacher layer through a learned linear
map. Here the student is the teacher with heads (and FFN neurons) gated or removed, so the
hidden size is the same and the layers pair by their original index: each kept block's output
is compared with the teacher block of the same original index, no map needed. The term is the
squared error relative to the teacher's own size, per token,

    sum over kept layers l, unmasked tokens i of ||s_li - t_li||^2 / (||t_li||^2 + eps),

divided by the number of layers, so its scale (a share of the teacher's norm) does not depend
on the hidden size or on how large the activations of a family are. Returned as a (sum, count)
pair over tokens, as the other loss terms are (losses.py), so accumulation and data parallelism
add up exactly. A teacher whose hidden size differs (another model altogether) has no pairing
and is refused by `pairs`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from headprune_cli.errors import UsageError
from headprune_cli.model.arch import adapter_for
from headprune_cli.model.layout import info_of

EPS = 1e-6


def pairs(student: nn.Module, teacher: nn.Module) -> list[tuple[int, int]]:
    """(student block position, teacher block position) for every kept layer of the student."""
    s, t = info_of(student), info_of(teacher)
    width = (s.config.get("hidden_size"), t.config.get("hidden_size"))
    if width[0] != width[1]:
        raise UsageError(
            f"--hidden-weight: the teacher's hidden size {width[1]} differs from the student's {width[0]}; "
            "layer distillation needs the same width (use --hidden-weight 0)"
        )
    where = {layer: i for i, layer in enumerate(t.layout.layers)}
    missing = [layer for layer in s.layout.layers if layer not in where]
    if missing:
        raise UsageError(f"--hidden-weight: the teacher lacks layers {missing} that the student keeps")
    return [(i, where[layer]) for i, layer in enumerate(s.layout.layers)]


@contextmanager
def captured(model: nn.Module) -> Iterator[list[torch.Tensor]]:
    """While open, the output hidden state of every block of `model`, in block order, is
    appended to the yielded list (cleared by the caller between forward passes)."""
    outputs: list[torch.Tensor] = []

    def keep(_module, _args, output):
        outputs.append(output[0] if isinstance(output, tuple) else output)

    handles = [block.register_forward_hook(keep) for block in adapter_for(model).layer_list(model)]
    try:
        yield outputs
    finally:
        for handle in handles:
            handle.remove()


def hidden_loss(
    student: list[torch.Tensor],
    teacher: list[torch.Tensor],
    paired: list[tuple[int, int]],
    mask: torch.Tensor,
    per_row: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of the mean over layers of the relative squared error, count): over unmasked tokens,
    or with `per_row` each row's tokens averaged first, so that it sums and counts rows."""
    weight = mask.float()
    if per_row:
        weight = weight / weight.sum(-1, keepdim=True).clamp(min=1.0)
    total = torch.zeros((), device=mask.device)
    for s_pos, t_pos in paired:
        s, t = student[s_pos].float(), teacher[t_pos].float().detach()
        error = (s - t).pow(2).sum(-1) / (t.pow(2).sum(-1) + EPS)
        total = total + (error * weight).sum()
    return total / max(1, len(paired)), weight.sum()
