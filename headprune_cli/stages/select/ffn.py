"""One budget over heads, FFN neurons and layers (`select --target-flops/--target-params`
with scores that hold neuron scores).

Every layer has two chains of removable units, least important first: its heads (the
chain chains.py builds, with every head constraint) and its FFN neurons (by score, in
steps that keep the width a multiple of `ffn_multiple_of` and at least `min_ffn`). A step
costs its units' scores (its loss) and saves its price (params or FLOPs per token, from
the cost table, which prices every neuron). Greedily, the step with the least loss per
unit of budget saved is taken until the predicted cost fits, as Kwon et al. 2022 allocate
one FLOPs budget between heads and neurons by their Fisher scores.

With loss-scale layer scores (`--layers` by loo or refit, which also measure each layer's
attention and FFN removed as a whole) layers join the same greedy as in joint.py: head and
neuron scores become shares of their layer's measured attention and FFN loss, a layer
costs its layer score minus the steps already paid in it, head or neuron steps a later
drop made redundant are given back while the budget still fits, and a dropped layer is kept
instead when head and neuron steps alone meet the budget at a lower loss.

With `uniform`, every kept layer keeps the same heads and KV groups and the same FFN
width (what a plain transformers config can say): the pair of levels with the least
removed score that fits is taken.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import accumulate

from headprune_cli.errors import UsageError
from headprune_cli.model.cost_table import predict
from headprune_cli.stages.budget import SLACK, Budget, BudgetUnreachable
from headprune_cli.stages.select import joint, runtime
from headprune_cli.stages.select import uniform as uniform_levels
from headprune_cli.stages.select.chains import Chain, Selection, chain_of, layers_to_drop


@dataclass
class NeuronChain:
    layer: int
    order: list[tuple[float, int]]  # (score, original neuron), least important first
    allowed: list[int]  # allowed counts of neurons removed, ascending (the first is forced)

    def removed(self, i: int) -> list[int]:
        return sorted(n for _, n in self.order[: self.allowed[i]])

    def step(self, i: int) -> tuple[float, int]:
        """(mean score per neuron, neurons) of going from allowed[i] to allowed[i + 1]."""
        units = self.order[self.allowed[i] : self.allowed[i + 1]]
        return sum(s for s, _ in units) / len(units), len(units)


def neuron_chain(layer: int, scores: list[float], kept: list[int], min_ffn: int, multiple_of: int) -> NeuronChain:
    width = len(kept)
    order = sorted(zip(scores, kept))  # ties: lower original index first
    allowed = [p for p in range(width) if width - p >= min_ffn and (width - p) % multiple_of == 0]
    if not allowed:
        raise UsageError(
            f"--ffn-multiple-of {multiple_of}: layer {layer} keeps {width} FFN neurons and cannot keep a multiple of "
            f"{multiple_of} with at least {min_ffn}"
        )
    return NeuronChain(layer, order, allowed)


def on_one_scale(table):
    """Head scores as shares of the attention loss and neuron scores as shares of the FFN
    loss their layer measured (negative scores count as 0)."""
    table = joint.on_one_scale(table)
    if not table.ffn_loss:
        return table
    ffn = {}
    for layer, scores in table.ffn.items():
        positive = [max(s, 0.0) for s in scores]
        total = sum(positive)
        loss = table.ffn_loss.get(layer, 0.0)
        ffn[layer] = [loss * (v / total if total > 0 else 1 / len(scores)) for v in positive]
    return replace(table, ffn=ffn)


@dataclass
class _Layer:
    """One layer's prices and losses at every allowed index of its two chains."""

    heads: Chain
    neurons: NeuronChain | None
    head_price: list[float]  # the layer's cost at each head index (full FFN)
    head_paid: list[float]
    neuron_price: float  # what one removed neuron saves
    neuron_paid: list[float]

    def price(self, h: int, f: int) -> float:
        removed = self.neurons.allowed[f] if self.neurons is not None else 0
        return self.head_price[h] - removed * self.neuron_price

    def paid(self, h: int, f: int) -> float:
        return self.head_paid[h] + (self.neuron_paid[f] if self.neurons is not None else 0.0)


def layers_of(table, head_chains, neuron_chains, key: str) -> dict[int, _Layer]:
    neurons = {ch.layer: ch for ch in neuron_chains}
    costs = {c.layer: c for c in table.cost.layers}
    per_neuron = "ffn_neuron_params" if key == "params" else "ffn_neuron_flops"
    out = {}
    for ch in head_chains:
        nc = neurons.get(ch.layer)
        paid = []
        if nc is not None:
            prefix = [0.0, *accumulate(s for s, _ in nc.order)]  # loss of removing the first k neurons
            paid = [prefix[count] for count in nc.allowed]
        out[ch.layer] = _Layer(
            ch, nc, joint._prices(table, ch, key), joint._paid(ch), getattr(costs[ch.layer], per_neuron), paid
        )
    return out


def choose(layers: dict[int, _Layer], table, outside: float, limit: float, droppable: list[int]):
    """(head index, neuron index) per layer and the dropped layers, with predicted cost <= limit
    (`outside`: the cost of everything not in `layers`); layers in `droppable` may go whole
    (loss-scale layer scores only)."""
    state = {layer: [0, 0] for layer in layers}
    dropped: list[int] = []

    def total(s, d) -> float:
        return outside + sum(layers[l].price(*s[l]) for l in s if l not in d)

    def greedy(state, dropped, droppable):
        while total(state, dropped) > limit:
            options = _options(table, layers, state, dropped, droppable)
            if not options:
                return None
            _, _, kind, layer = min(options)
            if kind == "layer":
                dropped.append(layer)
            else:
                state[layer][0 if kind == "head" else 1] += 1
        if dropped:
            _give_back(layers, state, dropped, lambda s: total(s, dropped) <= limit)
        return state

    greedy(state, dropped, droppable)

    def loss(state, dropped) -> float:
        return sum(table.layers[l] if l in dropped else layers[l].paid(*hf) for l, hf in state.items())

    if dropped:  # a dropped layer kept instead, when head and neuron steps meet the budget at a lower loss
        state, dropped = joint.keep_dropped_layers(state, dropped, lambda s, d: greedy(s, list(d), []), loss)
    return state, sorted(dropped), total(state, dropped)


def _options(table, layers, state, dropped, droppable) -> list[tuple[float, int, str, int]]:
    """(loss per unit saved, order, kind, layer) of every kept layer's next head step, next
    neuron step, and its drop."""
    out = []
    for layer, (h, f) in state.items():
        if layer in dropped:
            continue
        lay = layers[layer]
        now = lay.price(h, f)
        if h + 1 < len(lay.heads.allowed):
            out.append(_option(lay.head_paid[h + 1] - lay.head_paid[h], now - lay.price(h + 1, f), 0, "head", layer))
        if lay.neurons is not None and f + 1 < len(lay.neurons.allowed):
            out.append(_option(lay.neuron_paid[f + 1] - lay.neuron_paid[f], now - lay.price(h, f + 1), 1, "ffn", layer))
        if layer in droppable and len(dropped) + 1 < len(state):
            out.append(_option(table.layers[layer] - lay.paid(h, f), now, 2, "layer", layer))
    return [o for o in out if o is not None]


def _option(loss: float, saving: float, order: int, kind: str, layer: int):
    return (loss / saving, order, kind, layer) if saving > 0 else None


def _give_back(layers, state, dropped, fits) -> None:
    """Undo the most important last steps of kept layers while the budget still fits."""
    while True:
        undo = []
        for layer, (h, f) in state.items():
            if layer in dropped:
                continue
            lay = layers[layer]
            if h > 0:
                undo.append((lay.head_paid[h] - lay.head_paid[h - 1], 0, layer))
            if f > 0:
                undo.append((lay.neuron_paid[f] - lay.neuron_paid[f - 1], 1, layer))
        for _, which, layer in sorted(undo, reverse=True):
            state[layer][which] -= 1
            if fits(state):
                break
            state[layer][which] += 1
        else:
            return


def removal(layers: dict[int, _Layer], state, dropped) -> tuple[dict, dict, list[int]]:
    """(remove_heads, remove_ffn, remove_layers) of a state, original indices."""
    remove_heads, remove_ffn = {}, {}
    for layer, (h, f) in state.items():
        if layer in dropped:
            continue
        lay = layers[layer]
        cut = lay.heads.heads_removed(lay.heads.allowed[h])
        if cut:
            remove_heads[layer] = cut
        if lay.neurons is not None and lay.neurons.allowed[f]:
            remove_ffn[layer] = lay.neurons.removed(f)
    return remove_heads, remove_ffn, sorted(dropped)


def choose_uniform(table, layers: dict[int, _Layer], outside: float, limit: float):
    """The (head level, FFN width) pair common to every layer with the least removed score that fits
    (`outside`: the cost of everything not in `layers`)."""
    head_levels = uniform_levels.levels(table, [lay.heads for lay in layers.values()])
    widths = {
        l: {len(lay.neurons.order) - p: i for i, p in enumerate(lay.neurons.allowed)}
        for l, lay in layers.items()
        if lay.neurons
    }
    common = sorted(set.intersection(*(set(w) for w in widths.values())), reverse=True) if widths else [None]
    if not common:
        raise UsageError("--uniform: no FFN width is allowed in every layer under --min-ffn/--ffn-multiple-of")
    best = None
    for level in head_levels:
        for width in common:
            state = {
                l: [lay.heads.allowed.index(level[l]), widths[l][width] if width is not None and l in widths else 0]
                for l, lay in layers.items()
            }
            if outside + sum(layers[l].price(*state[l]) for l in state) > limit * SLACK:
                continue
            loss = sum(layers[l].paid(*state[l]) for l in state)
            if best is None or loss < best[0]:
                best = (loss, state)
    return None if best is None else best[1]


def select_ffn(table, strategy: str | None, budget: Budget, c):
    """Heads, FFN neurons (and layers) under one cost budget; see the module docstring."""
    if table.cost is None or not table.cost.prices_ffn:
        raise UsageError("FFN scores need a cost table that prices neurons; rescore with `score --ffn`")
    key = budget.cost_key
    before = predict(table.cost, table.kept())
    limit = budget.limit(before)
    fixed = c.drop_layers or c.layer_threshold is not None
    loss_scale = strategy in (None, "joint") and not fixed and joint.on_loss_scale(table) and bool(table.ffn_loss)
    if strategy == "joint" and not loss_scale:
        joint.check_scale(table)
        raise UsageError(
            "strategy 'joint' with FFN neurons needs scores by `score --ffn --layers` with loo or refit "
            "layers, which measure each layer's FFN too"
        )
    scored = on_one_scale(table) if loss_scale else table
    drop = [] if loss_scale else layers_to_drop(table, c)
    head_chains = [chain_of(scored, layer, c) for layer in sorted(table.heads) if layer not in drop]
    neuron_chains = [
        neuron_chain(
            ch.layer, scored.ffn[ch.layer], table.ffn_kept[ch.layer], c.min_ffn or c.ffn_multiple_of, c.ffn_multiple_of
        )
        for ch in head_chains
        if ch.layer in scored.ffn
    ]
    layers = layers_of(scored, head_chains, neuron_chains, key)
    # Embeddings, task head, and layers not in play; the layers dropped by --drop-layers/--layer-threshold
    # are gone (counting them here cut 0.67 of the FLOPs for an 0.5 budget after one dropped layer).
    outside = predict(table.cost, table.kept(), {}, [*layers, *drop])[key]
    protected = {layer for layer, _ in c.protect}
    dropped: list[int]
    if c.uniform:
        state, dropped = choose_uniform(scored, layers, outside, limit), []
    elif c.uniform_heads:  # vLLM: one head level, FFN widths per layer
        state, dropped = runtime.choose_same_heads(scored, layers, outside, limit), []
    else:
        droppable = [l for l in layers if l not in protected] if loss_scale else []
        state, dropped, _ = choose(layers, scored, outside, limit * SLACK, droppable)
    if state is None:
        raise BudgetUnreachable(detail="no common head count and FFN width fits it")
    remove_heads, remove_ffn, remove_layers = removal(layers, state, sorted(set(dropped) | set(drop)))
    selection = Selection("joint" if loss_scale else "budget", remove_heads, remove_layers, remove_ffn=remove_ffn)
    after = predict(table.cost, table.kept(), remove_heads, remove_layers, remove_ffn)
    selection.predicted = {"before": before, "after": after}
    if not budget.fits(after, before):
        raise BudgetUnreachable(best=budget.share(before, after))
    return selection
