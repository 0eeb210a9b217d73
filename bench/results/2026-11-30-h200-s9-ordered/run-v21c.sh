#!/usr/bin/env bash
# Session 9, device call 5: v21c (four-warp gathering producer as v21a, 16-byte row stores) against v21a (s9c) and main (s9).
set -uo pipefail
tar xJf .device/s9f/bins.tar.xz -C .device; R=$OUT/r; mkdir -p $R; N=.device/s9f/n; A=.device/s9c/n; O=.device/s9
$N/ariadne_cuda_tests --gtest_brief=1 --gtest_filter='CudaBandWg.*:CudaAttention.FusedTokenOrder:CudaEdges.*:Cuda/Sweep.MatchesReference/*d80*' > $R/tests.txt 2>&1; echo "tests rc $?" >> $R/tests.txt
for t in memcheck racecheck synccheck; do compute-sanitizer --tool $t --error-exitcode 9 $N/ariadne_cuda_tests --gtest_brief=1 \
  --gtest_filter='CudaBandWg.OrderedSmallCasesForSanitizers:CudaBandWg.SmallCasesForSanitizers' > $R/san-$t.txt 2>&1; echo "$t $?" >> $R/tests.txt; done
echo "tests done $SECONDS"
F=vit-n1024-b1-win64,vit-n4096-b1-win64,vit-n16384-b1-win64,vit-n4096-b8-win64,stack-ariadne-896
for x in n a o n2 a2 o2; do b=$N; [[ $x == o* ]] && b=$O; [[ $x == a* ]] && b=$A; $b/bench_attention_cuda bench/cases.json $F > $R/b-$x.json 2>/dev/null; done
echo "bench done $SECONDS"
rm -f $R/*.raw.csv
cd $OUT && tar cJf r.tar.xz r && rm -rf r
