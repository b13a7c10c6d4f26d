"""headprune score: each method computes what it claims (checked against an independent computation)
and the CLI contract."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from headprune_cli import save
from headprune_cli.data.readers import read_data
from headprune_cli.model.layout import info_of
from headprune_cli.model.surgery import HeadGates, apply_plan
from headprune_cli.stages.objectives import embed, per_example_loss
from headprune_cli.stages.score.importance import score_model
from headprune_cli.stages.score.importance.context import ScoreContext
from headprune_cli.stages.score.importance.gradients import batch_losses
from tests.support import TINY, assert_refused, give_tokenizer, snapshot, write_jsonl, write_text


def _mean_loss(model, data, objective="classification", gates=None):
    batch = {"input_ids": data.input_ids, "attention_mask": data.attention_mask}
    if data.labels is not None:
        batch["labels"] = data.labels
    with torch.no_grad(), HeadGates(model, gates or [torch.ones(n) for n in map(len, info_of(model).layout.heads)]):
        return per_example_loss(embed(model, batch), batch, objective).double().mean().item()


@pytest.fixture
def setup(tmp_path):
    model = give_tokenizer(TINY["reference"]())
    data = read_data(write_jsonl(tmp_path / "d.jsonl", 12, num_labels=2), model)
    return model, data


def test_gate_gradients_match_finite_differences(setup):
    model = setup[0].double()
    data = setup[1]
    result = score_model(model, data, "gradient", batch_size=5, normalize=False)
    # |dL_i/dgate| per example: check the signed per-example derivative of one head by central differences.
    ctx = ScoreContext(model, data, "classification", batch_size=len(data))
    batch = {"input_ids": data.input_ids[:1], "attention_mask": data.attention_mask[:1], "labels": data.labels[:1]}
    for pos, head in [(0, 1), (1, 2), (2, 0)]:
        gates = [torch.ones(1, n, dtype=torch.float64, requires_grad=True) for n in (4, 3, 4)]
        with HeadGates(model, gates):
            loss = batch_losses(ctx, batch, 0).sum()
        (grad,) = torch.autograd.grad(loss, [gates[pos]])
        eps, diffs = 1e-5, []
        for sign in (1, -1):
            g = [torch.ones(n, dtype=torch.float64) for n in (4, 3, 4)]
            g[pos][head] += sign * eps
            with torch.no_grad(), HeadGates(model, g):
                diffs.append(batch_losses(ctx, batch, 0).sum().item())
        assert grad[0, head].item() == pytest.approx((diffs[0] - diffs[1]) / (2 * eps), rel=1e-6, abs=1e-9)
    # And the scorer's mean |dL_i/dgate| equals the same derivative averaged by hand.
    manual = 0.0
    for i in range(len(data)):
        gates = [torch.ones(1, n, dtype=torch.float64, requires_grad=True) for n in (4, 3, 4)]
        one = {
            "input_ids": data.input_ids[i : i + 1],
            "attention_mask": data.attention_mask[i : i + 1],
            "labels": data.labels[i : i + 1],
        }
        with HeadGates(model, gates):
            loss = batch_losses(ctx, one, 0).sum()
        manual += torch.autograd.grad(loss, [gates[1]])[0][0, 2].abs().item()
    assert result.heads[1][2] == pytest.approx(manual / len(data), rel=1e-9)


def test_loo_equals_physical_removal(setup):
    model, data = setup
    result = score_model(model, data, "loo", batch_size=5)
    base = _mean_loss(model, data)
    for layer, head in [(0, 0), (1, 2), (2, 3)]:
        cut = apply_plan(copy.deepcopy(model), {layer: [head]}, [])
        assert result.heads[layer][head] == pytest.approx(_mean_loss(cut, data) - base, abs=2e-6)


def test_layer_loo_and_cosine(setup):
    model, data = setup
    result = score_model(model, data, "random", layers="loo", batch_size=5)
    base = _mean_loss(model, data)
    cut = apply_plan(copy.deepcopy(model), {}, [1])
    assert result.layers[1] == pytest.approx(_mean_loss(cut, data) - base, abs=2e-6)
    cosine = score_model(model, data, "random", layers="cosine").layers
    assert all(0 < v < 2 for v in cosine.values())


def test_dead_heads_score_zero_and_rank_last(setup):
    model, data = setup
    dead = {0: 2, 1: 0, 2: 3}
    with torch.no_grad():
        for layer, head in dead.items():
            model.layers[layer].attention.o_proj.weight[:, head * 8 : (head + 1) * 8] = 0
    for method in ("gradient", "taylor", "taylor-weight", "fisher", "loo"):
        heads = score_model(model, data, method, batch_size=5).heads
        for layer, head in dead.items():
            assert heads[layer][head] == 0.0, (method, layer, head)
        alive = [v for layer, hs in heads.items() for h, v in hs.items() if dead[layer] != h]
        if method == "loo":  # signed: only heads whose removal lowers the loss may rank below
            assert all(v < 0 for v in alive if v <= 0)
        else:
            assert min(alive) > 0, method


@pytest.mark.parametrize(
    "name, objective", [("gpt2", "causal-lm"), ("llama-gqa", "causal-lm"), ("roberta", "fidelity")]
)
def test_every_objective_scores_every_head(tmp_path, name, objective):
    model = give_tokenizer(TINY[name](), encoder=name == "roberta")
    data = read_data(write_text(tmp_path / "t.txt", 6), model)
    for method in ("taylor", "loo", "entropy"):
        result = score_model(model, data, method, batch_size=4)
        assert result.objective == objective
        assert sum(len(v) for v in result.heads.values()) == sum(info_of(model).layout.num_heads)
        assert any(v != 0 for hs in result.heads.values() for v in hs.values())


def test_scores_use_original_indices(setup):
    model, data = setup
    apply_plan(model, {0: [1], 2: [0, 3]}, [1])
    heads = score_model(model, data, "taylor", batch_size=5).heads
    assert {k: sorted(v) for k, v in heads.items()} == {0: [0, 2, 3], 2: [1, 2]}


# --- CLI ----------------------------------------------------------------------------------------
@pytest.fixture
def files(tmp_path):
    model = give_tokenizer(TINY["reference"]())
    save(model, tmp_path / "m.safetensors")
    write_jsonl(tmp_path / "d.jsonl", 10, num_labels=2)
    return tmp_path


def _strip(text):
    data = json.loads(text)
    data.pop("created")
    return data


def test_cli_json_on_stdout_deterministic(files, cli):
    first = cli(
        "score",
        files / "m.safetensors",
        "--data",
        files / "d.jsonl",
        "--method",
        "combined",
        "--weights",
        "taylor=1,fisher=0.5",
        "--seed",
        "3",
        "--batch-size",
        "4",
        "--layers",
    )
    assert first.code == 0, first.err
    data = json.loads(first.out)
    assert data["kind"] == "scores" and data["method"] == "combined" and data["samples"] == 10
    assert [i["role"] for i in data["inputs"]] == ["model", "data"]
    assert data["config"]["weights"] == {"fisher": 0.5, "taylor": 1.0} and data["layers"]
    second = cli(
        "score",
        files / "m.safetensors",
        "--data",
        files / "d.jsonl",
        "--method",
        "combined",
        "--weights",
        "taylor=1,fisher=0.5",
        "--seed",
        "3",
        "--batch-size",
        "4",
        "--layers",
        "-o",
        files / "s.json",
    )
    assert second.code == 0 and second.out == ""
    on_stdout, in_file = _strip(first.out), _strip((files / "s.json").read_text())
    # A file names the inputs in its own folder relative to it; stdout has no folder.
    assert [i["path"] for i in on_stdout.pop("inputs")] == [str(files / "m.safetensors"), str(files / "d.jsonl")]
    assert [i["path"] for i in in_file.pop("inputs")] == ["m.safetensors", "d.jsonl"]
    assert in_file == on_stdout
    assert cli("score", files / "m.safetensors", "--data", files / "d.jsonl", "-o", files / "s.json").code == 2


@pytest.mark.parametrize("extra, method", [((), "taylor"), (("--ffn",), "fisher")])
def test_the_default_method_is_the_measured_winner_per_unit(files, cli, extra, method):
    """Heads alone: taylor; with FFN neurons: fisher (BENCHMARKS.md, "Which method"). The artifact names
    the method that ran, and equals what naming it gives."""
    common = ("score", files / "m.safetensors", "--data", files / "d.jsonl", *extra)
    default, named = cli(*common), cli(*common, "--method", method)
    assert default.code == 0 and named.code == 0, default.err + named.err
    assert json.loads(default.out)["method"] == method
    assert _strip(default.out) == _strip(named.out)


def test_cli_unknown_method_did_you_mean(files, cli):
    result = cli("score", files / "m.safetensors", "--data", files / "d.jsonl", "--method", "tailor")
    assert_refused(result, 2, "did you mean 'taylor'")


@pytest.mark.parametrize(
    "content, extra",
    [
        ("", []),
        ('{"text": "w1 w2", "label": 5}\n', []),
        ('{"text": "w1 w2"}\n', []),
        (None, ["--samples", "0"]),
    ],
)
def test_cli_bad_input(files, cli, content, extra):
    data = files / "d.jsonl"
    if content is not None:
        data.write_text(content)
    before = snapshot(files)
    result = cli("score", files / "m.safetensors", "--data", data, *extra, "-o", files / "out.json")
    assert result.code != 0 and result.out == ""
    assert [line for line in result.err.splitlines() if line.startswith("Error:")] and "Traceback" not in result.err
    assert snapshot(files) == before


def test_cli_tokenizerless_checkpoint(files, cli):
    save(TINY["reference"](), files / "bare.safetensors")
    result = cli("score", files / "bare.safetensors", "--data", files / "d.jsonl")
    assert result.code == 1 and "no tokenizer" in result.err and result.out == ""


def test_torchrun_two_processes_equal_one(files):
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SOURCE_DATE_EPOCH": "0"}
    args = [
        "-m",
        "headprune_cli",
        "score",
        str(files / "m.safetensors"),
        "--data",
        str(files / "d.jsonl"),
        "--method",
        "combined",
        "--weights",
        "gradient=1,taylor=1,fisher=1,loo=1,entropy=1",
        "--batch-size",
        "2",
        "--layers",
    ]
    one = subprocess.run(
        [sys.executable, *args, "-o", str(files / "one.json")], env=env, capture_output=True, text=True
    )
    assert one.returncode == 0, one.stderr
    two = subprocess.run(
        [str(torchrun), "--nproc-per-node", "2", "--master-port", "29517", *args, "-o", str(files / "two.json")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert two.returncode == 0, two.stderr[-2000:]
    a, b = json.loads((files / "one.json").read_text()), json.loads((files / "two.json").read_text())
    assert a["samples"] == b["samples"] == 10
    for layer, heads in a["heads"].items():
        for head, value in heads.items():
            assert b["heads"][layer][head] == pytest.approx(value, abs=1e-6, rel=1e-6)
    for layer, value in a["layers"].items():
        assert b["layers"][layer] == pytest.approx(value, abs=1e-6)
    for layer, value in a["attention"].items():  # --layers defaults to refit, which measures attention too
        assert b["attention"][layer] == pytest.approx(value, abs=1e-6)
