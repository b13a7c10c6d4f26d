"""Iterative pruning without training: rescoring the refit model, refitting the ORIGINAL by the union."""

from __future__ import annotations

import pytest
import torch

from headprune_cli.errors import UsageError
from headprune_cli.model.cost import flops_per_token
from headprune_cli.model.layout import info_of
from headprune_cli.stages.constraints import Constraints
from headprune_cli.stages.iterate import rounds
from headprune_cli.stages.iterate.rounds import _union, iterative_prune
from headprune_cli.stages.iterate.schedule import schedule_of
from headprune_cli.stages.objectives import evaluate
from headprune_cli.stages.prune.cut import Compensation
from headprune_cli.stages.select.chains import Selection
from tests.stages.iterate.support import cut_copy, dataset, heads_chosen_at_three_tenths, lstsq, write_task
from tests.support import TINY


def _iterate(model, compensation, targets=(0.8, 0.6), **options):
    return iterative_prune(
        model,
        dataset(32, 0),
        dataset(16, 1),
        schedule=schedule_of(targets, "flops"),
        method="fisher",
        ffn=True,
        seq_len=8,
        constraints=Constraints(ffn_multiple_of=4),
        recover="lstsq",
        compensation=compensation,
        **options,
    )


def test_lstsq_rounds_refit_the_original_by_every_removal_so_far(monkeypatch):
    def no_training(*args, **kwargs):
        raise AssertionError("lstsq recovery must not train")

    monkeypatch.setattr(rounds, "finetune", no_training)
    model = TINY["reference"]()  # 11 heads, 3 x 48 FFN neurons
    start = flops_per_token(model, 8)
    compensation = lstsq(dataset(32, 2))
    result = _iterate(model, compensation)
    first, second = result.rounds
    assert all(r.accepted for r in result.rounds) and second.neurons_kept < first.neurons_kept < 144
    assert flops_per_token(result.model, 8) <= 0.6 * start * (1 + 1e-9)
    # The shipped model is the original cut by both rounds' removals and refit once, towards
    # the original's outputs: not the first round's refit model refit again.
    union = _union(Selection("r", first.remove_heads, [], remove_ffn=first.remove_ffn), _round_selection(second))
    shipped, wanted = result.model.state_dict(), cut_copy(model, union, compensation).state_dict()
    assert shipped.keys() == wanted.keys()
    assert all(torch.equal(shipped[k], wanted[k]) for k in wanted)
    chained = cut_copy(_first_round_model(model, compensation), _round_selection(second), compensation)
    assert any(not torch.equal(shipped[k], v) for k, v in chained.state_dict().items())
    assert flops_per_token(model, 8) == start  # the input is untouched


def _round_selection(r) -> Selection:
    return Selection("r", r.remove_heads, [], remove_ffn=r.remove_ffn)


def _first_round_model(model, compensation):
    return _iterate(model, compensation, targets=(0.8,)).model


@pytest.mark.parametrize("failing", [None, 1, 2])
def test_rounds_from_the_file_give_the_in_memory_rounds_bytes(tmp_path, monkeypatch, failing):
    """source + work: one model held at a time, the same rounds and the same saved file,
    also when round `failing` is refused (the last accepted model, or the input, comes back)."""
    from headprune_cli import load, save

    calls = []

    def accept_until_failing(*args):
        calls.append(args)
        return len(calls) != failing  # round `failing` refused (calls are cleared between the runs)

    monkeypatch.setattr(rounds, "_acceptable", lambda *args: accept_until_failing(*args))
    save(TINY["reference"](), tmp_path / "m.safetensors")
    compensation = lstsq(dataset(32, 2))
    in_memory = _iterate(load(tmp_path / "m.safetensors"), compensation)
    calls.clear()
    (tmp_path / "work").mkdir()
    source = dict(source=tmp_path / "m.safetensors", work=tmp_path / "work")
    spilled = _iterate(load(tmp_path / "m.safetensors"), compensation, **source)
    assert spilled.rounds == in_memory.rounds and len(in_memory.rounds) == (failing or 2)
    # the rounds went through files, numbered from 1 (the in-memory route writes none)
    rounds_written = sorted(p.name for p in (tmp_path / "work").iterdir())
    assert rounds_written == [f"round-{n}.safetensors" for n in range(1, len(spilled.rounds) + 1)]
    save(in_memory.model, tmp_path / "a.safetensors")
    save(spilled.model, tmp_path / "b.safetensors")
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()
    assert info_of(spilled.model).layout == info_of(in_memory.model).layout
    kept = sum(len(h) for h in info_of(in_memory.model).layout.heads)
    assert kept < 11 if failing != 1 else kept == 11  # a cut model, or the input when round one failed


def test_lstsq_rounds_report_the_plain_cuts_metric_then_the_refits():
    """Each round's "pruned" metric is the original cut by every removal so far WITHOUT the refit,
    measured here on its own; "recovered" is the refit one. Fidelity (continuous) tells them apart;
    accuracy on a few rows often cannot (a refit that moves no prediction across the boundary)."""
    model, compensation, dev = TINY["reference"](), lstsq(dataset(32, 2)), dataset(16, 1)
    result = _iterate(model, compensation, objective="fidelity", teacher=model)
    union = Selection("r", {}, [])
    assert len(result.rounds) == 2
    for r in result.rounds:
        union = _union(union, _round_selection(r))
        plain, refit = cut_copy(model, union), cut_copy(model, union, compensation)
        assert r.metric_pruned == evaluate(plain, dev, "fidelity", reference=model)[0].value
        assert r.metric_recovered == evaluate(refit, dev, "fidelity", reference=model)[0].value
        assert r.metric_pruned < r.metric_recovered < 1.0  # the refit moves the cut towards the original


def test_the_union_merges_removals_of_every_kind():
    a = Selection("a", {0: [1], 2: [0]}, [1], remove_ffn={0: [4, 5]})
    b = Selection("b", {0: [3], 3: [2]}, [], remove_ffn={0: [6], 2: [1]})
    u = _union(a, b)
    assert u.remove_heads == {0: [1, 3], 2: [0], 3: [2]} and u.remove_layers == [1]
    assert u.remove_ffn == {0: [4, 5, 6], 2: [1]}


def test_lstsq_recovery_needs_calibration_and_a_known_recovery():
    from headprune_cli.stages.iterate.stage import RECOVERIES

    assert RECOVERIES == rounds.RECOVERIES  # the stage's copy keeps torch out of its import
    model = TINY["reference"]()
    with pytest.raises(UsageError, match="calibration"):
        _iterate(model, None)
    with pytest.raises(UsageError, match="calibration"):
        _iterate(model, Compensation("lstsq", []))
    with pytest.raises(UsageError, match="unknown recovery"):
        iterative_prune(model, dataset(8, 0), dataset(8, 1), recover="lstq")


def _files(tmp_path):
    write_task(tmp_path)
    return [
        tmp_path / "m.safetensors",
        "--data",
        tmp_path / "train.safetensors",
        "--eval-data",
        tmp_path / "dev.safetensors",
        "--max-length",
        "8",
        "--target-flops",
        "0.8,0.6",
        "--ffn",
    ]


def test_iterate_command_recovers_by_lstsq(cli, tmp_path):
    from headprune_cli import load

    common = _files(tmp_path)
    res = cli("iterate", *common, "--recover", "lstsq", "--samples", "16", "-o", tmp_path / "out.safetensors")
    assert res.code == 0, res.err
    assert "round flops 60%" in res.err
    out = load(tmp_path / "out.safetensors")
    assert flops_per_token(out, 8) <= 0.6 * flops_per_token(TINY["reference"](), 8) * (1 + 1e-9)
    again = cli("iterate", *common, "--recover", "lstsq", "--samples", "16", "-o", tmp_path / "again.safetensors")
    assert again.code == 0
    assert (tmp_path / "out.safetensors").read_bytes() == (tmp_path / "again.safetensors").read_bytes()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--recover", "lstsq", "--teacher", "self"], "--teacher: training options, but --recover lstsq"),
        (["--recover", "lstsq", "--lr", "1e-3", "--epochs", "2"], "--lr, --epochs: training options"),
        (["--ridge", "1"], "--ridge: calibration options, for --recover lstsq only"),
        (["--samples", "64", "--ridge", "1"], "--samples, --ridge: calibration options"),
        (["--recover", "lstq"], "unknown --recover 'lstq'"),
    ],
)
def test_iterate_refuses_options_lstsq_recovery_cannot_use(cli, tmp_path, extra, message):
    res = cli("iterate", *_files(tmp_path), *extra, "-o", tmp_path / "bad.safetensors")
    assert res.code == 2 and message in res.err, res.err
    assert len(res.err.strip().splitlines()) == 1 and not (tmp_path / "bad.safetensors").exists()


def test_lstsq_calibration_is_the_first_samples_rows_of_data_at_the_ridge_given(tmp_path):
    from headprune_cli.stages.iterate.stage import IterateOptions, _compensation
    from headprune_cli.stages.prune.compensation import DEFAULT_RIDGE

    def options(**extra):
        paths = dict(checkpoint=tmp_path / "m", data=tmp_path / "d", eval_data=tmp_path / "e", output=tmp_path / "o")
        return IterateOptions(**paths, **extra)

    train = dataset(40, 0)
    comp = _compensation(options(recover="lstsq", samples=20, ridge=1.0), train)
    rows = torch.cat([b["input_ids"] for b in comp.batches])
    assert torch.equal(rows, train.input_ids[:20]) and comp.ridge == 1.0 and comp.method == "lstsq"
    every = _compensation(options(recover="lstsq", samples=1000), train)
    assert sum(len(b["input_ids"]) for b in every.batches) == 40 and every.ridge == DEFAULT_RIDGE
    assert _compensation(options(), train) is None  # finetune recovery: no calibration


def test_a_cost_step_the_last_round_already_met_is_skipped():
    # round 0.8 keeps 0.7954 of the FLOPs (FFN widths in multiples of 4), under 0.799: nothing to do there
    result = _iterate(TINY["reference"](), lstsq(dataset(32, 2)), targets=(0.8, 0.799, 0.7))
    assert [r.ratio for r in result.rounds] == [0.8, 0.7]
    assert result.rounds[0].cost_kept < 0.799


def test_lstsq_rounds_score_by_the_objective_asked_for():
    """The heads a round removes are those the objective's scores choose: on this model fidelity
    and classification choose different heads."""
    model, data = TINY["reference"](), dataset(32, 0)
    fidelity = heads_chosen_at_three_tenths(model, data, "taylor", objective="fidelity")
    assert fidelity != heads_chosen_at_three_tenths(model, data, "taylor", objective="classification")
    result = iterative_prune(
        model,
        data,
        dataset(16, 1),
        schedule=schedule_of((0.3,)),
        objective="fidelity",
        teacher=model,
        recover="lstsq",
        compensation=lstsq(data),
    )
    assert result.rounds[0].remove_heads == fidelity


def test_work_without_a_source_keeps_the_rounds_in_memory(tmp_path):
    (tmp_path / "work").mkdir()
    result = _iterate(TINY["reference"](), lstsq(dataset(32, 2)), targets=(0.8,), work=tmp_path / "work")
    assert len(result.rounds) == 1 and list((tmp_path / "work").iterdir()) == []


def test_rounds_score_in_batches_of_32_and_price_at_128_tokens_by_default(monkeypatch):
    seen = []

    def recording(*args, **scoring):
        seen.append((scoring["batch_size"], scoring["seq_len"]))
        return real(*args, **scoring)

    real = rounds.prune_once
    monkeypatch.setattr(rounds, "prune_once", recording)
    iterative_prune(TINY["reference"](), dataset(32, 0), dataset(16, 1), schedule=schedule_of((0.8,), "flops"))
    assert seen == [(32, 128)]
