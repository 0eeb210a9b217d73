#!/usr/bin/env bash
# Session 9, device call 1: rowsum8 A/B, window ordered-path timings, 128K dense/RR profiles.
set -uo pipefail
REPO=$PWD; R=$OUT/r; mkdir -p $R /tmp/ab/p
tar xJf .device/rs8/ab.tar.xz -C /tmp/ab && tar xJf .device/s8f/bin.tar.xz -C /tmp/ab/p
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv > $R/gpu.txt 2>&1
( cd /tmp/ab
  ./n/ariadne_cuda_tests --gtest_brief=1 --gtest_filter='CudaEstimate.*' 2>&1 | grep -E "PASSED|FAILED|Failure"
  for t in memcheck racecheck; do compute-sanitizer --tool $t --error-exitcode 9 ./n/ariadne_cuda_tests --gtest_brief=1 \
    --gtest_filter='CudaEstimate.TensorCoreScoringV3SmallCasesForSanitizers' >/dev/null 2>&1; echo "$t $?"; done
  for x in n p/bin n2 p/bin; do echo "== ${x%2}"; ./${x%2}/bench_estimate_cuda 32768 131072 --methods rr --strides 8,16 --recall-max 0 \
    --scoring mma3 2>/dev/null | grep -E '"(id|ms_scoring|ms_estimate|density)"'; done ) > $R/rs8.txt 2>&1
echo "rs8 done $SECONDS"
for k in 1 2; do ./.device/s9/bench_attention_cuda bench/cases.json vit-n1024-b1-win64,vit-n4096-b1-win64,vit-n16384-b1-win64,stack-ariadne-896 \
  > $R/win$k.json 2>$R/win$k.err; done
echo "win done $SECONDS"
BIN=/tmp/ab/p/bin
for x in dense:2 rr:7; do NAME=${x%%:*}128k KERNEL=attention_wgmma_kernel SKIP=${x##*:} NCU_SET=full NCU_TIMEOUT=200 OUT=$R \
  scripts/ncu-kernel "$BIN/bench_estimate_cuda" 131072 --methods rr --strides 8 --recall-max 0 --scoring mma3 > $R/ncu-${x%%:*}.log 2>&1; echo "ncu $x $SECONDS"; done
rm -f $R/*.raw.csv
cd $OUT && tar cJf r.tar.xz r && rm -rf r
