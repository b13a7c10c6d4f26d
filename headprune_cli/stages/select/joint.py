"""Joint selection: heads and whole layers chosen together under one FLOPs/params budget.

Both kinds of unit are priced on one scale, the measured loss change of removing them on
the calibration set (nats per example; for fidelity, 1 - cosine):
- a layer costs its layer score (`loo`: the loss change when the block is skipped;
  `refit`: the same after a short calibration refit) minus the head steps already taken in
  it, which the layer's removal no longer adds to;
- a head costs its share of its layer's `attention` score (the loss change when all of
  the layer's heads are removed together, measured by `score --layers` beside loo/refit),
  split in proportion to the heads' own scores (negative scores count as 0). Any head
  method then ranks heads inside a layer, and the measurement says what a layer's heads
  are worth against other layers and against whole blocks. (Scores without `attention`
  use raw `loo` head scores, the only head method that is a loss change itself.)
Each step takes the unit with the lowest loss per unit of budget saved (FLOPs per token
or parameters, from the cost table) until the predicted cost fits; finishing with the
single cheapest step that fits is taken instead when it costs less than the greedy path.
Afterwards head steps made redundant by a later layer drop are given back, most expensive
first, while the budget still fits, and a dropped layer is kept instead when head steps
alone meet the budget at a lower loss (a drop can overshoot the budget by a whole
layer). Layer scores on other scales (cosine) cannot be
compared this way: selection.select falls back to heads only (`budget`) for them.
"""

from __future__ import annotations

import copy
from dataclasses import replace

from headprune_cli.errors import UsageError
from headprune_cli.model.cost_table import CostTable, predict
from headprune_cli.stages.score.importance.registry import is_loss_scale, loss_scale_layer_methods


def on_loss_scale(table) -> bool:
    """Whether the table's head and layer scores can be priced together: layer scores that
    are loss changes, and heads either measured together per layer or loss-scale themselves."""
    heads_ok = bool(table.attention) or is_loss_scale(table.method)
    return bool(table.layers) and is_loss_scale(None, table.layer_method) and heads_ok


def check_scale(table) -> None:
    if not table.layers:
        raise UsageError("strategy 'joint' needs layer scores (score with --layers)")
    if not on_loss_scale(table):
        raise UsageError(
            f"strategy 'joint' compares heads and layers as loss changes: needs layer scores by "
            f"{' or '.join(loss_scale_layer_methods())} (got {table.layer_method}), which also measure each "
            f"layer's attention (or head scores by loo; got {table.method})"
        )


def on_one_scale(table):
    """The table with head scores as shares of their layer's measured attention loss."""
    if not table.attention:
        return table
    heads = {}
    for layer, scores in table.heads.items():
        positive = {h: max(s, 0.0) for h, s in scores.items()}
        total = sum(positive.values())
        loss = table.attention.get(layer, 0.0)
        heads[layer] = {h: loss * (v / total if total > 0 else 1 / len(scores)) for h, v in positive.items()}
    return replace(table, heads=heads)


def choose(table, chains, droppable: list[int], key: str, limit: float) -> tuple[dict[int, int], list[int]]:
    """(allowed-prefix index per layer, dropped layers) whose predicted `key` is <= limit."""
    by_layer = {ch.layer: ch for ch in chains}
    price = {ch.layer: _prices(table, ch, key) for ch in chains}  # cost of the layer at each allowed index
    paid = {ch.layer: _paid(ch) for ch in chains}  # loss of the head steps up to each allowed index
    outside = predict(table.cost, table.kept(), {}, list(by_layer))[key]  # embeddings, task head, layers not in play
    state = {ch.layer: 0 for ch in chains}
    dropped: list[int] = []

    def total(state, dropped) -> float:
        return outside + sum(price[layer][i] for layer, i in state.items() if layer not in dropped)

    # Greedy by loss per unit saved; at every point, finishing with the single cheapest step
    # that fits is a candidate too (a costly layer can beat many cheap heads at the end).
    best, spent = None, 0.0
    while (now := total(state, dropped)) > limit:
        options = _options(table, state, dropped, price, paid, droppable, len(chains))
        if not options:
            break
        finishing = [o for o in options if now - o[1] <= limit]
        if finishing:
            last = min(finishing, key=lambda o: (o[0], o[3]))
            if best is None or spent + last[0] < best[0]:
                best = (spent + last[0], *_apply(state, dropped, last))
        pick = min(options, key=lambda o: (o[0] / o[1], o[3]))
        state, dropped = _apply(state, dropped, pick)
        spent += pick[0]
    if total(state, dropped) <= limit and (best is None or spent <= best[0]):
        best = (spent, state, dropped)
    if best is not None:
        _, state, dropped = best
    _give_back(state, dropped, paid, lambda s: total(s, dropped) <= limit)

    def fill(state, dropped):  # head steps alone, cheapest per unit saved, until the budget fits
        while total(state, dropped) > limit:
            options = _options(table, state, dropped, price, paid, [], len(chains))
            if not options:
                return None
            state, dropped = _apply(state, dropped, min(options, key=lambda o: (o[0] / o[1], o[3])))
        _give_back(state, dropped, paid, lambda s: total(s, dropped) <= limit)
        return state

    def loss(state, dropped) -> float:
        return sum(table.layers[l] if l in dropped else paid[l][i] for l, i in state.items())

    state, dropped = keep_dropped_layers(state, dropped, fill, loss)
    return state, sorted(dropped)


def keep_dropped_layers(state, dropped: list[int], fill, loss):
    """A layer drop is a coarse step: it can land far below the budget (at 0.6 of the FLOPs,
    a third dropped layer of six lands at 0.5). For each dropped layer, keep it instead and
    meet the budget with finer steps (`fill(state, dropped)`: the new state, or None when
    they cannot); take the change whenever its loss is lower, until none is."""
    while dropped:
        trials = []
        for layer in dropped:
            rest = [l for l in dropped if l != layer]
            filled = fill(copy.deepcopy(state), rest)
            if filled is not None:
                trials.append((loss(filled, rest), layer, filled, rest))
        best = min(trials, key=lambda t: (t[0], t[1]), default=None)
        if best is None or not best[0] < loss(state, dropped):
            return state, dropped
        _, _, state, dropped = best
    return state, dropped


def _options(table, state, dropped, price, paid, droppable, layers) -> list[tuple[float, float, str, int]]:
    """(loss, saving, kind, layer) of every next step: a layer's next head step, or its drop."""
    out = []
    for layer, i in state.items():
        if layer in dropped:
            continue
        if i + 1 < len(price[layer]):
            out.append((paid[layer][i + 1] - paid[layer][i], price[layer][i] - price[layer][i + 1], "head", layer))
        if layer in droppable and len(dropped) + 1 < layers:
            out.append((table.layers[layer] - paid[layer][i], price[layer][i], "layer", layer))
    return [o for o in out if o[1] > 0]


def _apply(state, dropped, option) -> tuple[dict[int, int], list[int]]:
    _, _, kind, layer = option
    if kind == "head":
        return {**state, layer: state[layer] + 1}, list(dropped)
    return dict(state), dropped + [layer]


def _prices(table, ch, key: str) -> list[float]:
    """The layer's own predicted cost after each allowed prefix (predict on that layer alone)."""
    alone = CostTable(table.cost.seq_len, 0, 0.0, [c for c in table.cost.layers if c.layer == ch.layer])
    kept = {ch.layer: table.kept()[ch.layer]}
    return [predict(alone, kept, {ch.layer: ch.heads_removed(p)})[key] for p in ch.allowed]


def _paid(ch) -> list[float]:
    return [sum(s for s, _ in ch.units[:p]) for p in ch.allowed]


def _give_back(state: dict[int, int], dropped: list[int], paid: dict, fits) -> None:
    """Undo head steps (the most expensive last step of any layer first) while it still fits."""
    while True:
        undo = sorted(
            ((paid[l][i] - paid[l][i - 1], l) for l, i in state.items() if i > 0 and l not in dropped), reverse=True
        )
        for _, layer in undo:
            trial = {**state, layer: state[layer] - 1}
            if fits(trial):
                state[layer] -= 1
                break
        else:
            return
