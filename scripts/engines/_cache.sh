# Sourced by the engine build scripts (llama_cpp.sh, vllm.sh): where an engine env lives.
# By default in a cache outside the clone, one folder per build: NAME-KEY under
# $HEADPRUNE_ENGINE_CACHE (default ~/.cache/headprune/engines), KEY being the build script's
# sha256 (16 hex) and the engine's version, as the stamp records. So every clone and every CI
# run on one machine reuses one build, and a changed script or version builds a new folder
# beside the old ones (delete those by hand). The clone's .engines/NAME links to it, where
# headprune and the tests look. An explicit $VARIABLE (HEADPRUNE_LLAMA_CPP_ENV, ...) is used
# as it is, with no link.
#   SCRIPT --where    prints the env folder the script would build or reuse, builds nothing

engine_env() {  # NAME VARIABLE [the script's arguments]; needs ROOT and WANT; sets ENV_DIR, STAMP
  ENGINE_NAME=$1 ENGINE_VARIABLE=$2
  shift 2
  local cache="${HEADPRUNE_ENGINE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/headprune/engines}"
  ENV_DIR="${!ENGINE_VARIABLE:-$cache/$ENGINE_NAME-$WANT}"
  STAMP="$ENV_DIR/.headprune-built"
  if [ "${1:-}" = --where ]; then
    echo "$ENV_DIR"
    exit 0
  fi
  mkdir -p "$(dirname "$ENV_DIR")"
  # One build per folder at a time: a second run (another clone, a parallel CI job) waits, then reuses it.
  exec 9>"$ENV_DIR.lock"
  flock 9
}

link_env() {  # the clone's .engines/NAME -> the cached env (not for an explicit $VARIABLE)
  [ -z "${!ENGINE_VARIABLE:-}" ] || return 0
  local link="$ROOT/.engines/$ENGINE_NAME"
  mkdir -p "$ROOT/.engines"
  [ -L "$link" ] || rm -rf "$link"  # an env built inside the clone by an older script
  ln -sfn "$ENV_DIR" "$link"
}
