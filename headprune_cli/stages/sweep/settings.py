"""What a sweep runs: the methods and head ratios, or the FLOPs budgets and routes, and how
each point is cut and judged. The `sweep` stage's options are these plus its files
(stage.py); `run_sweep` (loop.py) receives the options object itself. No torch here.
"""

from __future__ import annotations

from headprune_cli.stages.options import BatchSize, Names, Samples, Schedule, SeedOptions, TokenOptions
from headprune_cli.stages.unit import option

DEFAULT_RATIOS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
ROUTE_NAMES = ("heads", "heads+ffn", "heads+ffn+layers")  # loop.ROUTES says what each may remove
# The artifact's `config`, in the order sweeps have always recorded it (so that its bytes stay);
# `targets` is --target-flops. A ratio sweep records no budget keys, a budget sweep no ratios.
CONFIG_KEYS = (
    "methods",
    "ratios",
    "compensate",
    "max_drop",
    "batch_size",
    "max_length",
    "samples",
    "seed",
    "targets",
    "routes",
    "repeats",
)
BUDGET_KEYS = ("targets", "routes", "repeats")


class SweepSettings(SeedOptions, TokenOptions):
    methods: Names = option(
        ["taylor", "gradient", "random"], "Comma-separated importance methods, e.g. taylor,gradient,random."
    )
    ratios: Schedule = option(list(DEFAULT_RATIOS), "Comma-separated fractions of heads to remove.")
    target_flops: Schedule | None = option(
        None,
        "Comma-separated fractions of the FLOPs to keep (e.g. 0.8,0.6,0.5): "
        "sweep FLOPs budgets per --routes instead of head ratios.",
    )
    routes: Names = option(
        list(ROUTE_NAMES),
        "With --target-flops: what a budget may remove, comma-separated: heads, heads+ffn, heads+ffn+layers.",
    )
    repeats: int = option(5, "With --target-flops: timed runs per model for the measured speedup (0 skips).", ge=0)
    compensate: str = option("none", "none | bias | lstsq (closed-form, on --data).")
    max_drop: float = option(1.0, "Budget: largest allowed drop of the main metric (points, or perplexity).", ge=0)
    batch_size: BatchSize = 16
    samples: Samples = None

    def recorded(self) -> dict:
        """The settings as the artifact records them: a ratio sweep's keys, or a budget sweep's."""
        budget = self.target_flops is not None
        values = {key: getattr(self, "target_flops" if key == "targets" else key) for key in CONFIG_KEYS}
        dropped = ("ratios",) if budget else BUDGET_KEYS
        return {k: v for k, v in values.items() if k not in dropped}
