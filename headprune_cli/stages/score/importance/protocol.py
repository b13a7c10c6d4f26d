"""The one shape of every importance method: heads, FFN neurons and whole layers.

A method is a small class; it scores the units it can and the registry (registry.py)
declares which, so selection knows what the scores mean without importing torch:
- `heads(ctx)`: one float64 tensor per kept layer, in the model's current head order;
- `neurons(ctx)`: one float64 tensor per kept layer, one score per kept FFN neuron;
- `layers(ctx)`: one float64 score per kept layer.
Higher = more important, for every unit. A method that scores heads and neurons computes
both from the same passes where it can (statistics are cached on the ScoreContext).

`settings()` is what the scores artifact records of the method's own options (the
registry's `Method.options` names them); `check(ffn)` refuses, before any pass over the
data, a combination of the method's settings and the units asked for that cannot work.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from headprune_cli.stages.score.importance.context import ScoreContext


class Importance:
    """Base of every scorer; a unit a method does not score raises (the registry says which it does)."""

    name: str = ""

    def heads(self, ctx: ScoreContext) -> list[torch.Tensor]:
        raise NotImplementedError(f"{self.name} scores no heads")

    def neurons(self, ctx: ScoreContext) -> list[torch.Tensor]:
        raise NotImplementedError(f"{self.name} scores no FFN neurons")

    def layers(self, ctx: ScoreContext) -> torch.Tensor:
        raise NotImplementedError(f"{self.name} scores no layers")

    def settings(self) -> dict[str, Any]:
        """The method's own options as the scores artifact records them (none by default)."""
        return {}

    def check(self, ffn: bool) -> None:
        """Refuse settings that cannot score the units asked for (nothing to refuse by default)."""
