#!/bin/bash
# session 14 call 7: v43 final (no size threshold): the whole CUDA suite under ARIADNE_WGMMA=1 and 0,
# memcheck and racecheck on the band sanitizer cases, the chunk cells once.
cd "$(dirname "$0")/../.." && mkdir -p /tmp/ab && tar xJf .device/s14/ab7.tar.xz -C /tmp/ab
export ARIADNE_SOURCE_DIR=$PWD
mkdir -p $OUT/ab7; B=/tmp/ab/ab7/n
for wg in 1 0; do
  ARIADNE_WGMMA=$wg $B/ariadne_cuda_tests --gtest_brief=1 > $OUT/ab7/suite_wgmma_$wg.txt 2>&1
  echo "suite ARIADNE_WGMMA=$wg rc $? $(grep -E '^\[  PASSED' $OUT/ab7/suite_wgmma_$wg.txt)"
  grep -E "^\[  FAILED|Failure" -A4 $OUT/ab7/suite_wgmma_$wg.txt | head -20
done
for tool in memcheck racecheck; do
  compute-sanitizer --tool $tool --error-exitcode 9 $B/ariadne_cuda_tests --gtest_brief=1 --gtest_filter='CudaBandWg.*Sanitizers*' > $OUT/ab7/san-$tool.txt 2>&1
  echo "$tool rc $?"
done
$B/bench_attention_cuda bench/cases.json vit-n1024-b1-chunk64,vit-n4096-b1-chunk64,stack-chunk-896 > $OUT/ab7/bench.json 2>/dev/null
python3 -c "
import json,sys
for r in json.load(open('$OUT/ab7/bench.json')): print(r['id'], r.get('ms'), r.get('ms_single'), r.get('path'))"
