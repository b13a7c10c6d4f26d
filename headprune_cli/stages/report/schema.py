"""The `report` artifact: baseline vs pruned quality, cost, measured speed, gates.

Registered with schema.register_kind on import, so `read_artifact(path, ("report",))`
validates it like scores and plans. Everything measured with a clock is under
`measured`; the rest is a deterministic function of the inputs.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from headprune_cli.stages.report.latency import Latency  # the dataclass latency.py fills is the schema too
from headprune_cli.schema import Envelope, register_kind


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Metric(_Strict):
    name: str
    value: float
    higher_is_better: bool


class MainMetric(_Strict):
    name: str
    higher_is_better: bool
    baseline: float
    pruned: float
    drop: float
    unit: str
    rel_drop: float


class ModelFacts(_Strict):
    path: str
    sha256: str
    family: str
    architecture: str
    layers: int
    original_layers: int
    heads: int
    original_heads: int
    params: int
    flops_per_token: float


class Cost(_Strict):
    seq_len: int
    params_ratio: float
    flops_ratio: float
    predicted_speedup: float


class Measured(_Strict):
    batch: int
    seq_len: int
    threads: int
    repeats: int
    warmup: int
    order: str
    latency_ms: dict[Literal["baseline", "pruned"], Latency]
    speedup: float
    speedup_vs_predicted: float


class HeadMapRow(_Strict):
    layer: int
    num_heads: int
    baseline: list[int]
    kept: list[int]
    removed: list[int]
    layer_removed: bool
    scores: dict[int, float] | None


class Lineage(_Strict):
    descendant: bool
    how: str


class Gate(_Strict):
    name: str
    description: str
    threshold: float
    value: float  # min-speedup reads the measured speedup: the one gate that varies run to run
    passed: bool


class Report(Envelope):
    kind: Literal["report"]
    task: str
    objective: str
    models: dict[Literal["baseline", "pruned"], ModelFacts]
    metrics: dict[Literal["baseline", "pruned"], list[Metric]]
    main_metric: MainMetric
    cost: Cost
    measured: Measured | None
    head_map: list[HeadMapRow]
    lineage: Lineage
    warnings: list[str]
    gates: list[Gate]
    verdict: Literal["pass", "fail", "no-gates"]


class SweepRow(_Strict):
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


class SweepBest(_Strict):
    ratio: float
    heads_removed: int
    fraction_removed: float
    main: float
    drop: float
    predicted_speedup: float


class SweepMain(_Strict):
    name: str
    higher_is_better: bool
    baseline: float
    unit: str


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


register_kind("report", Report)
register_kind("sweep", Sweep)
