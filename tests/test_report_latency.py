"""latency.measure: warm-up, interleaved alternating order, median and spread."""

import time

import pytest
import torch
from torch import nn

from headprune_cli.stages.report.latency import measure, summarize, synthetic_inputs

from .conftest import TINY


class Recorder(nn.Module):
    def __init__(self, name, log, sleep_s=0.0):
        super().__init__()
        self.name, self.log, self.sleep_s = name, log, sleep_s

    def forward(self, **_):
        self.log.append(self.name)
        time.sleep(self.sleep_s)


def test_summary_statistics():
    lat = summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (lat.median_ms, lat.q1_ms, lat.q3_ms, lat.min_ms, lat.max_ms, lat.runs) == (3.0, 2.0, 4.0, 1.0, 5.0, 5)


def test_models_are_warmed_up_then_timed_interleaved_in_alternating_order():
    log = []
    models = {"a": Recorder("a", log), "b": Recorder("b", log)}
    timed = measure(models, {"a": {}, "b": {}}, repeats=4, warmup=1, threads=1)
    assert log == ["a", "b", "a", "b", "b", "a", "a", "b", "b", "a"]
    assert timed["a"].runs == timed["b"].runs == 4


def test_thread_count_is_restored_and_a_slower_model_measures_slower():
    before = torch.get_num_threads()
    log = []
    timed = measure({"slow": Recorder("s", log, 0.008), "fast": Recorder("f", log, 0.002)}, {"slow": {}, "fast": {}}, repeats=5, warmup=0, threads=1)
    assert torch.get_num_threads() == before
    assert timed["slow"].median_ms / timed["fast"].median_ms == pytest.approx(4, rel=0.5)


def test_synthetic_inputs_have_the_stated_shape():
    inputs, seq = synthetic_inputs(TINY["bert"](), 3, 9)
    assert inputs["input_ids"].shape == (3, 9) and seq == 9
    inputs, seq = synthetic_inputs(TINY["vit"](), 2, 100)
    assert inputs["pixel_values"].shape == (2, 3, 16, 16) and seq == 5  # patches + [CLS]
    inputs, _ = synthetic_inputs(TINY["gpt2"](), 1, 4)
    assert inputs["use_cache"] is False
