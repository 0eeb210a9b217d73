#!/usr/bin/env bash
# Session 13, call 6: v38, the d 80 wgmma kernel's O through the Q buffer and TMA stores (as v35 at
# d 128). The whole CUDA suite on the new binary, sanitizers on the new test, then the full-layer
# cases and stacks: new (stores by TMA), new with ARIADNE_WG_OUT_TMA=0, old (main's kernels, the
# check's binaries), alternated twice; the stack anchors.
# Prediction (before the run): full d 80 N 1024 b1 -2 to -4% (8 key tiles a CTA), N 4096 -1 to -2%,
# N 16384 +-1%, batch 8 N 1024 -2%, N 4096 -1%; stack -0.5 to -1%.
cd "$(dirname "$0")/../.." || exit 1
mkdir -p /tmp/n /tmp/o && tar xJf .device/s13/bin6.tar.xz -C /tmp/n && tar xJf .device/s13/bin.tar.xz -C /tmp/o
/tmp/n/bin/ariadne_cuda_tests 2>&1 | tail -3
for tool in memcheck racecheck synccheck; do
  compute-sanitizer --tool $tool /tmp/n/bin/ariadne_cuda_tests --gtest_filter='WgmmaTma.OutputThroughTheCopyEngineBothWays' 2>&1 | grep -E "SUMMARY|PASSED|FAILED"
done
F=vit-n1024-b1-full,vit-n4096-b1-full,vit-n16384-b1-full,vit-n1024-b8-full,vit-n4096-b8-full,stack-ariadne-896,stack-full-896
for r in 1 2; do
  /tmp/n/bin/bench_attention_cuda bench/cases.json $F >$OUT/new$r.json 2>$OUT/new$r.log
  ARIADNE_WG_OUT_TMA=0 /tmp/n/bin/bench_attention_cuda bench/cases.json $F >$OUT/off$r.json 2>$OUT/off$r.log
  /tmp/o/bin/bench_attention_cuda bench/cases.json $F >$OUT/old$r.json 2>$OUT/old$r.log
done
PYTHONUNBUFFERED=1 timeout 120 python3 bench/anchors.py --out $OUT/anchors.json --only stack-full-896,vit-n4096-b1-full >$OUT/anchors.log 2>&1
echo "anchors rc $?"
python3 - <<'PY'
import json, os
O = os.environ["OUT"]
names = ["new1", "off1", "old1", "new2", "off2", "old2"]
runs = {n: {r["id"]: r for r in json.load(open(f"{O}/{n}.json")) if "ms" in r} for n in names}
for cid in runs["new1"]:
    cells = " ".join(f"{n} {runs[n][cid]['ms']:.4f}/{runs[n][cid].get('ms_single', 0):.4f}" for n in names)
    print(f"{cid:20s} {cells}")
try:
    for r in json.load(open(f"{O}/anchors.json")):
        if r.get("ms"): print(r["id"], r["impl"], round(r["ms"], 4))
except Exception as e:
    print("anchors:", e)
PY
