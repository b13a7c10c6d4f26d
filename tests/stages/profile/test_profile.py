"""`profile`: the latency artifact, its grid, layer sharing, the decode phase, and the harness.

The clock is replaced at its boundary (timing.make_timer) by MacTimer, which runs every
block variant for real and answers with its multiply-accumulates: the tests check what
was timed and how it was recorded, never how fast anything ran."""

from __future__ import annotations

import json

import pytest
import torch

from headprune_cli.artifacts.schema import read_artifact
from headprune_cli.stages import timing
from headprune_cli.stages.profile.measure import grid
from headprune_cli.stages.profile.stage import ProfileOptions
from tests.support import saved_model
from tests.support.latency import MacTimer

FAST = (
    "--points",
    "3",
    "--rounds",
    "2",
    "--warmup",
    "1",
    "--min-time",
    "0",
    "--batch-size",
    "2",
    "--seq-len",
    "8",
    "--threads",
    "1",
)


@pytest.fixture
def fake_clock(monkeypatch):
    monkeypatch.setattr(timing, "make_timer", MacTimer)
    monkeypatch.setattr(MacTimer, "noise", 0.0)
    return MacTimer


def test_grid_spans_smallest_to_full_aligned():
    assert grid(12, 5) == [1, 3, 6, 9, 12]
    assert grid(1536, 5, 8) == [8, 384, 768, 1152, 1536]
    assert grid(12, 5, 4) == [4, 8, 12]
    assert grid(10, 3, 4) == [4, 10]  # the full count is a point even off the alignment
    assert grid(4, 2) == [1, 4]


def test_profile_writes_a_table_that_reads_back(tmp_path, cli, fake_clock):
    _, path = saved_model(tmp_path, "bert")
    out = tmp_path / "latency.json"
    result = cli("profile", path, "-o", out, *FAST)
    assert result.code == 0, result.err
    table, _ = read_artifact(out, ("latency",))
    assert table.model.layers == [0, 1, 2] and table.model.heads == {0: 4, 1: 4, 2: 4}
    assert table.device.type == "cpu" and table.threads == 1 and (table.batch, table.seq_len) == (2, 8)
    assert table.torch_version == torch.__version__ and table.dtype == "float32"
    layers = table.phases["forward"].layers
    # Three identical layers: the first is timed, the others share its measurement.
    assert [layers[l].measured_as for l in (0, 1, 2)] == [0, 0, 0]
    assert [p.units for p in layers[0].attention] == [1, 2, 4] and [p.width for p in layers[0].ffn] == [8, 24, 48]
    ms = [p.median_ms for p in layers[0].attention]
    assert ms == sorted(ms) and ms[0] < ms[-1]  # more heads: more multiply-accumulates
    assert layers[0].attention[-1].median_ms == layers[0].ffn[-1].median_ms  # the full block is both grids' end
    assert table.inputs[0].role == "model"


def test_every_layer_times_each_layer(tmp_path, cli, fake_clock):
    _, path = saved_model(tmp_path, "bert")
    out = tmp_path / "latency.json"
    assert cli("profile", path, "-o", out, "--every-layer", *FAST).code == 0
    layers = json.loads(out.read_text())["phases"]["forward"]["layers"]
    assert [layers[str(l)]["measured_as"] for l in (0, 1, 2)] == [0, 1, 2]


def test_everything_but_the_measured_numbers_is_deterministic(tmp_path, cli, fake_clock, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    monkeypatch.setattr(MacTimer, "noise", 0.5)  # every measurement differs between the runs
    _, path = saved_model(tmp_path, "bert")
    texts = []
    for name in ("a.json", "b.json"):
        assert cli("profile", path, "-o", tmp_path / name, *FAST).code == 0
        texts.append(json.loads((tmp_path / name).read_text()))
    assert texts[0] != texts[1]
    assert _without_times(texts[0]) == _without_times(texts[1])


def _without_times(value):
    if isinstance(value, dict):
        return {k: _without_times(v) for k, v in value.items() if not k.endswith("_ms")}
    if isinstance(value, list):
        return [_without_times(v) for v in value]
    return value


def test_gqa_grid_counts_kv_groups_and_decode_profiles_one_token(tmp_path, cli, fake_clock):
    _, path = saved_model(tmp_path, "llama-gqa")
    out = tmp_path / "latency.json"
    assert cli("profile", path, "-o", out, "--context", "6", *FAST).code == 0, "profile failed"
    table, _ = read_artifact(out, ("latency",))
    forward, decode = table.phases["forward"], table.phases["decode"]
    assert decode.context == 6 and forward.context is None
    assert [(p.units, p.heads) for p in forward.layers[0].attention] == [(1, 4), (2, 8)]  # 2 KV groups of 4
    # One token against the cache does less work than 2 x 8 tokens of prefill.
    assert decode.layers[0].attention[-1].median_ms < forward.layers[0].attention[-1].median_ms


def test_context_on_an_encoder_is_refused(tmp_path, cli, fake_clock):
    _, path = saved_model(tmp_path, "bert")
    result = cli("profile", path, "-o", tmp_path / "t.json", "--context", "4", *FAST)
    assert result.code == 2 and "only causal LMs" in result.err and not (tmp_path / "t.json").exists()


def test_a_busy_machine_is_refused_not_written(tmp_path, cli, monkeypatch):
    """Timings where more heads are much faster than fewer, on every try: nothing is written."""

    class Backwards(MacTimer):
        def _seconds(self):
            return 1.0 / super()._seconds()

    monkeypatch.setattr(timing, "make_timer", Backwards)
    _, path = saved_model(tmp_path, "bert")
    result = cli("profile", path, "-o", tmp_path / "t.json", *FAST)
    assert result.code == 1 and "not monotone" in result.err and "too busy" in result.err
    assert not (tmp_path / "t.json").exists()


def test_harness_interleaves_rounds_and_summarises_medians():
    """The real Timer: each round times every callable once, in alternating order."""
    log = []
    calls = {name: (lambda name=name: log.append(name)) for name in "abc"}
    timed = timing.measure_interleaved(calls, rounds=3, warmup=1, threads=1, min_run_time=0.0)
    assert set(timed) == set("abc") and all(t.runs == 3 for t in timed.values())
    assert all(0 < t.q1_ms <= t.median_ms <= t.q3_ms for t in timed.values())
    # Warm-up a b c, then rounds a b c / c b a / a b c (runs of one callable collapsed).
    runs = "".join(name for i, name in enumerate(log) if i == 0 or log[i - 1] != name)
    assert runs == "abc" + "abc" + "ba" + "bc"


def test_cuda_device_is_named_from_torch(monkeypatch):
    """CUDA path on a CPU machine: the device facts come from torch.cuda (mocked at that boundary)."""
    from headprune_cli.stages.profile.build import device_facts

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: f"Fake GPU {index}")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert device_facts(torch.device("cuda", 1)) == {"type": "cuda", "name": "Fake GPU 1", "index": 1}
    assert device_facts(torch.device("cuda")) == {"type": "cuda", "name": "Fake GPU 0", "index": 0}


@pytest.mark.parametrize("family", ["bert", "llama-gqa", "gpt2"])
def test_a_variant_computes_what_the_adapters_cut_does_and_shares_the_rest(family):
    """A timed variant is the block cut as pruning cuts it (outputs equal the adapter's own
    slicing of a full copy), and holds no copy of what it does not cut."""
    import copy

    from headprune_cli.model.arch import adapter_for
    from headprune_cli.stages.profile.measure import block_inputs, variant
    from tests.support import TINY

    model = TINY[family]()
    adapter = adapter_for(model)
    inputs = {**adapter.example_inputs(model, 2, 7), **({"use_cache": False} if family != "bert" else {})}
    args, kwargs = block_inputs(model, inputs)
    block = adapter.layer_list(model)[0]
    view = adapter.attention(block)
    for cut, reference_cut in (
        ({"units": 1}, lambda b: adapter.slice_heads(adapter.attention(b), list(range(view.group_size)), [0])),
        ({"width": 8}, lambda b: adapter.slice_ffn(adapter.ffn(b), list(range(8)))),
    ):
        timed, reference = variant(model, block, **cut), copy.deepcopy(block)
        reference_cut(reference)
        with torch.no_grad():
            got, want = timed(*args, **kwargs), reference(*args, **kwargs)
        got, want = (x[0] if isinstance(x, tuple) else x for x in (got, want))
        assert torch.allclose(got, want, atol=1e-6)
        originals = {p.data_ptr() for p in block.parameters()}
        untouched = adapter.ffn(timed).down if "units" in cut else adapter.attention(timed).o
        assert untouched.weight.data_ptr() in originals


def test_the_whole_block_is_timed_several_times_a_round_and_pooled(monkeypatch):
    """The whole block anchors both curves, so it gets FULL_TIMINGS samples a round (first,
    middle and last in the round); its point is the median of all of them, and the progress
    total counts every timed call."""
    from types import SimpleNamespace

    from headprune_cli.model.arch import adapter_for
    from headprune_cli.stages.profile import build, measure
    from tests.support import TINY

    model = TINY["bert"]().eval()
    block = adapter_for(model).layer_list(model)[0]
    made = []

    class Stub:
        def __init__(self, fn, threads):
            self.fn, self.calls = fn, 0
            self.ms = 10.0 + 2.0 * sum(
                1 for other in made if other.fn.__self__ is block
            )  # whole-block timers: 10, 12, 14 ms
            made.append(self)

        def timeit(self, number):
            return SimpleNamespace(median=0.0)

        def blocked_autorange(self, min_run_time=0.2):
            self.calls += 1
            return SimpleNamespace(median=(self.ms if self.fn.__self__ is block else 1.0) / 1000.0)

    def call_args(b):
        return b.forward  # a bound method: the stub tells the whole block from its variants by it

    monkeypatch.setattr(timing, "make_timer", Stub)
    ticks = []
    settings = ProfileOptions(model="m.safetensors", rounds=4, warmup=1, min_time=0.0, threads=1)
    units, widths = [1, 2, 4], [8, 24, 48]
    points = measure.layer_points(model, 0, units, widths, call_args, settings, lambda: ticks.append(1))
    whole = [t for t in made if t.fn.__self__ is block]
    assert len(whole) == measure.FULL_TIMINGS == 3 and all(t.calls == 4 for t in whole)
    assert points["attention"][-1]["median_ms"] == points["ffn"][-1]["median_ms"] == pytest.approx(12.0)
    assert [p["median_ms"] for p in points["attention"][:-1]] == [1.0, 1.0]
    grids = lambda pos: (units, widths)  # noqa: E731
    assert len(ticks) == build.ticks(model, settings, grids, phases=1) - settings.rounds  # less the outside's timings
