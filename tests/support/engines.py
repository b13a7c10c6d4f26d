"""Where the engines' own environments live (built by scripts/engines/*.sh), for the engine tests.

An engine test skips only when its environment is absent, and CI (HEADPRUNE_REQUIRE_ENGINES=1,
set by .ci/run after building them) turns that skip into a failure."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def llama_cpp_python() -> str:
    """The llama.cpp environment's interpreter, or a skip saying how to build it."""
    env = Path(os.environ.get("HEADPRUNE_LLAMA_CPP_ENV", ROOT / ".engines" / "llama-cpp"))
    python = env / "bin" / "python"
    if not python.is_file():
        reason = f"llama.cpp engine env absent ({env}): build it with `bash scripts/engines/llama_cpp.sh`"
        if os.environ.get("HEADPRUNE_REQUIRE_ENGINES") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return str(python)


def vllm_python() -> str:
    """The vLLM environment's interpreter, or a skip saying how to build it."""
    env = Path(os.environ.get("HEADPRUNE_VLLM_ENV", ROOT / ".engines" / "vllm"))
    python = env / "bin" / "python"
    if not python.is_file():
        reason = f"vLLM engine env absent ({env}): build it with `bash scripts/engines/vllm.sh`"
        if os.environ.get("HEADPRUNE_REQUIRE_ENGINES") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return str(python)
