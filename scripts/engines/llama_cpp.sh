#!/usr/bin/env bash
# Build the llama.cpp engine environment: a venv of its own (in the machine's engine cache, linked
# from .engines/llama-cpp; HEADPRUNE_LLAMA_CPP_ENV=DIR to choose: scripts/engines/_cache.sh) holding
# llama-cpp-python compiled from source for this machine's CPU. headprune is NOT installed there, so tests that run it prove a GGUF file loads
# without headprune. Idempotent: an env whose stamp matches this script is left as it is.
#   bash scripts/engines/llama_cpp.sh        (25-45 minutes on 2 loaded cores, once per machine)
#   bash scripts/engines/llama_cpp.sh --where   (the env folder; builds nothing)
# Why these CMake options: the Python bindings need only libllama + ggml; the llava/mtmd
# library, tests, examples and the server are not built, which roughly halves the build.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VERSION="${HEADPRUNE_LLAMA_CPP_VERSION:-0.3.36}"
PYTHON="${PYTHON:-python3}"
WANT="$(cat "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)-$VERSION"
source "$ROOT/scripts/engines/_cache.sh"
engine_env llama-cpp HEADPRUNE_LLAMA_CPP_ENV "$@"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && "$ENV_DIR/bin/python" -c "import llama_cpp" 2>/dev/null; then
  link_env
  echo "llama.cpp engine env up to date: $ENV_DIR" >&2
  exit 0
fi
rm -rf "$ENV_DIR"
"$PYTHON" -m venv "$ENV_DIR"
"$ENV_DIR/bin/python" -m pip install -q --upgrade pip >&2
export CMAKE_ARGS="-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF -DGGML_OPENMP=ON ${HEADPRUNE_LLAMA_CPP_CMAKE_ARGS:-}"
# Why no AMX: a native build on a CPU with AMX (Sapphire Rapids and later) routes q8_0/q4_0
# products through ggml's AMX kernels, which segfaulted on the first eval of our GGUF files
# (llama.cpp issue #20824, closed unfixed); -mno-amx-* before -march=native keep them out.
if [ "$(uname -m)" = x86_64 ]; then
  export CFLAGS="${CFLAGS:-} -mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  export CXXFLAGS="${CXXFLAGS:-} -mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
fi
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
nice "$ENV_DIR/bin/python" -m pip install -q --no-cache-dir --no-binary llama-cpp-python "llama-cpp-python==$VERSION" >&2
"$ENV_DIR/bin/python" -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__)" >&2
echo "$WANT" > "$STAMP"
link_env
