"""The `sweep` artifact: per method and ratio (or per route and FLOPs target), the pruned
model's quality and cost against the baseline, and the best row within the budget.

`rows` and `best` hold the points of either kind: SweepRow / SweepBest (head ratios, best per
method) or BudgetRow / BudgetBest (FLOPs targets, best per route; `budget` then names the
routes). Budget sweeps written before the one sweep loop kept their rows and best inside
`budget` and left `rows` and `best` empty; they still read.

Listed in artifacts.schema's table of kinds, so `read_artifact(path, ("sweep",))` validates
it. Its metric rows are the report's (report_artifact.Metric); fields are only ever added,
as the report's are.
"""

from __future__ import annotations

from typing import Literal

from headprune_cli.artifacts.schema import Envelope
from headprune_cli.stages.report.report_artifact import Metric, Strict


class SweepRow(Strict):
    method: str
    ratio: float
    heads_removed: int
    fraction_removed: float
    metrics: list[Metric]
    main: float
    drop: float
    rel_drop: float
    params: int
    flops_per_token: float
    predicted_speedup: float
    within_budget: bool


class SweepBest(Strict):
    ratio: float
    heads_removed: int
    fraction_removed: float
    main: float
    drop: float
    predicted_speedup: float


class SweepMain(Strict):
    name: str
    higher_is_better: bool
    baseline: float
    unit: str


class BudgetBest(Strict):
    method: str
    target_flops: float
    flops_kept: float
    main: float
    drop: float
    predicted_speedup: float
    measured_speedup: float | None


class BudgetRow(BudgetBest):
    route: str
    metrics: list[Metric]
    rel_drop: float
    params: int
    flops_per_token: float
    within_budget: bool


class BudgetSweep(Strict):
    routes: list[str]
    # Where budget sweeps kept their points before `rows` and `best` held them: read, not written.
    rows: list[BudgetRow] | None = None
    best: dict[str, BudgetBest | None] | None = None


class Sweep(Envelope):
    kind: Literal["sweep"]
    task: str
    objective: str
    main_metric: SweepMain
    baseline_metrics: list[Metric]
    total_heads: int
    max_drop: float
    rows: list[SweepRow] | list[BudgetRow]
    # method -> largest ratio within the budget, or (a FLOPs sweep) route -> fewest FLOPs kept within it
    best: dict[str, SweepBest | None] | dict[str, BudgetBest | None]
    budget: BudgetSweep | None = None  # `sweep --target-flops`: the routes
