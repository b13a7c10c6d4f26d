"""Bad input for `headprune tasks`, part of the bad-input matrix (its contract, workspace and
runner: test_bad_input_matrix.py). Each is one `Error: ...` line, the documented
exit code, and every file in the folder exactly as it was (no output folder made)."""

from __future__ import annotations

from pathlib import Path

import pytest

from headprune_cli import save
from headprune_cli.cli import main
from tests.hostile import test_bad_input_matrix as matrix
from tests.support import TINY

Case, M, run_case = matrix.Case, matrix.M, matrix.run_case
workspace = matrix.workspace  # the matrix's workspace fixture (module-scoped), used here as it is there
BUDGET = ["--target-flops", "0.6"]


def _task(folder: Path, name: str, model: str, extra: str = "") -> list:
    return ["--task", f"name={name},model={folder / model},data={folder / 'data.jsonl'}{extra}"]


def _stranger(folder: Path) -> None:
    """A model of the same family and shape from another base (its own root)."""
    save(TINY["reference"](), folder / "stranger.safetensors")


def _tasks(f: Path, second: str, *more) -> list:
    return ["tasks", *_task(f, "a", M), *_task(f, "b", second), *more, *BUDGET, "-o", f / "out"]


TASK_CASES = [
    Case("tasks of different bases", lambda f: _tasks(f, "stranger.safetensors"), 1, "do not share a base", _stranger),
    Case("a task pruned, its sibling not", lambda f: _tasks(f, "other.safetensors"), 1, "not a layout"),
    Case(
        "--base another model",
        lambda f: _tasks(f, M, "--base", f / "stranger.safetensors"),
        1,
        "does not come from the base",
        _stranger,
    ),
    Case(
        "scores of another model",
        lambda f: (
            ["tasks", *_task(f, "a", M), "--task", f"name=b,model={f / M},scores={f / 'other-scores.json'}"]
            + [*BUDGET, "-o", f / "out"]
        ),
        1,
        "made for another model",
        lambda f: main(
            ["score", str(f / "other.safetensors"), "--data", str(f / "data.jsonl"), "-o", str(f / "other-scores.json")]
        ),
    ),
    Case("a task model missing", lambda f: _tasks(f, "absent.safetensors"), 1, "no such checkpoint"),
    Case("one task only", lambda f: ["tasks", *_task(f, "a", M), *BUDGET, "-o", f / "out"], 2, "at least two --task"),
    Case("no budget", lambda f: ["tasks", *_task(f, "a", M), *_task(f, "b", M), "-o", f / "out"], 2, "budget"),
    Case("-o the data file", lambda f: [*_tasks(f, M)[:-1], f / "data.jsonl"], 2, "is also an input"),
]


@pytest.mark.parametrize("case", TASK_CASES, ids=[c.name for c in TASK_CASES])
def test_tasks_refusals(case: Case, workspace: Path, tmp_path: Path, cli):
    run_case(case, workspace, tmp_path, cli)
    assert not (tmp_path / "ws" / "out").exists()
