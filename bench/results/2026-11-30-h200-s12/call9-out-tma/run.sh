#!/usr/bin/env bash
# Session 12 call 9: the d 128 wgmma kernel's O through the Q buffer and the copy engine
# (ARIADNE_WG_OUT_TMA, default on): tests, sanitizers on the new test, then A/B against 8fece78.
set -uo pipefail
mkdir -p /tmp/n /tmp/o && tar xJf .device/s12f/bin.tar.xz -C /tmp/n && tar xJf .device/s12e/bin.tar.xz -C /tmp/o
O=$OUT/ot; mkdir -p $O; T=/tmp/n/bin/ariadne_cuda_tests
timeout 240 $T --gtest_brief=1 --gtest_filter='WgmmaTma.*:BlockSparseWgmma.*:Cuda/Sweep.*d128*:CudaEstimate.Prefill*:*Llama*:*Prefill*:*Wgmma*' > $O/tests.txt 2>&1; echo "tests rc $?"; grep -E "PASSED|FAILED|Failure" $O/tests.txt | head
for tool in memcheck racecheck; do
  timeout 150 compute-sanitizer --tool $tool $T --gtest_brief=1 --gtest_filter='WgmmaTma.OutputThroughTheCopyEngineBothWays' > $O/san-$tool.txt 2>&1; echo "$tool rc $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $O/san-$tool.txt)"
done
C=llm-n8192-causal,llm-n32768-causal,llm-n32768-blocks0.1,llm-n32768-blocks0.25,llm-n32768-blocks0.5,llm-n131072-blocks0.1
for r in 1 2; do
  timeout 150 /tmp/o/bin/bench_attention_cuda bench/cases.json $C > $O/a-old-$r.json 2>/dev/null
  timeout 150 /tmp/n/bin/bench_attention_cuda bench/cases.json $C > $O/a-new-$r.json 2>/dev/null
done
ARIADNE_WG_OUT_TMA=0 timeout 150 /tmp/n/bin/bench_attention_cuda bench/cases.json $C > $O/a-newoff-1.json 2>/dev/null
python3 - $O <<'PY'
import json,sys,statistics as st
o=sys.argv[1]
def ms(f):
    try: return {r['id']:(r['ms'],r.get('tflops')) for r in json.load(open(f)) if 'ms' in r}
    except Exception as e: return {}
A=[ms(f'{o}/a-old-{r}.json') for r in (1,2)]; B=[ms(f'{o}/a-new-{r}.json') for r in (1,2)]; C=ms(f'{o}/a-newoff-1.json')
for k in A[0]:
    a=[x[k][0] for x in A if k in x]; b=[x[k][0] for x in B if k in x]; tf=[x[k][1] for x in B if k in x]
    print(k,'old',[round(x,4) for x in a],'new',[round(x,4) for x in b],'off',round(C.get(k,(0,0))[0],4),'old/new %.3f'%(st.median(a)/st.median(b)),'new TF/s',[round(t,1) for t in tf])
PY
cd $OUT && tar cJf ot.tar.xz ot && rm -rf ot
