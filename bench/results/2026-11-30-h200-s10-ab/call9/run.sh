#!/usr/bin/env bash
# Session 10: v29 (first tiles streamed, first Q's ahead; on v26) against main (a6ff98b, the s10g
# device-check binaries): tests + sanitizers of v29, bench alternated three times, timeline of v29,
# then the anchors of the batch-1 window cases and v29's bench once more in the same call.
set -uo pipefail
tar xJf .device/s10h/bins.tar.xz -C .device/s10h; mkdir -p /tmp/s10g && tar xJf .device/s10g/bin.tar.xz -C /tmp/s10g
R=$OUT/r; mkdir -p $R; C=.device/s10h/c; O=/tmp/s10g/bin
$C/ariadne_cuda_tests --gtest_brief=1 --gtest_filter='CudaBandWg.*:CudaAttention.*:CudaEdges.*:CudaBand.*:VitCuda.*' > $R/tests.txt 2>&1; echo "tests rc $?" >> $R/tests.txt
for t in memcheck racecheck synccheck; do compute-sanitizer --tool $t --error-exitcode 9 $C/ariadne_cuda_tests --gtest_brief=1 \
  --gtest_filter='CudaBandWg.*Sanitizers*' > $R/san-$t.txt 2>&1; echo "$t $?" >> $R/tests.txt; done
echo "tests done $SECONDS"; tail -4 $R/tests.txt
F=stack-ariadne-896,vit-n4096-b1-win64,vit-n16384-b1-win64,vit-n1024-b1-win64,vit-n4096-b8-win64
for x in c o c2 o2 c3 o3; do case $x in c*) e=$C;; *) e=$O;; esac; $e/bench_attention_cuda bench/cases.json $F > $R/b-$x.json 2>/dev/null; done
echo "bench done $SECONDS"
mkdir -p /tmp/tl; for c in vit-n4096-b1-win64 vit-n16384-b1-win64; do ARIADNE_BENCH_PROFILE=1 ARIADNE_BENCH_TIMELINE=/tmp/tl/t \
  .device/s10h/t/bench_attention_cuda bench/cases.json $c > /dev/null 2>&1; done
python3 scripts/bandwg-timeline /tmp/tl/t.*.txt > $R/timeline.txt 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt 2>&1
PYTHONUNBUFFERED=1 timeout 200 python3 bench/anchors.py --out $R/anchors.json --only vit-n1024-b1-win64,vit-n4096-b1-win64,vit-n16384-b1-win64 > $R/anchors.log 2>&1; echo "anchors rc $? $SECONDS"
$C/bench_attention_cuda bench/cases.json vit-n1024-b1-win64,vit-n4096-b1-win64,vit-n16384-b1-win64 > $R/b-c-after-anchors.json 2>/dev/null
$O/bench_attention_cuda bench/cases.json vit-n1024-b1-win64,vit-n4096-b1-win64,vit-n16384-b1-win64 > $R/b-o-after-anchors.json 2>/dev/null
echo "all done $SECONDS"
cd $OUT && tar cJf r.tar.xz r && rm -rf r
