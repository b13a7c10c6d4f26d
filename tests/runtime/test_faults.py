"""torchrun faults, named: a rank killed with kill -9, a truncated .distcp shard, a bad launch
environment. Two gloo processes on the CPU, a tiny LLaMA-GQA model."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from headprune_cli import load, save
from headprune_cli.model.surgery import apply_plan
from headprune_cli.stages.training import sharding
from tests.support import TINY, assert_refused
from tests.support.processes import env
from tests.support.training import tensor_set

TORCHRUN = str(Path(sys.executable).parent / "torchrun")
OUT = "o.safetensors"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    save(TINY["llama-gqa"](), tmp_path / "root.safetensors")
    model = load(tmp_path / "root.safetensors")
    apply_plan(model, {0: [0, 1, 2, 3]}, [])
    save(model, tmp_path / "pruned.safetensors")
    rows = load_file(str(tensor_set(tmp_path / "rows.safetensors", labels=False)))
    save_file({k: v.repeat(40, 1) for k, v in rows.items()}, str(tmp_path / "train.safetensors"))
    (tmp_path / "rows.safetensors").unlink()
    return tmp_path


def _torchrun(folder: Path, *extra: str, logs: str = "logs") -> subprocess.Popen:
    """finetune --fsdp under torchrun; each rank's stderr goes to its own file under LOGS (_errors)."""
    argv = [TORCHRUN, "--standalone", "--nproc-per-node", "2", "--log-dir", str(folder / logs), "--redirects", "2"]
    argv += ["-m", "headprune_cli", "finetune", "pruned.safetensors"]
    argv += ["--data", "train.safetensors", "--batch-size", "2", "--fsdp", "-o", OUT, *extra]
    return subprocess.Popen(argv, cwd=folder, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parent = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def _training_process(launcher: int, rank: int) -> int:
    """The process that trains as `rank` (the watched child: the deepest headprune process of that rank)."""
    pids = []
    for pid in _descendants(launcher):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ:
            pids.append(pid)
    assert pids, f"no process of rank {rank} under torchrun {launcher}"
    return max(pids)  # the watcher forks the training process after it starts


def _errors(logs: Path) -> list[str]:
    """Every `Error: ...` line each rank wrote to its own stderr (torchrun --redirects 2), rank 0
    first (a progress bar left unfinished may precede the line)."""
    files = sorted(logs.rglob("stderr.log"), key=lambda p: p.parent.name)
    assert len(files) == 2, files
    return [m for f in files for m in re.findall(r"(?:Internal error|Error): [^\n]*", f.read_text())]


def test_kill_9_of_one_rank_is_named_and_a_truncated_shard_is_refused_by_name(workspace: Path):
    run = _torchrun(workspace, "--steps", "5000", "--save-every", "2")
    state = workspace / f"{OUT}.state"
    deadline = time.monotonic() + 120
    while not (state / "latest.json").exists() and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert (state / "latest.json").exists(), run.communicate()[1][-3000:]
    os.kill(_training_process(run.pid, 1), signal.SIGKILL)
    _, err = run.communicate(timeout=120)
    assert run.returncode != 0
    step = json.loads((state / "latest.json").read_text())["step"]
    lines = _errors(workspace / "logs")
    assert len(lines) == 2, err[-3000:]  # one line per rank, no internal error
    advice = f"resume from step {step} (the state in {OUT}.state): rerun the same torchrun command with --resume"
    assert any(
        line.startswith("Error: rank 1 (pid ") and "died while rank 0 trained" in line and line.endswith(advice)
        for line in lines
    ), lines
    assert f"Error: rank 1 killed by SIGKILL; its temporaries were removed; {advice}" in lines, lines
    assert not (workspace / OUT).exists()  # no partial output
    target, _ = sharding.read_state(state, sharding.plan(load(workspace / "pruned.safetensors"), 2))
    assert target.name == f"step-{step:08d}"  # the state it names is intact

    # The same state with one shard cut short: both ranks refuse it by name, exit 2.
    shard = sorted(target.glob("*.distcp"))[0]
    os.truncate(shard, shard.stat().st_size // 2)
    resumed = _torchrun(workspace, "--steps", "5000", "--save-every", "2", "--resume", logs="logs-resumed")
    _, err = resumed.communicate(timeout=120)
    lines = _errors(workspace / "logs-resumed")
    expected = f"Error: --resume: shard {OUT}.state/{target.name}/{shard.name} of the training state is corrupt"
    assert len(lines) == 2 and all(line.startswith(expected) for line in lines), err[-3000:]
    assert err.count("exitcode  : 2 ") == 2  # torchrun's summary: both ranks exited 2
    assert not (workspace / OUT).exists()


@pytest.mark.parametrize(
    "environment,message",
    [
        ({"WORLD_SIZE": "2"}, "WORLD_SIZE=2 but RANK, MASTER_ADDR, MASTER_PORT not set"),
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not an integer"),
        ({"WORLD_SIZE": "2", "RANK": "2", "MASTER_ADDR": "localhost", "MASTER_PORT": "1"}, "RANK=2 is not below"),
        ({"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "x", "MASTER_PORT": "port"}, "MASTER_PORT='port'"),
        ({"LOCAL_RANK": "-1"}, None),  # one process: torchrun's variables are not read
    ],
)
@pytest.mark.parametrize("command", ["finetune", "score"])
def test_a_bad_launch_environment_is_one_line_before_anything_is_read(
    cli, monkeypatch, workspace: Path, environment: dict, message: str | None, command: str
):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    args = [command, workspace / "pruned.safetensors", "--data", workspace / "train.safetensors"]
    args += ["--steps", "1"] if command == "finetune" else []
    before = sorted(p.name for p in workspace.iterdir())
    result = cli(*args, "-o", workspace / "out.file")
    if message is None:
        assert result.code == 0, result
        return
    assert_refused(result, 2, message)
    assert "start it with torchrun --nproc-per-node N" in result.err
    assert sorted(p.name for p in workspace.iterdir()) == before
