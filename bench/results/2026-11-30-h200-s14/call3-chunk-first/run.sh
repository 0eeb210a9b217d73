#!/bin/bash
# session 14 call 3: v42 (chunked patterns on the wgmma band kernel): tests + sanitizers, then
# chunk (default) / tile (ARIADNE_BANDWG_CHUNK=0) alternated 4x on the chunk cells, then the anchors
# of the same cells (single calls and graph replays).
cd "$(dirname "$0")/../.." && mkdir -p /tmp/ab && tar xJf .device/s14/ab2.tar.xz -C /tmp/ab
C=vit-n1024-b1-chunk64,vit-n4096-b1-chunk64,vit-n16384-b1-chunk64,vit-n1024-b8-chunk64,vit-n4096-b8-chunk64,vit-n16384-b8-chunk64,stack-chunk-896
SETS="chunk=/tmp/ab/ab2/n tile=/tmp/ab/ab2/n:ARIADNE_BANDWG_CHUNK=0" ROUNDS=4 CASES=$C \
TESTS='CudaBandWg.*:CudaBand.*:CudaAttention.*:CudaEdges.*:VitCuda.*:Cuda/Sweep.*:WgmmaTma.*:CudaWgmma*' \
OUT=$OUT/ab2 scripts/device-ab-window
grep -E "FAILED|Failure" -A5 $OUT/ab2/tests.txt | head -60
rm -f $OUT/ab2/b-*.json.tmp
PYTHONUNBUFFERED=1 timeout 200 python3 bench/anchors.py --out $OUT/ab2/anchors.json --graph --only "$C" > $OUT/ab2/anchors.log 2>&1
tail -12 $OUT/ab2/anchors.log
cd $OUT && tar cJf ab2.tar.xz ab2 && rm -rf ab2
