#!/usr/bin/env bash
# Session 13, call 8: v39, variant 3 without the per-pair skip (every 16-key pair through the masks:
# no per-pair branch; 60 bytes of spills in the consumer's tile code) against main's window kernel.
# Prediction (before the run): N 16384 / batch 8 -2 to +3%, N 4096 the same range; same outputs.
cd "$(dirname "$0")/../.." || exit 1
mkdir -p /tmp/n /tmp/o && tar xJf .device/s13/bin8.tar.xz -C /tmp/n && tar xJf .device/s13/bin.tar.xz -C /tmp/o
/tmp/n/bin/ariadne_cuda_tests --gtest_filter='CudaBandWg.*:CudaEdges.*:Cuda/Sweep.MatchesReference/*d80*:CudaAttention.*:CudaVit*' 2>&1 | tail -2
compute-sanitizer --tool memcheck /tmp/n/bin/ariadne_cuda_tests --gtest_filter='CudaBandWg.SmallCasesForSanitizers' 2>&1 | grep -E "SUMMARY|PASSED|FAILED"
F=vit-n1024-b1-win64,vit-n4096-b1-win64,vit-n16384-b1-win64,vit-n1024-b8-win64,vit-n4096-b8-win64,stack-ariadne-896
for r in 1 2 3; do
  /tmp/o/bin/bench_attention_cuda bench/cases.json $F >$OUT/old$r.json 2>$OUT/old$r.log
  /tmp/n/bin/bench_attention_cuda bench/cases.json $F >$OUT/new$r.json 2>$OUT/new$r.log
done
python3 - <<'PY'
import json, os
O = os.environ["OUT"]
names = ["old1", "new1", "old2", "new2", "old3", "new3"]
runs = {n: {r["id"]: r for r in json.load(open(f"{O}/{n}.json")) if "ms" in r} for n in names}
for cid in runs["new1"]:
    cells = " ".join(f"{n} {runs[n][cid]['ms']:.4f}/{runs[n][cid].get('ms_single', 0):.4f}" for n in names)
    print(f"{cid:24s} {cells}")
PY
