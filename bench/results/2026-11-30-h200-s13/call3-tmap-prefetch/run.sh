#!/usr/bin/env bash
# Session 13, call 3: tensor-map prefetch in the window kernel's producer (ARIADNE_BANDWG_TMAP_PREFETCH
# 1 = on, the default, against 0), alternated twice; graph replays and single calls.
cd "$(dirname "$0")/../.." || exit 1
mkdir -p /tmp/n && tar xJf .device/s13/bin3.tar.xz -C /tmp/n
B=/tmp/n/bin
for v in 1 0; do
  ARIADNE_BANDWG_TMAP_PREFETCH=$v $B/ariadne_cuda_tests --gtest_filter='CudaBandWg.*:CudaEdges.*:DeviceBufferCuda.*' 2>&1 | tail -1
done
compute-sanitizer --tool racecheck $B/ariadne_cuda_tests --gtest_filter='CudaBandWg.SmallCasesForSanitizers' 2>&1 | grep -E "SUMMARY|PASSED|FAILED"
F=vit-n1024-b1-win64,vit-n4096-b1-win64,vit-n16384-b1-win64,vit-n1024-b8-win64,vit-n4096-b8-win64,stack-ariadne-896
for r in 1 2; do
  for v in 1 0; do
    ARIADNE_BANDWG_TMAP_PREFETCH=$v $B/bench_attention_cuda bench/cases.json $F >$OUT/p$v-$r.json 2>$OUT/p$v-$r.log
  done
done
python3 - <<'PY'
import json, os
O = os.environ["OUT"]
runs = {n: {r["id"]: r for r in json.load(open(f"{O}/{n}.json")) if "ms" in r} for n in ["p1-1", "p0-1", "p1-2", "p0-2"]}
for cid in runs["p1-1"]:
    cells = " ".join(f"{n} {runs[n][cid]['ms']:.4f}/{runs[n][cid].get('ms_single', 0):.4f}" for n in runs)
    print(f"{cid:26s} {cells}")
PY
