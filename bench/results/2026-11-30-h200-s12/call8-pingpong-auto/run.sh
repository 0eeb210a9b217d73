#!/usr/bin/env bash
# Session 12 call 8: d 128 ping-pong on short rows by default (cuda_wgmma_pingpong, blocks_nnz hint):
# tests, sanitizers on the new cases, then default against ARIADNE_WG_PINGPONG=0 (the old d 128 default).
set -uo pipefail
mkdir -p /tmp/b && tar xJf .device/s12e/bin.tar.xz -C /tmp/b
O=$OUT/pp2; mkdir -p $O; T=/tmp/b/bin/ariadne_cuda_tests
timeout 240 $T --gtest_brief=1 --gtest_filter='WgmmaTma.*:BlockSparseWgmma.*:Cuda/Sweep.*d128*:CudaEstimate.Prefill*:*Llama*:*Prefill*' > $O/tests.txt 2>&1; echo "tests rc $?"; grep -E "PASSED|FAILED|Failure" $O/tests.txt | head
timeout 120 compute-sanitizer --tool racecheck $T --gtest_brief=1 --gtest_filter='WgmmaTma.ConsumerPingPongBothWays' > $O/racecheck.txt 2>&1; echo "racecheck rc $?: $(grep 'RACECHECK SUMMARY' $O/racecheck.txt)"
C=llm-n8192-causal,llm-n32768-causal,llm-n32768-blocks0.1,llm-n32768-blocks0.25,llm-n32768-blocks0.5,llm-n131072-blocks0.1
for r in 1 2; do
  ARIADNE_WG_PINGPONG=0 timeout 150 /tmp/b/bin/bench_attention_cuda bench/cases.json $C > $O/a-off-$r.json 2>/dev/null
  timeout 150 /tmp/b/bin/bench_attention_cuda bench/cases.json $C > $O/a-auto-$r.json 2>/dev/null
done
python3 - $O <<'PY'
import json,sys,statistics as st
o=sys.argv[1]
def ms(f):
    try: return {r['id']:(r['ms'],r.get('tflops')) for r in json.load(open(f)) if 'ms' in r}
    except Exception as e: return {}
A=[ms(f'{o}/a-off-{r}.json') for r in (1,2)]; B=[ms(f'{o}/a-auto-{r}.json') for r in (1,2)]
for k in A[0]:
    a=[x[k][0] for x in A if k in x]; b=[x[k][0] for x in B if k in x]; tf=[x[k][1] for x in B if k in x]
    print(k,'off',[round(x,4) for x in a],'auto',[round(x,4) for x in b],'off/auto %.3f'%(st.median(a)/st.median(b)),'auto TF/s',[round(t,1) for t in tf])
PY
cd $OUT && tar cJf pp2.tar.xz pp2 && rm -rf pp2
