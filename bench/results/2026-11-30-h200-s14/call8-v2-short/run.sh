#!/bin/bash
# session 14 call 8: variant 2 (two consumers) against variant 3 on the launch-bound window cells
# (runs of two tiles at N 1024 batch 1 leave variant 3's third consumer idle), same binary (ab7).
cd "$(dirname "$0")/../.." && mkdir -p /tmp/ab && tar xJf .device/s14/ab7.tar.xz -C /tmp/ab
B=/tmp/ab/ab7/n; mkdir -p $OUT/ab8
C=vit-n1024-b1-win64,vit-n1024-b1-win64-sink,vit-n4096-b1-win64
for r in 1 2 3 4; do
  for v in 3 2; do ARIADNE_BANDWG_V=$v $B/bench_attention_cuda bench/cases.json $C > $OUT/ab8/b-v$v-$r.json 2>/dev/null; done
done
python3 - $OUT/ab8 <<'PY'
import glob, json, statistics, sys
d = {}
for p in glob.glob(sys.argv[1] + "/b-*.json"):
    v = p.split("/b-")[1].split("-")[0]
    for r in json.load(open(p)):
        d.setdefault((r["id"], v), []).append((r["ms"], r.get("ms_single") or 0))
for (cid, v), xs in sorted(d.items()):
    print(cid, v, "graph %.4f single %.4f" % (statistics.median(x[0] for x in xs), statistics.median(x[1] for x in xs)))
PY
