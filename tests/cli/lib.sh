# Helpers shared by the check_*.sh scripts (sourced, not run).
set -euo pipefail

fail() {
  echo "$(basename "$0"): $*" >&2
  exit 1
}

# expect_error "what" args...: the CLI must exit with code 1 and print an error on stderr.
expect_error() {
  local what=$1
  shift
  local err rc=0
  err=$("$ARIADNE" "$@" 2>&1 >/dev/null) || rc=$?
  [ "$rc" -eq 1 ] || fail "$what: 'ariadne $*' exited $rc, expected 1"
  grep -q "error" <<<"$err" || fail "$what: 'ariadne $*' printed no error message (got: $err)"
}
