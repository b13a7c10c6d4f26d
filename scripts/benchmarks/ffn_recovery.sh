#!/usr/bin/env bash
# Usage: [SCORE_SPLIT=calib|train] [COMPENSATE=none|lstsq] bash scripts/benchmarks/ffn_recovery.sh
#   (after scripts/tools/make_debian_task.py, seeds 0 and 1)
# Heads + FFN at 0.5 of the FLOPs (fisher scored on SCORE_SPLIT, default calib; cut with
# COMPENSATE, default none, calibrated on the same split), then one epoch of
# finetune --teacher auto; Debian-sections, both seeds.
set -eu
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false SOURCE_DATE_EPOCH=0
T=~/.cache/headprune/debian-sections
cd "$(dirname "$0")/../.."
source .venv/bin/activate
for seed in 0 1; do
  M=$T/model.safetensors; [ $seed = 1 ] && M=$T/model-seed1.safetensors
  W=${OUT:-/tmp/ffn_recovery}/s$seed; mkdir -p $W  # reruns replace only headprune's own outputs (--force)
  start=$(date +%s)
  headprune score $M --data $T/${SCORE_SPLIT:-calib}.jsonl --method fisher --ffn --max-length 32 -o $W/scores.json --force
  headprune select $W/scores.json --target-flops 0.5 -o $W/plan.json --force
  headprune prune $M --plan $W/plan.json --compensate ${COMPENSATE:-none} --data $T/${SCORE_SPLIT:-calib}.jsonl --max-length 32 -o $W/pruned.safetensors --force
  headprune finetune $W/pruned.safetensors --data $T/train.jsonl --eval-data $T/dev.jsonl --teacher auto --epochs 1 --max-length 32 --seed $seed -o $W/ft.safetensors --force
  OMP_NUM_THREADS=1 headprune report --model $W/ft.safetensors --baseline $M --data $T/dev.jsonl --seq-len 32 --batch-size 8 --threads 1 --repeats 20 --json $W/report.json --markdown $W/report.md --force
  OMP_NUM_THREADS=1 headprune report --model $W/pruned.safetensors --baseline $M --data $T/dev.jsonl --seq-len 32 --batch-size 8 --threads 1 --repeats 20 --json $W/report-before.json --force
  echo "seed $seed took $(( $(date +%s) - start )) s"
done
