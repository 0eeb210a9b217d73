#!/usr/bin/env bash
# `ariadne decode-bench`: a small synthetic run (JSON figures in range: τ 1 keeps every page and
# decodes as dense does, lower τ reads fewer pages), and its option errors.
source "$(dirname "$0")/lib.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$ARIADNE" decode-bench --context 600,1000 --batch 1,3 --heads 8 --kv-heads 2 --head-dim 64 --page-size 16 \
  --decode rr,quest,oracle --decode-tau 0.5,1 --repeat 1 --json >"$tmp/b.json" || fail "decode-bench"
python3 - "$tmp/b.json" <<'PY' || fail "decode-bench printed wrong figures"
import json, sys
rows = json.load(open(sys.argv[1]))
assert len(rows) == 4, rows
for r in rows:
    assert r["kv_bytes"] == r["batch"] * r["context"] * 2 * 64 * 2 * 2, r
    assert r["ms_dense"] > 0 and r["dense_gbps"] > 0 and r["copy_gbps"] > 0, r
    assert len(r["sparse"]) == 6, r
    for s in r["sparse"]:
        assert s["pages_visible"] == r["batch"] * 2 * -(-r["context"] // 16), (r, s)
        if s["tau"] == 1:
            assert s["density"] == 1 and s["out_rel_err"] < 1e-6 and abs(s["mass_recall"] - 1) < 1e-6, s
        else:
            assert 0 < s["density"] < 1 and 0 < s["mass_recall"] <= 1 + 1e-9, s
        if s["scorer"] == "oracle" and s["tau"] < 1:
            assert s["mass_recall"] >= s["tau"] - 1e-6, s
PY
expect_error "GQA ratio" decode-bench --heads 6 --kv-heads 4
expect_error "page size" decode-bench --page-size 20
expect_error "odd head dim" decode-bench --head-dim 63
expect_error "bad mix" decode-bench --mix "sink:0"
expect_error "unknown scorer" decode-bench --decode topk
