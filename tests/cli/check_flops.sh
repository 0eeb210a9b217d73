#!/usr/bin/env bash
# `ariadne flops`: the paper's whole-encoder figures (SPEC A.7) and argument errors.
source "$(dirname "$0")/lib.sh"

"$ARIADNE" flops --json --side 448,896,1792 --schedule full,chunk,ariadne | python3 -c '
import json, sys
rows = json.load(sys.stdin)
by = {(r["schedule"], r["side"]): r for r in rows}
assert len(rows) == 9, len(rows)
for r in rows:
    for k in ("schedule", "side", "tokens", "flops", "flops_paper", "tile_flops", "useful_fraction"):
        assert k in r, k
    assert r["flops_paper"] == 4 * r["flops"], r
    assert r["tokens"] == (r["side"] // 14) ** 2, r
    assert 0 < r["useful_fraction"] <= 1, r
    assert r["tile_flops"] >= r["flops"], r
# Full attention: 0.69T / 11.0T / 175.9T in the paper convention, exactly 4 x 4 N^2 1280 32.
for side, fig, nd in ((448, 0.69, 2), (896, 11.0, 1), (1792, 175.9, 1)):
    r = by[("full", side)]
    n = (side // 14) ** 2
    assert r["flops"] == 4 * n * n * 1280 * 32, r
    assert round(r["flops_paper"] / 1e12, nd) == fig, (side, r["flops_paper"])
a = by[("ariadne", 896)]
assert round(a["flops_paper"] / 1e12, 2) == 1.68, a["flops_paper"]
ratio = by[("full", 896)]["flops"] / a["flops"]
assert 6.5 <= ratio < 6.6, ratio
assert abs(a["vs_full"] - ratio) < 1e-9, a["vs_full"]
' || fail "figures do not match the paper"

# Human output is a table that names every schedule.
out=$("$ARIADNE" flops --side 896 --schedule full,ariadne)
grep -q "ariadne" <<<"$out" || fail "table lacks the ariadne row"
grep -q "11.00T" <<<"$out" || fail "table lacks the 11.00T figure"

expect_error "bad side" flops --side 450
expect_error "non-numeric side" flops --side big
expect_error "unknown schedule" flops --schedule nonsense
expect_error "bad tile" flops --tile 128
expect_error "unknown option" flops --sidez 448
