#!/bin/bash
# Greedy pruning (score taylor -> select --ratio -> prune -> finetune --teacher auto) against
# learned pruning (learn --ratio --teacher auto), the same training steps,
# on the bundled demo model; dev accuracy of every output. BENCHMARKS.md, "Learned pruning".
# Run: nice -n 10 scripts/benchmarks/learned_pruning.sh [OUT_FOLDER] [EPOCHS] [RATIOS]
set -euo pipefail
OUT=${1:-/tmp/learned-pruning}; EPOCHS=${2:-1}; RATIOS=${3:-"0.5 0.75"}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} SOURCE_DATE_EPOCH=0 TOKENIZERS_PARALLELISM=false
D=examples/demo; HP="python -m headprune_cli"; mkdir -p "$OUT"
for seed in 0 1; do
  $HP score $D/model.safetensors --data $D/train.jsonl --samples 512 --method taylor --seed $seed -o "$OUT/taylor-s$seed.json" --force 2>/dev/null
  for r in $RATIOS; do
    $HP select "$OUT/taylor-s$seed.json" --ratio "$r" -o "$OUT/plan-$r-s$seed.json" --force 2>/dev/null
    $HP prune $D/model.safetensors --plan "$OUT/plan-$r-s$seed.json" -o "$OUT/greedy-$r-s$seed.pruned.safetensors" --force 2>/dev/null
    $HP finetune "$OUT/greedy-$r-s$seed.pruned.safetensors" --data $D/train.jsonl --teacher auto --epochs "$EPOCHS" --seed $seed \
      -o "$OUT/greedy-$r-s$seed.safetensors" --force 2>/dev/null
    $HP learn $D/model.safetensors --data $D/train.jsonl --ratio "$r" --teacher auto --epochs "$EPOCHS" --seed $seed \
      -o "$OUT/learned-$r-s$seed.safetensors" --gates-out "$OUT/learned-$r-s$seed.gates.json" --force 2>&1 | grep -A1 "learned gates"
  done
done
python - "$OUT" <<'PY'
import sys
from pathlib import Path
from headprune_cli import load
from headprune_cli import read_data
from headprune_cli import evaluate
for path in sorted(Path(sys.argv[1]).glob("*.safetensors")):
    model = load(path)
    dev = read_data("examples/demo/dev.jsonl", model, max_length=128)
    accuracy = next(m.value for m in evaluate(model, dev, "classification") if m.name == "accuracy")
    print(f"{path.name}\theads {sum(map(len, model.headprune.layout.heads))}\tdev accuracy {accuracy:.4f}")
PY
