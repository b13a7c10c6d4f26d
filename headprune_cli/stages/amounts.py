"""The amount a selection spends, checked from the options alone (no scores, no table read):
the ranges of --ratio and the cost targets, and the latency options' pairing.

`select`, `prune --scores` and `search` call these from their options' `check()`, which
their `run` calls first and `headprune run` calls for every stage before the first runs
(pipeline/prepare.py), so a bad amount in the last stage costs nothing. The messages are
the ones the selection itself gives (stages/selection.py, stages/latency_select.py).
"""

from __future__ import annotations

import math

from headprune_cli.errors import UsageError

LATENCY_PHASES = ("forward", "decode")


def check_fractions(ratio: float | None, target_params: float | None, target_flops: float | None) -> None:
    """--ratio within [0, 1]; --target-params and --target-flops within (0, 1]."""
    if ratio is not None and not (math.isfinite(ratio) and 0 <= ratio <= 1):
        raise UsageError(f"--ratio {ratio} is outside [0, 1] (the fraction of kept heads to remove)")
    for value in (target_params, target_flops):
        if value is not None and not (math.isfinite(value) and 0 < value <= 1):
            raise UsageError(f"target {value} is outside (0, 1] (the fraction of the cost to keep)")


def check_latency_options(opts) -> None:
    """A latency budget needs a table and exactly one of --target-latency / --target-ms, in
    range, and no other amount (a SelectionOptions)."""
    from headprune_cli.stages.latency_select import check_amounts

    asked = (
        opts.latency is not None
        or opts.target_latency is not None
        or opts.target_ms is not None
        or opts.latency_phase != "forward"
    )
    if not asked:
        return
    if opts.latency_phase not in LATENCY_PHASES:
        raise UsageError(f"--latency-phase {opts.latency_phase!r}: expected forward or decode")
    if opts.latency is None:
        raise UsageError(
            "--target-latency/--target-ms price the budget by a latency table: give --latency TABLE from `headprune profile`"
        )
    others = {
        "--ratio": opts.ratio,
        "--threshold": opts.threshold,
        "--target-params": opts.target_params,
        "--target-flops": opts.target_flops,
    }
    check_amounts(opts.target_latency, opts.target_ms, others)
