#!/usr/bin/env bash
# Runs every tests/cli/check_*.sh against the CLI binary named by $ARIADNE; fails if any fails.
# Each check exits non-zero on its first failed assertion and says which.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
: "${ARIADNE:?set ARIADNE to the path of the ariadne binary}"
[ -x "$ARIADNE" ] || { echo "run.sh: ARIADNE=$ARIADNE is not an executable" >&2; exit 1; }
export ARIADNE
failed=0
count=0
for check in "$here"/check_*.sh; do
  [ -e "$check" ] || continue
  count=$((count + 1))
  if bash "$check"; then
    echo "ok   $(basename "$check")"
  else
    echo "FAIL $(basename "$check")"
    failed=$((failed + 1))
  fi
done
[ "$count" -gt 0 ] || { echo "run.sh: no check_*.sh found in $here" >&2; exit 1; }
echo "$((count - failed))/$count CLI checks passed"
[ "$failed" -eq 0 ]
