#!/usr/bin/env bash
# Run the whole test suite in a fresh or refreshed .venv.  Usage: bash scripts/test.sh [pytest args]
# First the static checks (seconds): ruff lint, ruff format and mypy, configured in pyproject.toml;
# any finding stops the run before pytest. HEADPRUNE_SKIP_LINT=1 skips them (a quick local rerun).
# Two pytest-xdist workers (HEADPRUNE_TEST_WORKERS=N to change, 0 for none): much of the suite
# waits on subprocesses importing torch, so two workers finish sooner than one on 2 cores.
source "$(dirname "$0")/_env.sh"
if [ "${HEADPRUNE_SKIP_LINT:-0}" != 1 ]; then
  ruff check headprune_cli tests scripts
  ruff format --check headprune_cli tests scripts
  mypy
fi
python -m pytest -q -n "${HEADPRUNE_TEST_WORKERS:-2}" "$@"
