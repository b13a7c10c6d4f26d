"""The `sweep` artifact: per method and ratio (or per route and FLOPs target), the pruned
model's quality and cost against the baseline, and the best row within the budget.

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
    rows: list[BudgetRow]
    best: dict[str, BudgetBest | None]  # route -> fewest FLOPs kept within the budget


class Sweep(Envelope):
    kind: Literal["sweep"]
    task: str
    objective: str
    main_metric: SweepMain
    baseline_metrics: list[Metric]
    total_heads: int
    max_drop: float
    rows: list[SweepRow]
    best: dict[str, SweepBest | None]  # method -> largest ratio within the budget
    budget: BudgetSweep | None = None  # `sweep --target-flops`: rows per route instead
