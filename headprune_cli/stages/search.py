"""Search over per-layer configurations, each candidate judged by its measured loss.

Greedy selection ranks units by their own scores, but scores are not additive: removing
two heads (or blocks) together can cost far more than their scores add up to. The search
starts from the greedy plan and looks for a better one by measuring: every candidate's
loss is the real loss of the model with the candidate's heads gated to 0 and its layers
skipped, on a held-out part of the calibration data.

Search space: how many heads (KV groups for grouped-query layers) each layer keeps, as a
prefix of its chain (selection.py: which heads a layer loses still follows its scores,
and every allowed prefix respects --min-heads, --multiple-of and --protect), with
neuron scores (`score --ffn`) how many FFN neurons it keeps (a prefix of its neuron
chain, in steps of --ffn-multiple-of), and, under a FLOPs/params budget, which layers are
dropped.

Moves from the current best: move one step of removal from one layer to another, between
chains of the same kind (the budget is unchanged: same heads removed, and under a cost
budget the cost must still fit); under a cost budget also trade one kind for the other
(give a step back in one chain, then take the cheapest steps of the other kind until the
budget fits), drop a layer and give steps back (the most important first) while the
budget still fits, or restore a dropped layer and take the cheapest steps until it fits. First improvement is taken (hill climbing); neighbours are
tried in a seeded random order; it stops at a local optimum or after `evaluations`
measured candidates. Local search rather than an evolutionary one: the greedy start is
already good, every move keeps the candidate inside the budget, and one evaluation costs a
forward pass over the held-out data, so a population would spend the budget on
candidates far from any good plan.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

from headprune_cli.errors import UsageError
from headprune_cli.model.cost_table import predict
from headprune_cli.stages import ffn_select, joint
from headprune_cli.stages.ffn_select import NeuronChain
from headprune_cli.stages.scores import ScoreTable
from headprune_cli.stages.selection import Constraints, Selection, _chain, select

State = tuple[tuple[int, ...], frozenset]  # (allowed-prefix index per chain, dropped layers)


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


class MaskedLoss:
    """The mean loss of the model with a plan's heads gated to 0 and its layers skipped."""

    def __init__(self, model, dataset, objective: str, batch_size: int):
        from headprune_cli.data import as_batch, num_batches
        from headprune_cli.device import input_device
        from headprune_cli.stages.objectives import embed

        self.model, self.objective, self.count = model, objective, len(dataset)
        device = input_device(model)
        self.batches = []
        for number in range(num_batches(dataset, batch_size)):
            batch = as_batch(dataset.select(number * batch_size, (number + 1) * batch_size))
            self.batches.append({k: v.to(device) for k, v in batch.items()})
        with torch.no_grad():  # fidelity compares with the unpruned model's own outputs
            self.references = [embed(model, b) for b in self.batches]

    def __call__(
        self,
        remove_heads: dict[int, list[int]],
        remove_layers: list[int],
        remove_ffn: dict[int, list[int]] | None = None,
    ) -> float:
        from headprune_cli.model.ffn import removal_ffn_gates
        from headprune_cli.model.surgery import HeadGates, NeuronGates, removal_gates, skip_layers
        from headprune_cli.stages.objectives import check_finite, embed, per_example_loss

        total = 0.0
        neurons = NeuronGates(self.model, removal_ffn_gates(self.model, remove_ffn)) if remove_ffn else nullcontext()
        with (
            torch.no_grad(),
            HeadGates(self.model, removal_gates(self.model, remove_heads)),
            neurons,
            skip_layers(self.model, remove_layers),
        ):
            for number, (batch, reference) in enumerate(zip(self.batches, self.references)):
                losses = per_example_loss(embed(self.model, batch), batch, self.objective, reference).double()
                check_finite(losses, f"held-out batch {number}")
                total += float(losses.sum())
        return total / self.count


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


def search(
    table: ScoreTable,
    loss: Callable[[dict, list, dict], float],
    *,
    ratio: float | None = None,
    target_params: float | None = None,
    target_flops: float | None = None,
    constraints: Constraints = Constraints(),
    evaluations: int = 100,
    seed: int = 0,
    rescore_layers: bool = False,
    on_evaluation: Callable[[int, float], None] = lambda n, best: None,
) -> SearchResult:
    """The best plan found from the greedy one (or, with `rescore_layers`, from the layers chosen
    one at a time by measured loss: stages/layer_rescore.py), by `loss(remove_heads, remove_layers, remove_ffn)`."""
    if evaluations < 1:
        raise UsageError(f"the search needs at least 1 evaluation (got {evaluations})")
    if constraints.uniform:
        raise UsageError(
            "search does not take --uniform: one head count for every layer leaves nothing per layer to search; use select --uniform"
        )
    if rescore_layers:
        from headprune_cli.stages.layer_rescore import rescored_search_start

        space, current, result, seen = rescored_search_start(
            table, loss, target_params, target_flops, constraints, evaluations, on_evaluation
        )
        best_loss = result.best_loss
    else:
        start = select(
            table, None, ratio=ratio, target_params=target_params, target_flops=target_flops, constraints=constraints
        )
        space = search_space(table, start, ratio, target_params, target_flops, constraints)
        current = _state_of(space, start)
        best_loss = loss(*space.removal(current))
        result = SearchResult(start, best_loss, best_loss, 1, 0, [best_loss])
        on_evaluation(1, best_loss)
        seen = {current}
    rng = random.Random(seed)
    while result.evaluations < evaluations:
        improved = False
        for candidate in _neighbours(space, current, rng):
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


def search_space(table, start: Selection | None, ratio, target_params, target_flops, c: Constraints) -> Space:
    """The search space around `start` (None: a cost budget searched from no plan, heads and neurons on one scale)."""
    one_scale = start.strategy == "joint" if start is not None else bool(table.ffn)
    scored = (ffn_select.on_one_scale(table) if table.ffn else joint.on_one_scale(table)) if one_scale else table
    chains = [_chain(scored, layer, c) for layer in sorted(table.heads)]  # the chains the start was chosen on
    if table.ffn and ratio is None:  # --ratio keeps meaning heads; a cost budget searches FFN widths too
        chains += [
            ffn_select.neuron_chain(
                layer, scored.ffn[layer], table.ffn_kept[layer], c.min_ffn or c.ffn_multiple_of, c.ffn_multiple_of
            )
            for layer in sorted(table.heads)
            if layer in scored.ffn
        ]
    protected = {layer for layer, _ in c.protect}
    droppable = [layer for layer in sorted(table.heads) if layer not in protected]
    if ratio is not None:  # the same number of heads removed as the greedy plan
        removed = sum(len(v) for v in start.remove_heads.values())
        space = Space(scored, chains, droppable, fits=None, layers_move=False)

        def fits(state: State) -> bool:
            return sum(len(v) for v in space.removal(state)[0].values()) == removed
    else:  # the predicted cost within the budget
        key = "params" if target_params is not None else "flops_per_token"
        limit = (target_params if target_params is not None else target_flops) * predict(table.cost, table.kept())[key]
        space = Space(scored, chains, droppable, fits=None, layers_move=bool(droppable) and len(table.heads) > 1)

        def fits(state: State) -> bool:
            remove_heads, remove_layers, remove_ffn = space.removal(state)
            return predict(table.cost, table.kept(), remove_heads, remove_layers, remove_ffn)[key] <= limit * (
                1 + 1e-12
            )

    space.fits = fits
    return space


def _state_of(space: Space, selection: Selection) -> State:
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


def _neighbours(space: Space, state: State, rng: random.Random) -> list[State]:
    index, dropped = state
    kept = [pos for pos, ch in enumerate(space.chains) if ch.layer not in dropped]
    moves = [
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
