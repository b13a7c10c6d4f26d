"""Selection strategies: scores -> which heads and layers to remove, under a budget or a
threshold. Choosing only; nothing here touches a model.

A strategy picks a prefix of every layer's chain (chains.py) among the lengths the
constraints allow. With `uniform`, it picks one kept count for all layers among those
every layer allows (uniform.py). A cost budget over scores with FFN neurons is spent by
ffn.py, heads and layers together on the loss scale by joint.py.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from headprune_cli.errors import UsageError
from headprune_cli.model.cost_table import predict
from headprune_cli.names import did_you_mean
from headprune_cli.stages.budget import SLACK, Budget, BudgetUnreachable, checked
from headprune_cli.stages.constraints import Constraints
from headprune_cli.stages.score.table import ScoreTable
from headprune_cli.stages.select import joint
from headprune_cli.stages.select import uniform as uniform_levels
from headprune_cli.stages.select.chains import (
    Chain,
    Selection,
    chain_of,
    check_table,
    layers_to_drop,
    parse_threshold,
)
from headprune_cli.stages.select.ffn import select_ffn


# --- strategies: chains + an amount -> prefix per layer --------------------------------
def _global(chains: list[Chain], ratio: float, **_) -> dict[int, int]:
    """Remove the least important heads overall until round(ratio * heads) are gone."""
    target = math.floor(ratio * sum(ch.total for ch in chains) + 0.5)
    return _greedy(chains, lambda removed, _: removed >= target, limit=target)


def _layer(chains: list[Chain], ratio: float, **_) -> dict[int, int]:
    """The same share from every layer (the same count when layers are alike)."""
    out = {}
    for ch in chains:
        want = ratio * ch.total
        out[ch.layer] = min(ch.allowed, key=lambda p: (abs(len(ch.heads_removed(p)) - want), p))
    return out


def _threshold(chains: list[Chain], value: float, **_) -> dict[int, int]:
    """Remove every removable step whose heads score below `value` on average."""
    out = {}
    for ch in chains:
        i = 0
        while i + 1 < len(ch.allowed) and ch.step(i)[0] < value:
            i += 1
        out[ch.layer] = ch.allowed[i]
    return out


def _budget(chains: list[Chain], fits: Callable[[dict[int, int]], bool], **_) -> dict[int, int]:
    """Remove the least important heads overall until the predicted cost fits."""
    return _greedy(chains, lambda _, prefixes: fits(prefixes), limit=None)


def _greedy(chains: list[Chain], done: Callable[[int, dict[int, int]], bool], limit: int | None) -> dict[int, int]:
    """Take the cheapest next step of any layer (mean score per head) until `done`.

    With a head `limit`, a step that would overshoot closes its layer; at the end the
    cheapest such step is taken if it lands nearer the limit than stopping short.
    """
    by_layer = {ch.layer: ch for ch in chains}
    state = {ch.layer: 0 for ch in chains}  # index into allowed
    prefixes = lambda: {layer: by_layer[layer].allowed[i] for layer, i in state.items()}  # noqa: E731
    removed = sum(len(ch.heads_removed(ch.allowed[0])) for ch in chains)
    heap = [(*ch.step(0), ch.layer) for ch in chains if len(ch.allowed) > 1]
    heapq.heapify(heap)
    over = None
    while heap and not done(removed, prefixes()):
        score, heads, layer = heapq.heappop(heap)
        if limit is not None and removed + heads > limit:
            over = over or (score, heads, layer)
            continue
        state[layer] += 1
        removed += heads
        if state[layer] + 1 < len(by_layer[layer].allowed):
            heapq.heappush(heap, (*by_layer[layer].step(state[layer]), layer))
    if limit is not None and over and removed < limit and removed + over[1] - limit < limit - removed:
        state[over[2]] += 1
    return prefixes()


def shuffled(table: ScoreTable, seed: int) -> ScoreTable:
    """The table with every head (and layer) score replaced by a seeded uniform draw: the
    random-heads control, chosen under the same constraints as a scored plan. Python's own
    generator, so a seed gives the same plan on every machine."""
    rng = random.Random(seed)
    heads = {layer: {head: rng.random() for head in sorted(kept)} for layer, kept in sorted(table.heads.items())}
    layers = {layer: rng.random() for layer in sorted(table.layers)} if table.layers else table.layers
    return dataclasses.replace(table, heads=heads, layers=layers, method="random", layer_method=None, attention=None)


@dataclass(frozen=True)
class Strategy:
    """A selection strategy as the registry declares it: the amount it takes (`ratio`,
    `threshold` or a cost `target`), and how it chooses: `prefixes(chains, ...)` picks a
    prefix of every layer's chain, or `whole(table, targets, constraints)` makes the whole
    selection itself (heads and layers together). `rescore(table, seed)` replaces the
    scores first (a seeded strategy)."""

    amount: str
    prefixes: Callable[..., dict[int, int]] | None = None
    whole: Callable[..., Selection] | None = None
    rescore: Callable[[ScoreTable, int], ScoreTable] | None = None


STRATEGIES: dict[str, Strategy] = {
    "global": Strategy("ratio", _global),
    "layer": Strategy("ratio", _layer),
    "threshold": Strategy("threshold", _threshold),
    "budget": Strategy("target", _budget),
    "joint": Strategy("target", whole=lambda table, budget, c: select_joint(table, budget, c)),  # joint.py
    "random": Strategy("ratio", _global, rescore=shuffled),  # the control: heads drawn at random, seeded
}
AMOUNT = {name: s.amount for name, s in STRATEGIES.items()}


def default_strategy(budget: Budget | None, threshold) -> str:
    if (budget is None) == (threshold is None):
        raise UsageError(
            "give exactly one of --ratio, --threshold, --target-params, --target-flops, --target-block-params"
        )
    if budget is None:
        return "threshold"
    return "global" if budget.kind == "heads" else "budget"


def select(
    table: ScoreTable,
    strategy: str | None = None,
    *,
    budget: Budget | None = None,
    threshold: str | float | None = None,
    constraints: Constraints = Constraints(),
    seed: int | None = None,
) -> Selection:
    """Choose heads/layers to remove under `budget` (stages/budget.py), or below a
    `threshold` (a number or a percentile like '25%'); `seed` for a seeded strategy (random; the others ignore it, as
    `headprune run` passes its seed to every stage)."""
    chosen = strategy or default_strategy(budget, threshold)
    if chosen not in STRATEGIES:
        raise UsageError(f"unknown strategy {chosen!r}{did_you_mean(chosen, STRATEGIES)}")
    _check_amount(chosen, budget, threshold)
    check_table(table, constraints)
    budget = _priced(budget, table)
    entry = STRATEGIES[chosen]
    if entry.rescore is not None:
        table = entry.rescore(table, 0 if seed is None else seed)
    if table.ffn and entry.amount == "target":  # a cost budget over heads, FFN neurons and layers
        return select_ffn(table, strategy, _target(budget), constraints)
    if strategy is None and entry.amount == "target" and _joint_by_default(table, constraints):
        chosen, entry = "joint", STRATEGIES["joint"]
    if entry.whole is not None:
        return entry.whole(table, budget, constraints)
    drop = layers_to_drop(table, constraints)
    chains = [chain_of(table, layer, constraints) for layer in sorted(table.heads) if layer not in drop]
    kwargs: dict = {"ratio": budget.value if budget is not None and budget.kind == "heads" else None}
    if entry.amount == "threshold":
        kwargs["value"] = threshold_value(table, chains, str(threshold))
    if entry.amount == "target":
        kwargs["fits"] = _budget_check(table, chains, drop, _target(budget))
    if constraints.uniform or constraints.uniform_heads:  # heads alone: one level for every layer
        prefixes = uniform_levels.choose(entry.amount, table, chains, kwargs)
    else:
        assert entry.prefixes is not None  # a strategy without `whole` (returned above) declares `prefixes`
        prefixes = entry.prefixes(chains, **kwargs)
    remove = {ch.layer: ch.heads_removed(prefixes[ch.layer]) for ch in chains}
    remove = {layer: heads for layer, heads in remove.items() if heads}
    selection = Selection(strategy=chosen, remove_heads=remove, remove_layers=drop)
    if table.cost is not None:
        selection.predicted = {
            "before": predict(table.cost, table.kept()),
            "after": predict(table.cost, table.kept(), remove, drop),
        }
    if entry.amount == "target" and not kwargs["fits"](prefixes):
        raise BudgetUnreachable(best=_share(selection, _target(budget)))
    return selection


def _priced(budget: Budget | None, table: ScoreTable) -> Budget | None:
    """The budget against the scores' cost table (a block-params budget leaves out what lies
    outside the blocks, which only the table knows)."""
    if budget is None or budget.kind != "block_params":
        return budget
    if table.cost is None:
        raise UsageError("a --target-block-params budget needs the cost table in the scores")
    return budget.priced(table.cost)


def _target(budget: Budget | None) -> Budget:
    """The budget of a target strategy (_check_amount refuses one without it)."""
    assert budget is not None
    return budget


def _joint_by_default(table: ScoreTable, c: Constraints) -> bool:
    """A budget chooses layers too when layer scores are on the heads' (loss) scale and no
    fixed layer count or threshold was asked for."""
    return not c.drop_layers and c.layer_threshold is None and joint.on_loss_scale(table)


def select_joint(table: ScoreTable, budget: Budget, c: Constraints) -> Selection:
    """Heads and layers together under one budget (see joint.py)."""
    joint.check_scale(table)
    if c.drop_layers or c.layer_threshold is not None:
        raise UsageError("strategy 'joint' chooses the layers itself; leave out --drop-layers/--layer-threshold")
    cost = table.cost  # on_one_scale below keeps it
    if cost is None:
        raise UsageError("a --target-params/--target-flops budget needs the cost table in the scores")
    before = predict(cost, table.kept())
    table = joint.on_one_scale(table)
    chains = [chain_of(table, layer, c) for layer in sorted(table.heads)]
    protected = {layer for layer, _ in c.protect}
    droppable = [layer for layer in sorted(table.heads) if layer not in protected]
    state, drop = joint.choose(table, chains, droppable, budget.cost_key, budget.limit(before) * SLACK)
    remove = {ch.layer: ch.heads_removed(ch.allowed[state[ch.layer]]) for ch in chains if ch.layer not in drop}
    selection = Selection("joint", {k: v for k, v in remove.items() if v}, drop)
    selection.predicted = {"before": before, "after": predict(cost, table.kept(), remove, drop)}
    if not budget.fits(selection.predicted["after"], before):
        raise BudgetUnreachable(best=_share(selection, budget))
    return selection


def _check_amount(strategy: str, budget: Budget | None, threshold) -> None:
    need = AMOUNT[strategy]
    if need == "ratio":
        if budget is None or budget.kind != "heads" or threshold is not None:
            raise UsageError(f"strategy {strategy!r} takes --ratio (and no threshold or target)")
        checked(budget)
    elif need == "threshold":
        if threshold is None or budget is not None:
            raise UsageError("strategy 'threshold' takes --threshold VALUE or --threshold P% (and no --ratio)")
    else:
        if budget is None or not budget.is_cost:
            raise UsageError(
                "strategy 'budget' takes one of --target-params F, --target-flops F or --target-block-params F "
                "(and no --ratio)"
            )
        checked(budget)


def threshold_value(table: ScoreTable, chains: list[Chain], text: str) -> float:
    value, percentile = parse_threshold(text)
    if percentile is None:
        assert value is not None  # parse_threshold gives exactly one of the two
        return value
    scores = sorted(s for ch in chains for s in table.heads[ch.layer].values())
    pos = percentile / 100 * (len(scores) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(scores) - 1)
    return scores[low] + (scores[high] - scores[low]) * (pos - low)


def _budget_check(table, chains, drop, budget: Budget) -> Callable[[dict[int, int]], bool]:
    if table.cost is None:
        raise UsageError("a --target-params/--target-flops budget needs the cost table in the scores")
    kept = table.kept()
    before = predict(table.cost, kept)
    by_layer = {ch.layer: ch for ch in chains}

    def fits(prefixes: dict[int, int]) -> bool:
        remove = {layer: by_layer[layer].heads_removed(p) for layer, p in prefixes.items()}
        return budget.fits(predict(table.cost, kept, remove, drop), before)

    return fits


def _share(selection: Selection, budget: Budget) -> str:
    if not selection.predicted:
        return "unknown"
    return budget.share(selection.predicted["before"], selection.predicted["after"])
