"""llama.cpp's engine environment: where its python is, and the one llama.cpp call headprune's
own writers need from it (its quantizer, for the k-quants gguf-py cannot write).

llama-cpp-python lives in an environment of its own (scripts/engines/llama_cpp.sh), where
headprune cannot be imported; headprune only ever runs that environment's python as a child.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from headprune_cli.errors import HeadpruneError, UsageError

ENV_VARIABLE = "HEADPRUNE_LLAMA_CPP_ENV"
BUILD_HINT = "build it with `bash scripts/engines/llama_cpp.sh`"
ENGINE_PYTHON_HELP = (
    "The python of llama.cpp's engine environment (default: $HEADPRUNE_LLAMA_CPP_ENV/bin/python, or the "
    "repository's .engines/llama-cpp, which scripts/engines/llama_cpp.sh links to its build, else that "
    "script's build in the machine's engine cache)."
)


def engine_python(option: Path | None, what: str = "--gguf") -> Path:
    """--engine-python, else $HEADPRUNE_LLAMA_CPP_ENV/bin/python, else the repository's
    environment (checkout_env; an installed package has no repository, and then the option or
    the variable must say where)."""
    if option is not None:
        python = option
    elif os.environ.get(ENV_VARIABLE):
        python = Path(os.environ[ENV_VARIABLE]) / "bin" / "python"
    else:
        root = Path(__file__).resolve().parents[2]
        if not (root / "scripts" / "engines" / "llama_cpp.sh").is_file():
            raise UsageError(
                f"{what} needs llama.cpp's engine environment: pass --engine-python PATH or set {ENV_VARIABLE}"
            )
        python = checkout_env(root) / "bin" / "python"
    if not python.is_file():
        raise UsageError(f"{what}: llama.cpp engine environment absent ({python} not found); {BUILD_HINT}")
    return python


def checkout_env(root: Path, folder: str = "llama-cpp", script: str = "llama_cpp.sh") -> Path:
    """The engine environment a checkout uses: its .engines/FOLDER (which scripts/engines/SCRIPT
    links to its build), else the finished build in the machine's engine cache that the script
    names (`--where`), so a fresh clone finds the build another clone made without rebuilding.
    (The engine tests find vLLM's the same way.)"""
    linked = root / ".engines" / folder
    if (linked / "bin" / "python").is_file():
        return linked
    where = subprocess.run(
        ["bash", str(root / "scripts" / "engines" / script), "--where"], capture_output=True, text=True
    )
    cached = Path(where.stdout.strip()) if where.returncode == 0 and where.stdout.strip() else linked
    return cached if (cached / ".headprune-built").is_file() else linked  # a build still under way is not one


# llama.cpp's quantizer (what its llama-quantize tool runs), on a file headprune wrote: the
# file type by name (LLAMA_FTYPE_MOSTLY_Q4_K_M, ...), every tensor as llama.cpp's mix decides.
QUANTIZE = r"""
import ctypes, sys
import llama_cpp
source, target, name, threads, embedding = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + name.upper())
params.nthread = threads
if embedding:  # llama-quantize's --token-embedding-type and --output-tensor-type
    params.token_embedding_type = params.output_tensor_type = getattr(llama_cpp, "GGML_TYPE_" + embedding.upper())
sys.exit(llama_cpp.llama_model_quantize(source.encode(), target.encode(), ctypes.byref(params)))
"""


def quantize(
    python: Path,
    source: str,
    target: str,
    gguf_type: str,
    threads: int | None = None,
    embedding_type: str | None = None,
) -> None:
    """`source` (a GGUF file) quantized to `gguf_type` by llama.cpp into `target` (the token
    embedding and output head in `embedding_type` if given, else as llama.cpp's mix decides)."""
    threads = threads or os.cpu_count() or 1
    done = subprocess.run(
        [str(python), "-c", QUANTIZE, source, target, gguf_type, str(threads), embedding_type or ""],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},  # the engine's own packages only
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise HeadpruneError(f"llama.cpp could not quantize to {gguf_type} (exit {done.returncode}): {last}")
