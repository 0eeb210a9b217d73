#!/usr/bin/env bash
# Session 15, call 8: v46 (wgmma descriptors built once per buffer, k-steps added; the consumer
# warpgroup index made warp-uniform) in the dense wgmma kernel (d 64 / 80 / 128) and the window
# kernel. New binaries (working tree after 311faff) against 940bfa2's (the final check's), 3 rounds.
# Prediction (before the call): dense d 80 short rows -2 to -5% (the S issue loses ~12 instructions
# a wgmma; ncu: 14% more instructions than cuDNN, ~7.6 uniform ops a wgmma), N 4096 -1 to -3%;
# window kernel -0 to -3% (static code -3%), unless the re-schedule costs as in v38/v41.
set -uo pipefail
mkdir -p /tmp/new /tmp/old
tar xJf .device/s15h/bin.tar.xz -C /tmp/new && tar xJf .device/s15h/old.tar.xz -C /tmp/old
SETS="new=/tmp/new/bin old=/tmp/old/bin" ROUNDS=3 TESTS='*' \
  SANITIZE='CudaBandWg.*Sanitizers*:WgmmaTma.VarlenPrefillSinksStrides:BlockSparseWgmma.LaunchOrdersGiveTheSameBits' \
  CASES=vit-n1024-b1-full,vit-n1024-b8-full,vit-n4096-b1-full,vit-n4096-b8-full,vit-n1024-b1-win64,vit-n4096-b1-win64,vit-n16384-b1-win64,vit-n1024-b8-win64,vit-n4096-b1-chunk64,stack-ariadne-896,llm-n8192-causal \
  OUT=$OUT/ab scripts/device-ab-window
cd "$OUT" && tar cJf ab.tar.xz ab && rm -rf ab
