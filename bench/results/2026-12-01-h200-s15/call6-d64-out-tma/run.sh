#!/usr/bin/env bash
# Session 15, call 6: v45 (the OT epilogue at d 64 too). The whole CUDA suite under both wgmma
# settings, sanitizers on the OT tests, then the A/B of one binary (default / ARIADNE_WG_OUT_TMA=0)
# on d 64 cases (SmolLM2's 9 / 3 heads causal; full 16 heads), 4 rounds.
# Prediction (before the call): short rows (N 1024 batch 8, N 2048) -2 to -5%, 8K-32K causal level.
set -uo pipefail
mkdir -p /tmp/b && tar xJf .device/s15g/bin.tar.xz -C /tmp/b
B=/tmp/b/bin
for w in 1 0; do
  ARIADNE_WGMMA=$w "$B/ariadne_cuda_tests" --gtest_brief=1 >"$OUT/suite$w.txt" 2>&1; echo "suite wgmma=$w rc $?" >>"$OUT/suite$w.txt"
  grep -E "PASSED|FAILED|rc " "$OUT/suite$w.txt"
done
SETS="ot=$B off=$B:ARIADNE_WG_OUT_TMA=0" ROUNDS=4 CASES_FILE=bench/results/2026-12-01-h200-s15/call6-d64-out-tma/cases-d64.json \
  CASES=d64-n1024-b8-causal,d64-n2048-b1-causal,d64-n8192-b1-causal,d64-n32768-b1-causal,d64-n1024-b8-full,d64-n4096-b1-full \
  TESTS='WgmmaTma.*' SANITIZE='WgmmaTma.OutputThroughTheCopyEngine*' OUT=$OUT/ab scripts/device-ab-window
cd "$OUT" && tar cJf ab.tar.xz suite1.txt suite0.txt ab && rm -rf ab suite1.txt suite0.txt
