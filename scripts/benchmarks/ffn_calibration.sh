#!/usr/bin/env bash
# How much calibration data the retraining-free heads+FFN route wants (BENCHMARKS.md, "How deep"):
# on each Debian-sections classifier, `score --method fisher --ffn` on SPLIT (calib = the
# task's 233 calibration rows, train = its 1696 training rows), `select --target-flops T`,
# `prune` with each compensation (none, lstsq; the diagonal FFN fit tried beside them is in
# docs/experiments/2026-12-02-rounds-one-to-four.md, not shipped), `report` on
# dev.jsonl (accuracy only: --repeats 0). Artifacts under WORK are reused when present.
#
#   SEEDS="0 1" SPLITS="calib train" TARGETS="0.6 0.5" COMPS="none lstsq" \
#     bash scripts/benchmarks/ffn_calibration.sh /tmp/ffn_calibration
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/_env.sh
WORK=${1:?usage: ffn_calibration.sh WORK}
TASK=${HEADPRUNE_CACHE:-$HOME/.cache/headprune}/debian-sections
for seed in ${SEEDS:-0 1}; do
  model=$TASK/model.safetensors; [ "$seed" = 0 ] || model=$TASK/model-seed$seed.safetensors
  for split in ${SPLITS:-calib train}; do
    dir=$WORK/seed$seed-$split; mkdir -p "$dir"
    [ -f "$dir/scores.json" ] || headprune score "$model" --data "$TASK/$split.jsonl" --max-length 32 --method fisher --ffn -o "$dir/scores.json"
    for target in ${TARGETS:-0.6 0.5}; do
      [ -f "$dir/plan-$target.json" ] || headprune select "$dir/scores.json" --target-flops "$target" -o "$dir/plan-$target.json"
      for comp in ${COMPS:-none lstsq}; do
        out=$dir/$target-$comp.safetensors
        [ -f "$out" ] || headprune prune --compensate "$comp" --plan "$dir/plan-$target.json" --data "$TASK/$split.jsonl" --max-length 32 -o "$out"
        headprune report --model "$out" --baseline "$model" --data "$TASK/dev.jsonl" --seq-len 32 --repeats 0 --json "$dir/report-$target-$comp.json" > /dev/null
        python - "$dir/report-$target-$comp.json" "seed $seed, scored on $split, $target of the FLOPs, $comp" <<'PY'
import json, sys
metric = json.load(open(sys.argv[1]))["main_metric"]
print(f"{sys.argv[2]}: accuracy {metric['pruned'] * 100:.2f}, drop {metric['drop']:.2f} points")
PY
      done
    done
  done
done
