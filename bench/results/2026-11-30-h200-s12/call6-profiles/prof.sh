#!/usr/bin/env bash
# Session 12 call 6: full Nsight Compute profiles of one block-sparse 32K 10% launch and one dense
# causal 32K launch of the d 128 wgmma kernel (main 4e7cd93), for the short-row overhead question.
set -uo pipefail
mkdir -p /tmp/b && tar xJf .device/s12d/bin.tar.xz -C /tmp/b
P=$OUT/p; mkdir -p $P
ARIADNE_PREBUILT=/tmp/b/bin OUT=$P NCU_TIMEOUT=120 scripts/ncu-prefill-stages blocks
NCU_SET=full OUT=$P NCU_TIMEOUT=120 NAME=causal32k KERNEL=attention_wgmma_kernel SKIP=2 scripts/ncu-kernel /tmp/b/bin/bench_attention_cuda bench/cases.json llm-n32768-causal
cd $OUT && rm -f p/*.raw.csv && tar cJf p.tar.xz p && rm -rf p
