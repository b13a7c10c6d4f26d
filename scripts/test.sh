#!/usr/bin/env bash
# Run the whole test suite in a fresh or refreshed .venv.  Usage: bash scripts/test.sh [pytest args]
source "$(dirname "$0")/_env.sh"
python -m pytest -q "$@"
