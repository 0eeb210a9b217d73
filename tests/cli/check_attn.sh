#!/usr/bin/env bash
# `ariadne attn --backward`: the backward's time and each gradient's error against the reference in
# the JSON document (every pattern form the sweep names, both sinks, GQA), errors small enough to
# mean the gradients are right, and --deterministic refused without --backward.
source "$(dirname "$0")/lib.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

for args in "--pattern full" "--pattern window:16,8 --sink denominator" "--pattern causal --sink key0 --kv-heads 2" \
            "--pattern chunk:40 --batch 2"; do
  # shellcheck disable=SC2086
  "$ARIADNE" attn --tokens 96 --heads 4 --dim 32 $args --backward --check yes --repeat 1 --json >"$tmp/out.json" \
    2>"$tmp/err" || fail "attn $args --backward failed: $(cat "$tmp/err")"
  python3 - "$tmp/out.json" "$args" <<'PY' || fail "attn $args --backward: bad JSON"
import json, sys
j, args = json.load(open(sys.argv[1])), sys.argv[2]
b = j["backward"]
assert b["checked"] and b["ms"] > 0 and b["gflops"] > 0, b
names = ["dq", "dk", "dv"] + (["dsink"] if "--sink" in args else [])
for g in names:
    assert b[g]["rel_l2"] < 1e-4 and b[g]["max_rel_err"] < 1e-3, (g, b[g])
assert ("dsink" in b) == ("--sink" in args), b
PY
done
"$ARIADNE" attn --deterministic 2>"$tmp/err" && fail "--deterministic without --backward was accepted"
grep -q -- "--backward" "$tmp/err" || fail "the error does not name --backward: $(cat "$tmp/err")"
exit 0
