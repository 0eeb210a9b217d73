#!/usr/bin/env bash
# Session 9: SM clock and power while bench_estimate_cuda runs 128K (dense, estimate, sparse): is the
# block-sparse launch slower in the bench (~97 ms) than alone under ncu (88.7 ms) because of clocks?
set -uo pipefail
R=$OUT/r; mkdir -p $R; xz -dk .device/s9g/b/bench_estimate_cuda.xz; chmod +x .device/s9g/b/bench_estimate_cuda
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,nounits -lms 25 > $R/smi.csv 2>&1 &
S=$!
nvidia-smi --query-gpu=timestamp,clocks_event_reasons.active --format=csv,nounits -lms 100 > $R/smi-why.csv 2>&1 &
S2=$!; sleep 1
for r in 1 2; do date +%T.%N > $R/t$r.txt; .device/s9g/b/bench_estimate_cuda 131072 --methods rr --strides 8 --recall-max 0 --scoring mma3 > $R/est$r.json 2>$R/est$r.err; date +%T.%N >> $R/t$r.txt; sleep 2; done
kill $S $S2; nvidia-smi -q -d POWER,CLOCK > $R/smi-q.txt 2>&1
cd $OUT && tar cJf r.tar.xz r && rm -rf r
