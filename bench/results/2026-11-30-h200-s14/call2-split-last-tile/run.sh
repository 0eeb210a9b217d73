#!/bin/bash
# session 14 call 2: v41 (split last tile) tests + sanitizers + A/B split / whole (same binary) / main
cd "$(dirname "$0")/../.." && mkdir -p /tmp/ab && tar xJf .device/s14/ab1.tar.xz -C /tmp/ab
SETS="split=/tmp/ab/ab1/n whole=/tmp/ab/ab1/n:ARIADNE_BANDWG_SPLIT=0 main=/tmp/ab/ab1/o" ROUNDS=4 \
CASES=stack-ariadne-896,vit-n4096-b1-win64,vit-n4096-b1-win64-sink,vit-n16384-b1-win64,vit-n1024-b1-win64,vit-n1024-b8-win64,vit-n4096-b8-win64 \
OUT=$OUT/ab1 scripts/device-ab-window
grep -E "FAILED|Failure" -A5 $OUT/ab1/tests.txt | head -60
