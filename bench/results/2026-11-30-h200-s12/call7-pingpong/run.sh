#!/usr/bin/env bash
# Session 12 call 7: consumer ping-pong (ARIADNE_WG_PINGPONG=1) on the d 128 wgmma kernel's short
# block-sparse rows, same binary (4e7cd93), alternated with the default (off at d 128) three times.
set -uo pipefail
mkdir -p /tmp/b && tar xJf .device/s12d/bin.tar.xz -C /tmp/b
O=$OUT/pp; mkdir -p $O
C=llm-n8192-causal,llm-n32768-causal,llm-n32768-blocks0.1,llm-n32768-blocks0.25,llm-n32768-blocks0.5,llm-n131072-blocks0.1
for r in 1 2 3; do
  timeout 150 /tmp/b/bin/bench_attention_cuda bench/cases.json $C > $O/a-def-$r.json 2>/dev/null
  ARIADNE_WG_PINGPONG=1 timeout 150 /tmp/b/bin/bench_attention_cuda bench/cases.json $C > $O/a-pp-$r.json 2>/dev/null
done
python3 - $O <<'PY'
import json,sys,statistics as st
o=sys.argv[1]
def ms(f):
    try: return {r['id']:r['ms'] for r in json.load(open(f)) if 'ms' in r}
    except Exception as e: return {}
A=[ms(f'{o}/a-def-{r}.json') for r in (1,2,3)]; B=[ms(f'{o}/a-pp-{r}.json') for r in (1,2,3)]
for k in A[0]:
    a=[x[k] for x in A if k in x]; b=[x[k] for x in B if k in x]
    print(k,'def',[round(x,4) for x in a],'pp',[round(x,4) for x in b],'def/pp %.3f'%(st.median(a)/st.median(b)))
PY
cd $OUT && tar cJf pp.tar.xz pp && rm -rf pp
