#!/usr/bin/env bash
# Session 9: v23 (programmatic dependent launch on the window kernel only) against main.
set -uo pipefail
tar xJf .device/s9i/bins.tar.xz -C .device; R=$OUT/r; mkdir -p $R; N=.device/s9i/n; O=.device/s9i/o
$N/ariadne_cuda_tests --gtest_brief=1 --gtest_filter='CudaPdl.*:CudaBandWg.*:CudaAttention.FusedTokenOrder:CudaEdges.*' > $R/tests.txt 2>&1; echo "tests rc $?" >> $R/tests.txt
for t in memcheck racecheck synccheck; do compute-sanitizer --tool $t --error-exitcode 9 $N/ariadne_cuda_tests --gtest_brief=1 \
  --gtest_filter='CudaPdl.SameBitsOnAndOffAndOnTheLegacyStream:CudaBandWg.SmallCasesForSanitizers' > $R/san-$t.txt 2>&1; echo "$t $?" >> $R/tests.txt; done
echo "tests done $SECONDS"
F=vit-n1024-b1-win64,vit-n4096-b1-win64,vit-n16384-b1-win64,vit-n4096-b8-win64,stack-ariadne-896,stack-full-896,vit-n4096-b1-full
for x in n o f n2 o2 f2; do b=$N; [[ $x == o* ]] && b=$O; e=""; [[ $x == f* ]] && e="ARIADNE_PDL=0"; env $e $b/bench_attention_cuda bench/cases.json $F > $R/b-$x.json 2>/dev/null; done
echo "bench done $SECONDS"
cd $OUT && tar cJf r.tar.xz r && rm -rf r
