#!/usr/bin/env bash
# How much the pooled whole-block timing steadies a latency table (BENCHMARKS section 16):
# `profile` of MODEL N times with the whole block timed once a round (what profile did before)
# and N times with measure.FULL_TIMINGS (3), alternating, then each table priced against the
# same measured cuts by latency_grid.py (REPORTS: folders of latency_budget.py's report-*.json).
#   bash scripts/benchmarks/whole_block_timings.sh MODEL SEQ_LEN OUT N REPORTS...
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/_env.sh
model=$1 seq=$2 out=$3 n=$4; shift 4
mkdir -p "$out"
tables=()
for i in $(seq 1 "$n"); do
  for timings in 1 3; do
    table=$out/whole$timings-$i.json
    [ -f "$table" ] || OMP_NUM_THREADS=1 python -c "
import sys
from headprune_cli.stages.profile import measure
measure.FULL_TIMINGS = $timings
from headprune_cli.cli.app import run
sys.argv = ['headprune', 'profile', '$model', '--batch-size', '8', '--seq-len', '$seq', '--threads', '1', '-o', '$table']
run()" 2> /dev/null
    tables+=("x$timings.$i=$table")
  done
done
python -m scripts.benchmarks.latency_grid --tables "${tables[@]}" --reports "$@" --baseline "$model" | tail -n $((2 * n + 1))
