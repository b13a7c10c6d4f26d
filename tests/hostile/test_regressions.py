"""Hostile-input defects that need more than one bad file: tampered training state, a full
disk reported by safetensors' own writer, a file-size limit, a perplexity that overflows,
the demo model's 64 positions, and a run fingerprint that must not walk folders.
(The single-file cases are in tests/hostile/test_bad_input_matrix.py's HOSTILE list.)
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from headprune_cli import save
from headprune_cli.errors import UsageError
from headprune_cli.stages.training.train import FinetuneConfig, finetune
from tests.support import ROOT, TINY, VOCAB, snapshot

DEMO = ROOT / "examples" / "demo"


def _data(rows: int = 24, seq: int = 8) -> dict[str, torch.Tensor]:
    ids = torch.randint(2, VOCAB, (rows, seq), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids[:, 0] % 2}


# --- tampered resume state is refused, never trained from ----------------------
@pytest.mark.parametrize(
    "tamper, message",
    [
        (lambda state, latest: state.update(step=-1), "greater than or equal to 1"),
        (lambda state, latest: state.update(step=99), "outside this run's 1..4"),
        (lambda state, latest: state.update(step="2"), "valid integer"),
        (lambda state, latest: state.update(history=[{"epoch": 0}]), "history"),
        (lambda state, latest: latest.update(folder="../../elsewhere"), "not a step folder"),
    ],
    ids=["negative step", "step past the total", "step a string", "history malformed", "pointer leaves the folder"],
)
def test_tampered_resume_state_is_refused(tmp_path, tamper, message):
    data, folder = _data(), tmp_path / "st"
    cfg = dict(steps=4, lr=1e-3, batch_size=8, seed=1)
    finetune(TINY["reference"](), data, FinetuneConfig(**cfg, state_dir=folder, stop_after=2))
    latest = json.loads((folder / "latest.json").read_text())
    state_file = folder / latest["folder"] / "state.json"
    state = json.loads(state_file.read_text())
    tamper(state, latest)
    state_file.write_text(json.dumps(state))
    (folder / "latest.json").write_text(json.dumps(latest))
    with pytest.raises(UsageError, match=message):
        finetune(TINY["reference"](), data, FinetuneConfig(**cfg, state_dir=folder, resume=True))


# --- a write that fails in the OS is one line, and leaves nothing ------------------
@pytest.fixture
def demo(tmp_path: Path, cli) -> Path:
    shutil.copy(DEMO / "model.safetensors", tmp_path / "model.safetensors")
    rows = (DEMO / "dev.jsonl").read_text().splitlines()[:16]
    (tmp_path / "data.jsonl").write_text("\n".join(rows) + "\n")
    assert (
        cli(
            "score", tmp_path / "model.safetensors", "--data", tmp_path / "data.jsonl", "-o", tmp_path / "scores.json"
        ).code
        == 0
    )
    assert cli("select", tmp_path / "scores.json", "--ratio", "0.25", "-o", tmp_path / "plan.json").code == 0
    return tmp_path


def test_disk_full_inside_safetensors_is_one_line(demo: Path, cli, monkeypatch):
    """safetensors' Rust writer reports ENOSPC as its own SafetensorError, not an OSError:
    saving the training state must still end in one line and leave no temporary folder."""
    from safetensors import SafetensorError

    import headprune_cli.stages.training.state as state

    def full_disk(tensors, path, metadata=None):
        Path(path).write_bytes(b"partial")
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(state, "save_file", full_disk)
    result = cli(
        "finetune",
        demo / "model.safetensors",
        "--data",
        demo / "data.jsonl",
        "--steps",
        "2",
        "--save-every",
        "1",
        "--state-dir",
        demo / "st",
        "-o",
        demo / "out.safetensors",
    )
    last = result.err.splitlines()[-1]  # after the progress bar: the one error line
    assert (
        result.code == 1
        and last.startswith("Error: could not save the training state")
        and last.endswith("No space left on device")
    ), result.err
    assert "Traceback" not in result.err and result.err.count("Error:") == 1 and not (demo / "out.safetensors").exists()
    assert not list((demo / "st").glob(".step-*"))


def test_file_size_limit_is_one_line(demo: Path):
    """A real EFBIG: the prune output is larger than RLIMIT_FSIZE allows."""
    before = snapshot(demo)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "headprune_cli",
            "prune",
            str(demo / "model.safetensors"),
            "--plan",
            str(demo / "plan.json"),
            "-o",
            str(demo / "small.safetensors"),
        ],
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (
        result.returncode == 1
        and result.stderr == f"Error: could not write {demo / 'small.safetensors'}: File too large\n"
    ), result.stderr
    assert snapshot(demo) == before


# --- score's default --max-length fits the model's 64 positions ----------------------
def test_score_clamps_max_length_to_the_position_table(demo: Path, cli):
    (demo / "long.jsonl").write_text(json.dumps({"text": " ".join(["X a b Y"] * 60), "label": 1}) + "\n")
    result = cli("score", demo / "model.safetensors", "--data", demo / "long.jsonl", "-o", demo / "long.json")
    assert result.code == 0, result.err
    assert json.loads((demo / "long.json").read_text())["config"]["max_length"] == 64


# --- a perplexity that overflows fails the gate (exit 3), reports written ------------
def test_perplexity_overflow_is_a_gate_failure(tmp_path: Path, cli):
    base = TINY["llama"]()
    save(base, tmp_path / "base.safetensors")
    broken = TINY["llama"]()
    with torch.no_grad():
        broken.lm_head.weight.mul_(1e5)  # logits of ~1e5: a mean loss far above log(float max)
    save(broken, tmp_path / "broken.safetensors")
    ids = torch.randint(2, VOCAB, (6, 10), generator=torch.Generator().manual_seed(0))
    save_file({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, str(tmp_path / "eval.safetensors"))
    result = cli(
        "report",
        "--model",
        tmp_path / "broken.safetensors",
        "--baseline",
        tmp_path / "base.safetensors",
        "--data",
        tmp_path / "eval.safetensors",
        "--max-drop",
        "1",
        "--repeats",
        "0",
        "--json",
        tmp_path / "r.json",
        "--markdown",
        tmp_path / "r.md",
    )
    assert result.code == 3, result.err
    assert result.err.splitlines()[-1].startswith("FAIL: gate max-drop failed") and "Traceback" not in result.err
    assert "1.798e+308" in result.err and len(result.err) < 2000
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["main_metric"]["pruned"] == sys.float_info.max and report["verdict"] == "fail"
    assert (tmp_path / "r.md").is_file()


# --- the rerun fingerprint hashes input files, never a folder an option names --------
def test_fingerprint_does_not_walk_a_folder_named_by_an_option(tmp_path: Path):
    from headprune_cli.pipeline.execute import stage_fingerprint
    from headprune_cli.pipeline.prepare import Stage

    tree = tmp_path / "usr"
    (tree / "deep").mkdir(parents=True)
    (tree / "deep" / "file").write_text("one")
    (tmp_path / "scores.json").write_text("{}")
    stage = Stage("select", "select", {}, argv=["select", str(tmp_path / "scores.json"), "--protect", str(tree)])
    first = stage_fingerprint(stage)
    (tree / "deep" / "file").write_text("two")
    assert stage_fingerprint(stage) == first  # the folder was not read
    (tmp_path / "scores.json").write_text("{ }")
    assert stage_fingerprint(stage) != first  # the input file was
