"""latency.measure: warm-up, interleaved alternating order, median and spread.

Timed with a fake clock that each model advances by a known cost, so the arithmetic is
checked exactly and nothing depends on the machine's load; how well real measurements
track real costs is a benchmark (scripts/benchmarks/speed.py, BENCHMARKS.md), not a test.
"""

import pytest
import torch
from torch import nn

from headprune_cli.stages.model_latency import measure, synthetic_inputs
from headprune_cli.stages.timing import summarize
from tests.support import TINY


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Recorder(nn.Module):
    """Logs its calls and advances the fake clock by its cost (ms); costs cycle."""

    def __init__(self, name, log, clock=None, costs_ms=(0.0,)):
        super().__init__()
        self.name, self.log, self.clock, self.costs_ms = name, log, clock, costs_ms

    def forward(self, **_):
        if self.clock is not None:
            self.clock.now += self.costs_ms[len([n for n in self.log if n == self.name]) % len(self.costs_ms)] / 1000.0
        self.log.append(self.name)


def test_summary_statistics():
    lat = summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (lat.median_ms, lat.q1_ms, lat.q3_ms, lat.min_ms, lat.max_ms, lat.runs) == (3.0, 2.0, 4.0, 1.0, 5.0, 5)


def test_models_are_warmed_up_then_timed_interleaved_in_alternating_order():
    log = []
    models = {"a": Recorder("a", log), "b": Recorder("b", log)}
    timed = measure(models, {"a": {}, "b": {}}, repeats=4, warmup=1, threads=1)
    assert log == ["a", "b", "a", "b", "b", "a", "a", "b", "b", "a"]
    assert timed["a"].runs == timed["b"].runs == 4


def test_each_model_is_timed_alone_and_warmup_runs_are_not_counted():
    clock, log = FakeClock(), []
    # The slow model's first call (warm-up) costs 1000 ms: it must not reach the summary.
    slow = Recorder("s", log, clock, costs_ms=(1000.0, 8.0, 8.0, 9.0, 7.0, 8.0, 30.0))
    fast = Recorder("f", log, clock, costs_ms=(2.0, 2.0, 1.0, 3.0, 2.0, 2.0, 2.0))
    before = torch.get_num_threads()
    timed = measure({"slow": slow, "fast": fast}, {"slow": {}, "fast": {}}, repeats=6, warmup=1, threads=1, clock=clock)
    assert torch.get_num_threads() == before
    assert [round(x, 6) for x in (timed["slow"].median_ms, timed["slow"].min_ms, timed["slow"].max_ms)] == [
        8.0,
        7.0,
        30.0,
    ]
    assert [round(x, 6) for x in (timed["fast"].median_ms, timed["fast"].min_ms, timed["fast"].max_ms)] == [
        2.0,
        1.0,
        3.0,
    ]
    assert timed["slow"].runs == timed["fast"].runs == 6


def test_thread_count_is_restored_when_a_model_fails():
    class Broken(nn.Module):
        def forward(self, **_):
            raise RuntimeError("boom")

    before = torch.get_num_threads()
    with pytest.raises(RuntimeError, match="boom"):
        measure({"x": Broken()}, {"x": {}}, repeats=1, warmup=0, threads=before + 1)
    assert torch.get_num_threads() == before


def test_synthetic_inputs_have_the_stated_shape():
    inputs, seq = synthetic_inputs(TINY["bert"](), 3, 9)
    assert inputs["input_ids"].shape == (3, 9) and seq == 9
    inputs, seq = synthetic_inputs(TINY["vit"](), 2, 100)
    assert inputs["pixel_values"].shape == (2, 3, 16, 16) and seq == 5  # patches + [CLS]
    inputs, _ = synthetic_inputs(TINY["gpt2"](), 1, 4)
    assert inputs["use_cache"] is False
