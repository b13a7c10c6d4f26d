"""Report policy at its edges: every gate exactly at its threshold and one ulp either side,
and `--baseline auto` trusting the root checkpoint only while its sha256 matches."""

from __future__ import annotations

import json
import math
import shutil

import pytest

from headprune_cli import load, save
from headprune_cli.stages import model_latency as latency
from headprune_cli.stages.report import build
from headprune_cli.stages.report.build import MainMetric, gates, verdict
from tests.support import assert_refused, run_report

below, above = (lambda x: math.nextafter(x, -math.inf)), (lambda x: math.nextafter(x, math.inf))


def _metric(drop: float, rel_drop: float) -> MainMetric:
    return MainMetric(
        name="accuracy",
        higher_is_better=True,
        baseline=0.8,
        pruned=0.8 - drop / 100,
        drop=drop,
        unit="points",
        rel_drop=rel_drop,
    )


@pytest.mark.parametrize("value", [7.5, 0.1, 1e-300, 0.0])
def test_max_drop_passes_at_the_threshold_and_fails_one_ulp_below(value):
    main = _metric(value, 0.0)
    assert [g.passed for g in gates(main, None, max_drop=value)] == [True]
    assert [g.passed for g in gates(main, None, max_drop=above(value))] == [True]
    assert [g.passed for g in gates(main, None, max_drop=below(value))] == [False]


@pytest.mark.parametrize("value", [0.0937, 1.0, 5e-324])
def test_max_rel_drop_passes_at_the_threshold_and_fails_one_ulp_below(value):
    main = _metric(3.0, value)
    assert [g.passed for g in gates(main, None, max_rel_drop=value)] == [True]
    assert [g.passed for g in gates(main, None, max_rel_drop=above(value))] == [True]
    assert [g.passed for g in gates(main, None, max_rel_drop=below(value))] == [False]


@pytest.mark.parametrize("speedup", [1.0, 1.7320508075688772, 4.0])
def test_min_speedup_passes_at_the_threshold_and_fails_one_ulp_above(speedup):
    main = _metric(0.0, 0.0)
    assert [g.passed for g in gates(main, speedup, min_speedup=speedup)] == [True]
    assert [g.passed for g in gates(main, speedup, min_speedup=below(speedup))] == [True]
    assert [g.passed for g in gates(main, speedup, min_speedup=above(speedup))] == [False]


def test_the_verdict_fails_when_any_gate_fails():
    main = _metric(2.0, 0.02)
    assert verdict(gates(main, 2.0, max_drop=2.0, max_rel_drop=0.02, min_speedup=2.0)) == "pass"
    assert verdict(gates(main, 2.0, max_drop=2.0, max_rel_drop=below(0.02), min_speedup=2.0)) == "fail"
    assert verdict([]) == "no-gates"


def _assert_gate_failed(result, gate: str) -> None:
    """Exit 3, the summary, then the one `Error:` line naming the gate (not a crash)."""
    assert result.code == 3, result
    assert result.err.splitlines()[-1].startswith(f"FAIL: gate {gate} failed"), result.err
    assert "Internal error" not in result.err and "Traceback" not in result.err


def test_the_cli_gates_the_measured_drop_exactly(models, cli):
    """Through the command: the drop the report measures, given back as --max-drop, passes
    (exit 0); one ulp less fails (exit 3). Same for --max-rel-drop."""
    folder, _ = models
    first = run_report(cli, folder, "--repeats", "0", "--json", "-")
    assert first.code == 0, first.err
    main = json.loads(first.out)["main_metric"]
    assert main["drop"] > 0 and main["rel_drop"] > 0
    for option, value in (("--max-drop", main["drop"]), ("--max-rel-drop", main["rel_drop"])):
        assert run_report(cli, folder, "--repeats", "0", option, repr(value)).code == 0, option
        _assert_gate_failed(run_report(cli, folder, "--repeats", "0", option, repr(below(value))), option[2:])


def test_the_cli_gates_the_measured_speedup_exactly(models, cli, monkeypatch):
    """A fake clock makes the baseline cost 6 ms and the pruned model 2 ms per forward:
    speedup exactly 3, so --min-speedup 3 passes and one ulp more fails."""
    folder, _ = models
    base_params = sum(p.numel() for p in load(folder / "base.safetensors").parameters())

    def fake_time_once(model, inputs, clock):
        return {"forward": 6.0 if sum(p.numel() for p in model.parameters()) == base_params else 2.0}

    monkeypatch.setattr(latency, "_time_once", fake_time_once)
    passed = run_report(cli, folder, "--min-speedup", "3", "--json", "-")
    assert passed.code == 0, passed.err
    assert json.loads(passed.out)["measured"]["speedup"] == 3.0
    _assert_gate_failed(run_report(cli, folder, "--min-speedup", repr(above(3.0))), "min-speedup")


def test_baseline_auto_refuses_a_root_whose_bytes_changed(models, cli, tmp_path):
    """The root is found by the path in the provenance, but trusted only by its sha256: a
    different model saved under the same name is refused, not silently compared against."""
    from headprune_cli.model.surgery import apply_plan

    folder, _ = models
    shutil.copy(folder / "pruned.safetensors", tmp_path / "pruned.safetensors")
    shutil.copy(folder / "dev.jsonl", tmp_path / "dev.jsonl")
    impostor = load(folder / "base.safetensors")
    apply_plan(impostor, {0: [3]}, [])  # same family and task: only the hash tells them apart
    save(impostor, tmp_path / "base.safetensors")
    assert_refused(run_report(cli, tmp_path), 1, "is not the root model any more (sha256 differs")
    shutil.copy(folder / "base.safetensors", tmp_path / "base.safetensors")  # the real root: accepted
    assert run_report(cli, tmp_path, "--repeats", "0").code == 0


def _metrics(name: str, value: float, higher_is_better: bool) -> list[dict]:
    return [{"name": name, "value": value, "higher_is_better": higher_is_better}]


@pytest.mark.parametrize(
    "task, name, higher, base, new, drop, unit, rel_drop",
    [
        ("classification", "accuracy", True, 0.8, 0.7, 10.0, "points", 0.125),  # worse: positive, in points
        ("classification", "accuracy", True, 0.8, 0.9, -10.0, "points", -0.125),  # better: negative
        ("causal-lm", "perplexity", False, 10.0, 12.0, 2.0, "perplexity", 0.2),  # lower is better, own unit
        ("causal-lm", "perplexity", False, 10.0, 9.0, -1.0, "perplexity", -0.1),
        ("embedding", "fidelity", True, 0.0, -0.5, 50.0, "points", 0.0),  # no relative drop from 0
    ],
)
def test_main_metric_measures_the_drop_in_the_metrics_own_direction(
    task, name, higher, base, new, drop, unit, rel_drop
):
    main = build.main_metric(task, _metrics(name, base, higher), _metrics(name, new, higher))
    assert (main.name, main.higher_is_better, main.baseline, main.pruned, main.unit) == (name, higher, base, new, unit)
    assert main.drop == pytest.approx(drop) and main.rel_drop == pytest.approx(rel_drop)


@pytest.mark.parametrize("missing_in", ["baseline", "pruned"])
def test_main_metric_missing_on_either_side_is_refused(missing_in):
    present, absent = _metrics("accuracy", 0.8, True), _metrics("macro_f1", 0.8, True)
    pair = (absent, present) if missing_in == "baseline" else (present, absent)
    with pytest.raises(build.DataError, match="produced no 'accuracy' metric for this classification model"):
        build.main_metric("classification", *pair)


def test_gates_say_what_they_check_and_against_what():
    main = _metric(1.5, 0.02)
    listed = [g.to_dict() for g in gates(main, 1.8, max_drop=2.0, max_rel_drop=0.025, min_speedup=1.5)]
    assert listed == [
        {
            "name": "max-drop",
            "description": "accuracy drop <= 2 points",
            "threshold": 2.0,
            "value": 1.5,
            "passed": True,
        },
        {
            "name": "max-rel-drop",
            "description": "accuracy relative drop <= 2.50%",
            "threshold": 0.025,
            "value": 0.02,
            "passed": True,
        },
        {
            "name": "min-speedup",
            "description": "measured speedup >= 1.5x",
            "threshold": 1.5,
            "value": 1.8,
            "passed": True,
        },
    ]


def test_min_speedup_without_latency_is_refused():
    with pytest.raises(build.UsageError, match="--min-speedup needs latency measurements; do not pass --repeats 0"):
        gates(_metric(0.0, 0.0), None, min_speedup=1.0)


def test_baseline_auto_finds_the_root_or_says_why_not(models, tmp_path):
    folder, _ = models
    assert build.resolve_baseline(folder / "pruned.safetensors", "auto") == folder / "base.safetensors"
    assert (
        build.resolve_baseline(folder / "pruned.safetensors", tmp_path / "other.safetensors")
        == tmp_path / "other.safetensors"
    )
    with pytest.raises(
        build.UsageError, match="has no root model in its provenance .it was never pruned.; pass --baseline CKPT"
    ):
        build.resolve_baseline(folder / "base.safetensors", "auto")
    shutil.copy(folder / "pruned.safetensors", tmp_path / "pruned.safetensors")  # moved away from its root
    with pytest.raises(
        build.CheckpointError,
        match=r"root model .*base.safetensors \(from the provenance of .*\) not found; pass --baseline CKPT",
    ):
        build.resolve_baseline(tmp_path / "pruned.safetensors", "auto")
