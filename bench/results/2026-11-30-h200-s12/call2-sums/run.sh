#!/usr/bin/env bash
# Session 12 call 2: tests of the vector key-stride sums, the staged score_ptr and the L2 policies
# (default on), memcheck of the sums test, then the estimate bench A/B against main (s12a old).
set -uo pipefail
B=/tmp/s12; mkdir -p $B; tar xJf .device/s12a/bins.tar.xz -C $B old; tar xJf .device/s12b/bins.tar.xz -C $B
O=$OUT/r; mkdir -p $O
timeout 200 $B/new/ariadne_cuda_tests --gtest_brief=1 --gtest_filter='CudaEstimate.*:CudaKeyStrideSums.*:BlockSparseWgmma.*:Cuda/Sweep.*d128*:*Prefill*' > $O/tests.txt 2>&1; echo "tests rc $?"; grep -E "PASSED|FAILED|Failure" $O/tests.txt | head -20
timeout 120 compute-sanitizer --tool memcheck $B/new/ariadne_cuda_tests --gtest_brief=1 --gtest_filter='CudaKeyStrideSums.*' > $O/memcheck.txt 2>&1; echo "memcheck rc $?"; tail -3 $O/memcheck.txt
E="--methods rr --strides 8 --recall-max 0 --scoring mma3"
for r in 1 2; do
  timeout 150 $B/old/bench_estimate_cuda 32768 131072 $E > $O/e-old-$r.json 2>/dev/null
  timeout 150 $B/new/bench_estimate_cuda 32768 131072 $E > $O/e-new-$r.json 2>/dev/null
done
ARIADNE_WG_L2HINT=0 timeout 150 $B/new/bench_estimate_cuda 131072 $E > $O/e-nohint.json 2>/dev/null
python3 - $O <<'PY'
import json,sys
o=sys.argv[1]
keys=['ms_sampling','ms_scoring','ms_selection','ms_host_setup','ms_host_setup_pooled','ms_estimate','ms_estimate_pooled','ms_attention','ms_total','ms_total_pooled','ms_dense','density']
for f in ['e-old-1','e-new-1','e-old-2','e-new-2','e-nohint']:
    try:
        for r in json.load(open(f'{o}/{f}.json')):
            print(f, r['id'], ' '.join(f"{k[3:]}={r[k]:.4f}" for k in keys if k in r))
    except Exception as e: print(f, e)
PY
cd $OUT && tar cJf r.tar.xz r && rm -rf r
