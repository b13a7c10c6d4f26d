"""Uniform selection: every kept layer keeps the same number of query heads and KV groups.

A uniform layout is what a plain transformers config can say (`num_attention_heads`,
`num_key_value_heads`), so `export --hf` can write a folder that loads without headprune
(see model/formats/hf_config.py). Which heads a layer loses still follows its scores: a layer
always loses a prefix of its chain (chains.py). Uniformity only restricts *how many*:
the candidates are the kept counts that every layer's chain allows (its constraints
included), and a strategy picks one of these levels for all layers at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from headprune_cli.errors import UsageError
from headprune_cli.stages.score.table import ScoreTable
from headprune_cli.stages.select.chains import Chain

Level = dict[int, int]  # layer -> prefix of its chain


def levels(table: ScoreTable, chains: list[Chain]) -> list[Level]:
    """The uniform levels, least removal first: prefixes that leave every layer with the
    same (query heads, KV groups)."""
    options = [_kept_counts(table, ch) for ch in chains]
    common = set.intersection(*(set(o) for o in options)) if options else set()
    if not common:
        allowed = "; ".join(
            f"layer {ch.layer}: {sorted({q for q, _ in o}, reverse=True)}" for ch, o in zip(chains, options)
        )
        raise UsageError(
            "--uniform: no head count is allowed in every layer under these constraints (heads "
            f"each layer may keep: {allowed})"
        )
    ordered = sorted(common, key=lambda counts: (-counts[0], -counts[1]))
    return [{ch.layer: o[counts] for ch, o in zip(chains, options)} for counts in ordered]


def _kept_counts(table: ScoreTable, ch: Chain) -> dict[tuple[int, int], int]:
    """(query heads, KV groups) left by each allowed prefix of a layer's chain -> prefix."""
    group = table.num_heads[ch.layer] // table.num_kv_heads[ch.layer]
    out = {}
    for prefix in ch.allowed:
        removed = set(ch.heads_removed(prefix))
        left = [h for h in table.heads[ch.layer] if h not in removed]
        out[(len(left), len({h // group for h in left}))] = prefix
    return out


def removed_heads(chains: list[Chain], level: Level) -> int:
    return sum(len(ch.heads_removed(level[ch.layer])) for ch in chains)


def by_ratio(chains: list[Chain], options: list[Level], ratio: float) -> Level:
    """The level nearest round(ratio * heads) removed; a tie keeps more heads."""
    target = math.floor(ratio * sum(ch.total for ch in chains) + 0.5)
    return min(options, key=lambda lv: abs(removed_heads(chains, lv) - target))  # min keeps the first of ties


def by_threshold(table: ScoreTable, chains: list[Chain], options: list[Level], value: float) -> Level:
    """Step to the next level while the heads that step removes (in all layers together)
    score below `value` on average: the threshold rule, pooled over layers."""
    i = 0
    while i + 1 < len(options):
        step = [
            table.heads[ch.layer][h]
            for ch in chains
            for h in set(ch.heads_removed(options[i + 1][ch.layer])) - set(ch.heads_removed(options[i][ch.layer]))
        ]
        if not sum(step) / len(step) < value:
            break
        i += 1
    return options[i]


def by_budget(options: list[Level], fits: Callable[[Level], bool]) -> Level:
    """The least removal that fits the budget (the last level when none does; the caller
    then reports the budget as unmet)."""
    return next((lv for lv in options if fits(lv)), options[-1])


def choose(amount: str, table: ScoreTable, chains: list[Chain], kwargs: dict) -> Level:
    """The uniform level for a strategy's amount (its registry entry's `amount`)."""
    options = levels(table, chains)
    if amount == "ratio":
        return by_ratio(chains, options, kwargs["ratio"])
    if amount == "threshold":
        return by_threshold(table, chains, options, kwargs["value"])
    return by_budget(options, kwargs["fits"])
