"""The hostile-input tests' user folder: a model, data, a scores and a plan artifact made by
the real commands (process helpers: tests/support/processes.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support import ROOT

DEMO = ROOT / "examples" / "demo"


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    from headprune_cli.cli import main

    folder = tmp_path_factory.mktemp("user")
    shutil.copy(DEMO / "model.safetensors", folder / "model.safetensors")
    rows = (DEMO / "dev.jsonl").read_text().splitlines()[:12]
    (folder / "data.jsonl").write_text("\n".join(rows) + "\n")
    assert (
        main(
            [
                "score",
                str(folder / "model.safetensors"),
                "--data",
                str(folder / "data.jsonl"),
                "--method",
                "random",
                "-o",
                str(folder / "scores.json"),
            ]
        )
        == 0
    )
    assert main(["select", str(folder / "scores.json"), "--ratio", "0.25", "-o", str(folder / "plan.json")]) == 0
    return folder


@pytest.fixture
def work(base, tmp_path) -> Path:
    """A fresh copy of the user's folder for one test."""
    folder = tmp_path / "work"
    shutil.copytree(base, folder)
    return folder
