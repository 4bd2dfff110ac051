# Written once for the bash scripts of ops/, which source it: what they used to copy.
#   . "$(dirname "$0")/lib.sh"    # before the script's `cd`
# Sourcing it defines the functions below and the variables OPS_DIR (this folder) and
# OPS_SELF (the script); it exports nothing, starts nothing and sets no trap.
#   usage                     prints the comment block at the head of the script (its usage)
#   on_help "$@"              -h or --help as the first argument: usage, then exit 0
#   use_build_cache           exports CARGO_TARGET_DIR, default $HOME/.cache/kvmem/target
#   set_up_project [--quiet]  the build-and-run scripts' start: cd to the checkout, run
#                             ops/setup (installs and checks what the build loads; --quiet:
#                             its standard output goes nowhere), then use_build_cache
#   at_exit CMD ARG...        runs CMD ARG... when the script exits, after those added before
#   pg_start [DIR PORT]       unless DATABASE_URL is set: starts ops/pg's cluster and exports
#                             its DATABASE_URL (DIR and PORT: KVMEM_PG_DIR and KVMEM_PG_PORT)
#   throwaway_pg [DIR PORT]   the same, and stops (deletes) that cluster at exit
#   throwaway_s3 [PORT]       unless KVMEM_TEST_S3_ENDPOINT is set: ops/s3's server
#                             (PORT: KVMEM_S3_PORT), stopped at exit
#   model_path TOOL ARG...    the path `ops/TOOL ARG...` prints as its last line
#   need_python, need_gguf, sha256_of FILE    the model scripts' Python
# A script that uses at_exit (or throwaway_pg, throwaway_s3) sets no EXIT trap of its own.

# shellcheck shell=bash
OPS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OPS_SELF="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"

usage() { awk 'NR == 1 && /^#!/ { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$OPS_SELF"; }

on_help() {
    case "${1:-}" in
        -h|--help) usage; exit 0 ;;
    esac
}

# One build cache for the tests, the demo, the benchmarks and CI, outside the clone, so
# llama.cpp is compiled once per machine.
default_target_dir="$HOME/.cache/kvmem/target"
use_build_cache() { export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$default_target_dir}"; }

set_up_project() {
    cd "$OPS_DIR/.."
    if [ "${1:-}" = --quiet ]; then "$OPS_DIR/setup" >/dev/null; else "$OPS_DIR/setup"; fi
    use_build_cache
}

exit_commands=()
at_exit() {
    exit_commands+=("$(printf '%q ' "$@")")
    trap run_exit_commands EXIT
}
run_exit_commands() {
    local c
    for c in "${exit_commands[@]}"; do eval "$c"; done
}

# shellcheck disable=SC2120 # DIR and PORT are optional
pg_start() {
    [ -z "${DATABASE_URL:-}" ] || return 0
    if [ "$#" -ge 2 ]; then export KVMEM_PG_DIR="$1" KVMEM_PG_PORT="$2"; fi
    local pg_env
    # An assignment, not eval "$(…)": a failed start must stop the script here.
    pg_env="$("$OPS_DIR/pg" start)"
    eval "$pg_env"
}
# shellcheck disable=SC2120 # DIR and PORT are optional
throwaway_pg() {
    [ -z "${DATABASE_URL:-}" ] || return 0
    pg_start "$@"
    at_exit "$OPS_DIR/pg" stop
}

# shellcheck disable=SC2120 # PORT is optional
throwaway_s3() {
    [ -z "${KVMEM_TEST_S3_ENDPOINT:-}" ] || return 0
    if [ "$#" -ge 1 ]; then export KVMEM_S3_PORT="$1"; fi
    local s3_env
    s3_env="$("$OPS_DIR/s3" start)"
    eval "$s3_env"
    at_exit "$OPS_DIR/s3" stop
}

# ops/fetch-model, ops/fetch-embedder, ops/make-tiny-model and ops/requantize-model print
# the model's path as their last line (logs go to stderr).
model_path() {
    local tool="$1"
    shift
    "$OPS_DIR/$tool" "$@" | tail -n 1
}

# The model scripts run $PYTHON (default python3); their messages start with their name.
need_python() {
    command -v "${PYTHON:-python3}" >/dev/null 2>&1 || {
        printf "%s: error: python interpreter '%s' not found\n" "$(basename "$0")" "${PYTHON:-python3}" >&2
        exit 1
    }
}

# Installs the gguf and numpy packages from PyPI when $PYTHON lacks them.
need_gguf() {
    local me py="${PYTHON:-python3}"
    me="$(basename "$0")"
    if ! "$py" -c 'import gguf, numpy' >/dev/null 2>&1; then
        echo "$me: installing python packages gguf and numpy" >&2
        "$py" -m pip install --quiet gguf numpy 1>&2 || {
            echo "$me: error: 'pip install gguf numpy' failed (on an externally managed" \
                 "python, use a virtualenv and set PYTHON=/path/to/venv/bin/python)" >&2
            exit 1
        }
    fi
}

sha256_of() {
    "${PYTHON:-python3}" - "$1" <<'PY'
import hashlib, sys
h = hashlib.sha256()
with open(sys.argv[1], "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
print(h.hexdigest())
PY
}

# Run rather than sourced (bash ops/lib.sh): what it holds.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    usage
fi
