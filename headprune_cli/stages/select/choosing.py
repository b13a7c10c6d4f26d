"""How a plan is chosen from scores: the selection options (the amount and the constraints)
and `plan_from_scores`. select, prune (which selects in place from scores) and tasks (a plan per
task) share them, so all three spell, default and check the selection the same way; a library
module of select's, so no stage imports select's entry file.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from headprune_cli.artifacts.schema import input_ref, read_artifact
from headprune_cli.errors import UsageError
from headprune_cli.stages.budget import Budget, block_params
from headprune_cli.stages.constraints import parse_protect
from headprune_cli.stages.options import BudgetOptions, ConstraintOptions, SeedOptions
from headprune_cli.stages.score.table import ScoreTable
from headprune_cli.stages.select import latency as latency_select
from headprune_cli.stages.select.amounts import check_latency_options
from headprune_cli.stages.select.chains import parse_threshold
from headprune_cli.stages.select.plan import make_plan
from headprune_cli.stages.select.runtime import check_serves
from headprune_cli.stages.select.strategies import select as choose
from headprune_cli.stages.unit import option


class SelectionOptions(BudgetOptions, SeedOptions, ConstraintOptions):
    """How to choose from scores: the amount (one of ratio, threshold, targets) and the constraints."""

    strategy: str | None = option(
        None,
        "global | layer | threshold | budget | joint | random (default: from the amount given; "
        "a --target-* with loss-scale layer scores is joint; random: a seeded control, --ratio only).",
    )
    drop_layers: int = option(0, "Also drop the N least important layers (needs layer scores).", ge=0)
    layer_threshold: float | None = option(None, "Also drop layers scoring below T.")
    threshold: str | None = option(None, "Remove heads scoring below T, or below the P-th percentile ('25%').")
    latency: str | None = option(
        None,
        "Latency table from `headprune profile`: price the budget in measured milliseconds (with "
        "--target-latency or --target-ms).",
    )
    target_latency: float | None = option(None, "With --latency: keep this fraction of the profiled latency.")
    target_ms: float | None = option(None, "With --latency: keep the predicted latency at most this many milliseconds.")
    latency_phase: str = option(
        "forward",
        "With --latency: price by the table's 'forward' profile, "
        "or its 'decode' one (causal LMs profiled with --context).",
    )

    def budget(self) -> Budget | None:
        """The one cost or head budget these options name (None with --threshold or none).
        Latency budgets are priced by their table (`_latency_plan`)."""
        found = self.budgets()
        if len(found) > 1 or (found and self.threshold is not None):
            raise UsageError(
                "give exactly one of --ratio, --threshold, --target-params, --target-flops, --target-block-params"
            )
        return found[0] if found else None

    def check(self) -> None:
        """Refusals that need no file: the amount's range and the latency options' pairing."""

        self.budget()
        check_latency_options(self)

    def selection_given(self) -> list[str]:
        """The selection options set to other than their defaults."""
        return [
            name
            for name in SelectionOptions.model_fields
            if getattr(self, name) != SelectionOptions.model_fields[name].default
        ]


def plan_from_scores(opts: SelectionOptions, source: str, scores=None, scores_sha: str | None = None) -> dict:
    """The plan artifact chosen from scores (read from `source` unless given parsed)."""
    if scores is None:
        scores, scores_sha = read_artifact(source, ("scores",))
    check_serves(opts.runtime, scores, source)
    constraints = opts.constraints()
    latency = check_latency_options(opts)
    if latency is not None:
        return _latency_plan(opts, latency, scores, str(source), scores_sha, constraints)
    selection = choose(
        ScoreTable.from_scores(scores),
        opts.strategy,
        budget=opts.budget(),
        threshold=opts.threshold,
        constraints=constraints,
        seed=opts.seed,
    )
    return make_plan(
        selection, constraints, scores, str(source), scores_sha, _config(opts, selection, constraints, scores)
    )


def _config(opts: SelectionOptions, selection, constraints, scores, **latency) -> dict:
    return {
        "strategy": selection.strategy,
        "ratio": opts.ratio,
        "threshold": opts.threshold,
        "target_params": opts.target_params,
        "target_flops": opts.target_flops,
        **block_params(opts.target_block_params),
        **latency,
        **constraints.to_dict(ffn=getattr(scores, "ffn", None) is not None),
        **({"seed": opts.seed} if selection.strategy == "random" else {}),
    }


def _latency_plan(
    opts: SelectionOptions, latency: Budget, scores, source: str, scores_sha: str | None, constraints
) -> dict:
    """A plan under a latency budget (latency.py), checked by check_latency_options."""
    assert opts.latency is not None  # check_latency_options gives a budget only with a table
    table, table_sha = latency_select.read_latency(opts.latency, scores, opts.latency_phase)
    budget = latency_select.LatencyBudget(table, latency)
    pick = lambda t, strategy, flops, c: choose(t, strategy, budget=flops, constraints=c)  # noqa: E731
    selection, record = latency_select.select_by_latency(
        ScoreTable.from_scores(scores), opts.strategy, budget, constraints, pick
    )
    config = _config(
        opts,
        selection,
        constraints,
        scores,
        target_latency=opts.target_latency,
        target_ms=opts.target_ms,
        latency_phase=opts.latency_phase,
    )
    plan = make_plan(selection, constraints, scores, source, scores_sha, config, latency=record)
    plan["inputs"].append(input_ref("latency", opts.latency, table_sha))
    return plan


def _check_protect(value: Any) -> None:
    parse_protect(str(value))


def _check_threshold(value: Any) -> None:
    parse_threshold(str(value))


# The selection options' values as select (and prune, which selects in place) parses them.
SELECTION_CHECKS: dict[str, Callable[[Any], None]] = {"protect": _check_protect, "threshold": _check_threshold}
