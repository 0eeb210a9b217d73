#!/usr/bin/env bash
# Session 12 call 10: two back-to-back same-run samples of the 128K RR S 8 total against cuDNN
# (estimate bench + its dense anchors), final binaries (a797e68).
set -uo pipefail
mkdir -p /tmp/b && tar xJf .device/s12g/bin.tar.xz -C /tmp/b
for r in 1 2; do
  C=$OUT/r$r; mkdir -p $C
  OUT=$C ARIADNE_PREBUILT=/tmp/b/bin ARIADNE_SKIP="tests sanitize bench mmasync variants python anchors" \
    ARIADNE_ESTIMATE_TOKENS="131072" ARIADNE_ESTIMATE_ARGS="--methods rr --strides 8 --recall-max 0 --scoring mma3" \
    scripts/device-check > $C/device-check.out 2>&1
  grep -E "^rr-n131072" $C/check.log
done
cd $OUT && tar cJf ratio.tar.xz r1 r2 && rm -rf r1 r2
