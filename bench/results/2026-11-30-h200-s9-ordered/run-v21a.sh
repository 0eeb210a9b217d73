#!/usr/bin/env bash
# Session 9, device call 3: v21 with the packed rows in shared memory; profiles of the ordered path.
set -uo pipefail
R=$OUT/r; mkdir -p $R; N=.device/s9c/n; O=.device/s9
$N/ariadne_cuda_tests --gtest_brief=1 --gtest_filter='CudaBandWg.*:CudaAttention.FusedTokenOrder:CudaEdges.*' > $R/tests.txt 2>&1; echo "tests rc $?" >> $R/tests.txt
for t in memcheck racecheck synccheck; do compute-sanitizer --tool $t --error-exitcode 9 $N/ariadne_cuda_tests --gtest_brief=1 \
  --gtest_filter='CudaBandWg.OrderedSmallCasesForSanitizers:CudaBandWg.SmallCasesForSanitizers' > $R/san-$t.txt 2>&1; echo "$t $?" >> $R/tests.txt; done
echo "tests done $SECONDS"
F=vit-n1024-b1-win64,vit-n4096-b1-win64,vit-n16384-b1-win64,vit-n4096-b8-win64,stack-ariadne-896
for x in n o n2 o2; do b=$N; [[ $x == o* ]] && b=$O; $b/bench_attention_cuda bench/cases.json $F > $R/b-$x.json 2>/dev/null; done
echo "bench done $SECONDS"
for x in st:1 id:3; do ARIADNE_BENCH_PROFILE=1 NAME=${x%%:*}16k KERNEL=attention_bandwg_kernel SKIP=${x##*:} NCU_SET=full NCU_TIMEOUT=120 OUT=$R \
  scripts/ncu-kernel $N/bench_attention_cuda bench/cases.json vit-n16384-b1-win64 > $R/ncu-${x%%:*}.log 2>&1; echo "ncu $x $SECONDS"; done
rm -f $R/*.raw.csv
cd $OUT && tar cJf r.tar.xz r && rm -rf r
