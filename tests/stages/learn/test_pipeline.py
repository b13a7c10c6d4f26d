"""`learn` as a `headprune run` stage: the same files as the command, and the old spelling refused."""

from __future__ import annotations

import json

import yaml

from tests.support import assert_refused, snapshot
from tests.support import saved_root as root

LEARN = {"ratio": 0.5, "steps": 6, "lr": 1e-3, "batch_size": 8, "gate_tolerance": 1.0, "seed": 2}


def _config(folder, ckpt, data, stage: dict):
    path = folder / "run.yaml"
    path.write_text(
        yaml.safe_dump({"model": str(ckpt), "data": str(data), "out": str(folder / "out"), "stages": [stage]})
    )
    return path


def test_a_learn_stage_writes_what_the_command_writes(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")
    ckpt, data = root(tmp_path, "reference")
    res = cli("run", _config(tmp_path, ckpt, data, {"command": "learn", "gates_out": True, **LEARN}))
    assert res.code == 0, res.err
    out = tmp_path / "out"
    assert (out / "learned.safetensors").is_file() and (out / "learned.gates.json").is_file()
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in LEARN.items()]
    mine = tmp_path / "cli"  # beside out/: the provenance's relative paths to the root are the same
    mine.mkdir()
    gates = mine / "learned.gates.json"
    assert (
        cli("learn", ckpt, "--data", data, *flags, "--gates-out", gates, "-o", mine / "learned.safetensors").code == 0
    )
    assert (out / "learned.safetensors").read_bytes() == (mine / "learned.safetensors").read_bytes()
    ran, typed = json.loads((out / "learned.gates.json").read_text()), json.loads(gates.read_text())
    for scores in (ran, typed):  # the pipeline records its inputs' paths as given, the command relative to -o
        scores["inputs"] = [{k: v for k, v in ref.items() if k != "path"} for ref in scores["inputs"]]
    assert ran == typed


def test_a_finetune_stage_with_learned_gates_is_refused_naming_learn(cli, tmp_path):
    ckpt, data = root(tmp_path, "reference")
    config = _config(tmp_path, ckpt, data, {"command": "finetune", "learn_gates": True, "gate_ffn": True, **LEARN})
    before = snapshot(tmp_path)
    message = "stages.0 (finetune).learn_gates, ratio, gate_ffn, gate_tolerance: moved to the `learn` stage"
    assert_refused(cli("run", config), 2, message)
    assert snapshot(tmp_path) == before
