#!/usr/bin/env bash
# Session 9: v22 (one walk for the gathering producer warpgroup) against main (v21a).
set -uo pipefail
tar xJf .device/s9h/bins.tar.xz -C .device; R=$OUT/r; mkdir -p $R; N=.device/s9h/n; O=.device/s9h/o
$N/ariadne_cuda_tests --gtest_brief=1 --gtest_filter='CudaBandWg.*:CudaAttention.FusedTokenOrder:CudaEdges.*:Cuda/Sweep.MatchesReference/*d80*' > $R/tests.txt 2>&1; echo "tests rc $?" >> $R/tests.txt
for t in memcheck racecheck synccheck; do compute-sanitizer --tool $t --error-exitcode 9 $N/ariadne_cuda_tests --gtest_brief=1 \
  --gtest_filter='CudaBandWg.OrderedSmallCasesForSanitizers:CudaBandWg.SmallCasesForSanitizers' > $R/san-$t.txt 2>&1; echo "$t $?" >> $R/tests.txt; done
echo "tests done $SECONDS"
F=vit-n1024-b1-win64,vit-n4096-b1-win64,vit-n16384-b1-win64,vit-n4096-b8-win64,stack-ariadne-896
for x in n o n2 o2; do b=$N; [[ $x == o* ]] && b=$O; $b/bench_attention_cuda bench/cases.json $F > $R/b-$x.json 2>/dev/null; done
echo "bench done $SECONDS"
cd $OUT && tar cJf r.tar.xz r && rm -rf r
