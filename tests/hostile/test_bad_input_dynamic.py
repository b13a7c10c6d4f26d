"""Bad input for the dynamic-heads benchmark (issue #39 part 3), part of the bad-input matrix
(its contract: tests.support.assert_refused): a gate budget above the head count, or one that
keeps no head, is refused with one `Error:` line, exit 2, and nothing written. Dynamic heads
ship as a benchmark, not a stage (BENCHMARKS.md section 24), so its driver is the one place a
gate budget is accepted."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support import ROOT, assert_refused, snapshot
from tests.support.processes import env
from tests.support.refusals import CliResult


@pytest.mark.parametrize(
    ("budget", "message"),
    [
        (["--shares", "1.5"], "gate budget 18 heads per layer is above the head count (12)"),
        (["--shares", "1.01"], "is above the head count"),
        (["--shares", "0.5", "--heads", "4", "--shares", "1.25"], "gate budget 5 heads per layer is above"),
        (["--shares", "0"], "at least 1 head per layer"),
    ],
)
def test_a_gate_budget_outside_the_head_count_is_refused_and_nothing_written(tmp_path, budget, message):
    (tmp_path / "keep.txt").write_text("untouched\n")
    before = snapshot(tmp_path)
    args = ["--work", str(tmp_path / "work"), "--json", str(tmp_path / "rows.json"), *budget]
    done = subprocess.run(
        [sys.executable, "-m", "scripts.benchmarks.dynamic_heads", *args],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert_refused(CliResult(done.returncode, done.stdout, done.stderr), 2, message)
    assert snapshot(tmp_path) == before and not (tmp_path / "work").exists()
