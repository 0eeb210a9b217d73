#!/usr/bin/env bash
# Session 15, call 5: where the d 80 full kernel's time goes on short rows, and cuDNN's launch
# shape on the same case (Nsight Compute, default sections: launch, occupancy, stalls, memory).
set -uo pipefail
mkdir -p /tmp/b && tar xJf .device/s15f/bin.tar.xz -C /tmp/b
B=/tmp/b/bin P=$OUT/p
mkdir -p $P
NAME=wg1024b8 KERNEL=attention_wgmma_kernel SKIP=3 OUT=$P scripts/ncu-kernel $B/bench_attention_cuda bench/cases.json vit-n1024-b8-full | tail -25
NAME=wg4096b1 KERNEL=attention_wgmma_kernel SKIP=3 OUT=$P scripts/ncu-kernel $B/bench_attention_cuda bench/cases.json vit-n4096-b1-full | tail -25
NAME=cudnn1024b8 KERNEL='fprop|sdpa|flash|fmha|attn' SKIP=6 NCU_TIMEOUT=200 OUT=$P scripts/ncu-kernel \
  python3 bench/anchors.py --only vit-n1024-b8-full --impls sdpa_cudnn --out $P/a.json --target-s 0.02 | tail -25
grep -h -E "^ +(Grid Size|Block Size|Registers Per Thread|Dynamic Shared Memory Per Block|Waves Per SM|Achieved Occupancy|Duration|Theoretical Occupancy|Block Limit)" $P/ncu-*.txt
grep -h "Kernel Name\|^  [a-zA-Z_].*(.*)x(" $P/ncu-cudnn1024b8.txt | head -3
cd $OUT && tar cJf p.tar.xz p && rm -rf p
