"""The `tasks` artifact's payload, from the plans and the cross-task comparison."""

from __future__ import annotations

from headprune_cli.stages.budget import Budget
from headprune_cli.stages.select.plan import selection_of
from headprune_cli.stages.tasks.base import Base
from headprune_cli.stages.tasks.compare import Kept, Unit, jaccard, kept_by, overlap, pairs, retained
from headprune_cli.stages.tasks.plans import SHARED_RULE, TaskPlans
from headprune_cli.stages.tasks.scoring import TaskScores


def head_names(units) -> list[str]:
    return [f"{layer}:{head}" for layer, head in sorted(units)]


def per_layer(units, layers: list[int]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {str(layer): [] for layer in layers}
    for layer, index in sorted(units):
        out[str(layer)].append(index)
    return out


def flops_kept(plan: dict) -> float | None:
    predicted = plan.get("predicted") or {}
    if "before" not in predicted:
        return None
    return predicted["after"]["flops_per_token"] / predicted["before"]["flops_per_token"]


def _kept_view(kept: Kept, layers: list[int]) -> dict:
    return {
        "heads": per_layer(kept.heads, layers),
        "heads_kept": len(kept.heads),
        "ffn_kept": len(kept.ffn),
        "ffn_per_layer": {k: len(v) for k, v in per_layer(kept.ffn, layers).items()},
    }


def build(scored: list[TaskScores], plans: dict[str, TaskPlans], base: Base, budget: Budget, files: dict) -> dict:
    names = [s.spec.name for s in scored]
    layers = sorted(plans[names[0]].table.heads)
    own = {n: kept_by(plans[n].table, selection_of(plans[n].own)) for n in names}
    shared = kept_by(plans[names[0]].table, selection_of(plans[names[0]].shared))
    both = overlap(own)
    tasks = []
    for s in scored:
        n, table = s.spec.name, plans[s.spec.name].table
        tasks.append(
            {
                "name": n,
                "model": str(s.spec.model),
                "objective": s.artifact.objective,
                "method": s.artifact.method,
                "samples": s.artifact.samples,
                "own": {
                    **_kept_view(own[n], layers),
                    "flops_kept": flops_kept(plans[n].own),
                    "importance_kept": retained(table, own[n]),
                },
                "shared": {
                    "flops_kept": flops_kept(plans[n].shared),
                    "importance_kept": retained(table, shared),
                    "jaccard_heads_with_own": jaccard(own[n].heads, shared.heads),
                    "jaccard_ffn_with_own": jaccard(own[n].ffn, shared.ffn),
                },
            }
        )
    return {
        "base": {"sha256": base.sha256, "how": base.how},
        "budget": {"kind": budget.kind, "value": budget.value, "option": budget.option},
        "tasks": tasks,
        "heads": _overlap_view(both["heads"], head_names),
        "ffn": _overlap_view(both["ffn"], lambda units: per_layer(units, layers)),
        "pairs": pairs({n: plans[n].table for n in names}, own),
        "shared": {"rule": SHARED_RULE, "strategy": plans[names[0]].shared["strategy"], **_kept_view(shared, layers)},
        "files": files,
    }


def _overlap_view(found: dict, spell) -> dict:
    every: set[Unit] = found["every"]
    only: dict[str, set[Unit]] = found["only"]
    return {
        "every": spell(every),
        "every_count": len(every),
        "only": {name: spell(units) for name, units in only.items()},
        "only_count": {name: len(units) for name, units in only.items()},
    }
