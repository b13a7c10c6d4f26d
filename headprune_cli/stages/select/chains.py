"""Chains and constraints: what every selection is chosen from and must respect.

Every layer's removable heads form a *chain* of units, least important first: single
heads, or for grouped-query layers whole KV groups (a group's importance is the sum of
its query heads' scores) or, with `gqa_unit="head"`, "rows" of one query head from every
group (so that every remaining group keeps the same size). A layer always loses a
prefix of its chain. The constraints (min heads, multiple-of, protected heads) decide
which prefix lengths are allowed; a strategy only picks among the allowed ones, so
every strategy respects every constraint by construction. The Constraints value itself is
stages/constraints.py's (the shared option groups build it below the stage packages).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from headprune_cli.errors import NumericalError, UsageError
from headprune_cli.stages.constraints import Constraints
from headprune_cli.stages.score.table import ScoreTable


@dataclass
class Selection:
    strategy: str
    remove_heads: dict[int, list[int]]
    remove_layers: list[int]
    predicted: dict | None = None
    remove_ffn: dict[int, list[int]] = field(default_factory=dict)  # original layer -> original neurons


@dataclass
class Chain:
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
def check_table(table: ScoreTable, c: Constraints) -> None:
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
    units: list[tuple[float, tuple[int, ...]]]
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


def chain_of(table: ScoreTable, layer: int, c: Constraints) -> Chain:
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
    return Chain(layer, total, units, allowed)


def layers_to_drop(table: ScoreTable, c: Constraints) -> list[int]:
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
        assert c.layer_threshold is not None  # the early return: no --drop-layers means a threshold
        drop = [layer for s, layer in candidates if s < c.layer_threshold]
    if len(drop) >= len(table.heads):
        raise UsageError("layer removal would drop every layer; at least one must remain")
    return sorted(drop)
