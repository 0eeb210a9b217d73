#!/usr/bin/env bash
# `ariadne rf`: the talk's receptive-field example (SPEC A.5) and argument errors.
source "$(dirname "$0")/lib.sh"

"$ARIADNE" rf --json --grid 10x14 --window 4 --schedule RRRRRRR --merge 1 | python3 -c '
import json, sys
d = json.load(sys.stdin)
cov = d["coverage"]
assert len(cov) == 7, cov
assert round(100 * cov[-1]) == 41, cov  # about 41% after 7 row-order layers
assert d["start"] == [5, 7], d["start"]  # default: the centre
assert all(b >= a for a, b in zip(cov, cov[1:])), cov
' || fail "row-only coverage is not about 41%"

"$ARIADNE" rf --json --grid 10x14 --window 4 --schedule RRRRCCC | python3 -c '
import json, sys
d = json.load(sys.stdin)
cov = d["coverage"]
assert len(cov) == 7, cov
assert cov[3] < 0.3, cov       # four row layers spread along rows only
assert cov[6] == 1.0, cov      # the whole image by layer 7
assert all(v >= 0 for row in d["reached"] for v in row), d["reached"]
' || fail "RRRR-CCC does not cover the image by layer 7"

"$ARIADNE" rf --json --grid 10x14 --window 4 --schedule RRRRCCC --start 0,0 | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["start"] == [0, 0] and d["reached"][0][0] == 0, d["start"]
' || fail "--start is not honoured"

out=$("$ARIADNE" rf --grid 10x14 --window 4 --schedule RRRRCCC)
grep -q '\*' <<<"$out" || fail "the picture lacks the start mark"

expect_error "start outside" rf --grid 10x14 --start 10,0
expect_error "bad start" rf --grid 10x14 --start 5
expect_error "bad grid" rf --grid 10by14
expect_error "bad schedule" rf --schedule RRZ
expect_error "odd grid with merge 2" rf --grid 9x14 --merge 2
