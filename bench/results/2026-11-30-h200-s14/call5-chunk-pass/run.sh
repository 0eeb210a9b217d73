#!/bin/bash
# session 14 call 5: v43 (the chunk kernel's one-chunk pass): band / attention / encoder / sweep
# tests and the band sanitizers, then pass (default) / window kernel (ARIADNE_BANDWG_CHUNK_PASS=0)
# alternated 3x on the chunk cells, then the anchors of the same cells.
cd "$(dirname "$0")/../.." && mkdir -p /tmp/ab && tar xJf .device/s14/ab5.tar.xz -C /tmp/ab
export ARIADNE_SOURCE_DIR=$PWD
C=vit-n1024-b1-chunk64,vit-n4096-b1-chunk64,vit-n16384-b1-chunk64,vit-n1024-b8-chunk64,vit-n4096-b8-chunk64,vit-n16384-b8-chunk64,stack-chunk-896
SETS="pass=/tmp/ab/ab5/n window=/tmp/ab/ab5/n:ARIADNE_BANDWG_CHUNK_PASS=0" ROUNDS=3 CASES=$C \
TESTS='CudaBandWg.*:CudaBand.*:CudaAttention.*:CudaEdges.*:VitCuda.*:Cuda/Sweep.*' \
OUT=$OUT/ab5 scripts/device-ab-window
grep -E "FAILED|Failure" -A6 $OUT/ab5/tests.txt | head -50
PYTHONUNBUFFERED=1 timeout 200 python3 bench/anchors.py --out $OUT/ab5/anchors.json --graph --only "$C" > $OUT/ab5/anchors.log 2>&1
tail -2 $OUT/ab5/anchors.log
cd $OUT && tar cJf ab5.tar.xz ab5 && rm -rf ab5
