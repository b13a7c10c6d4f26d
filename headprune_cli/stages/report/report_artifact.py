"""The `report` artifact: baseline vs pruned quality, cost, measured speed, gates.

Listed in artifacts.schema's table of kinds, so `read_artifact(path, ("report",))`
validates it like scores and plans. Everything measured with a clock is under
`measured`; the rest is a deterministic function of the inputs.

Versioning: fields are only ever added, as optional fields with a null default, and
schema_version stays 1 while that holds. `kv_cache`, `cost.decode` and `measured.decode`
(causal-LM serving, report.serving), and `shipped` (`report --onnx`, report.shipped) came
that way: reports written before them still read. A reader older than a field refuses a
report that has it (every model forbids unknown fields), naming the field, instead of
silently dropping it. A change that renames, removes or retypes a field bumps schema_version.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from headprune_cli.artifacts.schema import Envelope
from headprune_cli.stages.timing import Latency  # the dataclass latency.py fills is the schema too


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Metric(Strict):
    name: str
    value: float
    higher_is_better: bool


class MainMetric(Strict):
    name: str
    higher_is_better: bool
    baseline: float
    pruned: float
    drop: float
    unit: str
    rel_drop: float


class ModelFacts(Strict):
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


class DecodeSide(Strict):
    prefill_flops: float  # one sequence's prompt; the output head once
    flops_per_token: float  # per generated token, at the mean decode context
    weight_bytes_per_step: int
    kv_bytes_per_token: float  # KV-cache bytes one generated token reads
    bytes_per_token: float  # weight bytes / batch + kv_bytes_per_token


class DecodeCost(Strict):
    batch: int
    prompt: int
    tokens: int
    model: str  # what the predictions are ratios of
    baseline: DecodeSide
    pruned: DecodeSide
    predicted_prefill_speedup: float
    predicted_decode_speedup: float
    decode_flops_speedup: float  # what FLOPs alone would predict for decode


class LatencyCost(Strict):
    """`report --latency`: the latency table's prediction beside the measured speedup."""

    table: str
    sha256: str
    device: str  # where the table was profiled
    comparable: bool  # False: profiled in another setting (`reason`), nothing compared
    reason: str | None = None
    predicted_ms: dict[Literal["baseline", "pruned"], float] | None = None
    predicted_speedup: float | None = None
    flops_predicted_speedup: float | None = None
    measured_speedup: float | None = None
    latency_error: float | None = None  # predicted / measured speedup - 1
    flops_error: float | None = None


class Cost(Strict):
    seq_len: int
    params_ratio: float
    flops_ratio: float
    predicted_speedup: float
    decode: DecodeCost | None = None  # causal LMs with decode on
    latency: LatencyCost | None = None  # with a latency table (`report --latency`)


class KvSide(Strict):
    per_layer: dict[int, int]  # original layer index -> bytes per token
    total: int


class KvCache(Strict):
    dtype: str
    baseline: KvSide
    pruned: KvSide
    ratio: float
    reduction: float


class MeasuredDecode(Strict):
    batch: int
    prompt: int
    tokens: int
    threads: int
    repeats: int
    warmup: int
    order: str
    prefill_ms: dict[Literal["baseline", "pruned"], Latency]
    decode_ms: dict[Literal["baseline", "pruned"], Latency]  # all `tokens` steps of one run
    decode_tokens_per_s: dict[Literal["baseline", "pruned"], float]
    prefill_speedup: float
    decode_speedup: float
    prefill_vs_predicted: float
    decode_vs_predicted: float


class Measured(Strict):
    batch: int
    seq_len: int
    threads: int
    repeats: int
    warmup: int
    order: str
    latency_ms: dict[Literal["baseline", "pruned"], Latency]
    speedup: float
    speedup_vs_predicted: float
    decode: MeasuredDecode | None = None


class HeadMapRow(Strict):
    layer: int
    num_heads: int
    baseline: list[int]
    kept: list[int]
    removed: list[int]
    layer_removed: bool
    scores: dict[int, float] | None
    ffn: dict[str, int] | None = None  # {"kept", "of"}: FFN neurons kept of the original width, when the FFN was cut


class Lineage(Strict):
    descendant: bool
    how: str


class Gate(Strict):
    name: str
    description: str
    threshold: float
    value: float  # min-speedup reads the measured speedup: the one gate that varies run to run
    passed: bool


class Shipped(Strict):
    """`report --onnx FILE` / `--gguf FILE`: the file that ran for the pruned side (metrics, latency, gates)."""

    path: str
    sha256: str
    engine: str  # onnxruntime or llama.cpp
    engine_version: str
    quantization: str | None  # from the file's metadata (export --quantize); None: not quantized by headprune
    source_checked: bool  # the file names the --model checkpoint's sha256 (export --quantize writes it)
    bytes: int  # the file (and its external data)
    checkpoint_metrics: list[Metric]  # the --model checkpoint in PyTorch on the same data: the cut alone
    # `report --gguf` only: llama.cpp's architecture, its KV cache type, and how closely its logits
    # on a probe row follow --model's (a GGUF file names no checkpoint; this stands in).
    architecture: str | None = None
    kv_cache: str | None = None
    probe_correlation: float | None = None


class Report(Envelope):
    kind: Literal["report"]
    task: str
    objective: str
    models: dict[Literal["baseline", "pruned"], ModelFacts]
    metrics: dict[Literal["baseline", "pruned"], list[Metric]]
    main_metric: MainMetric
    cost: Cost
    kv_cache: KvCache | None = None  # causal LMs only
    measured: Measured | None
    head_map: list[HeadMapRow]
    lineage: Lineage
    shipped: Shipped | None = None  # `report --onnx`: the engine run that stands for the pruned model
    warnings: list[str]
    gates: list[Gate]
    verdict: Literal["pass", "fail", "no-gates"]
