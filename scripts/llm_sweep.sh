#!/usr/bin/env bash
# One stream of the SmolLM2 retrieval sweep (bench/RESULTS.md, "SmolLM2 (CPU)"): one `ariadne llm-probe`
# invocation per (task, length, seed), each writing DIR/<task>-<tokens>-s<seed>.json (+ .err), so a
# stream cut short still leaves whole files. Single-threaded on purpose: on a shared 2-core machine
# OpenMP barriers under contention cost far more than the second thread gains; run two streams.
#
#   scripts/llm_sweep.sh DIR "TASKS" "LENGTHS" "SEEDS" [extra ariadne llm-probe options...]
#   e.g. scripts/llm_sweep.sh runs/a "passkey niah" "1024" "1 2 3 4" --probe-outputs
set -euo pipefail
dir=$1 tasks=$2 lengths=$3 seeds=$4
shift 4
bin=${ARIADNE_BIN:-build/ariadne}
mkdir -p "$dir"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
for len in $lengths; do
  for seed in $seeds; do
    for task in $tasks; do
      out=$dir/$task-$len-s$seed.json
      [ -s "$out" ] && continue
      # The answer's digits are one token each, after a space: 5 (passkey) or 7 (niah), and a spare.
      new=7
      [ "$task" = niah ] && new=9
      "$bin" llm-probe --threads 1 --task "$task" --tokens "$len" --seed "$seed" --seeds 1 \
        --depth "${DEPTHS:-0.1,0.3,0.5,0.7,0.9}" --method dense,rr,xattn,oracle --offset paper,released \
        --tau "${TAU:-0.95}" --stride "${STRIDE:-8}" --probe-tau 0.9,0.95 --probe-stride 8,16 \
        --probe-protect "${PROTECT:-published,none,sink+diagonal}" --new "$new" --per-layer --json "$@" >"$out.tmp" 2>"$out.err"
      mv "$out.tmp" "$out"
    done
  done
done
