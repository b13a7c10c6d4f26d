"""`profile` as a pipeline stage and as the command its --help shows."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import yaml

import headprune_cli
from headprune_cli.stages import timing
from tests.support import ROOT, TINY, tensor_data
from tests.support.latency import MacTimer

FAST = {"points": 3, "rounds": 1, "warmup": 0, "min_time": 0.0, "batch_size": 2, "seq_len": 8, "threads": 1}


@pytest.fixture
def fake_clock(monkeypatch):
    monkeypatch.setattr(timing, "make_timer", MacTimer)


def test_a_pipeline_profiles_then_prunes_to_a_latency_target(tmp_path, cli, fake_clock, monkeypatch):
    monkeypatch.chdir(tmp_path)
    headprune_cli.save(TINY["bert"](), tmp_path / "model.safetensors")
    tensor_data(tmp_path)  # calib.safetensors
    config = {
        "model": "model.safetensors",
        "data": "calib.safetensors",
        "out": "out",
        "seed": 0,
        "stages": [
            {"command": "profile", **FAST},
            {"command": "score", "method": "fisher", "objective": "fidelity", "samples": 8, "ffn": True},
            {"command": "select", "target_latency": 0.8},
            {"command": "prune"},
        ],
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    result = cli("run", "run.yaml")
    assert result.code == 0, result.err
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert plan["latency"]["after_fraction"] <= 0.8 + 1e-9
    assert [r["path"] for r in plan["inputs"] if r["role"] == "latency"] == ["latency.json"]
    assert (tmp_path / "out" / "pruned.safetensors").is_file()


def test_a_flops_target_in_a_pipeline_with_a_profile_ignores_the_table(tmp_path, cli, fake_clock, monkeypatch):
    from headprune_cli.pipeline.prepare import prepare

    monkeypatch.chdir(tmp_path)
    headprune_cli.save(TINY["bert"](), tmp_path / "model.safetensors")
    tensor_data(tmp_path)
    config = {
        "model": "model.safetensors",
        "data": "calib.safetensors",
        "out": "out",
        "stages": [
            {"command": "profile"},
            {"command": "score", "method": "fisher"},
            {"command": "select", "target_flops": 0.8},
        ],
    }
    assert "--latency" not in prepare(config).stages[2].argv


def test_profile_help_states_the_default_grid_and_its_examples_run(tmp_path, cli, fake_clock, monkeypatch):
    result = cli("profile", "--help")
    assert result.code == 0
    text = " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.out).split())
    assert "default 9: the smallest allowed count, every eighth of the full count, and all" in text
    from headprune_cli.stages.profile.stage import HELP

    examples = [line.strip() for line in HELP.splitlines() if line.strip().startswith("headprune ")]
    assert len(examples) == 3 and all(example.split(" -o ")[0][:40] in text for example in examples)
    monkeypatch.chdir(tmp_path)
    model = TINY["bert"]()
    headprune_cli.save(model, tmp_path / "model.safetensors")
    from tests.support import write_scores

    write_scores(tmp_path, model, tmp_path / "model.safetensors")
    fast = [f"--{k.replace('_', '-')}={v}" for k, v in FAST.items()]
    assert cli(*examples[0].split()[1:], *fast).code == 0
    cuda = cli(*examples[1].split()[1:], *fast, "--force")  # this machine has no GPU: a clear refusal
    assert cuda.code == 2 and "no CUDA device" in cuda.err
    select = cli(*examples[2].split()[1:])  # the scores and the table of the same model.safetensors
    assert select.code == 0, select.err
    assert json.loads((tmp_path / "plan.json").read_text())["latency"]["after_fraction"] <= 0.7 + 1e-9


def test_select_with_a_latency_table_does_not_import_torch(tmp_path):
    from tests.support import saved_model, write_scores
    from tests.support.latency import write_latency

    model, path = saved_model(tmp_path, "bert")
    scores = write_scores(tmp_path, model, path)
    table = write_latency(tmp_path / "latency.json", model, path)
    probe = (
        f"from headprune_cli.cli.app import main\n"
        f"main(['select', {str(scores)!r}, '--latency', {str(table)!r}, '--target-latency', '0.9', '-o', "
        f"{str(tmp_path / 'plan.json')!r}])\n"
        "import sys\nprint([m for m in ('torch', 'transformers') if m in sys.modules])"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stderr
    assert json.loads((tmp_path / "plan.json").read_text())["latency"]["after_fraction"] <= 0.9 + 1e-9
