#!/usr/bin/env bash
# Session 13, call 4: v23's programmatic dependent launch on the window kernel (ARIADNE_PDL unset =
# on, 0 = off), one binary, alternated twice; graph replays and single calls; tests, sanitizers on
# the PDL chain; the stack anchors of the same run.
# Prediction (before the run): stack single calls 1.41-1.43 -> 1.38-1.40 ms (about 1 us a window
# layer, 28 of them, in a stream of back-to-back launches); stack graph level (v23); single calls
# of one window layer level (an event separates the call from the spin kernel).
cd "$(dirname "$0")/../.." || exit 1
mkdir -p /tmp/n && tar xJf .device/s13/bin4.tar.xz -C /tmp/n
B=/tmp/n/bin
for v in 1 0; do
  ARIADNE_PDL=$v $B/ariadne_cuda_tests --gtest_filter='CudaPdl.*:CudaBandWg.*:CudaEdges.*:CudaAttention.*' 2>&1 | tail -1
done
for tool in memcheck racecheck synccheck; do
  compute-sanitizer --tool $tool $B/ariadne_cuda_tests --gtest_filter='CudaPdl.SameBitsOnAndOffAndOnTheLegacyStream' 2>&1 | grep -E "SUMMARY|PASSED|FAILED"
done
F=vit-n1024-b1-win64,vit-n4096-b1-win64,vit-n16384-b1-win64,vit-n1024-b8-win64,vit-n4096-b8-win64,stack-ariadne-896,stack-chunk-896
for r in 1 2; do
  for v in 1 0; do
    ARIADNE_PDL=$v $B/bench_attention_cuda bench/cases.json $F >$OUT/pdl$v-$r.json 2>$OUT/pdl$v-$r.log
  done
done
PYTHONUNBUFFERED=1 timeout 150 python3 bench/anchors.py --out $OUT/anchors.json --only stack-full-896,stack-ariadne-896 >$OUT/anchors.log 2>&1
echo "anchors rc $?"
python3 - <<'PY'
import json, os
O = os.environ["OUT"]
runs = {n: {r["id"]: r for r in json.load(open(f"{O}/{n}.json")) if "ms" in r} for n in ["pdl1-1", "pdl0-1", "pdl1-2", "pdl0-2"]}
for cid in runs["pdl1-1"]:
    cells = " ".join(f"{n} {runs[n][cid]['ms']:.4f}/{runs[n][cid].get('ms_single', 0):.4f}" for n in runs)
    print(f"{cid:26s} {cells}")
try:
    for r in json.load(open(f"{O}/anchors.json")):
        if r.get("ms"): print(r["id"], r["impl"], round(r["ms"], 4))
except Exception as e:
    print("anchors:", e)
PY
