#!/usr/bin/env bash
# `ariadne orders` and `ariadne schedule`: Qwen's window boundaries (SPEC C.1), the talk's 4x8
# figure, per-layer tables, argument errors.
source "$(dirname "$0")/lib.sh"

"$ARIADNE" orders --json --grid 14x16 --order qwen_window | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["cu_seqlens"] == [0, 64, 128, 176, 224], d["cu_seqlens"]
assert sorted(d["order"]) == list(range(224))
assert all(d["perm"][d["order"][s]] == s for s in range(224))
' || fail "qwen_window 14x16 windows are not [0, 64, 128, 176, 224]"

"$ARIADNE" orders --json --grid 4x8 --order block_row | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["order"][:8] == [0, 1, 4, 5, 8, 9, 12, 13], d["order"]
assert d["order"][8:16] == [2, 3, 6, 7, 10, 11, 14, 15], d["order"]
assert d["cu_seqlens"] == [0, 32], d["cu_seqlens"]
' || fail "block_row 4x8 positions differ from the talk figure"

"$ARIADNE" orders --json --grid 4x8 --order block_col | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["order"][:8] == [0, 1, 8, 9, 16, 17, 24, 25], d["order"]
' || fail "block_col 4x8 positions are wrong"

out=$("$ARIADNE" orders --grid 4x8 --order raster)
grep -q "31" <<<"$out" || fail "the grid picture lacks position 31"

"$ARIADNE" schedule --json --preset ariadne | python3 -c '
import json, sys
layers = json.load(sys.stdin)
assert len(layers) == 32, len(layers)
assert [l["layer"] for l in layers if l["kind"] == "full"] == [7, 15, 23, 31]
assert all(l["sink"] == (l["kind"] != "full") for l in layers)
assert all(l["window"] == 64 for l in layers if l["kind"] == "window")
assert sum(l["reorder"] for l in layers) == 7
' || fail "the ariadne preset table is wrong"

"$ARIADNE" schedule --json --spec "4x(RRRRCCCF)" --window 32 | python3 -c '
import json, sys
layers = json.load(sys.stdin)
assert "".join(l["letter"] for l in layers) == "RRRRCCCF" * 4
assert layers[0]["window"] == 32 and layers[4]["order"] == "block_col"
' || fail "the short syntax table is wrong"

expect_error "unknown order" orders --grid 4x8 --order zigzag
expect_error "odd side" orders --grid 13x16 --order block_row
expect_error "missing grid" orders --order raster
expect_error "missing order" orders --grid 4x8
expect_error "unknown preset" schedule --preset ariadne2
expect_error "parse error" schedule --spec "4x(RRZ)"
expect_error "preset and spec" schedule --preset full --spec RRR
msg=$("$ARIADNE" schedule --spec "4x(RRZ)" 2>&1 || true)
grep -q "position 6" <<<"$msg" || fail "parse error does not name position 6 (got: $msg)"
