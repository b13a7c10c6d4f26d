#!/usr/bin/env bash
# Mutation testing (mutmut) of the modules whose bugs the other tests might not see.
# Not run in CI: it is slow. Each module is mutated in its own scratch copy of the tree
# and checked against a fast subset of the tests (the ones that exercise it), at low
# priority. Prints the surviving-mutant count per module; docs/testing.md records the runs.
#
#   pip install -e '.[dev]'               # mutmut
#   scripts/tools/mutation.sh                   # every module below
#   scripts/tools/mutation.sh selection fileio  # some of them
#   MUTATION_MAX_CHILDREN=2 MUTATION_WORK=/tmp/mut scripts/tools/mutation.sh surgery
#   MUTATION_RERUN=1 scripts/tools/mutation.sh lora  # after new tests: the same mutants, those not killed
#
# MUTATION_RERUN=1 keeps the module's scratch folder and its mutants, copies tests/ in from this
# tree and reruns every mutant the last run did not kill (survived, no tests,
# timeout); the last run's verdicts are kept in $WORK/NAME.before.results.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${MUTATION_WORK:-/tmp/headprune-mutation}
CHILDREN=${MUTATION_MAX_CHILDREN:-2}

# name | file to mutate | mutant-name pattern (mutmut run "..."), * = all | the tests that judge it
declare -A FILE PATTERN TESTS
FILE[selection]=headprune_cli/stages/select/strategies.py; PATTERN[selection]='*'
TESTS[selection]='tests/stages/select/test_select.py tests/stages/select/test_budget.py tests/stages/select/test_joint.py tests/stages/select/test_uniform.py'
FILE[surgery]=headprune_cli/model/surgery.py; PATTERN[surgery]='*'
TESTS[surgery]='tests/model/test_surgery.py tests/stages/score/importance/test_score.py'  # HeadGates (in surgery.py) is checked by scoring's gradient tests
FILE[gates]=headprune_cli/stages/report/build.py; PATTERN[gates]='headprune_cli.stages.report.build.x_gates* headprune_cli.stages.report.build.x_verdict* headprune_cli.stages.report.build.x_resolve_baseline* headprune_cli.stages.report.build.x_main_metric*'
TESTS[gates]='tests/stages/report/test_policy.py'
FILE[checkpoint]=headprune_cli/model/checkpoint.py; PATTERN[checkpoint]='*'
TESTS[checkpoint]='tests/model/test_import_inspect.py tests/hostile/test_robustness.py tests/integration/test_large_models.py tests/stages/prune/test_prune.py tests/model/test_surgery.py tests/model/test_export.py'
FILE[fileio]=headprune_cli/files/io.py; PATTERN[fileio]='*'
TESTS[fileio]='tests/files/test_io.py tests/hostile/test_robustness.py tests/hostile/test_file_safety.py tests/hostile/test_bad_input_matrix.py tests/hostile/test_regressions.py'
# The modules the last round added or changed most (issue 48), each judged by its own test files.
FILE[lora]=headprune_cli/stages/training/lora.py; PATTERN[lora]='*'; TESTS[lora]='tests/stages/finetune/test_lora.py'
# sharding.py runs under torchrun in test_fsdp.py, which mutmut cannot judge (DESELECT): its
# in-process tests (a gloo group of one rank) judge it
FILE[sharding]=headprune_cli/stages/training/sharding.py; PATTERN[sharding]='*'
TESTS[sharding]='tests/stages/training/test_sharding.py tests/stages/training/test_fsdp.py'
FILE[gate_space]=headprune_cli/stages/learn/gate_space.py; PATTERN[gate_space]='*'
TESTS[gate_space]='tests/stages/learn/test_gate_space.py'
FILE[rewind]=headprune_cli/stages/finetune/rewind.py; PATTERN[rewind]='*'; TESTS[rewind]='tests/stages/finetune/test_rewind.py'
# gguf.py has 693 mutants, hours at the shared machine's load: only its RoPE functions (the
# issue's swapped llama3 branches), 129 mutants.
FILE[gguf_export]=headprune_cli/model/formats/gguf.py; TESTS[gguf_export]='tests/model/formats/test_gguf.py'
PATTERN[gguf_export]='headprune_cli.model.formats.gguf.x_rope_freqs* headprune_cli.model.formats.gguf.x__rope* headprune_cli.model.formats.gguf.x__check_rope*'
FILE[vllm_export]=headprune_cli/model/formats/vllm.py; PATTERN[vllm_export]='*'; TESTS[vllm_export]='tests/model/formats/test_vllm.py'
FILE[runtime]=headprune_cli/stages/select/runtime.py; PATTERN[runtime]='*'; TESTS[runtime]='tests/stages/select/test_runtime.py'
FILE[onnx_quantize]=headprune_cli/model/formats/onnx_quantize.py; PATTERN[onnx_quantize]='*'
TESTS[onnx_quantize]='tests/model/formats/test_onnx_quantize.py'
FILE[tasks_plans]=headprune_cli/stages/tasks/plans.py; PATTERN[tasks_plans]='*'; TESTS[tasks_plans]='tests/stages/tasks/test_tasks_stage.py'
FILE[tasks_payload]=headprune_cli/stages/tasks/payload.py; PATTERN[tasks_payload]='*'
TESTS[tasks_payload]='tests/stages/tasks/test_tasks_stage.py'
FILE[rounds]=headprune_cli/stages/iterate/rounds.py; PATTERN[rounds]='*'
TESTS[rounds]='tests/stages/iterate/test_lstsq_rounds.py tests/stages/iterate/test_iterate.py'
FILE[refit]=headprune_cli/stages/search/refit.py; PATTERN[refit]='*'
TESTS[refit]='tests/stages/search/test_refit.py tests/stages/search/test_judged_after_compensation.py tests/stages/search/test_search.py'

# Tests that run `python -m headprune_cli` in another working folder: mutmut's trampolines
# there look for mutmut's configuration in that folder and fail, whatever the mutant; the
# torchrun test, which starts two more interpreters per mutant; and the shell pipe, whose
# `headprune` console script imports the installed (unmutated) package: it judges no mutant
# and took 19 of the 51 s that checkpoint's tests take. `-k` matches words of test names: a test
# meant to judge a module must not have one of these words in its name (test_sharding.py's did).
DESELECT='"-k", "not locked_out and not signal_during_a_write and not sigkill_while_writing and not torchrun and not score_select_prune_pipe", '

# mutmut works in the scratch copies only; the package must end as it began (no mutant left in a
# source file, whatever mutmut did): its status and diff before the runs, compared at the end
# (tests may be edited meanwhile).
tree_before=$(cd "$ROOT" && git status --porcelain -- headprune_cli && git diff -- headprune_cli)

# The module's test files that exist in folder $2, as a TOML list's items.
selection() {
  local t tests=""
  for t in ${TESTS[$1]}; do [ -f "$2/$t" ] && tests="$tests\"$t\", "; done
  echo "$tests"
}

# The not-killed mutants of an earlier run of module $1 in folder $2, against its test files as
# they are in this tree now.
rerun() {
  local name=$1 dir=$2 names
  [ -d "$dir/mutants" ] || { echo "no earlier run of $name in $dir" >&2; exit 2; }
  # the whole tests/ folder: new test files, and the support code they import
  cp -r "$ROOT/tests" "$dir/" && cp -r "$ROOT/tests" "$dir/mutants/"
  sed -i "s|^pytest_add_cli_args_test_selection = .*|pytest_add_cli_args_test_selection = [$(selection "$name" "$dir")]|" "$dir/pyproject.toml"
  (cd "$dir" && mutmut results --all true > "$WORK/$name.before.results" 2>&1) || true
  names=$(grep -E ': (survived|no tests|timeout|suspicious)$' "$WORK/$name.before.results" | sed 's/^ *//; s/: .*//')
  set -f
  (cd "$dir" && env -u PYTHONPATH HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1 \
      nice -n "${MUTATION_NICE:-10}" python "$ROOT/scripts/tools/mutmut_whole_files.py" run --max-children "$CHILDREN" $names > "$WORK/$name.rerun.log" 2>&1) || true
  set +f
  report "$name" "$dir"
}

# Counts of a module's mutants by verdict, from `mutmut results`.
report() {
  local name=$1 dir=$2 total killed
  (cd "$dir" && mutmut results --all true > "$WORK/$name.results" 2>&1) || true
  total=$(grep ': ' "$WORK/$name.results" | grep -vc 'not checked' || true)
  killed=$(grep -c ': killed' "$WORK/$name.results" || true)
  echo "$name ${FILE[$name]}: $killed killed of $total mutants ($(grep -c ': survived' "$WORK/$name.results" || true) survived," \
    "$(grep -c ': no tests' "$WORK/$name.results" || true) without a test, $(grep -c ': timeout' "$WORK/$name.results" || true) timeouts);" \
    "list: $WORK/$name.results"
}

modules=("$@")
[ ${#modules[@]} -eq 0 ] && modules=(selection surgery gates checkpoint fileio)

for name in "${modules[@]}"; do
  [ -n "${FILE[$name]:-}" ] || { echo "unknown module $name (known: ${!FILE[*]})" >&2; exit 2; }
  dir="$WORK/$name"
  if [ -n "${MUTATION_RERUN:-}" ]; then
    rerun "$name" "$dir"
    continue
  fi
  rm -rf "$dir" && mkdir -p "$dir"
  (cd "$ROOT" && git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$dir")
  tests=$(selection "$name" "$dir")
  cat >> "$dir/pyproject.toml" <<CONF

[tool.mutmut]
source_paths = ["headprune_cli"]
only_mutate = ["${FILE[$name]}"]
pytest_add_cli_args_test_selection = [${tests}]
pytest_add_cli_args = [${DESELECT}"-p", "no:cacheprovider", "-x", "-q"]
process_isolation = "forkserver"
use_git_change_detection = false
# CPU seconds a mutant may take: (its tests' time + constant) x multiplier x 2. mutmut times the
# test calls without their fixtures (a scored model, a CLI run), so with its constant of 1 s a
# mutant whose tests build a fixture for seconds is killed as a timeout whatever it changes (47 of
# 52 runtime.py mutants on 2026-12-04); the constant of 30 s covers the fixtures, the multiplier of
# 3 keeps an endless-loop mutant of a greedy loop from burning long on a shared machine.
timeout_constant = ${MUTATION_TIMEOUT_CONSTANT:-30.0}
timeout_multiplier = ${MUTATION_TIMEOUT_MULTIPLIER:-3.0}
also_copy = ["examples", "configs", "scripts", "docs", "README.md", "BENCHMARKS.md"]  # what tests read besides code
CONF
  set -f; patterns=${PATTERN[$name]}; [ "$patterns" = "*" ] && patterns=""; set +f
  start=$(date +%s)
  # PYTHONPATH would put the unmutated tree ahead of mutmut's copy: clear it.
  set -f
  (cd "$dir" && env -u PYTHONPATH HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1 \
      nice -n "${MUTATION_NICE:-10}" python "$ROOT/scripts/tools/mutmut_whole_files.py" run --max-children "$CHILDREN" $patterns > "$WORK/$name.log" 2>&1) || true
  set +f
  echo "$name: $(( $(date +%s) - start )) s"
  report "$name" "$dir"
done
if [ "$(cd "$ROOT" && git status --porcelain -- headprune_cli && git diff -- headprune_cli)" != "$tree_before" ]; then
  echo "error: headprune_cli/ changed during the mutation runs (git status, git diff)" >&2
  exit 1
fi
