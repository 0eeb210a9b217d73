#!/bin/bash
# session 14 call 4: v42 final form (chunked calls from 32768 rows x heads, orders too): the whole
# CUDA suite under ARIADNE_WGMMA=1 and 0, the band sanitizers, chunk (default) / tile
# (ARIADNE_BANDWG_CHUNK=0) alternated 3x on the chunk cells, the anchors of the same cells.
cd "$(dirname "$0")/../.." && mkdir -p /tmp/ab && tar xJf .device/s14/ab3.tar.xz -C /tmp/ab
export ARIADNE_SOURCE_DIR=$PWD
mkdir -p $OUT/ab3
for wg in 1 0; do
  ARIADNE_WGMMA=$wg /tmp/ab/ab3/n/ariadne_cuda_tests --gtest_brief=1 > $OUT/ab3/suite_wgmma_$wg.txt 2>&1
  echo "suite ARIADNE_WGMMA=$wg rc $? $(grep -E '^\[  PASSED' $OUT/ab3/suite_wgmma_$wg.txt)"
  grep -E "^\[  FAILED|Failure" -A4 $OUT/ab3/suite_wgmma_$wg.txt | head -30
done
C=vit-n1024-b1-chunk64,vit-n4096-b1-chunk64,vit-n16384-b1-chunk64,vit-n1024-b8-chunk64,vit-n4096-b8-chunk64,vit-n16384-b8-chunk64,stack-chunk-896
SETS="chunk=/tmp/ab/ab3/n tile=/tmp/ab/ab3/n:ARIADNE_BANDWG_CHUNK=0" ROUNDS=3 CASES=$C TESTS='CudaBandWg.Chunks:CudaBandWg.Routing' \
OUT=$OUT/ab3 scripts/device-ab-window
PYTHONUNBUFFERED=1 timeout 200 python3 bench/anchors.py --out $OUT/ab3/anchors.json --graph --only "$C" > $OUT/ab3/anchors.log 2>&1
tail -3 $OUT/ab3/anchors.log
cd $OUT && tar cJf ab3.tar.xz ab3 && rm -rf ab3
