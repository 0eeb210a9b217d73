#!/usr/bin/env bash
# Session 9, device call 4: v21b (one-warp gathering producer, 16-byte row stores) against v21a (s9c) and main (s9).
set -uo pipefail
tar xJf .device/s9e/bins.tar.xz -C .device; R=$OUT/r; mkdir -p $R; N=.device/s9d/n; A=.device/s9c/n; O=.device/s9
$N/ariadne_cuda_tests --gtest_brief=1 --gtest_filter='CudaBandWg.*:CudaAttention.FusedTokenOrder:CudaEdges.*:Cuda/Sweep.MatchesReference/*d80*' > $R/tests.txt 2>&1; echo "tests rc $?" >> $R/tests.txt
for t in memcheck racecheck synccheck; do compute-sanitizer --tool $t --error-exitcode 9 $N/ariadne_cuda_tests --gtest_brief=1 \
  --gtest_filter='CudaBandWg.OrderedSmallCasesForSanitizers:CudaBandWg.SmallCasesForSanitizers' > $R/san-$t.txt 2>&1; echo "$t $?" >> $R/tests.txt; done
echo "tests done $SECONDS"
F=vit-n1024-b1-win64,vit-n4096-b1-win64,vit-n16384-b1-win64,vit-n4096-b8-win64,stack-ariadne-896
for x in n a o n2 a2 o2; do b=$N; [[ $x == o* ]] && b=$O; [[ $x == a* ]] && b=$A; $b/bench_attention_cuda bench/cases.json $F > $R/b-$x.json 2>/dev/null; done
echo "bench done $SECONDS"
for x in id:3; do ARIADNE_BENCH_PROFILE=1 NAME=${x%%:*}16k KERNEL=attention_bandwg_kernel SKIP=${x##*:} NCU_SET=full NCU_TIMEOUT=120 OUT=$R \
  scripts/ncu-kernel $N/bench_attention_cuda bench/cases.json vit-n16384-b1-win64 > $R/ncu-${x%%:*}.log 2>&1; echo "ncu $x $SECONDS"; done
rm -f $R/*.raw.csv
cd $OUT && tar cJf r.tar.xz r && rm -rf r
