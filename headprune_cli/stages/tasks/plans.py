"""Per-task plans and the shared plan, all under one budget and one set of constraints.

A task's own plan is exactly what `headprune select` chooses from its scores. The shared
plan is chosen once, from the mean of the tasks' normalised importance (compare.py), and
written once per task as a plan of that task's model (the same units removed, priced by
that model's own cost table), so `headprune prune --plan` cuts every task the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from headprune_cli.model.cost_table import predict
from headprune_cli.stages.budget import Budget
from headprune_cli.stages.constraints import Constraints
from headprune_cli.stages.score.table import ScoreTable
from headprune_cli.stages.select.chains import Selection
from headprune_cli.stages.select.choosing import SelectionOptions, plan_from_scores
from headprune_cli.stages.select.plan import make_plan
from headprune_cli.stages.select.strategies import select as choose
from headprune_cli.stages.tasks.compare import check_same_units, shared_table
from headprune_cli.stages.tasks.scoring import TaskScores

SHARED_RULE = "mean of the tasks' importance, each normalised to sum 1 over heads and FFN neurons"


@dataclass
class TaskPlans:
    table: ScoreTable
    own: dict  # the task's own plan artifact
    shared: dict  # the shared plan, as a plan of this task's model


def shared_selection(tables: list[ScoreTable], opts: SelectionOptions, budget: Budget) -> Selection:
    return choose(shared_table(tables), opts.strategy, budget=budget, constraints=opts.constraints())


def priced_for(table: ScoreTable, shared: Selection) -> Selection:
    """The shared selection with this task's own cost prediction."""
    if table.cost is None:
        return Selection(
            shared.strategy, shared.remove_heads, shared.remove_layers, shared.predicted, shared.remove_ffn
        )
    before = predict(table.cost, table.kept())
    after = predict(table.cost, table.kept(), shared.remove_heads, shared.remove_layers, shared.remove_ffn)
    return Selection(
        f"shared-{shared.strategy}",
        shared.remove_heads,
        shared.remove_layers,
        {"before": before, "after": after},
        shared.remove_ffn,
    )


def all_plans(scored: list[TaskScores], opts: SelectionOptions, budget: Budget) -> dict[str, TaskPlans]:
    tables = {s.spec.name: ScoreTable.from_scores(s.artifact) for s in scored}
    check_same_units(tables)  # one plan must name the same units in every task
    own = {s.spec.name: plan_from_scores(opts, s.path, scores=s.artifact, scores_sha=s.sha256) for s in scored}
    shared = shared_selection(list(tables.values()), opts, budget)
    constraints: Constraints = opts.constraints()
    out = {}
    for s in scored:
        name = s.spec.name
        config = {**own[name]["config"], "strategy": f"shared-{shared.strategy}", "shared": SHARED_RULE}
        config["tasks"] = [t.spec.name for t in scored]
        plan = make_plan(priced_for(tables[name], shared), constraints, s.artifact, s.path, s.sha256, config)
        out[name] = TaskPlans(tables[name], own[name], plan)
    return out
