"""What the hostile-input tests share: a user's working folder (a model, data, a scores and a
plan artifact made by the real commands), running the installed entry point in a real
process, and the checks every refusal must pass."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from headprune_cli.temps import TEMP_PATTERN

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "demo"
PANIC_TEXT = ("panicked", "stack backtrace", "RUST_BACKTRACE", "Traceback", "pyo3")


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    from headprune_cli.cli import main

    folder = tmp_path_factory.mktemp("user")
    shutil.copy(DEMO / "model.safetensors", folder / "model.safetensors")
    rows = (DEMO / "dev.jsonl").read_text().splitlines()[:12]
    (folder / "data.jsonl").write_text("\n".join(rows) + "\n")
    assert main(["score", str(folder / "model.safetensors"), "--data", str(folder / "data.jsonl"), "--method", "random", "-o", str(folder / "scores.json")]) == 0
    assert main(["select", str(folder / "scores.json"), "--ratio", "0.25", "-o", str(folder / "plan.json")]) == 0
    return folder


@pytest.fixture
def work(base, tmp_path) -> Path:
    """A fresh copy of the user's folder for one test."""
    folder = tmp_path / "work"
    shutil.copytree(base, folder)
    return folder


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def headprune(*args, cwd: Path, script: Path | None = None, **popen) -> subprocess.Popen:
    """A real `headprune` process (the console entry point, watcher included); `script`
    runs a hook file first that ends by calling that entry point."""
    program = [str(script)] if script is not None else ["-m", "headprune_cli"]
    return subprocess.Popen([sys.executable, *program, *map(str, args)], cwd=cwd, env=env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def finished(process: subprocess.Popen, timeout: float = 120) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def leftovers(folder: Path) -> list[str]:
    """Temporaries anywhere under `folder`: headprune's naming, or any hidden *.tmp."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if TEMP_PATTERN.match(p.name) or (p.name.startswith(".") and p.name.endswith(".tmp")))


def assert_one_error(code: int, err: str, expected_code: int, fragment: str) -> None:
    """Exit `expected_code`, exactly one `Error: ...` line holding `fragment`, no panic or traceback."""
    assert code == expected_code, (code, err)
    assert err.startswith("Error: ") and err.count("\n") == 1 and err.endswith("\n"), err
    assert fragment.lower() in err.lower(), (fragment, err)
    assert not any(text in err for text in PANIC_TEXT), err
