"""`headprune prune`: plan or scores in, smaller checkpoint out; compensation."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from headprune_cli import load
from headprune_cli.model.layout import info_of
from headprune_cli.model.surgery import apply_plan
from headprune_cli.stages.prune.compensation import compensate
from tests.support import (
    TINY,
    assert_refused,
    calibration,
    model_inputs,
    model_output,
    saved_model,
    snapshot,
    tensor_data,
    write_scores,
)


def outputs(path_or_model, family="bert"):
    model = load(path_or_model) if isinstance(path_or_model, Path) else path_or_model
    return model_output(model, model_inputs(family))


def test_prune_with_a_plan_file_and_from_stdin(tmp_path, cli, monkeypatch):
    model, model_path = saved_model(tmp_path)
    scores = write_scores(tmp_path, model, model_path)
    assert cli("select", scores, "--ratio", "0.5", "-o", tmp_path / "plan.json").code == 0
    plan = json.loads((tmp_path / "plan.json").read_text())
    result = cli("prune", model_path, "--plan", tmp_path / "plan.json", "-o", tmp_path / "a.safetensors")
    assert result.code == 0, result.err
    assert result.out == ""
    small = load(tmp_path / "a.safetensors")
    layout = info_of(small).layout
    for layer, removed in plan["remove_heads"].items():
        assert not set(removed) & set(layout.heads[layout.position(int(layer))])
    assert sum(len(h) for h in layout.heads) == 6
    from headprune_cli.files.io import sha256_file

    assert info_of(small).provenance["plan"] == sha256_file(tmp_path / "plan.json")
    # No checkpoint argument: the plan names the model; the plan arrives on stdin, so the
    # name it stores relative to its own folder is read from the current folder.
    monkeypatch.chdir(tmp_path)
    again = cli("prune", "-o", tmp_path / "b.safetensors", stdin=(tmp_path / "plan.json").read_text())
    assert again.code == 0, again.err
    assert torch.equal(outputs(tmp_path / "a.safetensors"), outputs(tmp_path / "b.safetensors"))
    # Scores on stdin are told apart by kind, and selected in place.
    third = cli("prune", "--ratio", "0.5", "-o", tmp_path / "c.safetensors", stdin=scores.read_text())
    assert third.code == 0, third.err
    assert torch.equal(outputs(tmp_path / "a.safetensors"), outputs(tmp_path / "c.safetensors"))


def test_ratio_zero_gives_an_identical_model(tmp_path, cli):
    model, model_path = saved_model(tmp_path)
    scores = write_scores(tmp_path, model, model_path)
    assert cli("prune", "--scores", scores, "--ratio", "0", "-o", tmp_path / "same.safetensors").code == 0
    same = load(tmp_path / "same.safetensors")
    original = load(model_path)
    assert info_of(same).layout == info_of(original).layout
    for (name, a), (_, b) in zip(same.state_dict().items(), original.state_dict().items()):
        assert torch.equal(a, b), name


def test_ratio_one_leaves_exactly_one_head_per_layer(tmp_path, cli):
    model, model_path = saved_model(tmp_path, "reference")
    scores = write_scores(tmp_path, model, model_path)
    result = cli("prune", "--scores", scores, "--ratio", "1", "--min-heads", "1", "-o", tmp_path / "one.safetensors")
    assert result.code == 0, result.err
    assert [len(h) for h in info_of(load(tmp_path / "one.safetensors")).layout.heads] == [1, 1, 1]


def test_model_is_found_relative_to_the_artifact(tmp_path, cli, monkeypatch):
    (tmp_path / "run").mkdir()
    model, model_path = saved_model(tmp_path / "run")
    monkeypatch.chdir(tmp_path / "run")
    write_scores(tmp_path / "run", model, Path("m.safetensors"))
    monkeypatch.chdir(tmp_path)
    result = cli("prune", "--scores", "run/scores.json", "--ratio", "0.25", "-o", "small.safetensors")
    assert result.code == 0, result.err


def test_a_plan_for_another_model_is_refused(tmp_path, cli):
    model, model_path = saved_model(tmp_path)
    other, other_path = saved_model(tmp_path, "roberta", "other.safetensors")
    scores = write_scores(tmp_path, model, model_path)
    assert cli("select", scores, "--ratio", "0.5", "-o", tmp_path / "plan.json").code == 0
    before = snapshot(tmp_path)
    result = cli("prune", other_path, "--plan", tmp_path / "plan.json", "-o", tmp_path / "x.safetensors")
    assert result.code != 0
    assert result.err.startswith("Error: ") and "another model" in result.err
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "args",
    [
        ["--ratio", "1.5"],
        ["--ratio", "0.3", "--min-heads", "7"],
        ["--ratio", "0.3", "--multiple-of", "5"],
        ["--ratio", "0.3", "--strategy", "nope"],
        ["--ratio", "0.3", "--compensate", "lstsq"],  # no --data
        ["--ratio", "0.3", "--compensate", "magic", "--data", "x"],
    ],
)
def test_prune_bad_input_writes_nothing(tmp_path, cli, args):
    model, model_path = saved_model(tmp_path)
    scores = write_scores(tmp_path, model, model_path)
    before = snapshot(tmp_path)
    result = cli("prune", "--scores", scores, *args, "-o", tmp_path / "out.safetensors")
    assert result.code != 0
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.err
    assert snapshot(tmp_path) == before


def test_nan_in_scores_is_refused_by_prune(tmp_path, cli):
    model, model_path = saved_model(tmp_path)
    scores = write_scores(tmp_path, model, model_path)
    text = scores.read_text().replace('"0": 0.', '"0": NaN, "y": 0.', 1)
    result = cli("prune", "--ratio", "0.3", "-o", tmp_path / "o.safetensors", stdin=text)
    assert result.code != 0 and result.err.startswith("Error: ")
    assert not (tmp_path / "o.safetensors").exists()


def test_selection_options_with_a_plan_are_refused(tmp_path, cli):
    model, model_path = saved_model(tmp_path)
    scores = write_scores(tmp_path, model, model_path)
    assert cli("select", scores, "--ratio", "0.5", "-o", tmp_path / "plan.json").code == 0
    result = cli("prune", "--plan", tmp_path / "plan.json", "--ratio", "0.2", "-o", tmp_path / "o.safetensors")
    assert_refused(result, 2, "--ratio: selection options apply to scores, but the input is a plan")


# --- compensation ---------------------------------------------------------------------
# LLaMA's o_proj has no bias, so `bias` is not offered there (test_bias_skips_layers_without_bias).
@pytest.mark.parametrize(
    ("family", "method"),
    [(f, m) for f in ("reference", "bert", "gpt2", "llama") for m in ("bias", "lstsq") if (f, m) != ("llama", "bias")],
)
def test_compensation_reduces_output_error(family, method):
    base = TINY[family]()
    remove = {0: [1], 1: [0, 2], 2: [0, 2]}
    held_out = calibration(2, seed=99)

    def error(model) -> float:
        total = 0.0
        for batch in held_out:
            ref, out = model_output(base, batch), model_output(model, batch)
            total += float(((out - ref) ** 2).sum() / (ref**2).sum())
        return total

    plain = copy.deepcopy(base)
    apply_plan(plain, remove, [])
    fixed = copy.deepcopy(base)
    result = compensate(fixed, remove, [], calibration(8, seed=1), method=method)
    apply_plan(fixed, remove, [])
    assert result.layers == [0, 1, 2]
    assert all(result.error_after[l] < result.error_before[l] for l in result.layers)
    assert error(fixed) < error(plain)


def test_compensation_with_dropped_layers_and_gqa():
    base = TINY["llama-gqa"]()
    remove, drop = {0: [0, 1, 2, 3]}, [1]
    fixed = copy.deepcopy(base)
    result = compensate(fixed, remove, drop, calibration(6, seed=2), method="lstsq")
    apply_plan(fixed, remove, drop)
    assert result.layers == [0] and result.error_after[0] < result.error_before[0]
    plain = copy.deepcopy(base)
    apply_plan(plain, remove, drop)
    assert model_output(fixed, model_inputs("llama")).shape == model_output(plain, model_inputs("llama")).shape


def test_bias_skips_layers_without_bias():
    model = TINY["llama"]()
    result = compensate(model, {0: [1]}, [], calibration(2, seed=0), method="bias")
    assert result.layers == [] and "no bias" in result.skipped[0]


def test_prune_compensate_from_the_command_line(tmp_path, cli):
    model, model_path = saved_model(tmp_path, "reference")
    scores = write_scores(tmp_path, model, model_path)
    data = tensor_data(tmp_path, n=48)
    common = ["--scores", scores, "--ratio", "0.5"]
    assert cli("prune", *common, "-o", tmp_path / "plain.safetensors").code == 0
    result = cli("prune", *common, "--compensate", "lstsq", "--data", data, "-o", tmp_path / "comp.safetensors")
    assert result.code == 0, result.err
    assert "lstsq compensation" in result.err and result.out == ""
    inputs = model_inputs("reference", batch=8, seq=10)
    ref = model_output(model, inputs)
    err = lambda p: float(((model_output(load(p), inputs) - ref) ** 2).mean())  # noqa: E731
    assert err(tmp_path / "comp.safetensors") < err(tmp_path / "plain.safetensors")
    # Calibration data without --compensate means the refit; --compensate none still opts out.
    assert cli("prune", *common, "--data", data, "-o", tmp_path / "data-only.safetensors").code == 0
    assert cli("prune", *common, "--compensate", "none", "--data", data, "-o", tmp_path / "none.safetensors").code == 0
    tensors = lambda name: load_file(str(tmp_path / name))  # noqa: E731 (the in-place plan records the options given)
    for implicit, explicit in (("data-only", "comp"), ("none", "plain")):
        a, b = tensors(f"{implicit}.safetensors"), tensors(f"{explicit}.safetensors")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# --- the pipe, end to end, as a shell runs it --------------------------------------------
def test_score_select_prune_pipe(tmp_path):
    exe = Path(sys.executable).with_name("headprune")
    assert exe.exists(), "the headprune console script must be installed next to this Python"
    model, model_path = saved_model(tmp_path, "reference")
    data = tensor_data(tmp_path, n=16)
    labels = torch.arange(16) % 2
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(data))
    tensors["labels"] = labels
    save_file(tensors, str(data))
    score = f"{exe} score m.safetensors --method taylor --data calib.safetensors"
    for tail in [
        f"{exe} select --ratio 0.3 | {exe} prune -o a.safetensors",
        f"{exe} prune --ratio 0.3 --min-heads 1 -o b.safetensors",
    ]:
        run = subprocess.run(f"{score} | {tail}", shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        assert run.stdout == ""
    a, b = load(tmp_path / "a.safetensors"), load(tmp_path / "b.safetensors")
    assert info_of(a).layout == info_of(b).layout
    assert sum(len(h) for h in info_of(a).layout.heads) == 11 - 3  # 4+3+4 heads, round(3.3) removed
