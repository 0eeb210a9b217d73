#!/usr/bin/env bash
# Session 13, call 2: ms_single by a host hold (old = check binaries) against by a spinning kernel
# (new), alternated twice, and the anchors of the same cases.
cd "$(dirname "$0")/../.." || exit 1
mkdir -p /tmp/old /tmp/new
tar xJf .device/s13/bin.tar.xz -C /tmp/old && tar xJf .device/s13/bin2.tar.xz -C /tmp/new
F=vit-n1024-b1-win64,vit-n4096-b1-win64,vit-n16384-b1-win64,vit-n1024-b8-win64,vit-n4096-b1-full,stack-ariadne-896
/tmp/new/bin/ariadne_cuda_tests --gtest_filter='DeviceBufferCuda.*' 2>&1 | tail -3
for r in 1 2; do
  /tmp/old/bin/bench_attention_cuda bench/cases.json $F >$OUT/old$r.json 2>$OUT/old$r.log
  /tmp/new/bin/bench_attention_cuda bench/cases.json $F >$OUT/new$r.json 2>$OUT/new$r.log
done
PYTHONUNBUFFERED=1 timeout 200 python3 bench/anchors.py --out $OUT/anchors.json --only $F >$OUT/anchors.log 2>&1
echo "anchors rc $?"
python3 - <<'PY'
import json, os
O = os.environ["OUT"]
def load(n):
    return {r["id"]: r for r in json.load(open(f"{O}/{n}.json")) if "ms" in r}
runs = {n: load(n) for n in ["old1", "new1", "old2", "new2"]}
anc = {}
try:
    for r in json.load(open(f"{O}/anchors.json")):
        if r.get("ms"):
            anc.setdefault(r["id"], []).append((r["ms"], r["impl"]))
except Exception as e:
    print("anchors:", e)
for cid in runs["new1"]:
    best = min(anc.get(cid, [(float("nan"), "-")]))
    cells = " ".join(f"{n} {runs[n][cid]['ms']:.4f}/{runs[n][cid].get('ms_single', 0):.4f}" for n in runs)
    print(f"{cid:26s} {cells} best {best[0]:.4f} {best[1]}")
PY
