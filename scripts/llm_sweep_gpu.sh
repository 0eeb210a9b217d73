#!/usr/bin/env bash
# The SmolLM2 retrieval sweep on the GPU (docs/llm.md, "Results (GPU)"): `ariadne llm --backend cuda`
# for every (task, length, seed, needle depth) prompt, JOBS_PARALLEL processes sharing the one GPU (the
# model is small: the runs are bound by launches and host work, which several processes overlap).
# Each prompt is one job writing DIR/<task>-<tokens>-s<seed>-d<depth>.json (+ .err): every method's
# generation run and the probes of its dense run. Jobs start in seed-major order, so a sweep cut
# short by SWEEP_SECONDS (no job starts after it) still covers every length, task and depth.
#
#   scripts/llm_sweep_gpu.sh DIR [extra ariadne llm options...]
#   env: ARIADNE_BIN (build/ariadne), JOBS_PARALLEL (8), SWEEP_SECONDS (unlimited), HARD_SECONDS (unlimited),
#        SEEDS_1K/2K/4K/8K (last seed per length, 12/10/8/6), SEED_FIRST (1: a later sweep that
#        continues an earlier one into a new DIR starts past its seeds), DEPTHS ("0.1 0.3 0.5 0.7 0.9"),
#        TAU (0.9,0.95), STRIDE (8,16), PROTECT (probe protections: published,sink+diagonal),
#        METHODS (dense,rr,xattn,oracle), OFFSETS (paper,released), PROBE (1; 0: no mask probes).
#   A lean accuracy sweep (generation runs only, many prompts; docs/llm.md):
#     METHODS=dense,rr OFFSETS=released TAU=0.95 STRIDE=8 PROBE=0 SEED_FIRST=7 SEEDS_1K=40 \
#       SEEDS_2K=40 SEEDS_4K=40 SEEDS_8K=40 scripts/llm_sweep_gpu.sh lean
set -euo pipefail
dir=$1
shift
bin=${ARIADNE_BIN:-build/ariadne}
mkdir -p "$dir"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=1
declare -A seeds=([1024]=${SEEDS_1K:-12} [2048]=${SEEDS_2K:-10} [4096]=${SEEDS_4K:-8} [8192]=${SEEDS_8K:-6})
max=0
for n in "${seeds[@]}"; do ((n > max)) && max=$n; done
jobs=()
for ((s = ${SEED_FIRST:-1}; s <= max; ++s)); do
  for len in 1024 2048 4096 8192; do
    ((s <= seeds[$len])) || continue
    for task in passkey niah; do
      for depth in ${DEPTHS:-0.1 0.3 0.5 0.7 0.9}; do jobs+=("$task $len $s $depth"); done
    done
  done
done
deadline=$(($(date +%s) + ${SWEEP_SECONDS:-1000000}))
# Running jobs are stopped at HARD_SECONDS (their prompt is lost; finished files stay).
hard=$(($(date +%s) + ${HARD_SECONDS:-1000000}))
run_job() {
  local task=$1 len=$2 seed=$3 depth=$4
  local out=$dir/$task-$len-s$seed-d$depth.json
  [ -s "$out" ] && return 0
  (($(date +%s) < deadline)) || return 0
  local left=$((hard - $(date +%s)))
  # The answer's digits are one token each, after a space: 5 (passkey) or 7 (niah), and a spare.
  local new=7
  [ "$task" = niah ] && new=9
  local cmd=llm-probe probe=(--probe-protect "${PROTECT:-published,sink+diagonal}")
  [ "${PROBE:-1}" = 0 ] && cmd=llm probe=()
  timeout "$left" "$bin" "$cmd" --backend cuda --task "$task" --tokens "$len" --seed "$seed" --seeds 1 \
    --depth "$depth" --method "${METHODS:-dense,rr,xattn,oracle}" --offset "${OFFSETS:-paper,released}" \
    --tau "${TAU:-0.9,0.95}" --stride "${STRIDE:-8,16}" "${probe[@]}" \
    --new "$new" --json "${extra[@]}" >"$out.tmp" 2>"$out.err" && mv "$out.tmp" "$out"
}
extra=("$@")
running=0
for j in "${jobs[@]}"; do
  # shellcheck disable=SC2086
  run_job $j &
  if ((++running >= ${JOBS_PARALLEL:-8})); then
    wait -n || true
    running=$((running - 1))
  fi
done
wait
