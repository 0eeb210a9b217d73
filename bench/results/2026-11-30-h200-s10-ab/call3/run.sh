#!/usr/bin/env bash
# Session 10: v25 A (batched chunk-barrier tests only) and B (+ the first NCONS tiles' Q ahead)
# against main (v24, the s9w 'n' binaries): tests of B, A/B/O bench, timeline of B.
set -uo pipefail
tar xJf .device/s10b/bins.tar.xz -C .device/s10b; mkdir -p /tmp/s9w && tar xJf .device/s9w/bins.tar.xz -C /tmp/s9w
R=$OUT/r; mkdir -p $R; A=.device/s10b/a; B=.device/s10b/b; O=/tmp/s9w/s9w/n
$B/ariadne_cuda_tests --gtest_brief=1 --gtest_filter='CudaBandWg.*:CudaAttention.*:CudaEdges.*:CudaBand.*:VitCuda.*' > $R/tests.txt 2>&1; echo "tests rc $?" >> $R/tests.txt
for t in memcheck racecheck synccheck; do compute-sanitizer --tool $t --error-exitcode 9 $B/ariadne_cuda_tests --gtest_brief=1 \
  --gtest_filter='CudaBandWg.*Sanitizers*' > $R/san-$t.txt 2>&1; echo "$t $?" >> $R/tests.txt; done
echo "tests done $SECONDS"; tail -4 $R/tests.txt
F=stack-ariadne-896,vit-n4096-b1-win64,vit-n16384-b1-win64,vit-n1024-b1-win64,vit-n4096-b8-win64
for x in b a o b2 a2 o2 b3 a3 o3; do case $x in a*) e=$A;; b*) e=$B;; *) e=$O;; esac; $e/bench_attention_cuda bench/cases.json $F > $R/b-$x.json 2>/dev/null; done
echo "bench done $SECONDS"
mkdir -p /tmp/tl; for c in vit-n4096-b1-win64 vit-n16384-b1-win64; do ARIADNE_BENCH_PROFILE=1 ARIADNE_BENCH_TIMELINE=/tmp/tl/t \
  .device/s10b/t/bench_attention_cuda bench/cases.json $c > /dev/null 2>&1; done
python3 scripts/bandwg-timeline /tmp/tl/t.*.txt > $R/timeline.txt 2>&1
cd $OUT && tar cJf r.tar.xz r && rm -rf r
