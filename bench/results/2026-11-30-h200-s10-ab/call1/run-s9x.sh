#!/usr/bin/env bash
# The window kernel's timeline (5 stamps a tile: the chunk wait split into the earlier chunks' waits
# and releases and the tile's own chunks), main's kernels of session 9 built with the timeline.
set -uo pipefail
xz -dk .device/s9x/bench_attention_cuda.xz; chmod +x .device/s9x/bench_attention_cuda; mkdir -p /tmp/tl
for c in vit-n4096-b1-win64 vit-n16384-b1-win64; do ARIADNE_BENCH_PROFILE=1 ARIADNE_BENCH_TIMELINE=/tmp/tl/t \
  .device/s9x/bench_attention_cuda bench/cases.json $c > /dev/null 2>&1; done
python3 scripts/bandwg-timeline /tmp/tl/t.*.txt > /tmp/tl/report.txt 2>&1; tar cJf $OUT/tl.tar.xz -C /tmp tl; grep -v sink /tmp/tl/report.txt | head -60
