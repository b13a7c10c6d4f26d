"""The search space: per-layer chain positions (heads, FFN neurons) and dropped layers, the
moves between candidates, and the budget every candidate must fit (see local.py).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from headprune_cli.model.cost_table import predict
from headprune_cli.stages.budget import Budget
from headprune_cli.stages.constraints import Constraints
from headprune_cli.stages.score.table import ScoreTable
from headprune_cli.stages.select import ffn as ffn_select
from headprune_cli.stages.select import joint
from headprune_cli.stages.select.chains import Chain, Selection, chain_of
from headprune_cli.stages.select.ffn import NeuronChain

State = tuple[tuple[int, ...], frozenset]  # (allowed-prefix index per chain, dropped layers)


@dataclass
class Space:
    table: ScoreTable
    chains: list
    droppable: list[int]
    fits: Callable[[State], bool]
    layers_move: bool  # whether candidates may drop or restore layers

    def layers(self) -> list[int]:
        return sorted({ch.layer for ch in self.chains})

    def removal(self, state: State) -> tuple[dict[int, list[int]], list[int], dict[int, list[int]]]:
        """(remove_heads, remove_layers, remove_ffn) of a state."""
        index, dropped = state
        heads, ffn = {}, {}
        for ch, i in zip(self.chains, index):
            if ch.layer in dropped:
                continue
            if isinstance(ch, NeuronChain):
                ffn[ch.layer] = ch.removed(i)
            else:
                heads[ch.layer] = ch.heads_removed(ch.allowed[i])
        return {k: v for k, v in heads.items() if v}, sorted(dropped), {k: v for k, v in ffn.items() if v}


def search_space(table, start: Selection | None, budget: Budget, c: Constraints) -> Space:
    """The search space around `start` (None: a cost budget searched from no plan, heads and neurons on one scale)."""
    one_scale = start.strategy == "joint" if start is not None else bool(table.ffn)
    scored = (ffn_select.on_one_scale(table) if table.ffn else joint.on_one_scale(table)) if one_scale else table
    # the chains the start was chosen on
    chains: list[Chain | NeuronChain] = [chain_of(scored, layer, c) for layer in sorted(table.heads)]
    if table.ffn and budget.is_cost:  # --ratio keeps meaning heads; a cost budget searches FFN widths too
        chains += [
            ffn_select.neuron_chain(
                layer, scored.ffn[layer], table.ffn_kept[layer], c.min_ffn or c.ffn_multiple_of, c.ffn_multiple_of
            )
            for layer in sorted(table.heads)
            if layer in scored.ffn
        ]
    protected = {layer for layer, _ in c.protect}
    droppable = [layer for layer in sorted(table.heads) if layer not in protected]
    # each `fits` reads `space` when called, after it is built below it
    if not budget.is_cost:  # --ratio: the same number of heads removed as the greedy plan
        assert start is not None  # a --ratio search starts from the greedy plan (search.stage)
        removed = sum(len(v) for v in start.remove_heads.values())

        def fits(state: State) -> bool:
            return sum(len(v) for v in space.removal(state)[0].values()) == removed

        space = Space(scored, chains, droppable, fits=fits, layers_move=False)
    else:  # the predicted cost within the budget
        before = predict(table.cost, table.kept())
        budget = budget.priced(table.cost)  # a block-params budget leaves out the cost outside the blocks

        def fits(state: State) -> bool:
            remove_heads, remove_layers, remove_ffn = space.removal(state)
            return budget.fits(predict(table.cost, table.kept(), remove_heads, remove_layers, remove_ffn), before)

        space = Space(scored, chains, droppable, fits=fits, layers_move=bool(droppable) and len(table.heads) > 1)
    return space


def state_of(space: Space, selection: Selection) -> State:
    """The chain positions of a selection (a layer's removed heads are a prefix of its chain)."""
    index = []
    for ch in space.chains:
        if isinstance(ch, NeuronChain):
            removed = sorted(selection.remove_ffn.get(ch.layer, []))
            options = [ch.removed(i) for i in range(len(ch.allowed))]
        else:
            removed = sorted(selection.remove_heads.get(ch.layer, []))
            options = [ch.heads_removed(p) for p in ch.allowed]
        matches = [i for i, cut in enumerate(options) if cut == removed]
        index.append(
            matches[0] if matches else min(range(len(options)), key=lambda i: abs(len(options[i]) - len(removed)))
        )
    return tuple(index), frozenset(selection.remove_layers)


def neighbours(space: Space, state: State, rng: random.Random) -> list[State]:
    index, dropped = state
    kept = [pos for pos, ch in enumerate(space.chains) if ch.layer not in dropped]
    moves: list[State | None] = [
        (_shifted(index, a, b), dropped)
        for a in kept
        for b in kept
        if a != b
        and type(space.chains[a]) is type(space.chains[b])
        and index[a] > 0
        and index[b] + 1 < len(space.chains[b].allowed)
    ]
    if space.layers_move or any(isinstance(ch, NeuronChain) for ch in space.chains):
        for a in kept:  # trade: one step back in chain a, then the other kind's cheapest steps until it fits
            if index[a] > 0:
                back = tuple(v - 1 if i == a else v for i, v in enumerate(index))
                other = [p for p in kept if type(space.chains[p]) is not type(space.chains[a])]
                if other:
                    moves.append(take_until_fits(space, (back, dropped), only=other))
    if space.layers_move:
        for layer in space.layers():
            if layer in dropped:
                restored = tuple(0 if ch.layer == layer else v for ch, v in zip(space.chains, index))
                moves.append(take_until_fits(space, (restored, dropped - {layer})))
            elif layer in space.droppable and len(dropped) + 1 < len(space.layers()):
                moves.append(_give_back_while_fits(space, (index, dropped | {layer})))
    rng.shuffle(moves)
    return [m for m in moves if m is not None]


def _shifted(index: tuple[int, ...], give: int, take: int) -> tuple[int, ...]:
    """One step of removal moved from chain `give` to chain `take`."""
    out = list(index)
    out[give] -= 1
    out[take] += 1
    return tuple(out)


def _step_scores(space: Space, index: tuple[int, ...], dropped, forward: bool, only=None) -> list[tuple[float, int]]:
    """(mean score per unit, chain position) of each kept chain's next (or last) step."""
    out = []
    for pos, ch in enumerate(space.chains):
        if ch.layer in dropped or (only is not None and pos not in only):
            continue
        i = index[pos]
        if forward and i + 1 < len(ch.allowed):
            out.append((ch.step(i)[0], pos))
        elif not forward and i > 0:
            out.append((ch.step(i - 1)[0], pos))
    return out


def take_until_fits(space: Space, state: State, only=None) -> State | None:
    """Take the cheapest steps (lowest mean score; of the chains `only`, if given) until the budget fits."""
    index, dropped = list(state[0]), state[1]
    while not space.fits((tuple(index), dropped)):
        steps = _step_scores(space, tuple(index), dropped, forward=True, only=only)
        if not steps:
            return None
        index[min(steps)[1]] += 1
    return tuple(index), dropped


def _give_back_while_fits(space: Space, state: State) -> State | None:
    """Give back the most important removed head steps while the budget still fits."""
    index, dropped = list(state[0]), state[1]
    if not space.fits((tuple(index), dropped)):
        return None
    while True:
        for _, pos in sorted(_step_scores(space, tuple(index), dropped, forward=False), reverse=True):
            index[pos] -= 1
            if space.fits((tuple(index), dropped)):
                break
            index[pos] += 1
        else:
            return tuple(index), dropped


def selection_of(space: Space, state: State) -> Selection:
    remove_heads, remove_layers, remove_ffn = space.removal(state)
    selection = Selection("search", remove_heads, remove_layers, remove_ffn=remove_ffn)
    if space.table.cost is not None:
        kept = space.table.kept()
        selection.predicted = {
            "before": predict(space.table.cost, kept),
            "after": predict(space.table.cost, kept, remove_heads, remove_layers, remove_ffn),
        }
    return selection
