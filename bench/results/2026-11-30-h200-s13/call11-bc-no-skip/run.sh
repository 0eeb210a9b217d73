#!/usr/bin/env bash
# Session 13, call 11: v40, the block_col window kernel (the stack's column layers) without the
# per-pair skip (the storage-order kernels byte-identical to main's), against main, alternated 4x.
# Prediction (before the run): stack -0.3 to -0.7% in both timings (v39 gave -0.7% with all
# variant-3 kernels changed; its storage-order layers gained ~1%, the column layers the rest).
cd "$(dirname "$0")/../.." || exit 1
mkdir -p /tmp/n /tmp/o && tar xJf .device/s13/bin11.tar.xz -C /tmp/n && tar xJf .device/s13/bin2.tar.xz -C /tmp/o
SETS="v40=/tmp/n/bin main=/tmp/o/bin" ROUNDS=4 CASES=stack-ariadne-896,vit-n4096-b1-win64 TESTS='CudaBandWg.*:VitCuda.*' OUT=$OUT/ab \
  scripts/device-ab-window 2>&1 | tail -4
