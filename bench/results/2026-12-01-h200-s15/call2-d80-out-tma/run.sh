#!/usr/bin/env bash
# Session 15, call 2: v44 (d 80 O through the copy engine on short rows, the OT instantiation).
# The whole CUDA suite once (default settings), then the A/B of one binary: default (OT on short
# rows) / ARIADNE_WG_OUT_TMA=0 (the other instantiation, as main) / =1 (OT on every length).
# Prediction (before the call): full N 1024 b1 and b8 -3 to -6% (v38's numbers); N 4096 rows
# not routed (default = off, identical kernels); forced on N 4096: level to +3% single.
set -uo pipefail
B=$(pwd)/.device/s15b/bin
mkdir -p /tmp/b && tar xJf .device/s15b/bin.tar.xz -C /tmp/b
B=/tmp/b/bin
"$B/ariadne_cuda_tests" --gtest_brief=1 >"$OUT/suite.txt" 2>&1; echo "suite rc $?" >>"$OUT/suite.txt"
grep -E "PASSED|FAILED|rc " "$OUT/suite.txt"
SETS="ot=$B off=$B:ARIADNE_WG_OUT_TMA=0 force=$B:ARIADNE_WG_OUT_TMA=1" ROUNDS=${ROUNDS:-4} \
  CASES=vit-n1024-b1-full,vit-n1024-b8-full,vit-n4096-b1-full,vit-n4096-b8-full \
  TESTS='WgmmaTma.*' SANITIZE='WgmmaTma.OutputThroughTheCopyEngine*' OUT=$OUT/ab scripts/device-ab-window
cd "$OUT" && tar cJf ab.tar.xz suite.txt ab && rm -rf ab suite.txt
