#!/usr/bin/env bash
# `ariadne demo --part shs --quick`: the committed trained checkpoint (data/study) is found and scored
# beside random weights of its architecture, with held-out images whose masks are exact, and on the
# VOC photos (the out-of-distribution probe).
source "$(dirname "$0")/lib.sh"

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$ARIADNE" demo --out "$out" --quick --part shs > "$out/log.txt" 2>&1 || { cat "$out/log.txt"; fail "demo --part shs failed"; }
grep -q "### A trained checkpoint" "$out/report.md" || fail "the trained-checkpoint section is missing"
grep -q "Skipped:" "$out/report.md" && fail "the trained checkpoint was not found (data/study)"
python3 - "$out" <<'PY' || fail "the trained section's JSON is wrong"
import json, pathlib, sys
d = json.loads((pathlib.Path(sys.argv[1]) / "report.json").read_text())
shs = d["parts"]["shs"]["trained"]
t, r = shs["trained"], shs["random_same_architecture"]
assert t["random_weights"] is False and r["random_weights"] is True, (t["source"], r["source"])
assert t["source"]["weights"].endswith("full-224.safetensors"), t["source"]
vt, vr = shs["voc_trained"], shs["voc_random_same_architecture"]
assert vt["random_weights"] is False and vr["random_weights"] is True
for s in (t, r, vt, vr):
    assert 0.5 <= s["shs_index"] <= 1.0, s["shs_index"]
    assert s["images_scored"] >= 1 and s["layers"] == len(s["per_layer"]), s["images_scored"]
assert vt["images_scored"] == 3, vt["images_scored"]
PY
grep -q "| SHS-Index | .* | .* | .* | .* |" "$out/report.md" || fail "the trained section's table lacks the VOC columns"
ARIADNE_DATA_DIR="$out/none" "$ARIADNE" demo --out "$out/b" --quick --part shs > /dev/null 2>&1 \
  || fail "demo --part shs fails without the data folder"
grep -q "Skipped: .*full-224.safetensors is missing" "$out/b/report.md" || fail "a missing checkpoint is not reported"
