"""Learned gates that reach their target: the schedule (rise, then hold), the Lagrangian that keeps
pushing while the expected share is short, the check before closing (extend, then refuse), the
report, and layer distillation against the teacher's hidden states."""

from __future__ import annotations

import json

import pytest
import torch

from headprune_cli.model.surgery import HeadGates, removal_gates
from headprune_cli.stages.budget import Budget
from headprune_cli.stages.constraints import Constraints
from headprune_cli.stages.learn.gates import FarFromTarget, LearnedGates
from headprune_cli.stages.learn.learn import close_gates, make_gates
from headprune_cli.stages.training.hidden import captured, hidden_loss, pairs
from tests.support import TINY, assert_refused, model_inputs, saved_root, snapshot


def gates_for(model, ratio: float = 0.5, **kwargs) -> LearnedGates:
    defaults = dict(seed=0, seq_len=16, lr=0.3, warmup=0.5, closed_share=0.4)
    return make_gates(model, Budget("heads", ratio), Constraints(), **{**defaults, **kwargs})


def test_the_target_rises_over_the_first_part_of_the_gate_phase_then_holds():
    gates = gates_for(TINY["reference"](), ratio=0.5, warmup=0.5, closed_share=0.4)
    total = 100  # the gates close at step 60; the target rises over 30 steps, then holds for 30
    goal = gates.goal  # the share the closing removes: 6 of the 11 heads at --ratio 0.5
    assert goal == pytest.approx(6 / 11)
    targets = [gates.target_at(step, total) for step in range(gates.closing_from(total))]
    assert gates.closing_from(total) == 60
    assert targets[0] == pytest.approx(goal / 30) and targets[14] == pytest.approx(goal / 2)
    assert all(b > a for a, b in zip(targets[:29], targets[1:30]))  # rising
    assert targets[29:] == [goal] * 31  # held at the target until the gates close


def test_the_lagrangian_term_grows_while_the_expected_share_is_short():
    gates = gates_for(TINY["reference"](), ratio=0.5)
    total, penalties, pushes = 100, [], []
    for step in range(40, 50):  # the target is held at 6/11; the gates start open (expected share ~0)
        gates.zero_grad()
        penalties.append(gates.penalty_backward(step, total))
        pushes.append(float(gates.log_alpha.grad.mean()))  # > 0: descent lowers log alpha, i.e. closes gates
        gates.lambda_optimizer.step()  # only the multipliers move: the share stays short
    assert gates.trace[-1]["expected_sparsity"] < 0.1 and gates.trace[-1]["target"] == round(6 / 11, 6)
    assert all(b > a for a, b in zip(penalties, penalties[1:]))  # the push grows every step it is short
    assert gates.trace[-1]["lambda1"] < 0 < gates.trace[-1]["lambda2"]
    assert pushes[-1] > pushes[1] > 0


def test_closing_far_from_the_target_extends_the_gate_phase_then_refuses():
    gates = gates_for(TINY["reference"](), ratio=0.5, tolerance=0.05, extra_steps=2)
    total = 10
    closing = gates.closing_from(total)
    assert [gates.extend(step, total) for step in range(closing)] == [0] * closing  # before the closing: nothing
    assert gates.extend(closing, total) == 1  # open gates, 0.5 short: one more gate-phase step
    assert gates.closing_from(total + 1) == closing + 1
    assert gates.extend(closing + 1, total + 1) == 1
    with pytest.raises(FarFromTarget, match=r"is 0.010 at closing, 0.535 from the 0.545 target.*after 2 extra steps"):
        gates.extend(closing + 2, total + 2)


def test_gates_that_never_closed_in_training_are_checked_when_closed_after_it():
    # --closed-share 0: the run ends before the closing step, so close_gates makes the check itself
    model = TINY["reference"]()
    gates = gates_for(model, ratio=0.5, closed_share=0.0, tolerance=0.05)
    with pytest.raises(FarFromTarget, match=r"is 0.010 at closing, 0.535 from the 0.545 target.*after 0 extra steps"):
        close_gates(model, gates, Constraints(), Budget("heads", 0.5), checkpoint=None, data=None, max_length=16,
                    objective="classification", samples=0, config={})  # fmt: skip


def test_closing_near_the_target_closes_and_reports_expected_against_closed():
    gates = gates_for(TINY["reference"](), ratio=0.5, tolerance=0.05, extra_steps=2)
    with torch.no_grad():  # half the heads' gates shut, half open: the expected share is the target's
        order = torch.arange(gates.space.size)
        gates.log_alpha.copy_(torch.where(order % 2 == 0, torch.tensor(-12.0), torch.tensor(12.0)))
    total = 10
    closing = gates.closing_from(total)
    assert gates.extend(closing, total) == 0
    selection = gates.close(gates.table())
    report = gates.report(selection)
    assert report["expected_at_close"] == pytest.approx(6 / 11, abs=1e-3)  # 6 of the 11 units were shut
    assert report["closed"] == pytest.approx(sum(len(v) for v in selection.remove_heads.values()) / 11)
    assert report["extra_steps"] == 0 and report["closed_at_step"] == closing and report["target"] == round(6 / 11, 6)


def test_layer_distillation_is_zero_against_itself_and_grows_with_the_gated_heads():
    torch.manual_seed(0)
    teacher, student = TINY["reference"](), TINY["reference"]()
    student.load_state_dict(teacher.state_dict())
    paired = pairs(student, teacher)
    assert paired == [(i, i) for i in range(len(paired))] and paired
    inputs = model_inputs("reference")
    with torch.no_grad(), captured(teacher) as ref:
        teacher(**inputs)
    with captured(student) as same:
        student(**inputs)
    mask = inputs["attention_mask"]
    zero, count = hidden_loss(same, ref, paired, mask)
    assert float(zero.detach()) == pytest.approx(0.0, abs=1e-9) and float(count) == float(mask.sum())
    losses = []
    for removed in ({0: [0]}, {0: [0, 1], 1: [0, 1]}):
        with HeadGates(student, removal_gates(student, removed)), captured(student) as states:
            student(**inputs)
        loss, _ = hidden_loss(states, ref, paired, mask, per_row=True)
        losses.append(loss)
    assert 0 < float(losses[0].detach()) < float(losses[1].detach())
    losses[1].backward()  # the term trains the student
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in student.parameters())


def learn(cli, ckpt, data, out, *extra):
    return cli("learn", ckpt, "--data", data, "--lr", "1e-3", "--batch-size", "8", "-o", out, *extra)


def test_the_gates_report_goes_into_the_gates_artifact_and_the_summary(cli, tmp_path):
    ckpt, data = saved_root(tmp_path, "reference")
    out, gates = tmp_path / "small.safetensors", tmp_path / "gates.json"
    res = learn(cli, ckpt, data, out, "--steps", "100", "--ratio", "0.5", "--gates-out", gates, "--teacher", "auto")
    assert res.code == 0, res.err
    report = json.loads(gates.read_text())["config"]["gates"]
    assert report["target"] == round(6 / 11, 6) and report["budget_removed"] == 0.5 and report["budget"] == "heads"
    assert abs(report["expected_at_close"] - 6 / 11) <= report["tolerance"] == 0.01  # reached before closing
    assert report["closed"] == pytest.approx(6 / 11)  # select removes 6 of the 11 heads
    steps = report["trace"]
    assert len(steps) == report["closed_at_step"] == 60 + report["extra_steps"]
    assert [s["step"] for s in steps] == list(range(1, len(steps) + 1))
    assert {"expected_sparsity", "target", "lambda1", "lambda2", "penalty"} <= set(steps[0])
    assert steps[-1]["target"] == report["target"] and abs(steps[-1]["expected_sparsity"] - 6 / 11) < 0.05  # held
    assert "expected share removed vs target" in res.err and "closed 0.545 (target 0.545, heads)" in res.err


def test_gates_that_cannot_reach_the_target_refuse_after_the_extra_steps_and_write_nothing(cli, tmp_path):
    ckpt, data = saved_root(tmp_path, "reference")
    before = snapshot(tmp_path)
    out, gates = tmp_path / "small.safetensors", tmp_path / "gates.json"
    # --gate-lr 0: the gates never move, so the expected share stays near 0 against a 0.5 target.
    res = learn(
        cli,
        ckpt,
        data,
        out,
        "--steps",
        "10",
        "--ratio",
        "0.5",
        "--gate-lr",
        "0",
        "--gate-extra-steps",
        "3",
        "--gates-out",
        gates,
    )
    assert res.code == 1
    last = res.err.strip().splitlines()[-1]
    assert last.startswith("Error: learned gates: the expected share removed is") and "after 3 extra steps" in last
    assert "Traceback" not in res.err and snapshot(tmp_path) == before  # nothing written, not even the state folder


def test_a_ratio_rounded_to_whole_heads_is_not_a_target_out_of_reach():
    gates = gates_for(TINY["reference"](), ratio=0.4, tolerance=0.01)  # 4.4 of 11 heads: select removes 4
    assert gates.goal == pytest.approx(4 / 11)  # 0.036 under 0.4 (rounding), not refused


def test_bad_gate_options_are_refused_and_nothing_is_written(cli, tmp_path):
    ckpt, data = saved_root(tmp_path, "reference")
    before = snapshot(tmp_path)
    out = tmp_path / "out.safetensors"
    cases = {
        ("learn", "--gate-tolerance"): ["--ratio", "0.5", "--gate-tolerance", "1.5"],
        ("learn", "--gate-warmup"): ["--ratio", "0.5", "--gate-warmup", "-0.1"],
        ("learn", "--gate-extra-steps"): ["--ratio", "0.5", "--gate-extra-steps", "-1"],
        ("finetune", "--hidden-weight > 0 needs a teacher"): ["--hidden-weight", "1"],
        ("learn", "--hidden-weight > 0 needs a teacher"): ["--ratio", "0.5", "--hidden-weight", "1"],
        ("learn", "--ratio: the gates would have to remove 1.000 of the heads, but the closing"): [
            "--ratio",
            "1.0",
        ],  # a gate budget above the heads that can go
    }
    for (command, message), extra in cases.items():
        assert_refused(cli(command, ckpt, "--data", data, "--steps", "2", "-o", out, *extra), 2, message)
        assert snapshot(tmp_path) == before
