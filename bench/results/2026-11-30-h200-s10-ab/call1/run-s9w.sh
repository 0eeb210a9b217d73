#!/usr/bin/env bash
# Session 9: v24 (block_col tiles loaded and stored by the copy engine) against v21a (main); the stack.
set -uo pipefail
tar xJf .device/s9w/bins.tar.xz -C .device; R=$OUT/r; mkdir -p $R; N=.device/s9w/n; O=.device/s9w/o
$N/ariadne_cuda_tests --gtest_brief=1 --gtest_filter='CudaBandWg.*:CudaAttention.FusedTokenOrder:CudaEdges.*' > $R/tests.txt 2>&1; echo "tests rc $?" >> $R/tests.txt
for t in memcheck racecheck synccheck; do compute-sanitizer --tool $t --error-exitcode 9 $N/ariadne_cuda_tests --gtest_brief=1 \
  --gtest_filter='CudaBandWg.BlockColSmallForSanitizers' > $R/san-$t.txt 2>&1; echo "$t $?" >> $R/tests.txt; done
echo "tests done $SECONDS"
F=stack-ariadne-896,vit-n4096-b1-win64,vit-n16384-b1-win64
for x in n o g n2 o2 g2; do b=$N; [[ $x == o* ]] && b=$O; e="X=1"; [[ $x == g* ]] && e="ARIADNE_BANDWG_TMA_ORDER=0"; env $e $b/bench_attention_cuda bench/cases.json $F > $R/b-$x.json 2>/dev/null; done
echo "bench done $SECONDS"
cd $OUT && tar cJf r.tar.xz r && rm -rf r
