#!/usr/bin/env bash
# Session 12 call 3: the d128 wgmma kernel's early start (barriers and Q before the CSR walk) and
# next-wave Q prefetch (ARIADNE_WG_START, default on): tests, sanitizers, then A/B in one binary.
set -uo pipefail
B=/tmp/s12; mkdir -p $B; tar xJf .device/s12c/bins.tar.xz -C $B
O=$OUT/r; mkdir -p $O
T=$B/new/ariadne_cuda_tests
timeout 240 $T --gtest_brief=1 --gtest_filter='BlockSparseWgmma.*:*Wgmma*:Cuda/Sweep.*d128*:CudaEstimate.Prefill*:*Llama*' > $O/tests.txt 2>&1; echo "tests rc $?"; grep -E "PASSED|FAILED|Failure" $O/tests.txt | head -20
for tool in memcheck racecheck synccheck; do
  timeout 120 compute-sanitizer --tool $tool $T --gtest_brief=1 --gtest_filter='BlockSparseWgmma.EarlyStartGivesTheSameBits' > $O/san-$tool.txt 2>&1; echo "$tool rc $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $O/san-$tool.txt)"
done
C=llm-n8192-causal,llm-n32768-causal,llm-n32768-blocks0.1,llm-n32768-blocks0.25,llm-n32768-blocks0.5,llm-n131072-blocks0.1
for r in 1 2 3; do
  ARIADNE_WG_START=0 timeout 150 $B/new/bench_attention_cuda bench/cases.json $C > $O/a-off-$r.json 2>/dev/null
  timeout 150 $B/new/bench_attention_cuda bench/cases.json $C > $O/a-on-$r.json 2>/dev/null
done
E="131072 --methods rr --strides 8 --recall-max 0 --scoring mma3"
ARIADNE_WG_START=0 timeout 150 $B/new/bench_estimate_cuda $E > $O/e-off.json 2>/dev/null
timeout 150 $B/new/bench_estimate_cuda $E > $O/e-on.json 2>/dev/null
python3 - $O <<'PY'
import json,sys,statistics as st
o=sys.argv[1]
def ms(f):
    try: return {r['id']:r['ms'] for r in json.load(open(f)) if 'ms' in r}
    except Exception as e: return {}
offs=[ms(f'{o}/a-off-{r}.json') for r in (1,2,3)]; ons=[ms(f'{o}/a-on-{r}.json') for r in (1,2,3)]
for k in offs[0]:
    a=[x[k] for x in offs if k in x]; b=[x[k] for x in ons if k in x]
    print(k,'off',[round(x,4) for x in a],'on',[round(x,4) for x in b],'off/on %.3f'%(st.median(a)/st.median(b)))
for f in ('e-off','e-on'):
    try:
        for r in json.load(open(f'{o}/{f}.json')):
            print(f,{k:(round(v,4) if isinstance(v,float) else v) for k,v in r.items() if k in ('ms_attention','ms_estimate_pooled','ms_total_pooled','ms_dense','ms_sampling','ms_host_setup_pooled')})
    except Exception as e: print(f,e)
PY
cd $OUT && tar cJf r.tar.xz r && rm -rf r
