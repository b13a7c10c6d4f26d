"""Search over per-layer configurations, each candidate judged by its measured loss.

Greedy selection ranks units by their own scores, but scores are not additive: removing
two heads (or blocks) together can cost far more than their scores add up to. The search
starts from the greedy plan and looks for a better one by measuring: every candidate's
loss is the real loss of the model with the candidate's heads gated to 0 and its layers
skipped, on a held-out part of the calibration data.

Search space: how many heads (KV groups for grouped-query layers) each layer keeps, as a
prefix of its chain (select/chains.py: which heads a layer loses still follows its scores,
and every allowed prefix respects --min-heads, --multiple-of and --protect), with
neuron scores (`score --ffn`) how many FFN neurons it keeps (a prefix of its neuron
chain, in steps of --ffn-multiple-of), and, under a FLOPs/params budget, which layers are
dropped.

Moves from the current best: move one step of removal from one layer to another, between
chains of the same kind (the budget is unchanged: same heads removed, and under a cost
budget the cost must still fit); under a cost budget also trade one kind for the other
(give a step back in one chain, then take the cheapest steps of the other kind until the
budget fits), drop a layer and give steps back (the most important first) while the
budget still fits, or restore a dropped layer and take the cheapest steps until it fits.
First improvement is taken (hill climbing); neighbours are
tried in a seeded random order; it stops at a local optimum or after `evaluations`
measured candidates. Local search rather than an evolutionary one: the greedy start is
already good, every move keeps the candidate inside the budget, and one evaluation costs a
forward pass over the held-out data, so a population would spend the budget on
candidates far from any good plan.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from headprune_cli.errors import UsageError
from headprune_cli.stages.budget import Budget
from headprune_cli.stages.score.table import ScoreTable
from headprune_cli.stages.search.layer_rescore import rescored_start
from headprune_cli.stages.search.space import neighbours, search_space, selection_of, state_of
from headprune_cli.stages.select.chains import Constraints, Selection
from headprune_cli.stages.select.strategies import select


@dataclass
class SearchResult:
    selection: Selection
    start_loss: float  # the greedy plan's measured loss
    best_loss: float
    evaluations: int  # candidates measured, the greedy start included
    improvements: int
    history: list[float] = field(default_factory=list)  # best loss after each evaluation
    rescored_layers: list[int] | None = None  # with rescore_layers: the layers the start drops, in the order chosen

    def summary(self) -> dict:
        record = {
            "start_loss": self.start_loss,
            "best_loss": self.best_loss,
            "evaluations": self.evaluations,
            "improvements": self.improvements,
        }
        if self.rescored_layers is not None:
            record["rescored_layers"] = self.rescored_layers
        return record


def search(
    table: ScoreTable,
    loss: Callable[[dict, list, dict], float],
    *,
    budget: Budget,
    constraints: Constraints = Constraints(),
    evaluations: int = 100,
    seed: int = 0,
    rescore_layers: bool = False,
    on_evaluation: Callable[[int, float], None] = lambda n, best: None,
) -> SearchResult:
    """The best plan found from the greedy one (or, with `rescore_layers`, from the layers chosen
    one at a time by measured loss: layer_rescore.py), by `loss(remove_heads, remove_layers, remove_ffn)`."""
    if evaluations < 1:
        raise UsageError(f"the search needs at least 1 evaluation (got {evaluations})")
    if constraints.uniform:
        raise UsageError(
            "search does not take --uniform: one head count for every layer leaves nothing per layer "
            "to search; use select --uniform"
        )
    if rescore_layers:
        space, current, result, seen = _rescored_start(table, loss, budget, constraints, evaluations, on_evaluation)
        best_loss = result.best_loss
    else:
        start = select(table, None, budget=budget, constraints=constraints)
        space = search_space(table, start, budget, constraints)
        current = state_of(space, start)
        best_loss = loss(*space.removal(current))
        result = SearchResult(start, best_loss, best_loss, 1, 0, [best_loss])
        on_evaluation(1, best_loss)
        seen = {current}
    rng = random.Random(seed)
    while result.evaluations < evaluations:
        improved = False
        for candidate in neighbours(space, current, rng):
            if candidate in seen or not space.fits(candidate):
                continue
            seen.add(candidate)
            value = loss(*space.removal(candidate))
            result.evaluations += 1
            if value < best_loss:
                current, best_loss, improved = candidate, value, True
                result.improvements += 1
            result.history.append(best_loss)
            on_evaluation(result.evaluations, best_loss)
            if improved or result.evaluations >= evaluations:
                break
        if not improved:
            break  # a local optimum: no neighbour measures better
    result.best_loss = best_loss
    result.selection = selection_of(space, current)
    return result


def _rescored_start(table, loss, budget: Budget, c, evaluations: int, on_evaluation):
    """(space, start state, result so far, states measured) of a search that starts from layers chosen by rescoring."""

    if not budget.is_cost:
        raise UsageError(
            "--rescore-layers needs --target-flops or --target-params: --ratio counts heads, "
            "which dropping a layer does not change"
        )
    if table.cost is None:
        raise UsageError("a --target-params/--target-flops budget needs the cost table in the scores")
    space = search_space(table, None, budget, c)
    found = rescored_start(space, loss, evaluations, on_evaluation)
    if found.state is None:
        raise UsageError(
            f"no plan within the budget was found in {evaluations} evaluations of layers dropped one "
            "at a time; raise --evaluations"
        )
    result = SearchResult(
        selection_of(space, found.state),
        found.loss,
        found.loss,
        found.evaluations,
        0,
        found.history,
        rescored_layers=found.order,
    )
    return space, found.state, result, found.seen
