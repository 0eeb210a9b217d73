#!/usr/bin/env bash
# Session 15, final call: the device-check of the final binaries (v44), then two switches of the
# d 80 full kernel on the short-row cells (launch order heads-fastest, ping-pong off), alternated.
set -uo pipefail
scripts/device-session-check check .device/s15f/bin.tar.xz
B=/tmp/b/bin
SETS="heads=$B:ARIADNE_WGMMA_ORDER=heads nopp=$B:ARIADNE_WG_PINGPONG=0 def=$B" ROUNDS=3 \
  CASES=vit-n1024-b8-full,vit-n1024-b1-full,vit-n4096-b1-full TESTS='WgmmaTma.OutputThroughTheCopyEngineRoutes' \
  SANITIZE='WgmmaTma.OutputThroughTheCopyEngineRoutes' OUT=$OUT/sw scripts/device-ab-window | tail -5
cd "$OUT" && tar cJf sw.tar.xz sw && rm -rf sw
