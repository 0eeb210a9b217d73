#!/usr/bin/env bash
# Session 10: v30 (.read wait at the CTA's end, on main a6ff98b) against main (the s10g binaries),
# then the anchors of the batch-1 window cases and both benches once more in the same call.
set -uo pipefail
tar xJf .device/s10i/bins.tar.xz -C .device/s10i; mkdir -p /tmp/s10g && tar xJf .device/s10g/bin.tar.xz -C /tmp/s10g
R=$OUT/r; mkdir -p $R
SETS="v30=.device/s10i/c main=/tmp/s10g/bin" OUT=$R scripts/device-ab-window
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt 2>&1
W=vit-n1024-b1-win64,vit-n4096-b1-win64,vit-n16384-b1-win64
PYTHONUNBUFFERED=1 timeout 200 python3 bench/anchors.py --out $R/anchors.json --only $W > $R/anchors.log 2>&1; echo "anchors rc $? $SECONDS"
.device/s10i/c/bench_attention_cuda bench/cases.json $W > $R/b-v30-after-anchors.json 2>/dev/null
/tmp/s10g/bin/bench_attention_cuda bench/cases.json $W > $R/b-main-after-anchors.json 2>/dev/null
cd $OUT && tar cJf r.tar.xz r && rm -rf r
