"""Which whole layers to drop, chosen one at a time by measured loss (`search --rescore-layers`).

Single-layer scores are measured with every other layer in place, so they are not
additive: two layers that each cost little alone can cost a great deal together (the
two top blocks of a small encoder, say). Here the layers are chosen one after another,
each time by measuring, with the layers already chosen dropped, the loss of dropping one
more: forward selection. Every candidate is a whole plan under the budget: the layers
dropped, then the rest of the budget filled with the lowest-scoring head steps, as the
search's own moves fill it; while the layers so far cannot meet the budget even with that
fill, the layers alone are measured, to choose the next one by. Heads only: with FFN
neurons the fill would weigh head and neuron scores against each other with no common
scale. It stops when no further layer lowers the
measured loss (or only one layer would be left, or the evaluations run out) and hands the
best plan to the search as its start, in place of the greedy plan.

This lives with the search, not with `select`: measuring needs the model and held-out
data, and `select` only has scores. `score` could rescore too, but its artifact holds
one score per layer, and a sequence of conditional choices is not one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from headprune_cli.stages.budget import Budget, BudgetUnreachable
from headprune_cli.stages.search.judged import WORST, Judged, as_judged
from headprune_cli.stages.search.space import search_space, take_until_fits


@dataclass
class Rescored:
    state: object | None  # the best plan's state in the search space (None: no plan fits)
    loss: Judged  # the best plan's judgement
    order: list[int]  # the layers dropped, in the order they were chosen
    evaluations: int = 0
    history: list[float | None] = field(default_factory=list)  # best judged metric after each evaluation
    seen: set = field(default_factory=set)


def rescored_start(space, loss: Callable, evaluations: int, on_evaluation: Callable[[int, Judged], None]) -> Rescored:
    """Forward selection of layers to drop by measured loss (or any judgement `loss` returns,
    judged.py), within `evaluations` measurements."""
    zero = tuple(0 for _ in space.chains)
    out = Rescored(None, WORST, [])

    best = [WORST]  # the best judgement of a plan within the budget measured so far

    def measure(state) -> Judged:
        value = as_judged(loss(*space.removal(state)))
        out.seen.add(state)
        out.evaluations += 1
        if space.fits(state):
            best[0] = min(best[0], value)
        out.history.append(best[0].metric)
        on_evaluation(out.evaluations, best[0])
        return value

    start = take_until_fits(space, (zero, frozenset()))  # no layer dropped: heads alone, if they meet the budget
    if start is not None:
        out.state, out.loss = start, measure(start)
    layers = space.layers()
    while out.evaluations < evaluations and len(out.order) + 2 <= len(layers):
        options = []
        for layer in space.droppable:
            if layer not in out.order and out.evaluations < evaluations:
                # the plan with these layers dropped and the budget filled; where no fill meets
                # the budget yet, the layers alone, to choose the next one by
                dropped = frozenset(out.order) | {layer}
                filled = take_until_fits(space, (zero, dropped))
                state = filled if filled is not None else (zero, dropped)
                options.append(
                    (filled is None, measure(state), layer, state)
                )  # plans within the budget first, then the lowest loss
        if not options:
            break
        unfit, value, layer, state = min(options)
        if not unfit and value >= out.loss:
            break  # one more layer would only cost more than the best plan so far
        out.order.append(layer)
        if not unfit:
            out.state, out.loss = state, value
    return out


def check_reachable(table, budget: Budget, c) -> None:
    """Refuse a budget that no plan meets, even with every layer but one dropped and the rest
    cut to the constraints' minimum, before anything is scored or measured (the scores do
    not matter here: `table` may hold zeros)."""
    space = search_space(table, None, budget, c)
    deepest = tuple(len(ch.allowed) - 1 for ch in space.chains)
    protected = [layer for layer in space.layers() if layer not in space.droppable]
    keep_one = [()] if protected else [(layer,) for layer in space.droppable]
    if not any(space.fits((deepest, frozenset(space.droppable) - set(kept))) for kept in keep_one):
        what = {"params": "params", "block_params": "block params"}.get(budget.kind, "FLOPs per token")
        raise BudgetUnreachable(detail=f"even with all layers but one dropped ({what})")
