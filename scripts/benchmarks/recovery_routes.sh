#!/usr/bin/env bash
# Usage: [OUT=/tmp/recovery_routes] [SEEDS="0 1"] [ROUTES="full lora-x1 lora-x10 lora-x30 fsdp"] bash scripts/benchmarks/recovery_routes.sh
#   (after scripts/tools/make_debian_task.py --seed 0 and --seed 1)
# Full KD against LoRA KD against FSDP KD on the same cut: heads + FFN at 0.5 of the FLOPs
# (fisher on calib.jsonl, lstsq compensation), then one epoch of `finetune --teacher auto`
# on train.jsonl (1696 rows, batch 16, the model's seed) four ways:
#   full       every weight, AdamW, one process
#   lora       --lora (rank 8, its default rate: 10 x full training's since BENCHMARKS.md, "Which recovery")
#   lora-xN    --lora --lr N x full training's default rate (e.g. lora-x10, lora-x30)
#   fsdp       --fsdp under torchrun --nproc-per-node 2 (gloo), the same global batch
# Dev accuracy from `report --repeats 0` (no timing); peak RSS of each finetune from
# /usr/bin/time -f %M (for torchrun: the launcher's largest child). Prints a Markdown table.
set -eu
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false SOURCE_DATE_EPOCH=0
T=${HEADPRUNE_CACHE:-~/.cache/headprune}/debian-sections
cd "$(dirname "$0")/../.."
source .venv/bin/activate
ROWS=()
for seed in ${SEEDS:-0 1}; do
  M=$T/model.safetensors; [ "$seed" = 1 ] && M=$T/model-seed1.safetensors
  W=${OUT:-/tmp/recovery_routes}/s$seed; mkdir -p "$W"
  headprune score "$M" --data $T/calib.jsonl --method fisher --ffn --max-length 32 -o $W/scores.json --force
  headprune select $W/scores.json --target-flops 0.5 -o $W/plan.json --force
  headprune prune "$M" --plan $W/plan.json --compensate lstsq --data $T/calib.jsonl --max-length 32 -o $W/cut.safetensors --force
  LR=$(python -c "from headprune_cli import default_lr, load; print(default_lr(load('$W/cut.safetensors')))")
  COMMON=(--data $T/train.jsonl --teacher auto --epochs 1 --max-length 32 --seed "$seed" --force)
  for route in ${ROUTES:-full lora-x1 lora-x10 lora-x30 fsdp}; do
    case $route in
      full) CMD=(headprune finetune $W/cut.safetensors "${COMMON[@]}") ;;
      lora) CMD=(headprune finetune $W/cut.safetensors "${COMMON[@]}" --lora) ;;
      lora-x*) CMD=(headprune finetune $W/cut.safetensors "${COMMON[@]}" --lora --lr "$(python -c "print($LR * ${route#lora-x})")") ;;
      fsdp) CMD=(torchrun --nproc-per-node 2 -m headprune_cli finetune $W/cut.safetensors "${COMMON[@]}" --fsdp) ;;
    esac
    start=$(date +%s)
    /usr/bin/time -f %M -o $W/$route.rss "${CMD[@]}" -o $W/$route.safetensors 2> $W/$route.log
    secs=$(( $(date +%s) - start ))
    headprune report --model $W/$route.safetensors --baseline "$M" --data $T/dev.jsonl --seq-len 32 --repeats 0 --json $W/$route.json --force 2>/dev/null
    ROWS+=("$(python - "$seed" "$route" "$W" "$secs" <<'PY'
import json, sys
seed, route, w, secs = sys.argv[1:]
r = json.load(open(f"{w}/{route}.json"))["main_metric"]
rss = int(open(f"{w}/{route}.rss").read().split()[-1]) / 2**20
print(f"| {seed} | {route} | {100 * r['baseline']:.2f} | {100 * r['pruned']:.2f} | {100 * (r['baseline'] - r['pruned']):+.2f} | {rss:.2f} | {secs} |")
PY
)")
  done
  headprune report --model $W/cut.safetensors --baseline "$M" --data $T/dev.jsonl --seq-len 32 --repeats 0 --json $W/cut.json --force 2>/dev/null
  ROWS+=("$(python -c "import json; r=json.load(open('$W/cut.json'))['main_metric']; print(f'| $seed | cut, no training | {100*r[\"baseline\"]:.2f} | {100*r[\"pruned\"]:.2f} | {100*(r[\"baseline\"]-r[\"pruned\"]):+.2f} | | |')")")
done
echo "| seed | recovery | baseline | dev accuracy | drop (points) | peak RSS GiB (one process) | wall s |"
echo "|---|---|---:|---:|---:|---:|---:|"
printf '%s\n' "${ROWS[@]}"
