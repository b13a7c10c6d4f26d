"""Measured forward latency of several models, side by side.

Timing on a shared machine drifts (frequency scaling, other processes), so the models
are measured interleaved: every repeat runs each model once, alternating the order
(A B, B A, ...) so that neither model always runs first or always runs hot. Each model
gets warm-up runs first (allocator, oneDNN kernel selection). The summary is the median
with the quartiles and min/max; the speedup is the ratio of the medians.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass

import torch
from torch import nn

from headprune_cli.errors import UsageError
from headprune_cli.model.layout import info_of


@dataclass
class Latency:
    median_ms: float
    q1_ms: float
    q3_ms: float
    min_ms: float
    max_ms: float
    runs: int

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(samples_ms: list[float]) -> Latency:
    ordered = sorted(samples_ms)
    if len(ordered) >= 2:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        q1 = q3 = ordered[0]
    return Latency(
        median_ms=statistics.median(ordered),
        q1_ms=q1,
        q3_ms=q3,
        min_ms=ordered[0],
        max_ms=ordered[-1],
        runs=len(ordered),
    )


def max_sequence(model: nn.Module) -> int | None:
    from headprune_cli.data import position_limit

    return position_limit(model)


def synthetic_inputs(model: nn.Module, batch: int, seq_len: int, seed: int = 0) -> tuple[dict, int]:
    """Random inputs of the stated shape (timing does not depend on token values).

    Returns the inputs and the sequence length actually used: a ViT's length is fixed
    by its image size (patches + [CLS]), whatever was asked.
    """
    config = info_of(model).config
    gen = torch.Generator().manual_seed(seed)
    dtype = next(model.parameters()).dtype
    if config.get("model_type") == "vit":
        size, patch, channels = config.get("image_size", 224), config.get("patch_size", 16), config.get("num_channels", 3)
        pixels = torch.randn(batch, channels, size, size, generator=gen).to(dtype)
        return {"pixel_values": pixels}, (size // patch) ** 2 + 1
    limit = max_sequence(model)
    if limit is not None and seq_len > limit:
        raise UsageError(f"--seq-len {seq_len} exceeds the model's maximum of {limit} positions")
    vocab = int(config.get("vocab_size", 2))
    ids = torch.randint(min(3, vocab - 1), vocab, (batch, seq_len), generator=gen)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if info_of(model).task == "causal-lm":
        inputs["use_cache"] = False  # a KV cache is not part of a single forward's cost
    return inputs, seq_len


def _time_once(model: nn.Module, inputs: dict, clock: Callable[[], float]) -> float:
    start = clock()
    model(**inputs)
    return (clock() - start) * 1000.0


def measure(
    models: Mapping[str, nn.Module],
    inputs: Mapping[str, dict],
    repeats: int = 10,
    warmup: int = 2,
    threads: int | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Latency]:
    """Median-and-spread latency (ms per forward) of each model, measured interleaved.

    `clock` (seconds) is there so tests can check the arithmetic with a fake one."""
    names = list(models)
    samples: dict[str, list[float]] = {name: [] for name in names}
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            for name in names:
                for _ in range(warmup):
                    _time_once(models[name], inputs[name], clock)
            for repeat in range(repeats):
                order = names if repeat % 2 == 0 else names[::-1]
                for name in order:
                    samples[name].append(_time_once(models[name], inputs[name], clock))
    finally:
        torch.set_num_threads(previous)
    return {name: summarize(samples[name]) for name in names}
