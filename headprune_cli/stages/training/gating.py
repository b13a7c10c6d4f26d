"""Gates on heads, FFN neurons and layers while the model trains, and head dropout.

A gating gives the training loop per-example gates for each micro-batch, by hook
(`applied`: HeadGates multiplies each head's output by them, NeuronGates each FFN neuron's,
LayerGates each block's change to the hidden states); the loop calls `sample`, then once per
optimizer step `penalty_backward` and `step`. Two gatings exist: `HeadDropout` here (the
`finetune --head-dropout` of recovery) and the learned gates of the `learn` stage
(stages/learn/gates.py).

Head dropout (`HeadDropout`): each head's output is zeroed with probability p,
independently per example, and NOT rescaled by 1/(1 - p). Pruning removes a head and
leaves the others at their full scale, so training under unscaled dropout is training
under the condition the pruned model runs in (LayerDrop does the same for layers).

Gate noise and dropout masks come from generators seeded by (seed, step, micro-batch),
so runs are deterministic and independent of the global RNG.
"""

from __future__ import annotations

from contextlib import ExitStack, nullcontext

import torch
from torch import nn

from headprune_cli.model.layout import info_of
from headprune_cli.model.surgery import HeadGates, LayerGates, NeuronGates


def generator(seed: int, step: int, micro: int, stream: int) -> torch.Generator:
    """The generator of one micro-batch's draws; `stream` tells the gatings apart."""
    return torch.Generator().manual_seed(((seed * 1_000_003 + step) * 1009 + micro) * 8 + stream)


def applied(model: nn.Module, gates: dict[str, torch.Tensor], device=None) -> ExitStack:
    """The hooks that apply `gates` (GateSpace.split's names: `head.POS`, `ffn.POS`, `layer`) to
    `model`, on `device` (default: where its parameters are)."""
    dtype = next(model.parameters()).dtype
    device = device if device is not None else next(model.parameters()).device
    stack = ExitStack()
    by_kind = {kind: [gates[name] for name in positions(gates, kind)] for kind in ("head", "ffn")}
    if by_kind["head"]:
        stack.enter_context(HeadGates(model, [g.to(device, dtype) for g in by_kind["head"]]))
    if by_kind["ffn"]:
        stack.enter_context(NeuronGates(model, [g.to(device, dtype) for g in by_kind["ffn"]]))
    if "layer" in gates:
        stack.enter_context(LayerGates(model, gates["layer"].to(device, dtype)))
    return stack


def positions(gates: dict[str, torch.Tensor], kind: str) -> list[str]:
    """The names `KIND.POS` in `gates`, in block order."""
    return sorted((name for name in gates if name.startswith(kind + ".")), key=lambda name: int(name.split(".")[1]))


class HeadDropout:
    """Per-example, unscaled dropout of whole heads during training (see the module docstring)."""

    restores_best = True

    def __init__(self, model: nn.Module, p: float, seed: int):
        self.counts = [len(heads) for heads in info_of(model).layout.heads]
        self.p, self.seed = p, seed

    def sample(self, step: int, micro: int, rows: int, total: int) -> dict[str, torch.Tensor]:
        u = torch.rand(rows, sum(self.counts), generator=generator(self.seed, step, micro, 1))
        return {f"head.{pos}": g for pos, g in enumerate((u >= self.p).float().split(self.counts, dim=1))}

    def zero_grad(self) -> None:
        pass

    def extend(self, step: int, total: int) -> int:
        return 0

    def penalty_backward(self, step: int, total: int) -> float:
        return 0.0

    def step(self) -> None:
        pass

    def evaluating(self, model: nn.Module):
        return nullcontext()  # evaluation sees every head
