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
tried in a seeded random order. At a local optimum (every neighbour measured and none
better) the search restarts from a perturbation of the best plan so far: 2, 3 or 4 random
moves in a row, in turn (iterated local search), a plan not measured before; it stops when
`evaluations` candidates are measured, `seconds` have passed, or no unmeasured perturbation
is found. The greedy climb alone stopped after 9-82 of 100 evaluations on the Debian
classifiers (BENCHMARKS.md section 15). Local search rather than an evolutionary one: the greedy start is
already good, every move keeps the candidate inside the budget, and one evaluation costs a
forward pass over the held-out data, so a population would spend the budget on
candidates far from any good plan.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from headprune_cli.errors import UsageError
from headprune_cli.stages.budget import Budget
from headprune_cli.stages.constraints import Constraints
from headprune_cli.stages.score.table import ScoreTable
from headprune_cli.stages.search.judged import WORST, Judged, as_judged
from headprune_cli.stages.search.layer_rescore import rescored_start
from headprune_cli.stages.search.space import Space, State, neighbours, search_space, selection_of, state_of
from headprune_cli.stages.select.chains import Selection
from headprune_cli.stages.select.strategies import select

PERTURB_TRIES = 20  # random perturbations tried for one not measured before, before the search gives up


@dataclass
class SearchResult:
    selection: Selection
    start: Judged  # the start plan's judgement (greedy, or the rescored layers)
    best: Judged
    evaluations: int  # candidates measured, the start included
    improvements: int
    restarts: int = 0  # perturbations of the best plan, one per local optimum reached
    stopped: str = "evaluations"  # evaluations | seconds | exhausted (no unmeasured perturbation found)
    history: list[float | None] = field(default_factory=list)  # best judged metric after each evaluation
    rescored_layers: list[int] | None = None  # with rescore_layers: the layers the start drops, in the order chosen

    @property
    def start_loss(self) -> float:
        return self.start.loss

    @property
    def best_loss(self) -> float:
        return self.best.loss

    def summary(self) -> dict:
        record: dict[str, Any] = {
            "start_loss": self.start.loss,
            "best_loss": self.best.loss,
            **(
                {"start_accuracy": self.start.metric, "best_accuracy": self.best.metric}
                if len(self.best.key) > 1
                else {}
            ),
            "evaluations": self.evaluations,
            "improvements": self.improvements,
            "restarts": self.restarts,
            "stopped": self.stopped,
            "path": self.history,
        }
        if self.rescored_layers is not None:
            record["rescored_layers"] = self.rescored_layers
        return record


class _Tally:
    """What the search measured: the count, the best plan so far, and the path of its judgement."""

    def __init__(self, space: Space, judge: Callable, evaluations: int, deadline, clock, on_evaluation):
        self.space, self.judge, self.limit, self.deadline, self.clock = space, judge, evaluations, deadline, clock
        self.on_evaluation = on_evaluation
        self.evaluations, self.improvements, self.restarts = 0, 0, 0
        self.best = WORST
        self.best_state: State | None = None  # set by the start, before the climb reads it
        self.path: list[float | None] = []
        self.seen: set = set()

    def best_plan(self) -> State:
        """The best state measured so far (the start is measured, or given, before anything asks)."""
        assert self.best_state is not None
        return self.best_state

    def spent(self) -> str | None:
        if self.evaluations >= self.limit:
            return "evaluations"
        if self.deadline is not None and self.clock() >= self.deadline:
            return "seconds"
        return None

    def measure(self, state: State) -> Judged:
        value = as_judged(self.judge(*self.space.removal(state)))
        self.seen.add(state)
        self.evaluations += 1
        if value < self.best:
            self.improvements += self.best_state is not None
            self.best, self.best_state = value, state
        self.path.append(self.best.metric)
        self.on_evaluation(self.evaluations, self.best)
        return value


def search(
    table: ScoreTable,
    loss: Callable[[dict, list, dict], float | Judged],
    *,
    budget: Budget,
    constraints: Constraints = Constraints(),
    evaluations: int = 100,
    seconds: float | None = None,
    seed: int = 0,
    rescore_layers: bool = False,
    on_evaluation: Callable[[int, Judged], None] = lambda n, best: None,
    clock: Callable[[], float] = time.monotonic,
) -> SearchResult:
    """The best plan found from the greedy one (or, with `rescore_layers`, from the layers chosen
    one at a time by measured loss: layer_rescore.py), judged by `loss(remove_heads, remove_layers,
    remove_ffn)`: a loss (lower is better) or a Judged (judged.py). Stops after `evaluations`
    candidates or `seconds` (whichever comes first; a time budget is not byte-deterministic)."""
    if evaluations < 1:
        raise UsageError(f"the search needs at least 1 evaluation (got {evaluations})")
    if seconds is not None and not seconds > 0:
        raise UsageError(f"--seconds must be above 0 (got {seconds:g})")
    if constraints.uniform:
        raise UsageError(
            "search does not take --uniform: one head count for every layer leaves nothing per layer "
            "to search; use select --uniform"
        )
    deadline = None if seconds is None else clock() + seconds
    if rescore_layers:
        space, found = _rescored_start(table, loss, budget, constraints, evaluations, on_evaluation)
        tally, order = _Tally(space, loss, evaluations, deadline, clock, on_evaluation), found.order
        tally.evaluations, tally.path, tally.seen = found.evaluations, found.history, found.seen
        tally.best, tally.best_state = found.loss, found.state
    else:
        start = select(table, None, budget=budget, constraints=constraints)
        space, order = search_space(table, start, budget, constraints), None
        tally = _Tally(space, loss, evaluations, deadline, clock, on_evaluation)
        tally.measure(state_of(space, start))
    first = tally.best
    stopped = _iterated_climb(space, tally, random.Random(seed))
    return SearchResult(
        selection_of(space, tally.best_plan()),
        first,
        tally.best,
        tally.evaluations,
        tally.improvements,
        tally.restarts,
        stopped,
        tally.path,
        rescored_layers=order,
    )


def _iterated_climb(space: Space, tally: _Tally, rng: random.Random) -> str:
    """Climb to a local optimum, perturb the best plan, climb again, until the budget is spent
    (returns why it stopped)."""
    current, value = tally.best_plan(), tally.best
    while not tally.spent():
        step = _better_neighbour(space, current, value, tally, rng)
        if step is not None:
            current, value = step
            continue
        if tally.spent():
            break
        perturbed = _perturbed(space, tally.best_plan(), tally.seen, rng, strength=2 + tally.restarts % 3)
        if perturbed is None:
            return "exhausted"
        tally.restarts += 1
        current, value = perturbed, tally.measure(perturbed)
    return tally.spent() or "evaluations"


def _better_neighbour(space: Space, current: State, value: Judged, tally: _Tally, rng: random.Random):
    """The first unmeasured neighbour that judges better (first improvement), or None at a local
    optimum (or when the budget runs out on the way)."""
    for candidate in neighbours(space, current, rng):
        if candidate in tally.seen or not space.fits(candidate):
            continue
        judged = tally.measure(candidate)
        if judged < value:
            return candidate, judged
        if tally.spent():
            return None
    return None


def _perturbed(space: Space, state: State, seen: set, rng: random.Random, strength: int) -> State | None:
    """`strength` random moves in a row from `state`, each within the budget: a plan not
    measured yet (None when PERTURB_TRIES attempts only reach measured ones)."""
    for _ in range(PERTURB_TRIES):
        walk = state
        for _ in range(strength):
            step = next((c for c in neighbours(space, walk, rng) if space.fits(c)), None)
            if step is None:
                break
            walk = step
        if walk not in seen:
            return walk
    return None


def _rescored_start(table, loss, budget: Budget, c, evaluations: int, on_evaluation):
    """(space, the rescored start: layer_rescore.Rescored) of a search that starts from layers chosen by rescoring."""

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
    return space, found
