"""Where the engines' own environments live (built by scripts/engines/*.sh), for the engine tests.

$VARIABLE when set; else the clone's .engines/NAME (a link the build script makes); else the
machine's engine cache folder the build script names (`--where`), so a fresh clone finds an env
another clone built. An engine test skips only when its environment is absent, and CI
(HEADPRUNE_REQUIRE_ENGINES=1, set by .ci/run after building them) turns that skip into a failure."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from headprune_cli.model.llama_cpp_env import checkout_env

ROOT = Path(__file__).resolve().parents[2]


def llama_cpp_python() -> str:
    """The llama.cpp environment's interpreter, or a skip saying how to build it."""
    return _engine_python("llama.cpp", "HEADPRUNE_LLAMA_CPP_ENV", "llama-cpp", "llama_cpp.sh")


def vllm_python() -> str:
    """The vLLM environment's interpreter, or a skip saying how to build it."""
    return _engine_python("vLLM", "HEADPRUNE_VLLM_ENV", "vllm", "vllm.sh")


def _engine_python(engine: str, variable: str, folder: str, script: str) -> str:
    env = Path(os.environ[variable]) if variable in os.environ else checkout_env(ROOT, folder, script)
    python = env / "bin" / "python"
    if not python.is_file() or not (env / ".headprune-built").is_file():
        reason = f"{engine} engine env absent ({env}): build it with `bash scripts/engines/{script}`"
        if os.environ.get("HEADPRUNE_REQUIRE_ENGINES") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return str(python)
