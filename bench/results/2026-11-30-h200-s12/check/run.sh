#!/usr/bin/env bash
# Session 12 device-check on main 4e7cd93 (vector key-stride sums, staged score_ptr, bandwg encode_pair): the whole CUDA suite (both kernels),
# sanitizers, bench on the vision cases and stacks with anchors, estimate bench with dense anchors.
set -uo pipefail
mkdir -p /tmp/b && tar xJf .device/s12d/bin.tar.xz -C /tmp/b
C=$OUT/c; mkdir -p $C
OUT=$C ARIADNE_PREBUILT=/tmp/b/bin ARIADNE_SKIP="mmasync variants python" ARIADNE_BENCH_FILTER="vit-,stack-" \
  ARIADNE_ANCHORS_TIMEOUT=220 ARIADNE_ESTIMATE_TOKENS="32768 131072" \
  ARIADNE_ESTIMATE_ARGS="--xattn-max 32768 --recall-max 32768 --scoring mma3" scripts/device-check > $OUT/device-check.out 2>&1
echo "rc $?"; tail -5 $C/check.log
cd $OUT && tar cJf c.tar.xz c && rm -rf c
