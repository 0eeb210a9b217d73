#!/usr/bin/env bash
# Session 15, call 7: full-set Nsight Compute profiles (per-SASS-instruction executions and stall
# samples) of the d 80 full kernel and of cuDNN's kernel on batch 8 N 1024, to compare their
# instruction mixes by opcode (bench/cuda-notes.md, "The batch 8 N 1024 full cell against cuDNN").
set -uo pipefail
mkdir -p /tmp/b && tar xJf .device/s15f/bin.tar.xz -C /tmp/b
B=/tmp/b/bin P=$OUT/q
mkdir -p $P
export NCU_SET=full
NAME=wg1024b8 KERNEL=attention_wgmma_kernel SKIP=3 OUT=$P scripts/ncu-kernel $B/bench_attention_cuda bench/cases.json vit-n1024-b8-full | tail -3
NAME=cudnn1024b8 KERNEL='fprop' SKIP=6 NCU_TIMEOUT=240 OUT=$P scripts/ncu-kernel \
  python3 bench/anchors.py --only vit-n1024-b8-full --impls sdpa_cudnn --out $P/a.json --target-s 0.02 | tail -3
ls -la $P
cd $OUT && tar cJf q.tar.xz q && rm -rf q
