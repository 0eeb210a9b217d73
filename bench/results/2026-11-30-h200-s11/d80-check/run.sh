#!/usr/bin/env bash
# Session 11, call 7: did a73cd8b's block-sparse row bounds slow the dense d80 wgmma kernel (its
# SASS changed throughout)? new5 = the bounds at head dim 128 only (d80/d64 SASS identical to
# a6ff98b), a7 = a73cd8b, old = a6ff98b (s10g); dense d80 and the 32K LLM cases, alternated.
set -uo pipefail
mkdir -p /tmp/g /tmp/o && tar xJf .device/s11g/bins.tar.xz -C /tmp/g && tar xJf .device/s10g/bin.tar.xz -C /tmp/o
R=$OUT/r; mkdir -p $R
C=vit-n4096-b1-full,vit-n16384-b1-full,stack-full-896,vit-n1024-b1-full,llm-n32768
for r in 1 2 3; do for s in new5=/tmp/g/new5 a7=/tmp/g/a7 old=/tmp/o/bin; do
  ${s#*=}/bench_attention_cuda bench/cases.json $C > $R/b-${s%%=*}-$r.json 2>/dev/null; echo "${s%%=*} $r rc $? $SECONDS"
done; done
python3 - $R <<'PY'
import glob, json, statistics, sys
R = sys.argv[1]; med = {}
for n in ("new5", "a7", "old"):
    runs = {}
    for f in sorted(glob.glob(f"{R}/b-{n}-*.json")):
        for rec in json.load(open(f)): runs.setdefault(rec["id"], []).append(rec["ms"])
    for c, v in runs.items(): med[(c, n)] = statistics.median(v)
for c in dict.fromkeys(c for c, _ in med):
    o = med[(c, "old")]
    print(f"{c:28s} " + " ".join(f"{n} {med[(c, n)]:.4f} ({med[(c, n)] / o:.3f})" for n in ("new5", "a7", "old")))
PY
cd $OUT && tar cJf r.tar.xz r && rm -rf r
