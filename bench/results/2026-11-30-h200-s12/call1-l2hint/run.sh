#!/usr/bin/env bash
# Session 12 call 1: L2 policies on the d128 wgmma TMA copies (ARIADNE_WG_L2HINT) A/B against the
# old binary, the estimate's host split at 128K, then profiles of the selection and sums kernels.
set -uo pipefail
B=/tmp/s12a; mkdir -p $B; tar xJf .device/s12a/bins.tar.xz -C $B
O=$OUT/r; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv > $O/smi.txt
ARIADNE_WG_L2HINT=1 timeout 120 $B/new/ariadne_cuda_tests --gtest_brief=1 --gtest_filter='BlockSparseWgmma.*:Cuda*Sweep*d128*:CudaEstimate.PrefillMatches*' > $O/tests-hint.txt 2>&1; echo "tests rc $?"; tail -3 $O/tests-hint.txt
C=llm-n8192-causal,llm-n32768-causal,llm-n32768-blocks0.1,llm-n32768-blocks0.25,llm-n32768-blocks0.5,llm-n131072-blocks0.25
for r in 1 2; do
  timeout 150 $B/old/bench_attention_cuda bench/cases.json $C > $O/a-old-$r.json 2>/dev/null
  ARIADNE_WG_L2HINT=1 timeout 150 $B/new/bench_attention_cuda bench/cases.json $C > $O/a-hint-$r.json 2>/dev/null
done
E="131072 --methods rr --strides 8 --recall-max 0 --scoring mma3"
timeout 150 $B/new/bench_estimate_cuda $E > $O/e-off.json 2>$O/e-off.err
ARIADNE_WG_L2HINT=1 timeout 150 $B/new/bench_estimate_cuda $E > $O/e-on.json 2>$O/e-on.err
python3 - $O <<'PY'
import json,sys,glob
o=sys.argv[1]
def ms(f):
    try: return {r['id']:r['ms'] for r in json.load(open(f)) if 'ms' in r}
    except Exception as e: return {}
for r in (1,2):
    a=ms(f'{o}/a-old-{r}.json'); b=ms(f'{o}/a-hint-{r}.json')
    for k in a:
        if k in b: print(r,k,round(a[k],4),round(b[k],4),'old/hint %.3f'%(a[k]/b[k]))
for f in ('e-off','e-on'):
    try:
        for r in json.load(open(f'{o}/{f}.json')):
            print(f,{k:(round(v,4) if isinstance(v,float) else v) for k,v in r.items() if k.startswith('ms_') or k=='density'})
    except Exception as e: print(f,e)
PY
ARIADNE_PREBUILT=$B/new OUT=$O timeout 200 scripts/ncu-prefill-stages select sums > $O/ncu.txt 2>&1; echo "ncu rc $?"
cd $OUT && tar cJf r.tar.xz r && rm -rf r
