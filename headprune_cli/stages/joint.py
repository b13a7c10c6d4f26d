"""Joint selection: heads and whole layers chosen together under one FLOPs/params budget.

Both kinds of unit are priced on one scale, the estimated loss change of removing them
on the calibration set (nats per example):
- a head step (the next allowed prefix of a layer's chain, see selection.py) costs the
  sum of its heads' scores: `loo` head scores are the measured loss change of removing
  each head alone, `taylor`/`taylor-weight` scores first-order estimates of it;
- a layer costs its layer score (`refit`: the loss after removal and a short calibration
  refit, minus the loss before; `loo`: the loss change without refit) minus the head
  steps already taken in it, which the layer's removal no longer adds to.
Each step takes the unit with the lowest loss per unit of budget saved (FLOPs per token
or parameters, from the cost table), until the predicted cost fits; the step that makes
it fit is the cheapest one that does. Afterwards head steps made redundant by a later
layer drop are given back, most expensive first, while the budget still fits.
Scores on other scales (cosine, fisher, entropy...) cannot be compared this way and are
refused; selection.select falls back to heads only (strategy `budget`) for them.
"""

from __future__ import annotations

from headprune_cli.errors import UsageError
from headprune_cli.model.cost_table import CostTable, predict

# Methods whose scores estimate the loss change of removing the unit (see module doc).
LOSS_HEAD_METHODS = ("loo", "taylor", "taylor-weight")
LOSS_LAYER_METHODS = ("refit", "loo")


def on_loss_scale(table) -> bool:
    """Whether the table's head and layer scores can be priced together."""
    return bool(table.layers) and table.method in LOSS_HEAD_METHODS and table.layer_method in LOSS_LAYER_METHODS


def check_scale(table) -> None:
    if not table.layers:
        raise UsageError("strategy 'joint' needs layer scores (score with --layers)")
    if not on_loss_scale(table):
        raise UsageError(
            f"strategy 'joint' compares head and layer scores as loss changes: needs --method one of "
            f"{', '.join(LOSS_HEAD_METHODS)} (got {table.method}) and --layer-method one of "
            f"{', '.join(LOSS_LAYER_METHODS)} (got {table.layer_method})"
        )


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
    return state, sorted(dropped)


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
        undo = sorted(((paid[l][i] - paid[l][i - 1], l) for l, i in state.items() if i > 0 and l not in dropped), reverse=True)
        for _, layer in undo:
            trial = {**state, layer: state[layer] - 1}
            if fits(trial):
                state[layer] -= 1
                break
        else:
            return
