#!/usr/bin/env bash
# Session 13, call 10: the whole vision and stack matrix with the anchors timed both ways
# (device-check's anchors step now passes --graph) and ariadne's bench (main's kernels, the
# committed bench) in the same call: the complete like-for-like tables.
cd "$(dirname "$0")/../.." || exit 1
mkdir -p /tmp/b && tar xJf .device/s13/bin2.tar.xz -C /tmp/b
OUT=$OUT/c ARIADNE_PREBUILT=/tmp/b/bin ARIADNE_SKIP="tests sanitize mmasync variants estimate python" \
  ARIADNE_BENCH_FILTER="vit-,stack-" ARIADNE_ANCHORS_TIMEOUT=330 scripts/device-check >/dev/null 2>&1
echo "device-check rc $?"
grep -c ms_graph $OUT/c/bench_anchors.json; grep -i "capture failed\|skipped" $OUT/c/bench_anchors.json | head -5
tail -30 $OUT/c/check.log | cut -c1-260
