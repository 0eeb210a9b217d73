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

# with_small_vision_config SRC DST: a copy of the safetensors file SRC whose metadata says what the
# `small` preset says (2 heads, 56 px windows, full layers 1 and 3), so that the encoder reads the
# 4-layer parity tower of tests/data/vit without --config small.
with_small_vision_config() {
  python3 - "$1" "$2" <<'PY'
import json, sys
raw = open(sys.argv[1], "rb").read()
n = int.from_bytes(raw[:8], "little")
header = json.loads(raw[8:8 + n])
header.setdefault("__metadata__", {})["vision_config"] = json.dumps(
    {"num_heads": 2, "window_size": 56, "fullatt_block_indexes": [1, 3]})
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
open(sys.argv[2], "wb").write(len(text).to_bytes(8, "little") + text + raw[8 + n:])
PY
}
