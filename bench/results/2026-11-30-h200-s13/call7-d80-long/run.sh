#!/usr/bin/env bash
# Session 13, call 7: v38's long cases again, old binary first this time (call 6 ran new, off, old in
# that order each round): full N 16384, batch 8 N 4096, the full stack; old / new alternated 3x.
cd "$(dirname "$0")/../.." || exit 1
mkdir -p /tmp/n /tmp/o && tar xJf .device/s13/bin6.tar.xz -C /tmp/n && tar xJf .device/s13/bin.tar.xz -C /tmp/o
F=vit-n16384-b1-full,vit-n4096-b8-full,stack-full-896,vit-n4096-b1-full
for r in 1 2 3; do
  /tmp/o/bin/bench_attention_cuda bench/cases.json $F >$OUT/old$r.json 2>$OUT/old$r.log
  /tmp/n/bin/bench_attention_cuda bench/cases.json $F >$OUT/new$r.json 2>$OUT/new$r.log
done
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv
python3 - <<'PY'
import json, os
O = os.environ["OUT"]
names = ["old1", "new1", "old2", "new2", "old3", "new3"]
runs = {n: {r["id"]: r for r in json.load(open(f"{O}/{n}.json")) if "ms" in r} for n in names}
for cid in runs["new1"]:
    cells = " ".join(f"{n} {runs[n][cid]['ms']:.4f}/{runs[n][cid].get('ms_single', 0):.4f}" for n in names)
    print(f"{cid:20s} {cells}")
PY
