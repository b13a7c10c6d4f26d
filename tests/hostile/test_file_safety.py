"""headprune never destroys a user's files: state folders it deletes, where a run writes, empty
folders after a refusal, one run per out folder, and signals during a write.

The rule (headprune_cli/files/outputs.py): it deletes or fills only folders it made (they carry
a marker), no output may resolve to anything the command reads, and `--force` replaces
earlier outputs, never inputs. The refusals themselves are cases of the bad-input matrix
(tests/hostile/test_bad_input_matrix.py, SAFETY_CASES); here are the cases that need a working
directory, a pipeline, a second process or a signal.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from headprune_cli import load, save
from headprune_cli.errors import EXIT_USAGE
from headprune_cli.files.outputs import MARKER, exclusive, make_folder
from headprune_cli.model.surgery import apply_plan
from tests.support import ROOT, TINY, assert_refused, snapshot

DEMO = ROOT / "examples" / "demo"


@pytest.fixture
def work(tmp_path, monkeypatch) -> Path:
    """The working directory of a user: a model, a pruned child of it, data."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(DEMO / "model.safetensors", tmp_path / "model.safetensors")
    rows = (DEMO / "dev.jsonl").read_text().splitlines()[:16]
    (tmp_path / "data.jsonl").write_text("\n".join(rows) + "\n")
    child = load(tmp_path / "model.safetensors")
    apply_plan(child, {0: [0]}, [])
    save(child, tmp_path / "child.safetensors")
    return tmp_path


def _config(folder: Path, stages: list[dict], **top) -> Path:
    config = {"model": "model.safetensors", "data": "data.jsonl", "out": "out", "stages": stages, **top}
    path = folder / "run.yaml"
    path.write_text(json.dumps(config))
    return path


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


# --- a training-state folder is deleted after success, so it must be ours -------
def test_state_dir_dot_keeps_the_working_directory(work, cli):
    before = snapshot(work)
    result = cli(
        "finetune",
        "model.safetensors",
        "--data",
        "data.jsonl",
        "--steps",
        "1",
        "-o",
        "ft.safetensors",
        "--state-dir",
        ".",
    )
    assert result.code == 2 and result.err.startswith("Error: ") and result.err.count("\n") == 1, result.err
    assert snapshot(work) == before


def test_state_dir_dot_in_yaml_keeps_the_working_directory(work, cli):
    config = _config(work, [{"command": "finetune", "steps": 1, "state_dir": "."}])
    before = snapshot(work)
    result = cli("run", config)
    assert result.code == 2, result.err
    assert "Traceback" not in result.err and "contains the input" in result.err
    after = {k: v for k, v in snapshot(work).items() if not k.startswith("out/")}
    assert after == before


def test_only_a_state_folder_headprune_made_is_removed(work, cli):
    """The default OUT.state is made, marked, and removed after success."""
    result = cli(
        "finetune",
        "model.safetensors",
        "--data",
        "data.jsonl",
        "--steps",
        "2",
        "--save-every",
        "1",
        "-o",
        "ft.safetensors",
    )
    assert result.code == 0, result.err
    assert (work / "ft.safetensors").is_file() and not (work / "ft.safetensors.state").exists()
    # an empty folder the user made is adopted (marked while in use), then removed with its contents
    (work / "st").mkdir()
    result = cli(
        "finetune",
        "model.safetensors",
        "--data",
        "data.jsonl",
        "--steps",
        "2",
        "--save-every",
        "1",
        "-o",
        "ft2.safetensors",
        "--state-dir",
        "st",
    )
    assert result.code == 0, result.err
    assert not (work / "st").exists()


# --- run writes only inside `out`, stage names are plain names ------------------
@pytest.mark.parametrize("name", ["../escaped", "../model", "ABSOLUTE", "a/b", ".hidden", " "])
def test_stage_name_is_a_plain_file_name(work, cli, name):
    name = str(work / "abs") if name == "ABSOLUTE" else name
    config = _config(work, [{"command": "score", "method": "random", "name": name}])
    before = snapshot(work)
    result = cli("run", config, "--force")
    assert result.code == 2 and "plain file name" in result.err, result.err
    assert snapshot(work) == before and not (work / "out").exists()
    assert not (work.parent / "escaped.json").exists() and not (work.parent / "model.json").exists()


def test_dollar_in_a_file_name_is_not_a_variable(work, monkeypatch):
    """Only `${NAME}` is expanded; `a$b.jsonl` is a file name."""
    from headprune_cli.pipeline.prepare import prepare

    shutil.copy(work / "data.jsonl", work / "a$b.jsonl")
    monkeypatch.setenv("HP_MODEL", "model.safetensors")
    monkeypatch.delenv("b", raising=False)
    pipeline = prepare(
        json.loads(_config(work, [{"command": "score"}], data="a$b.jsonl", model="${HP_MODEL}").read_text())
    )
    assert pipeline.config.data == "a$b.jsonl" and pipeline.config.model == "model.safetensors"
    assert "a$b.jsonl" in pipeline.stages[0].argv


# --- a refused or failed command leaves no empty folder ------------------------
@pytest.mark.parametrize(
    "args",
    [
        [
            "report",
            "--model",
            "child.safetensors",
            "--data",
            "data.jsonl",
            "--min-speedup",
            "1",
            "--repeats",
            "0",
            "--plot",
            "plots",
        ],
        ["report", "--model", "child.safetensors", "--data", "missing.jsonl", "--plot", "plots"],
        [
            "sweep",
            "model.safetensors",
            "--data",
            "data.jsonl",
            "--eval-data",
            "missing.jsonl",
            "--methods",
            "random",
            "-o",
            "plots",
        ],
    ],
)
def test_refused_command_leaves_no_empty_folder(work, cli, args):
    result = cli(*args)
    assert result.code in (1, 2) and result.err.count("\n") == 1, result.err
    assert not (work / "plots").exists()


def test_plot_folder_is_made_and_marked(work, cli):
    result = cli("report", "--model", "child.safetensors", "--data", "data.jsonl", "--repeats", "0", "--plot", "plots")
    assert result.code == 0, result.err
    assert (work / "plots" / "head_map.png").is_file() and (work / "plots" / MARKER).is_file()


# --- one run per out folder ----------------------------------------------------
def test_second_run_on_a_locked_out_folder_is_refused(work):
    config = _config(work, [{"command": "score", "method": "random"}])
    command = [sys.executable, "-m", "headprune_cli", "run", str(config)]
    with exclusive(make_folder(work / "out"), "`headprune run`"):  # as a first run holds it
        second = subprocess.run(command, capture_output=True, text=True, env=_env(), cwd=work)
    assert second.returncode == 1, second.stderr
    assert (
        second.stderr.startswith("Error: ") and second.stderr.count("\n") == 1 and "in use by another" in second.stderr
    )
    assert sorted(p.name for p in (work / "out").iterdir()) == [MARKER]
    after = subprocess.run(
        command, capture_output=True, text=True, env=_env(), cwd=work
    )  # the lock went with its holder
    assert after.returncode == 0, after.stderr
    assert (work / "out" / "scores.json").is_file()


# --- SIGTERM / SIGINT during a write --------------------------------------------
SLOW_WRITE = textwrap.dedent("""
    import sys, time
    import headprune_cli.model.checkpoint as checkpoint
    real = checkpoint.write_file

    def slow(path, specs, metadata):  # the temporary is on disk, half-way through the write
        real(path, specs, metadata)
        print(path, flush=True)
        time.sleep(120)

    checkpoint.write_file = slow
    from headprune_cli.cli import main
    sys.exit(main(sys.argv[1:]))
""")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_during_a_write_cleans_up_and_exits_130(work, cli, signum):
    script = work / "slow_write.py"
    script.write_text(SLOW_WRITE)
    assert (
        cli("score", "model.safetensors", "--data", "data.jsonl", "--method", "random", "-o", "scores.json").code == 0
    )
    before = snapshot(work)
    proc = subprocess.Popen(
        [sys.executable, str(script), "prune", "--scores", "scores.json", "--ratio", "0.5", "-o", "small.safetensors"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd=work,
        stdin=subprocess.DEVNULL,
    )
    tmp = Path(work / proc.stdout.readline().strip())
    assert tmp.name.endswith(".tmp") and tmp.is_file()
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err == "Error: interrupted\n"
    assert not tmp.exists() and not (work / "small.safetensors").exists()
    assert snapshot(work) == before


# --- atomic writes: the temporary file sits beside its target ----------------------------
def test_atomic_write_stages_a_hidden_temp_file_beside_the_target_and_gives_the_usual_mode(tmp_path):
    """Beside the target, so the final rename stays on one filesystem (atomic); named after
    it and hidden, so a leftover is recognisable; mode 0666 minus the umask, not mkstemp's 0600."""
    from headprune_cli.files.io import atomic_write

    target, seen = tmp_path / "model.safetensors", []

    def write(tmp: str) -> str:
        seen.append(Path(tmp))
        Path(tmp).write_bytes(b"new")
        return "done"

    previous = os.umask(0o022)
    try:
        assert atomic_write(target, write) == "done"
    finally:
        os.umask(previous)
    (tmp,) = seen
    assert tmp.parent == tmp_path and tmp.name.startswith(".model.safetensors.") and tmp.name.endswith(".tmp")
    assert target.read_bytes() == b"new" and not tmp.exists() and sorted(tmp_path.iterdir()) == [target]
    assert target.stat().st_mode & 0o777 == 0o644


# --- --force replaces what headprune wrote, never another tool's weights or JSON -----------
def _trainer_files(folder: Path) -> dict[str, Path]:
    """What a user keeps beside headprune's outputs: a transformers checkpoint and its JSON."""
    hf = folder / "hf"
    TINY["bert"]().save_pretrained(hf)  # metadata {"format": "pt"}: no headprune key
    (folder / "trainer_state.json").write_text(json.dumps({"best_metric": 0.91, "kind": "trainer"}))
    (folder / "renamed.bin").write_bytes((hf / "model.safetensors").read_bytes())  # content decides, not the name
    return {
        "weights": hf / "model.safetensors",
        "config": hf / "config.json",
        "json": folder / "trainer_state.json",
        "renamed": folder / "renamed.bin",
    }


@pytest.mark.parametrize(
    "target, what",
    [
        ("weights", "a safetensors file"),
        ("config", "a JSON file"),
        ("json", "a JSON file"),
        ("renamed", "a safetensors file"),
    ],
)
def test_force_never_replaces_weights_or_json_another_tool_wrote(work, cli, target, what):
    path = _trainer_files(work)[target]
    before = snapshot(work)
    result = cli("import", "child.safetensors", "-o", path, "--force")
    assert_refused(result, EXIT_USAGE, f"{path} is {what} headprune did not write")
    assert snapshot(work) == before


def test_force_replaces_headprune_outputs_and_other_files(work, cli):
    """Earlier checkpoints and artifacts are replaced, and so is a file that is neither
    safetensors nor JSON (a report or plot headprune cannot mark)."""
    (work / "notes.md").write_text("an old report\n")
    assert (
        cli("score", "model.safetensors", "--data", "data.jsonl", "--method", "random", "-o", "scores.json").code == 0
    )
    assert cli("select", "scores.json", "--ratio", "0.25", "-o", "plan.json").code == 0
    assert cli("select", "scores.json", "--ratio", "0.5", "-o", "plan.json", "--force").code == 0
    assert json.loads((work / "plan.json").read_text())["config"]["ratio"] == 0.5
    assert cli("import", "model.safetensors", "-o", "child.safetensors", "--force").code == 0
    replaced, original = load(work / "child.safetensors").state_dict(), load(work / "model.safetensors").state_dict()
    assert all(replaced[k].equal(original[k]) for k in original)  # the import of the model, not the pruned child
    assert (
        cli(
            "report",
            "--model",
            "child.safetensors",
            "--baseline",
            "model.safetensors",
            "--data",
            "data.jsonl",
            "--markdown",
            "notes.md",
            "--force",
        ).code
        == 0
    )
    assert (work / "notes.md").read_text() != "an old report\n"
