"""Bad numbers and over-long values, part of the bad-input matrix (its contract, workspace
and runner: test_bad_input_matrix.py).

- number options out of the range their shared option type states (stages/options.py),
  refused with exit 2 when the options are read, before any model or data: seeds beyond
  32 bits (torch's generators overflowed at 2**64 with an internal error), learning rates of
  1e308 or inf, seconds of inf or NaN, budgets of inf.
- error lines: a task item of 800,000 characters (one line, its value cut to 80
  characters), an unset ${VAR} in a task item (one line, not a second one about the
  missing task), a run stage whose ratio is out of range.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.hostile import test_bad_input_matrix as matrix

Case, M, run_case = matrix.Case, matrix.M, matrix.run_case
workspace = matrix.workspace  # the matrix's workspace fixture (module-scoped), used here as it is there
DATA = "data.jsonl"
HUGE = str(2**70)


def _finetune(*extra: str) -> Callable[[Path], list]:
    return lambda f: ["finetune", f / M, "--data", f / DATA, "-o", f / "o.safetensors", *extra]


def _learn(*extra: str) -> Callable[[Path], list]:
    return lambda f: ["learn", f / M, "--data", f / DATA, "-o", f / "o.safetensors", *extra]


def _iterate(*extra: str) -> Callable[[Path], list]:
    return lambda f: ["iterate", f / M, "--data", f / DATA, "--eval-data", f / DATA, "-o", f / "o.safetensors", *extra]


def _search(*extra: str) -> Callable[[Path], list]:
    return lambda f: ["search", f / M, "--data", f / DATA, "--ratio", "0.5", "-o", f / "p.json", *extra]


def _tasks(*extra: str) -> Callable[[Path], list]:
    return lambda f: [
        "tasks",
        "--task",
        f"name=a,model={f / M},data={f / DATA}",
        "--task",
        f"name=b,model={f / M},data={f / DATA}",
        "--target-flops",
        "0.8",
        "-o",
        f / "t",
        *extra,
    ]


NUMBER_CASES = [
    Case("finetune --reinit 2**70", _finetune("--reinit", HUGE), 2, "--reinit"),
    Case("finetune --seed 2**70", _finetune("--seed", HUGE), 2, "--seed"),
    Case("finetune --seed -1", _finetune("--seed", "-1"), 2, "--seed"),
    Case("iterate --seed 2**70", _iterate("--seed", HUGE), 2, "--seed"),
    Case("search --seed 2**70", _search("--seed", HUGE), 2, "--seed"),
    Case("tasks --seed 2**70", _tasks("--seed", HUGE), 2, "--seed"),
    Case("score --seed 2**70", lambda f: ["score", f / M, "--data", f / DATA, "--seed", HUGE], 2, "--seed"),
    Case(
        "select --strategy random --seed 2**70",
        lambda f: ["select", f / "scores.json", "--ratio", "0.3", "--strategy", "random", "--seed", HUGE],
        2,
        "--seed",
    ),
    Case(
        "learn --gate-lr 1e308",
        _learn("--ratio", "0.5", "--gate-lr", "1e308"),
        2,
        "--gate-lr",
    ),
    Case("finetune --lr inf", _finetune("--lr", "inf"), 2, "--lr"),
    Case("iterate --lr 1e308", _iterate("--lr", "1e308"), 2, "--lr"),
    Case("search --seconds inf", _search("--seconds", "inf"), 2, "--seconds"),
    Case("search --seconds nan", _search("--seconds", "nan"), 2, "--seconds"),
    Case(
        "select --target-flops inf",
        lambda f: ["select", f / "scores.json", "--target-flops", "inf"],
        2,
        "--target-flops: Input should be a finite number",
    ),
]


def _run_config(*stages: dict) -> Callable[[Path], None]:
    def prepare(folder: Path) -> None:
        config = {"model": str(folder / M), "data": str(folder / DATA), "stages": list(stages)}
        (folder / "run.yaml").write_text(json.dumps(config))  # JSON is YAML

    return prepare


def _run_argv(f: Path) -> list:
    return ["run", f / "run.yaml", "--out", f / "out"]


def _tasks_stage(first: str) -> dict:
    return {"command": "tasks", "task": [first, "name=b,data=data.jsonl"], "target_flops": 0.8}


LONG = "name=" + "x" * 800_000 + ",data=data.jsonl"
LINE_CASES = [
    Case("run: a task item of 800,000 characters", _run_argv, 2, "a name is letters", _run_config(_tasks_stage(LONG))),
    Case(
        "run: a task item of 800,000 characters, not KEY=VALUE",
        _run_argv,
        2,
        "expected KEY=VALUE",
        _run_config(_tasks_stage("x" * 800_000)),
    ),
    Case(
        "run: an unset ${VAR} in a task item",
        _run_argv,
        2,
        "environment variable HEADPRUNE_SURELY_UNSET is not set",
        _run_config(_tasks_stage("name=a,model=${HEADPRUNE_SURELY_UNSET},data=data.jsonl")),
    ),
    Case(
        "run: select ratio 1.5",
        _run_argv,
        2,
        "--ratio 1.5 is outside [0, 1]",
        _run_config({"command": "score", "method": "random"}, {"command": "select", "ratio": 1.5}),
    ),
    Case(
        "run: search seconds .inf",
        _run_argv,
        2,
        "seconds",
        _run_config({"command": "search", "ratio": 0.5, "seconds": float("inf")}),
    ),
    Case(
        "learn --protect of 800,000 characters",
        _learn("--ratio", "0.5", "--protect", "0:" + "9" * 800_000),
        2,
        "--protect",
    ),
]


@pytest.mark.parametrize("case", NUMBER_CASES, ids=[c.name for c in NUMBER_CASES])
def test_numbers_out_of_range_are_refused_when_read(case, workspace: Path, tmp_path: Path, cli):
    run_case(case, workspace, tmp_path, cli)


@pytest.mark.parametrize("case", LINE_CASES, ids=[c.name for c in LINE_CASES])
def test_an_error_is_one_short_line(case, workspace: Path, tmp_path: Path, cli):
    result = run_case(case, workspace, tmp_path, cli)
    assert len(result.err) < 500, len(result.err)  # values in it cut to 80 characters
