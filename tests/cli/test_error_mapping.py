"""The CLI's one error mapping: refusals, environment failures and bugs are told apart.

A refusal of bad input is `Error: ...` with exit 1/2/3; a bug (any other exception, a Rust
panic from the tokenizers library included, which pyo3 raises as a BaseException) is
`Internal error: ...` with exit 70, so a crash can never pass for a refusal.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys

import pytest

from headprune_cli.errors import EXIT_INTERNAL, PlanError, UsageError
from headprune_cli.stages.select import choosing as select_stage
from tests.support import ROOT, assert_refused


class PanicException(BaseException):
    """Stands in for pyo3_runtime.PanicException, which derives from BaseException."""


def _raising(exc: BaseException):
    def command(*args, **kwargs):
        raise exc

    return command


@pytest.mark.parametrize(
    "exc",
    [ValueError("bad index"), KeyError("heads"), RecursionError(), PanicException("regex backtrack limit")],
    ids=["ValueError", "KeyError", "RecursionError", "PanicException"],
)
def test_bug_is_an_internal_error_not_a_refusal(exc, cli, monkeypatch, tmp_path):
    monkeypatch.setattr(select_stage, "read_artifact", _raising(exc), raising=True)
    (tmp_path / "s.json").write_text("{}")
    result = cli("select", tmp_path / "s.json", "--ratio", "0.5")
    assert result.code == EXIT_INTERNAL == 70, result
    lines = result.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Internal error: {type(exc).__name__}"), result.err
    assert "please report" in lines[0] and "HEADPRUNE_DEBUG=1" in lines[0] and "Traceback" not in result.err
    with pytest.raises(AssertionError, match="crashed instead of refusing"):
        assert_refused(result, 1, type(exc).__name__)


@pytest.mark.parametrize(
    ("exc", "code", "message"),
    [
        (UsageError("--ratio must be in [0, 1]"), 2, "--ratio must be"),
        (PlanError("head 9 out of range"), 1, "out of range"),
        (OSError(errno.ENOSPC, "No space left on device"), 1, "No space left on device"),
        (PermissionError(errno.EACCES, "Permission denied", "out.json"), 1, "Permission denied"),
    ],
    ids=["usage", "plan", "ENOSPC", "EACCES"],
)
def test_refusals_and_environment_failures_keep_their_codes(exc, code, message, cli, monkeypatch, tmp_path):
    monkeypatch.setattr(select_stage, "read_artifact", _raising(exc))
    (tmp_path / "s.json").write_text("{}")
    assert_refused(cli("select", tmp_path / "s.json", "--ratio", "0.5"), code, message)


_SCRIPT = """
import sys
from headprune_cli.stages.select import choosing as select_stage
from headprune_cli.cli.app import run
class PanicException(BaseException):
    pass
def boom(*a, **k):
    raise PanicException("called `Result::unwrap()` on an `Err` value")
select_stage.read_artifact = boom
sys.argv = ["headprune", "select", sys.argv[1], "--ratio", "0.5"]
run()
"""


@pytest.mark.parametrize("debug", ["", "1"])
def test_panic_through_the_console_entry_point(debug, tmp_path):
    """The real process exit status and stderr, as a CI job sees them; the traceback only on request."""
    (tmp_path / "s.json").write_text("{}")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HEADPRUNE_DEBUG": debug}
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(tmp_path / "s.json")], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 70, proc.stderr
    assert proc.stderr.splitlines()[-1].startswith("Internal error: PanicException: called `Result::unwrap()`"), (
        proc.stderr
    )
    assert ("Traceback" in proc.stderr) == bool(debug), proc.stderr
    if not debug:
        assert proc.stderr.count("\n") == 1, proc.stderr


def test_the_console_entry_point_delivers_what_it_printed_before_it_leaves():
    """run() leaves with os._exit (no interpreter teardown, docs/experiments/2026-12-01-large-models.md): what a
    command printed into a pipe, which Python buffers, must still arrive whole."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"} | {
        "PYTHONPATH": str(ROOT)
    }  # a pipe is block-buffered
    demo = ROOT / "examples/demo/model.safetensors"
    proc = subprocess.run(
        [sys.executable, "-m", "headprune_cli", "inspect", str(demo), "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    facts = json.loads(proc.stdout)
    assert facts["layers"] and proc.stdout.endswith("\n")
