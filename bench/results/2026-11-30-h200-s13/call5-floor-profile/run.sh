#!/usr/bin/env bash
# Session 13, call 5: the launch floor (bench/tools/launch_floor.cu, built here) and one Nsight
# Compute profile (full set) of the window kernel at N 16384 (steady state: 32 tiles a CTA).
cd "$(dirname "$0")/../.." || exit 1
nvcc -O2 -std=c++17 -arch=sm_90a bench/tools/launch_floor.cu -o /tmp/launch_floor && /tmp/launch_floor | tee $OUT/launch_floor.txt
mkdir -p /tmp/b && tar xJf .device/s13/bin.tar.xz -C /tmp/b
ARIADNE_BENCH_PROFILE=1 NCU_SET=full NCU_TIMEOUT=120 NAME=bandwg16k KERNEL=attention_bandwg_kernel SKIP=1 OUT=$OUT \
  scripts/ncu-kernel /tmp/b/bin/bench_attention_cuda bench/cases.json vit-n16384-b1-win64 2>&1 | tail -25
head -40 $OUT/ncu-bandwg16k.stalls.txt
