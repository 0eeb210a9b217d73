#!/usr/bin/env bash
# Session 10: v27 (per-warp slot releases, on v26) against v26 (s10d 'b') and main (v24 = s9w 'n'):
# tests + sanitizers of v27, bench alternated three times, timeline of v27.
set -uo pipefail
tar xJf .device/s10e/bins.tar.xz -C .device/s10e; mkdir -p /tmp/s9w /tmp/s10d && tar xJf .device/s9w/bins.tar.xz -C /tmp/s9w && tar xJf .device/s10d/bins.tar.xz -C /tmp/s10d
R=$OUT/r; mkdir -p $R; C=.device/s10e/c; B=/tmp/s10d/b; O=/tmp/s9w/s9w/n
$C/ariadne_cuda_tests --gtest_brief=1 --gtest_filter='CudaBandWg.*:CudaAttention.*:CudaEdges.*:CudaBand.*:VitCuda.*' > $R/tests.txt 2>&1; echo "tests rc $?" >> $R/tests.txt
for t in memcheck racecheck synccheck; do compute-sanitizer --tool $t --error-exitcode 9 $C/ariadne_cuda_tests --gtest_brief=1 \
  --gtest_filter='CudaBandWg.*Sanitizers*' > $R/san-$t.txt 2>&1; echo "$t $?" >> $R/tests.txt; done
echo "tests done $SECONDS"; tail -4 $R/tests.txt
F=stack-ariadne-896,vit-n4096-b1-win64,vit-n16384-b1-win64,vit-n1024-b1-win64,vit-n4096-b8-win64
for x in c b o c2 b2 o2 c3 b3 o3; do case $x in c*) e=$C;; b*) e=$B;; *) e=$O;; esac; $e/bench_attention_cuda bench/cases.json $F > $R/b-$x.json 2>/dev/null; done
echo "bench done $SECONDS"
mkdir -p /tmp/tl; for c in vit-n4096-b1-win64 vit-n16384-b1-win64; do ARIADNE_BENCH_PROFILE=1 ARIADNE_BENCH_TIMELINE=/tmp/tl/t \
  .device/s10e/t/bench_attention_cuda bench/cases.json $c > /dev/null 2>&1; done
python3 scripts/bandwg-timeline /tmp/tl/t.*.txt > $R/timeline.txt 2>&1
cd $OUT && tar cJf r.tar.xz r && rm -rf r
