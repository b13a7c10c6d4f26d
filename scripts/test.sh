#!/usr/bin/env bash
# Run the whole test suite in a fresh or refreshed .venv.  Usage: bash scripts/test.sh [pytest args]
# Two pytest-xdist workers (HEADPRUNE_TEST_WORKERS=N to change, 0 for none): much of the suite
# waits on subprocesses importing torch, so two workers finish sooner than one on 2 cores.
source "$(dirname "$0")/_env.sh"
python -m pytest -q -n "${HEADPRUNE_TEST_WORKERS:-2}" "$@"
