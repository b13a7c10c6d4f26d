"""The cross-task view: what each task keeps, what all or only one keep, how alike the
tasks' importance is, and one shared table of importance to serve every task from.

Units are heads (layer, head) and FFN neurons (layer, neuron), original indices. Each
task's scores are first divided by their total over all units (heads and neurons on the
scorer's one loss scale), so that a task whose loss happens to be larger does not outvote
the others; the shared importance of a unit is the mean of the tasks' normalised scores.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import combinations

import numpy as np

from headprune_cli.errors import UsageError
from headprune_cli.model.cost_table import predict
from headprune_cli.stages.score.table import ScoreTable
from headprune_cli.stages.select.chains import Selection

Unit = tuple[int, int]  # (original layer, original head or neuron)


@dataclass(frozen=True)
class Kept:
    heads: frozenset[Unit]
    ffn: frozenset[Unit]


def head_scores(table: ScoreTable) -> dict[Unit, float]:
    return {(layer, head): s for layer, heads in table.heads.items() for head, s in heads.items()}


def ffn_scores(table: ScoreTable) -> dict[Unit, float]:
    if table.ffn is None or table.ffn_kept is None:
        return {}
    return {
        (layer, neuron): float(s)
        for layer, values in table.ffn.items()
        for neuron, s in zip(table.ffn_kept[layer], values, strict=True)
    }


def kept_by(table: ScoreTable, selection: Selection) -> Kept:
    """The units a selection keeps, of those the table scores."""
    dropped = set(selection.remove_layers)
    heads = {u for u in head_scores(table) if u[0] not in dropped and u[1] not in selection.remove_heads.get(u[0], [])}
    ffn = {u for u in ffn_scores(table) if u[0] not in dropped and u[1] not in selection.remove_ffn.get(u[0], [])}
    return Kept(frozenset(heads), frozenset(ffn))


def jaccard(a: frozenset | set, b: frozenset | set) -> float:
    """|A and B| / |A or B|; two empty sets are the same set (1.0)."""
    union = len(a | b)
    return len(a & b) / union if union else 1.0


def ranks(values: list[float]) -> np.ndarray:
    """1-based ranks, tied values sharing the mean of their ranks (what Spearman needs)."""
    _, inverse, counts = np.unique(np.asarray(values, dtype=np.float64), return_inverse=True, return_counts=True)
    last = np.cumsum(counts)
    return (last - (counts - 1) / 2.0)[inverse]


def spearman(a: list[float], b: list[float]) -> float | None:
    """Spearman's rank correlation; None when either side is constant (it is undefined)."""
    ra, rb = ranks(a), ranks(b)
    if len(ra) < 2 or ra.std() == 0 or rb.std() == 0:
        return None
    return float(np.corrcoef(ra, rb)[0, 1])


def normalised(table: ScoreTable) -> dict[str, dict[Unit, float]]:
    """Head and neuron scores divided by the task's total importance over both."""
    heads, ffn = head_scores(table), ffn_scores(table)
    total = sum(abs(s) for s in heads.values()) + sum(abs(s) for s in ffn.values())
    if not total > 0:
        raise UsageError("a task's scores are all zero: nothing to compare (score it on more data)")
    return {"heads": {u: s / total for u, s in heads.items()}, "ffn": {u: s / total for u, s in ffn.items()}}


def shared_table(tables: list[ScoreTable]) -> ScoreTable:
    """The mean of the tasks' normalised scores, priced by the task whose model costs most
    (its FLOPs share is the largest after any cut, so a plan that fits it fits every task)."""
    methods = sorted({str(t.method) for t in tables})
    if len(methods) > 1:
        raise UsageError(f"the tasks were scored by different methods ({', '.join(methods)}); score them alike")
    if len({t.ffn is None for t in tables}) > 1:
        raise UsageError("some tasks' scores have FFN neuron scores and some do not; score them alike")
    norms = [normalised(t) for t in tables]
    mean = {kind: {u: float(np.mean([n[kind][u] for n in norms])) for u in norms[0][kind]} for kind in ("heads", "ffn")}
    priced = max(tables, key=lambda t: predict(t.cost, t.kept())["flops_per_token"] if t.cost else 0.0)
    heads: dict[int, dict[int, float]] = {}
    for (layer, head), s in sorted(mean["heads"].items()):
        heads.setdefault(layer, {})[head] = s
    ffn = None
    if priced.ffn is not None and priced.ffn_kept is not None:
        ffn = {layer: [mean["ffn"][(layer, n)] for n in kept] for layer, kept in priced.ffn_kept.items()}
    return replace(
        priced, heads=heads, ffn=ffn, layers=None, attention=None, ffn_loss=None, layer_method=None, objective="tasks"
    )


def check_same_units(tables: dict[str, ScoreTable]) -> None:
    names = list(tables)
    first = tables[names[0]]
    for name in names[1:]:
        other = tables[name]
        if set(head_scores(other)) != set(head_scores(first)) or set(ffn_scores(other)) != set(ffn_scores(first)):
            raise UsageError(f"tasks {names[0]} and {name} score different units; score both on their full model")


def overlap(kept: dict[str, Kept]) -> dict:
    """Per kind: what every task keeps, and what only one task keeps."""
    out = {}
    for kind in ("heads", "ffn"):
        sets = {name: getattr(k, kind) for name, k in kept.items()}
        every = frozenset.intersection(*sets.values())
        only = {name: s - frozenset().union(*(o for n, o in sets.items() if n != name)) for name, s in sets.items()}
        out[kind] = {"every": every, "only": only}
    return out


def pairs(tables: dict[str, ScoreTable], kept: dict[str, Kept]) -> list[dict]:
    """Every pair of tasks: rank correlation of their scores, Jaccard of their kept sets."""
    rows = []
    for a, b in combinations(tables, 2):
        ha, hb = head_scores(tables[a]), head_scores(tables[b])
        fa, fb = ffn_scores(tables[a]), ffn_scores(tables[b])
        units, neurons = sorted(ha), sorted(fa)
        rows.append(
            {
                "a": a,
                "b": b,
                "spearman_heads": spearman([ha[u] for u in units], [hb[u] for u in units]),
                "spearman_ffn": spearman([fa[u] for u in neurons], [fb[u] for u in neurons]) if neurons else None,
                "jaccard_heads": jaccard(kept[a].heads, kept[b].heads),
                "jaccard_ffn": jaccard(kept[a].ffn, kept[b].ffn) if neurons else None,
            }
        )
    return rows


def retained(table: ScoreTable, kept: Kept) -> float:
    """The share of a task's normalised importance that a set of kept units keeps."""
    norm = normalised(table)
    return sum(norm["heads"][u] for u in kept.heads) + sum(norm["ffn"][u] for u in kept.ffn)
