#!/usr/bin/env bash
# Session 15, call 9: the final binaries (v46 in the window kernel only; the dense kernels as in
# call 4): band / attention / encoder / wgmma tests under both wgmma settings, then the window
# cells with their anchors in the same run (bench-report --print gives the table).
set -uo pipefail
mkdir -p /tmp/b && tar xJf .device/s15i/bin.tar.xz -C /tmp/b
OUT=$OUT/w ARIADNE_PREBUILT=/tmp/b/bin ARIADNE_SKIP="sanitize mmasync variants python estimate" \
  ARIADNE_TEST_FILTER='CudaBandWg.*:CudaBand.*:CudaAttention.*:CudaEdges.*:VitCuda.*:WgmmaTma.*' \
  ARIADNE_BENCH_FILTER="vit-n4096-b1-win64,vit-n1024-b8-win64,vit-n16384-b1-win64,vit-n1024-b1-win64" \
  ARIADNE_ANCHORS_TIMEOUT=150 scripts/device-check >/dev/null 2>&1
echo "rc $?"; grep -E "tests|PASS|FAIL" $OUT/w/check.log | head; grep -E "^vit" $OUT/w/check.log | cut -c1-160
cd "$OUT" && tar cJf w.tar.xz w && rm -rf w
