"""Selection: scores -> which heads and layers to remove. Choosing only; nothing here
touches a model.

Every layer's removable heads form a *chain* of units, least important first: single
heads, or for grouped-query layers whole KV groups (a group's importance is the sum of
its query heads' scores) or, with `gqa_unit="head"`, "rows" of one query head from every
group (so that every remaining group keeps the same size). A layer always loses a
prefix of its chain. The constraints (min heads, multiple-of, protected heads) decide
which prefix lengths are allowed; a strategy only picks among the allowed ones, so
every strategy respects every constraint by construction. With `uniform`, the
strategy picks one kept count for all layers among those every layer allows
(uniform.py).
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from headprune_cli.model.cost_table import predict
from headprune_cli.stages.scores import ScoreTable  # noqa: F401  (selection's input type; imported from here too)
from headprune_cli.errors import NumericalError, UsageError, shorten
from headprune_cli.stages import joint
from headprune_cli.names import did_you_mean
from headprune_cli.stages import uniform as uniform_levels


@dataclass(frozen=True)
class Constraints:
    min_heads: int = 1
    multiple_of: int = 1
    protect: tuple[tuple[int, int], ...] = ()  # (original layer, original head)
    drop_layers: int = 0
    layer_threshold: float | None = None
    gqa_unit: str = "group"  # group | head
    uniform: bool = False  # every kept layer keeps the same number of heads and KV groups (and FFN width)
    min_ffn: int | None = None  # FFN neurons every kept layer keeps at least (None: ffn_multiple_of)
    ffn_multiple_of: int = 8  # kept FFN widths are multiples of this (GPU matrix tiles want multiples of 8)

    def to_dict(self, ffn: bool = False) -> dict:
        """As plans record them; the FFN keys only for plans that may cut FFN neurons, so
        head-only plans keep the bytes they always had."""
        out = asdict(self)
        out["protect"] = [f"{layer}:{head}" for layer, head in self.protect]
        if not ffn:
            del out["min_ffn"], out["ffn_multiple_of"]
        return out


@dataclass
class Selection:
    strategy: str
    remove_heads: dict[int, list[int]]
    remove_layers: list[int]
    predicted: dict | None = None
    remove_ffn: dict[int, list[int]] = field(default_factory=dict)  # original layer -> original neurons


@dataclass
class _Chain:
    layer: int
    total: int  # query heads the layer keeps now
    units: list[tuple[float, tuple[int, ...]]]  # removable units, least important first
    allowed: list[int]  # allowed prefix lengths, ascending (the first one is forced)

    def heads_removed(self, prefix: int) -> list[int]:
        return sorted(h for _, unit in self.units[:prefix] for h in unit)

    def step(self, i: int) -> tuple[float, int]:
        """(mean score per head, heads) of going from allowed[i] to allowed[i + 1]."""
        units = self.units[self.allowed[i] : self.allowed[i + 1]]
        heads = sum(len(u) for _, u in units)
        return sum(s for s, _ in units) / heads, heads


# --- parsing helpers for the CLI ------------------------------------------------------
def parse_protect(text: str | None) -> tuple[tuple[int, int], ...]:
    """'0:3,2:1' -> ((0, 3), (2, 1))."""
    if not text:
        return ()
    out = []
    for item in text.split(","):
        parts = item.strip().split(":")
        # ASCII digits only: str.isdigit() also accepts "²", which int() refuses.
        if len(parts) != 2 or not all(re.fullmatch(r"[0-9]{1,9}", p.strip()) for p in parts):
            raise UsageError(f"--protect: {shorten(item.strip())} is not LAYER:HEAD (e.g. 0:3,2:1)")
        out.append((int(parts[0]), int(parts[1])))
    return tuple(sorted(set(out)))


def parse_threshold(text: str) -> tuple[float | None, float | None]:
    """'0.01' -> (absolute 0.01, None); '25%' -> (None, percentile 25)."""
    try:
        if text.strip().endswith("%"):
            value = float(text.strip()[:-1])
            if not 0 <= value <= 100:
                raise UsageError(f"--threshold {text}: a percentile must be within 0%..100%")
            return None, value
        value = float(text)
    except ValueError:
        raise UsageError(f"--threshold {text!r}: expected a number or a percentile such as 25%") from None
    if not math.isfinite(value):
        raise UsageError("--threshold must be finite")
    return value, None


# --- chains and constraints --------------------------------------------------------
def _check_table(table: ScoreTable, c: Constraints) -> None:
    for layer, heads in table.heads.items():
        if any(not math.isfinite(s) for s in heads.values()):
            raise NumericalError(f"scores of layer {layer} contain NaN or inf; rescore the model")
    if table.layers and any(not math.isfinite(s) for s in table.layers.values()):
        raise NumericalError("layer scores contain NaN or inf; rescore the model")
    if c.min_heads < 1:
        raise UsageError("--min-heads must be at least 1 (drop a whole layer with --drop-layers)")
    if c.multiple_of < 1:
        raise UsageError("--multiple-of must be at least 1")
    if c.ffn_multiple_of < 1 or (c.min_ffn is not None and c.min_ffn < 1):
        raise UsageError("--ffn-multiple-of and --min-ffn must be at least 1 (drop a whole layer to remove its FFN)")
    if c.gqa_unit not in ("group", "head"):
        raise UsageError(f"unknown GQA unit {c.gqa_unit!r} (available: group, head)")
    for layer, head in c.protect:
        if head not in table.heads.get(layer, {}):
            raise UsageError(f"--protect {layer}:{head}: the scored model has no head {head} in layer {layer}")


def _units(table: ScoreTable, layer: int, c: Constraints) -> list[tuple[float, tuple[int, ...]]]:
    """Removable units of a layer, least important first; protected units left out."""
    scores = table.heads[layer]
    protected = {h for l, h in c.protect if l == layer}
    group = table.num_heads[layer] // table.num_kv_heads[layer]
    if group == 1:
        units = [(s, (h,)) for h, s in scores.items() if h not in protected]
    elif c.gqa_unit == "group":
        units = [(sum(scores[h] for h in hs), tuple(hs)) for hs in _groups(scores, group) if not protected & set(hs)]
    else:
        return _rows(scores, group, protected)
    return sorted(units, key=lambda u: (u[0], u[1]))  # ties: lower original index first


def _groups(scores: dict[int, float], group: int) -> list[list[int]]:
    """The kept query heads of each KV group (original indices), groups in order."""
    groups: dict[int, list[int]] = {}
    for h in sorted(scores):
        groups.setdefault(h // group, []).append(h)
    return list(groups.values())


def _rows(scores: dict[int, float], group: int, protected: set[int]) -> list[tuple[float, tuple[int, ...]]]:
    """Row r = the r-th least important query head of every group; sums are ascending."""
    ordered = [sorted(hs, key=lambda h: (h in protected, scores[h], h)) for hs in _groups(scores, group)]
    rows = []
    for r in range(min(len(hs) for hs in ordered)):
        row = tuple(sorted(hs[r] for hs in ordered))
        if protected & set(row):
            break  # protected heads sort last in their group, so every later row has one too
        rows.append((sum(scores[h] for h in row), row))
    return rows


def _chain(table: ScoreTable, layer: int, c: Constraints) -> _Chain:
    total = len(table.heads[layer])
    units = _units(table, layer, c)
    if total < c.min_heads:
        raise UsageError(f"--min-heads {c.min_heads} is above the {total} heads layer {layer} has")
    removed, allowed = 0, []
    for prefix in range(len(units) + 1):
        kept = total - removed
        if kept >= c.min_heads and kept % c.multiple_of == 0:
            allowed.append(prefix)
        if prefix < len(units):
            removed += len(units[prefix][1])
    if not allowed:
        raise UsageError(
            f"--multiple-of {c.multiple_of}: layer {layer} keeps {total} heads and cannot keep a multiple of "
            f"{c.multiple_of} with at least {c.min_heads} (units of {len(units[0][1]) if units else 1} heads"
            f"{', some protected' if c.protect else ''})"
        )
    return _Chain(layer, total, units, allowed)


def _layers_to_drop(table: ScoreTable, c: Constraints) -> list[int]:
    if not c.drop_layers and c.layer_threshold is None:
        return []
    if c.drop_layers and c.layer_threshold is not None:
        raise UsageError("give --drop-layers or --layer-threshold, not both")
    if not table.layers:
        raise UsageError("layer removal needs layer scores, and these scores have none (score layers too)")
    protected = {layer for layer, _ in c.protect}
    candidates = sorted(
        (s, layer) for layer, s in table.layers.items() if layer in table.heads and layer not in protected
    )
    if c.drop_layers:
        if c.drop_layers < 0:
            raise UsageError("--drop-layers must be non-negative")
        drop = [layer for _, layer in candidates[: c.drop_layers]]
        if len(drop) < c.drop_layers:
            raise UsageError(
                f"--drop-layers {c.drop_layers}: only {len(drop)} layers can be dropped (others are protected)"
            )
    else:
        drop = [layer for s, layer in candidates if s < c.layer_threshold]
    if len(drop) >= len(table.heads):
        raise UsageError("layer removal would drop every layer; at least one must remain")
    return sorted(drop)


# --- strategies: chains + an amount -> prefix per layer --------------------------------
def _global(chains: list[_Chain], ratio: float, **_) -> dict[int, int]:
    """Remove the least important heads overall until round(ratio * heads) are gone."""
    target = math.floor(ratio * sum(ch.total for ch in chains) + 0.5)
    return _greedy(chains, lambda removed, _: removed >= target, limit=target)


def _layer(chains: list[_Chain], ratio: float, **_) -> dict[int, int]:
    """The same share from every layer (the same count when layers are alike)."""
    out = {}
    for ch in chains:
        want = ratio * ch.total
        out[ch.layer] = min(ch.allowed, key=lambda p: (abs(len(ch.heads_removed(p)) - want), p))
    return out


def _threshold(chains: list[_Chain], value: float, **_) -> dict[int, int]:
    """Remove every removable step whose heads score below `value` on average."""
    out = {}
    for ch in chains:
        i = 0
        while i + 1 < len(ch.allowed) and ch.step(i)[0] < value:
            i += 1
        out[ch.layer] = ch.allowed[i]
    return out


def _budget(chains: list[_Chain], fits: Callable[[dict[int, int]], bool], **_) -> dict[int, int]:
    """Remove the least important heads overall until the predicted cost fits."""
    return _greedy(chains, lambda _, prefixes: fits(prefixes), limit=None)


def _greedy(chains: list[_Chain], done: Callable[[int, dict[int, int]], bool], limit: int | None) -> dict[int, int]:
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


@dataclass(frozen=True)
class Strategy:
    """A selection strategy as the registry declares it: the amount it takes (`ratio`,
    `threshold` or a cost `target`), and how it chooses: `prefixes(chains, ...)` picks a
    prefix of every layer's chain, or `whole(table, targets, constraints)` makes the whole
    selection itself (heads and layers together)."""

    amount: str
    prefixes: Callable[..., dict[int, int]] | None = None
    whole: Callable[..., "Selection"] | None = None


STRATEGIES: dict[str, Strategy] = {
    "global": Strategy("ratio", _global),
    "layer": Strategy("ratio", _layer),
    "threshold": Strategy("threshold", _threshold),
    "budget": Strategy("target", _budget),
    "joint": Strategy("target", whole=lambda table, tp, tf, c: select_joint(table, tp, tf, c)),  # stages/joint.py
}
AMOUNT = {name: s.amount for name, s in STRATEGIES.items()}


def default_strategy(ratio, threshold, target_params, target_flops) -> str:
    given = [
        n
        for n, v in (("ratio", ratio), ("threshold", threshold), ("target", target_params), ("target", target_flops))
        if v is not None
    ]
    if len(given) != 1:
        raise UsageError("give exactly one of --ratio, --threshold, --target-params, --target-flops")
    return {"ratio": "global", "threshold": "threshold", "target": "budget"}[given[0]]


def select(
    table: ScoreTable,
    strategy: str | None = None,
    *,
    ratio: float | None = None,
    threshold: str | float | None = None,
    target_params: float | None = None,
    target_flops: float | None = None,
    constraints: Constraints = Constraints(),
) -> Selection:
    """Choose heads/layers to remove. `threshold` is a number or a percentile like '25%'."""
    chosen = strategy or default_strategy(ratio, threshold, target_params, target_flops)
    if chosen not in STRATEGIES:
        raise UsageError(f"unknown strategy {chosen!r}{did_you_mean(chosen, STRATEGIES)}")
    _check_amount(chosen, ratio, threshold, target_params, target_flops)
    _check_table(table, constraints)
    entry = STRATEGIES[chosen]
    if table.ffn and entry.amount == "target":  # a cost budget over heads, FFN neurons and layers
        from headprune_cli.stages.ffn_select import select_ffn

        return select_ffn(table, strategy, target_params, target_flops, constraints)
    if strategy is None and entry.amount == "target" and _joint_by_default(table, constraints):
        chosen, entry = "joint", STRATEGIES["joint"]
    if entry.whole is not None:
        return entry.whole(table, target_params, target_flops, constraints)
    drop = _layers_to_drop(table, constraints)
    chains = [_chain(table, layer, constraints) for layer in sorted(table.heads) if layer not in drop]
    kwargs: dict = {"ratio": ratio}
    if entry.amount == "threshold":
        kwargs["value"] = _threshold_value(table, chains, str(threshold))
    if entry.amount == "target":
        kwargs["fits"] = _budget_check(table, chains, drop, target_params, target_flops)
    if constraints.uniform:
        prefixes = uniform_levels.choose(entry.amount, table, chains, kwargs)
    else:
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
        raise UsageError(
            f"the budget cannot be met within the constraints (best: {_fraction(selection, target_params)})"
        )
    return selection


def _joint_by_default(table: ScoreTable, c: Constraints) -> bool:
    """A budget chooses layers too when layer scores are on the heads' (loss) scale and no
    fixed layer count or threshold was asked for."""
    return not c.drop_layers and c.layer_threshold is None and joint.on_loss_scale(table)


def select_joint(table: ScoreTable, target_params, target_flops, c: Constraints) -> Selection:
    """Heads and layers together under one budget (see stages/joint.py)."""
    joint.check_scale(table)
    if c.drop_layers or c.layer_threshold is not None:
        raise UsageError("strategy 'joint' chooses the layers itself; leave out --drop-layers/--layer-threshold")
    if table.cost is None:
        raise UsageError("a --target-params/--target-flops budget needs the cost table in the scores")
    key = "params" if target_params is not None else "flops_per_token"
    limit = (target_params if target_params is not None else target_flops) * predict(table.cost, table.kept())[key]
    table = joint.on_one_scale(table)
    chains = [_chain(table, layer, c) for layer in sorted(table.heads)]
    protected = {layer for layer, _ in c.protect}
    droppable = [layer for layer in sorted(table.heads) if layer not in protected]
    state, drop = joint.choose(table, chains, droppable, key, limit * (1 + 1e-12))
    remove = {ch.layer: ch.heads_removed(ch.allowed[state[ch.layer]]) for ch in chains if ch.layer not in drop}
    selection = Selection("joint", {k: v for k, v in remove.items() if v}, drop)
    selection.predicted = {
        "before": predict(table.cost, table.kept()),
        "after": predict(table.cost, table.kept(), remove, drop),
    }
    if selection.predicted["after"][key] > limit * (1 + 1e-12):
        raise UsageError(
            f"the budget cannot be met within the constraints (best: {_fraction(selection, target_params)})"
        )
    return selection


def _check_amount(strategy, ratio, threshold, target_params, target_flops) -> None:
    need = AMOUNT[strategy]
    if need == "ratio":
        if ratio is None or threshold is not None or target_params is not None or target_flops is not None:
            raise UsageError(f"strategy {strategy!r} takes --ratio (and no threshold or target)")
        if not (isinstance(ratio, (int, float)) and math.isfinite(ratio) and 0 <= ratio <= 1):
            raise UsageError(f"--ratio {ratio} is outside [0, 1] (the fraction of kept heads to remove)")
    elif need == "threshold":
        if threshold is None or ratio is not None:
            raise UsageError("strategy 'threshold' takes --threshold VALUE or --threshold P% (and no --ratio)")
    else:
        if (target_params is None) == (target_flops is None) or ratio is not None:
            raise UsageError("strategy 'budget' takes one of --target-params F or --target-flops F (and no --ratio)")
        value = target_params if target_params is not None else target_flops
        if not (math.isfinite(value) and 0 < value <= 1):
            raise UsageError(f"target {value} is outside (0, 1] (the fraction of the cost to keep)")


def _threshold_value(table: ScoreTable, chains: list[_Chain], text: str) -> float:
    value, percentile = parse_threshold(text)
    if percentile is None:
        return value
    scores = sorted(s for ch in chains for s in table.heads[ch.layer].values())
    pos = percentile / 100 * (len(scores) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(scores) - 1)
    return scores[low] + (scores[high] - scores[low]) * (pos - low)


def _budget_check(table, chains, drop, target_params, target_flops) -> Callable[[dict[int, int]], bool]:
    if table.cost is None:
        raise UsageError("a --target-params/--target-flops budget needs the cost table in the scores")
    key = "params" if target_params is not None else "flops_per_token"
    fraction = target_params if target_params is not None else target_flops
    kept = table.kept()
    limit = fraction * predict(table.cost, kept)[key]
    by_layer = {ch.layer: ch for ch in chains}

    def fits(prefixes: dict[int, int]) -> bool:
        remove = {layer: by_layer[layer].heads_removed(p) for layer, p in prefixes.items()}
        return predict(table.cost, kept, remove, drop)[key] <= limit * (1 + 1e-12)

    return fits


def _fraction(selection: Selection, target_params) -> str:
    if not selection.predicted:
        return "unknown"
    key = "params" if target_params is not None else "flops_per_token"
    before, after = selection.predicted["before"][key], selection.predicted["after"][key]
    return f"{after / before:.3f} of the {key.replace('_', ' ')}"
