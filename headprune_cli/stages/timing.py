"""The timing harness: torch.utils.benchmark's Timer, run interleaved over many callables.

Timer handles what hand timing gets wrong: it runs under a fixed thread count, and its
clock synchronises the accelerator before every reading, so a CUDA kernel is timed to its
end, not its launch. On a shared machine timings drift (frequency scaling, other
processes), so callables are measured in rounds: every round times each callable once
(`blocked_autorange`, blocks of calls until `min_run_time` has passed) in alternating
order (A B C, C B A, ...), so that none always runs first or hot. Warm-up calls come first
(allocator, oneDNN and cuBLAS kernel choice). The summary per callable is the median of
its round medians, with quartiles and extremes.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Hashable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

Key = TypeVar("Key", bound=Hashable)  # what names a callable: the results are keyed the same way


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

    def spread(self) -> dict:
        """The three numbers a latency table keeps per point: median and interquartile range."""
        return {"median_ms": self.median_ms, "q1_ms": self.q1_ms, "q3_ms": self.q3_ms}


def summarize(samples_ms: list[float]) -> Latency:
    ordered = sorted(samples_ms)
    if len(ordered) >= 2:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        q1 = q3 = ordered[0]
    return Latency(statistics.median(ordered), q1, q3, ordered[0], ordered[-1], len(ordered))


def alternating(keys: list, rounds: int):
    """The order of each round: as given, reversed, as given, ..."""
    for r in range(rounds):
        yield keys if r % 2 == 0 else keys[::-1]


def make_timer(fn: Callable[[], object], threads: int | None):
    """The one place a Timer is made (tests replace it: the boundary to the clock)."""
    from torch.utils import benchmark  # noqa: PLC0415 (keeps torch out of this module's import)

    kwargs: dict[str, Any] = {"num_threads": threads} if threads is not None else {}  # else Timer's default
    return benchmark.Timer(stmt="fn()", globals={"fn": fn}, **kwargs)


def measure_interleaved(calls: Mapping[Key, Callable[[], object]], *settings, **named) -> dict[Key, Latency]:
    """Milliseconds per call of each callable (median over the interleaved rounds, with its
    spread); the arguments are interleaved_samples'."""
    return {key: summarize(values) for key, values in interleaved_samples(calls, *settings, **named).items()}


def interleaved_samples(
    calls: Mapping[Key, Callable[[], object]],
    rounds: int = 5,
    warmup: int = 2,
    threads: int | None = None,
    min_run_time: float = 0.05,
    advance: Callable[[], None] = lambda: None,
) -> dict[Key, list[float]]:
    """Each callable's round medians in milliseconds, one per round (`rounds` interleaved rounds
    after `warmup` calls each). `advance` is called after every timed measurement (a progress
    bar's tick)."""
    import torch  # noqa: PLC0415 (keeps torch out of this module's import)

    timers = {key: make_timer(fn, threads) for key, fn in calls.items()}
    samples: dict[Key, list[float]] = {key: [] for key in calls}
    keys = list(calls)
    with torch.inference_mode():
        for key in keys:
            if warmup:
                timers[key].timeit(warmup)
        for order in alternating(keys, rounds):
            for key in order:
                samples[key].append(timers[key].blocked_autorange(min_run_time=min_run_time).median * 1000.0)
                advance()
    return samples
