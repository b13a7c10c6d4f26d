"""What a candidate's judgement is: the number the search ranks by, and the loss beside it.

Classification is judged by held-out accuracy, the number a user ships on, with the loss as
the tie-breaker (116 held-out rows give accuracy in steps of 0.86 points, so ties are common);
other objectives, and `--judge loss`, by the mean held-out loss alone. At deep cuts the two
disagree (BENCHMARKS.md section 15: plans with the lower loss had the lower accuracy).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

JUDGES = ("metric", "loss")


@dataclass(frozen=True, order=True)
class Judged:
    key: tuple[float, ...]  # lower is better: (-accuracy, loss) or (loss,)
    metric: float | None = field(compare=False)  # the judged number: accuracy, or the loss itself
    loss: float = field(compare=False)

    @classmethod
    def of(cls, loss: float, accuracy: float | None) -> Judged:
        if accuracy is None:
            return cls((loss,), loss, loss)
        return cls((-accuracy, loss), accuracy, loss)

    def describe(self) -> str:
        if len(self.key) == 1:
            return f"loss {self.loss:.5f}"
        return f"accuracy {100 * (self.metric or 0.0):.2f}%, loss {self.loss:.5f}"


WORST = Judged((math.inf, math.inf), None, math.inf)  # below every real judgement (no plan yet)


def as_judged(value: float | Judged) -> Judged:
    """A judge may return a bare loss (the search's tests and library callers do)."""
    return value if isinstance(value, Judged) else Judged.of(float(value), None)


class HeldOutJudge:
    """A candidate judged on the held-out rows: gated (masked_loss.MaskedLoss), after the
    compensation `refit` solves for it when one is given (refit.Refit), by `by` (JUDGES)."""

    def __init__(self, measure, by: str, refit=None):
        self.measure, self.by, self.refit = measure, by, refit

    def __call__(self, remove_heads: dict, remove_layers: list, remove_ffn: dict | None = None) -> Judged:
        weights = self.refit.applied(remove_heads, remove_layers, remove_ffn or {}) if self.refit else None
        loss, accuracy = self.measure.measure(remove_heads, remove_layers, remove_ffn, weights)
        return Judged.of(loss, accuracy if self.by == "metric" else None)
