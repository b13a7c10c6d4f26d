"""Iterative pruning: follows the schedule of ORIGINAL heads, stops at the quality floor."""

from __future__ import annotations

import pytest
import torch

from headprune_cli.errors import UsageError
from headprune_cli.stages.constraints import Constraints
from headprune_cli.stages.iterate.rounds import _acceptable, iterative_prune
from headprune_cli.stages.iterate.schedule import schedule_of
from headprune_cli.stages.objectives import Metric, evaluate
from headprune_cli.stages.report.build import gates, main_metric
from headprune_cli.stages.select.chains import Selection
from headprune_cli.stages.training.train import FinetuneConfig
from tests.stages.iterate.support import cut_copy, dataset, heads_chosen_at_three_tenths, lstsq, write_task
from tests.support import TINY

CFG = FinetuneConfig(steps=2, lr=1e-3, batch_size=16)


def test_rounds_follow_the_schedule_of_original_heads():
    model = TINY["reference"]()  # 4 + 3 + 4 = 11 heads
    result = iterative_prune(
        model, dataset(32, 0), dataset(16, 1), schedule=schedule_of((0.2, 0.5)), method="taylor", finetune_config=CFG
    )
    assert [r.heads_kept for r in result.rounds] == [9, 5]  # round(0.2 * 11) = 2, round(0.5 * 11) = 6 removed
    assert all(r.accepted for r in result.rounds) and not result.stopped_early
    assert sum(len(h) for h in result.model.headprune.layout.heads) == 5
    assert sum(len(h) for h in model.headprune.layout.heads) == 11  # the input is untouched


def test_a_floor_that_would_be_crossed_keeps_the_last_good_model():
    model = TINY["reference"]()
    result = iterative_prune(
        model, dataset(32, 0), dataset(16, 1), schedule=schedule_of((0.2, 0.5)), finetune_config=CFG, floor=1.01
    )
    assert len(result.rounds) == 1 and result.stopped_early and not result.rounds[0].accepted
    assert sum(len(h) for h in result.model.headprune.layout.heads) == 11


def test_bad_schedules_are_refused():
    for schedule in [(), (0.3, 0.2), (0.0, 0.2), (0.5, 1.0)]:
        with pytest.raises(UsageError):
            iterative_prune(TINY["reference"](), dataset(8, 0), dataset(8, 1), schedule=schedule_of(schedule))


def test_iterate_command_writes_the_pruned_model(cli, tmp_path):
    from headprune_cli import load

    write_task(tmp_path)
    res = cli(
        "iterate",
        tmp_path / "m.safetensors",
        "--data",
        tmp_path / "train.safetensors",
        "--eval-data",
        tmp_path / "dev.safetensors",
        "--schedule",
        "0.2,0.4",
        "--lr",
        "1e-3",
        "--teacher",
        "self",
        "-o",
        tmp_path / "out.safetensors",
    )
    assert res.code == 0, res.err
    assert "round 40%" in res.err and res.out == ""
    out = load(tmp_path / "out.safetensors")
    assert sum(len(h) for h in out.headprune.layout.heads) == 7  # 11 - round(0.4 * 11)
    assert out.headprune.provenance["parent"] is not None
    bad = cli(
        "iterate",
        tmp_path / "m.safetensors",
        "--data",
        tmp_path / "train.safetensors",
        "--eval-data",
        tmp_path / "dev.safetensors",
        "--schedule",
        "0.4,0.2",
        "-o",
        tmp_path / "bad.safetensors",
    )
    assert bad.code == 2 and "schedule" in bad.err and not (tmp_path / "bad.safetensors").exists()


def test_max_drop_is_in_points_in_iterate_as_in_report_and_sweep():
    # 0.75 -> 0.7421875 is 0.78125 points worse (exact in binary): within 0.79, not within 0.78.
    base, value = Metric("accuracy", 0.75, True), 0.7421875
    assert _acceptable(base, value, None, 0.79) and not _acceptable(base, value, None, 0.78)
    main = main_metric(
        "classification", [base.to_dict()], [{"name": "accuracy", "value": value, "higher_is_better": True}]
    )
    assert (main.drop, main.unit) == (0.78125, "points")  # sweep's within_budget reads this same drop
    assert [g.passed for g in gates(main, None, max_drop=0.79)] == [True]
    assert [g.passed for g in gates(main, None, max_drop=0.78)] == [False]
    # perplexity: its own unit, lower is better
    ppl = Metric("perplexity", 10.0, False)
    assert _acceptable(ppl, 10.5, None, 0.5) and not _acceptable(ppl, 10.75, None, 0.5)
    assert _acceptable(base, 0.9, 0.8, None) and not _acceptable(base, 0.79, 0.8, None)  # --floor


def test_iterate_refuses_a_negative_max_drop(cli, tmp_path):
    result = cli(
        "iterate",
        tmp_path / "m.safetensors",
        "--data",
        tmp_path / "d.jsonl",
        "--eval-data",
        tmp_path / "d.jsonl",
        "--max-drop",
        "-1",
        "-o",
        tmp_path / "out.safetensors",
    )
    assert result.code == 2 and "--max-drop" in result.err


# --- FFN neurons and cost budgets ----------------------------------------------------
def _neurons(model) -> int:
    layout = model.headprune.layout
    return sum(len(layout.kept_neurons(layer)) for layer in layout.layers)


def _flops(model) -> float:
    from headprune_cli.model.cost import flops_per_token

    return flops_per_token(model, 8)


def test_flops_rounds_rescore_neurons_and_cut_them_with_the_heads():
    model = TINY["reference"]()  # 11 heads, 3 x 48 FFN neurons
    start = _flops(model)
    result = iterative_prune(
        model,
        dataset(32, 0),
        dataset(16, 1),
        schedule=schedule_of((0.8, 0.6), "flops"),
        method="taylor",
        finetune_config=CFG,
        ffn=True,
        seq_len=8,
        constraints=Constraints(ffn_multiple_of=4),
    )
    assert [r.ratio for r in result.rounds] == [0.8, 0.6] and all(r.accepted for r in result.rounds)
    for r in result.rounds:
        assert r.cost_kept <= r.ratio + 1e-9 and r.cost_kept > r.ratio - 0.1  # the budget of the ORIGINAL model, met
        assert r.remove_ffn and all(len(v) % 4 == 0 for v in r.remove_ffn.values())
    assert result.rounds[1].neurons_kept < result.rounds[0].neurons_kept < 144  # the second round cut neurons again
    assert _neurons(result.model) == result.rounds[1].neurons_kept
    assert abs(_flops(result.model) / start - result.rounds[1].cost_kept) < 1e-9  # cost_kept is the real model's
    assert _neurons(model) == 144 and _flops(model) == start  # the input is untouched


def test_block_params_rounds_keep_their_share_of_the_original_blocks():
    model = TINY["reference"]()  # embeddings, final norm and classifier: 4,098 of 25,562 params
    blocks = lambda m: sum(p.numel() for p in m.layers.parameters())  # noqa: E731
    start = blocks(model)
    result = iterative_prune(
        model,
        dataset(32, 0),
        dataset(16, 1),
        schedule=schedule_of((0.8, 0.6), "block_params"),
        method="taylor",
        finetune_config=CFG,
        ffn=True,
        seq_len=8,
        constraints=Constraints(ffn_multiple_of=4),
    )
    assert [r.ratio for r in result.rounds] == [0.8, 0.6] and all(r.accepted for r in result.rounds)
    for r in result.rounds:
        assert r.ratio - 0.05 < r.cost_kept <= r.ratio + 1e-9  # of the ORIGINAL blocks, met
    # The share is the blocks' own, measured on the cut model: counting the embeddings would
    # keep 0.6 of all params, i.e. about 0.52 of the blocks.
    assert blocks(result.model) / start == pytest.approx(result.rounds[1].cost_kept, abs=1e-9)
    assert blocks(result.model) / start > 0.55


def test_a_budget_without_ffn_cuts_heads_only_and_ffn_needs_a_budget():
    model = TINY["reference"]()
    result = iterative_prune(
        model, dataset(32, 0), dataset(16, 1), schedule=schedule_of((0.9,), "params"), finetune_config=CFG, seq_len=8
    )
    (r,) = result.rounds
    assert r.heads_kept < 11 and not r.remove_ffn and _neurons(result.model) == 144 and r.cost_kept <= 0.9
    with pytest.raises(UsageError, match="budget"):
        iterative_prune(model, dataset(8, 0), dataset(8, 1), schedule=schedule_of((0.2,)), ffn=True)
    for schedule in [(0.6, 0.8), (1.0,), (0.0,)]:  # cost fractions kept must fall within (0, 1)
        with pytest.raises(UsageError, match="fall"):
            iterative_prune(model, dataset(8, 0), dataset(8, 1), schedule=schedule_of(schedule, "flops"))


def test_iterate_command_cuts_ffn_neurons_under_a_flops_schedule(cli, tmp_path):
    from headprune_cli import load

    write_task(tmp_path)
    common = [
        "--data",
        tmp_path / "train.safetensors",
        "--eval-data",
        tmp_path / "dev.safetensors",
        "--lr",
        "1e-3",
        "--max-length",
        "8",
    ]
    res = cli(
        "iterate",
        tmp_path / "m.safetensors",
        *common,
        "--target-flops",
        "0.8,0.7",
        "--ffn",
        "--method",
        "fisher",
        "-o",
        tmp_path / "out.safetensors",
    )
    assert res.code == 0, res.err
    assert "round flops 70%" in res.err and "FFN neurons" in res.err
    out = load(tmp_path / "out.safetensors")
    assert _neurons(out) < 144 and _flops(out) <= 0.7 * _flops(TINY["reference"]()) * (1 + 1e-9)
    for extra, message in (
        (["--ffn"], "--ffn needs --target-flops"),
        (["--target-flops", "0.8", "--schedule", "0.2"], "not both"),
        (["--target-flops", "0.8", "--schedule", "0.1,0.2,0.3,0.4"], "not both"),  # the default, said out loud
        (["--target-flops", "0.6,0.8"], "fall"),
        (["--target-flops", "0.8", "--ffn", "--method", "loo"], "loo"),
    ):
        bad = cli("iterate", tmp_path / "m.safetensors", *common, *extra, "-o", tmp_path / "bad.safetensors")
        assert bad.code == 2 and message in bad.err, (extra, bad.err)
        assert not (tmp_path / "bad.safetensors").exists()


def test_finetune_rounds_report_the_cut_before_training():
    """Round 1's "pruned" metric is the input model cut by the round's removals, measured here."""
    model, dev = TINY["reference"](), dataset(16, 1)
    result = _fidelity_rounds(model, model, FinetuneConfig(steps=4, lr=3e-4, batch_size=16), 0.3)
    (first,) = result.rounds
    plain = cut_copy(model, Selection("r", first.remove_heads, []))
    assert first.metric_pruned == evaluate(plain, dev, "fidelity", reference=model)[0].value
    assert first.metric_recovered == evaluate(result.model, dev, "fidelity", reference=model)[0].value
    assert first.metric_pruned != first.metric_recovered


def _heads(model) -> list[int]:
    return [len(h) for h in model.headprune.layout.heads]


def _fidelity_rounds(model, teacher, cfg, ratio: float, **options):
    """iterative_prune of `model` at one heads step, judged by fidelity to `teacher`."""
    return iterative_prune(
        model,
        dataset(32, 0),
        dataset(16, 1),
        schedule=schedule_of((ratio,)),
        finetune_config=cfg,
        objective="fidelity",
        teacher=teacher,
        **options,
    )


def _moved(model):
    """A teacher that is `model` with every weight moved by 0.05."""
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05)
    return model


def test_a_step_that_removes_no_new_head_is_skipped_and_the_next_one_runs():
    # 11 heads: 0.1 removes round(1.1) = 1 (one head is a round), 0.12 still round(1.32) = 1 (nothing
    # new: skipped, no round), 0.5 removes round(5.5) = 6
    result = iterative_prune(
        TINY["reference"](), dataset(32, 0), dataset(16, 1), schedule=schedule_of((0.1, 0.12, 0.5)), finetune_config=CFG
    )
    assert [(r.ratio, r.heads_kept) for r in result.rounds] == [(0.1, 10), (0.5, 5)]


def test_the_default_recovery_is_one_epoch_under_the_seed_given(monkeypatch):
    """The configuration each round trains with, recorded on its way to the real finetune (with
    the default learning rate a tiny model's best epoch is often the untrained cut, so the
    metrics alone cannot tell one epoch from two)."""
    from headprune_cli.stages.iterate import rounds as rounds_module

    seen = []

    def recording(model, train, cfg, *args):
        seen.append((cfg.epochs, cfg.steps, cfg.seed))
        return real(model, train, cfg, *args)

    real = rounds_module.finetune
    monkeypatch.setattr(rounds_module, "finetune", recording)
    iterative_prune(TINY["reference"](), dataset(32, 0), dataset(16, 1), schedule=schedule_of((0.2, 0.5)), seed=3)
    assert seen == [(1, None, 3), (1, None, 3)]


def test_the_result_names_the_metric_and_the_baseline_measured_against_the_teacher():
    model, teacher, dev = TINY["reference"](), _moved(TINY["reference"]()), dataset(16, 1)
    result = _fidelity_rounds(model, teacher, CFG, 0.2)
    want = evaluate(model, dev, "fidelity", reference=teacher)[0]
    assert (result.metric_name, result.higher_is_better, result.baseline) == ("fidelity", True, want.value)
    assert want.value < 0.999  # against the teacher, not against itself
    plain = iterative_prune(
        model, dataset(32, 0), dev, schedule=schedule_of((0.2,)), finetune_config=CFG, max_drop=100.0
    )
    assert (plain.metric_name, plain.higher_is_better) == ("accuracy", True)
    lm = iterative_prune(
        TINY["llama"](), dataset(16, 0), dataset(8, 1), schedule=schedule_of((0.2,)), finetune_config=CFG
    )
    assert (lm.metric_name, lm.higher_is_better) == ("perplexity", False)


@pytest.mark.parametrize("recover", ["finetune", "lstsq"])
def test_every_round_keeps_the_protected_heads(recover):
    layer2 = tuple((2, h) for h in range(4))
    options = dict(schedule=schedule_of((0.4,)), finetune_config=CFG, recover=recover)
    if recover == "lstsq":
        options["compensation"] = lstsq(dataset(32, 0))
    free = iterative_prune(TINY["reference"](), dataset(32, 0), dataset(16, 1), **options)
    assert _heads(free.model)[2] < 4  # unconstrained, the cut reaches layer 2
    kept = iterative_prune(
        TINY["reference"](), dataset(32, 0), dataset(16, 1), constraints=Constraints(protect=layer2), **options
    )
    assert _heads(kept.model)[2] == 4 and sum(_heads(kept.model)) == 11 - 4


def test_the_library_refuses_what_the_command_refuses_by_the_same_line():
    model = TINY["reference"]()
    with pytest.raises(UsageError) as refused:
        iterative_prune(model, dataset(8, 0), dataset(8, 1), schedule=schedule_of((0.2,)), ffn=True)
    assert str(refused.value) == (
        "FFN neurons are cut under a cost budget: give the schedule as FLOPs or params fractions to keep"
    )
    with pytest.raises(UsageError) as refused:
        iterative_prune(model, dataset(8, 0), dataset(8, 1), recover="lstsq")
    assert str(refused.value) == "lstsq recovery needs calibration batches (a Compensation with data)"
    with pytest.raises(UsageError) as refused:
        iterative_prune(model, dataset(8, 0), dataset(8, 1), schedule=schedule_of((0.2,)), max_drop=-1.0)
    assert str(refused.value) == "max_drop must be a number >= 0 (got -1.0)"


def test_the_floor_and_the_drop_admit_their_boundary_for_either_direction():
    accuracy, ppl = Metric("accuracy", 0.75, True), Metric("perplexity", 10.0, False)
    assert _acceptable(accuracy, 0.75, 0.75, None) and not _acceptable(accuracy, 0.7499, 0.75, None)
    assert _acceptable(ppl, 10.5, 11.0, None) and _acceptable(ppl, 11.0, 11.0, None)
    assert not _acceptable(ppl, 11.01, 11.0, None)
    assert _acceptable(accuracy, 0.75, None, 0.0) and _acceptable(ppl, 10.0, None, 0.0)


def test_a_drop_budget_of_zero_is_a_valid_budget_that_refuses_any_loss():
    model = TINY["reference"]()
    strict = _fidelity_rounds(model, model, CFG, 0.3, max_drop=0.0)
    (only,) = strict.rounds
    assert only.metric_recovered < strict.baseline and not only.accepted
    assert sum(_heads(strict.model)) == 11  # the input model comes back
    half = _fidelity_rounds(model, model, CFG, 0.3, max_drop=0.5)  # half a point is a budget too
    assert 100 * (half.baseline - half.rounds[0].metric_recovered) > 0.5 and not half.rounds[0].accepted
    assert _fidelity_rounds(model, model, CFG, 0.3, max_drop=2.0).rounds[0].accepted


def test_finetune_rounds_distil_from_the_teacher_given():
    """Round 1 equals cutting the input by its removals and finetuning the cut with the teacher,
    done here step by step; without the teacher it trains to other weights."""
    from headprune_cli.stages.training.train import finetune

    model, teacher, train, dev = TINY["reference"](), _moved(TINY["reference"]()), dataset(32, 0), dataset(16, 1)
    cfg = FinetuneConfig(steps=4, lr=3e-3, batch_size=16, kd_weight=1.0)
    (first,) = _fidelity_rounds(model, teacher, cfg, 0.3).rounds
    removals = Selection("r", first.remove_heads, [])
    metrics = lambda m: {x.name: x.value for x in evaluate(m, dev, "fidelity", reference=teacher)}  # noqa: E731
    by_hand = finetune(cut_copy(model, removals), train, cfg, metrics, True, teacher)
    assert first.metric_recovered == by_hand.history[by_hand.best_epoch].metrics["fidelity"]
    plain_cfg = FinetuneConfig(steps=4, lr=3e-3, batch_size=16, kd_weight=0.0)
    alone = finetune(cut_copy(model, removals), train, plain_cfg, metrics, True, None)
    assert alone.history[-1].metrics["fidelity"] != by_hand.history[-1].metrics["fidelity"]


@pytest.mark.parametrize("recover", ["finetune", "lstsq"])
def test_head_rounds_normalise_gradient_scores_per_layer(recover):
    """Heads only: Michel et al.'s per-layer normalisation is on, as `score --method gradient`
    has it by default; on this model it chooses other heads than the raw scores."""
    model, data = TINY["reference"](), dataset(32, 0)

    def chosen(normalize: bool) -> dict:
        return heads_chosen_at_three_tenths(model, data, "gradient", objective="classification", normalize=normalize)

    assert chosen(True) != chosen(False)
    options = dict(finetune_config=CFG, recover=recover, method="gradient")
    if recover == "lstsq":
        options["compensation"] = lstsq(data)
    result = iterative_prune(model, data, dataset(16, 1), schedule=schedule_of((0.3,)), **options)
    assert result.rounds[0].remove_heads == chosen(True)
    # with FFN neurons it is off (heads and neurons on one scale; scoring refuses the two together)
    flops = schedule_of((0.8,), "flops")
    ffn = dict(ffn=True, seq_len=8, constraints=Constraints(ffn_multiple_of=4))
    assert len(iterative_prune(model, data, dataset(16, 1), schedule=flops, **ffn, **options).rounds) == 1
