"""The amount a selection spends, checked from the options alone (no scores, no table read):
the latency options' pairing (their ranges are budget.checked's, as every budget's).

`select`, `prune --scores` and `search` call these from their options' `check()`, which
their `run` calls first and `headprune run` calls for every stage before the first runs
(pipeline/prepare.py), so a bad amount in the last stage costs nothing. The messages are
the ones the selection itself gives (strategies.py, latency.py).
"""

from __future__ import annotations

from headprune_cli.errors import UsageError
from headprune_cli.stages.budget import Budget
from headprune_cli.stages.select.latency import latency_budget

LATENCY_PHASES = ("forward", "decode")


def check_latency_options(opts) -> Budget | None:
    """The latency budget the options ask for (None: they ask for none), after checking it has a
    table and exactly one of --target-latency / --target-ms, in range, and no other amount (a
    SelectionOptions)."""
    asked = (
        opts.latency is not None
        or opts.target_latency is not None
        or opts.target_ms is not None
        or opts.latency_phase != "forward"
    )
    if not asked:
        return None
    if opts.latency_phase not in LATENCY_PHASES:
        raise UsageError(f"--latency-phase {opts.latency_phase!r}: expected forward or decode")
    if opts.latency is None:
        raise UsageError(
            "--target-latency/--target-ms price the budget by a latency table: "
            "give --latency TABLE from `headprune profile`"
        )
    others = {
        "--ratio": opts.ratio,
        "--threshold": opts.threshold,
        "--target-params": opts.target_params,
        "--target-flops": opts.target_flops,
        "--target-block-params": opts.target_block_params,
    }
    return latency_budget(opts.target_latency, opts.target_ms, others)
