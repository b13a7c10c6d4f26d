"""Real `headprune` processes for tests: the installed entry point (watcher included), their
results, the temporaries they leave, and the one-line refusal every bad input must get."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from headprune_cli.files.temps import TEMP_PATTERN

ROOT = Path(__file__).resolve().parents[2]
PANIC_TEXT = ("panicked", "stack backtrace", "RUST_BACKTRACE", "Traceback", "pyo3")


def env() -> dict:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }


def headprune(*args, cwd: Path, script: Path | None = None, **popen) -> subprocess.Popen:
    """A real `headprune` process (the console entry point, watcher included); `script`
    runs a hook file first that ends by calling that entry point."""
    program = [str(script)] if script is not None else ["-m", "headprune_cli"]
    return subprocess.Popen(
        [sys.executable, *program, *map(str, args)],
        cwd=cwd,
        env=env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


def finished(process: subprocess.Popen, timeout: float = 120) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def leftovers(folder: Path) -> list[str]:
    """Temporaries anywhere under `folder`: headprune's naming, or any hidden *.tmp."""
    return sorted(
        str(p.relative_to(folder))
        for p in folder.rglob("*")
        if TEMP_PATTERN.match(p.name) or (p.name.startswith(".") and p.name.endswith(".tmp"))
    )


def assert_one_error(code: int, err: str, expected_code: int, fragment: str) -> None:
    """Exit `expected_code`, exactly one `Error: ...` line holding `fragment`, no panic or traceback."""
    assert code == expected_code, (code, err)
    assert err.startswith("Error: ") and err.count("\n") == 1 and err.endswith("\n"), err
    assert fragment.lower() in err.lower(), (fragment, err)
    assert not any(text in err for text in PANIC_TEXT), err
