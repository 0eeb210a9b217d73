#!/bin/bash
# session 14 call 6: v43's binaries (ab5): the whole CUDA suite under ARIADNE_WGMMA=1, then the
# N 1024 batch-1 chunk cell on the chunk kernel (ARIADNE_BANDWG_CHUNK=1) against the default route
# (the tile kernel under the 32768 rows x heads threshold), alternated 5x.
cd "$(dirname "$0")/../.." && mkdir -p /tmp/ab && tar xJf .device/s14/ab5.tar.xz -C /tmp/ab
export ARIADNE_SOURCE_DIR=$PWD
mkdir -p $OUT/ab6
/tmp/ab/ab5/n/ariadne_cuda_tests --gtest_brief=1 > $OUT/ab6/suite.txt 2>&1
echo "suite rc $? $(grep -E '^\[  PASSED' $OUT/ab6/suite.txt)"; grep -E "^\[  FAILED|Failure" -A4 $OUT/ab6/suite.txt | head -20
SETS="forced=/tmp/ab/ab5/n:ARIADNE_BANDWG_CHUNK=1 default=/tmp/ab/ab5/n" ROUNDS=5 CASES=vit-n1024-b1-chunk64 TESTS='CudaBandWg.Routing' \
OUT=$OUT/ab6 scripts/device-ab-window | tail -3
