#!/usr/bin/env bash
# Session 13, call 9: the anchors of the window cells and stacks timed both ways (single calls, and
# graph replays with --graph), and ariadne's bench (main's kernels, the committed bench) in the same
# call: graph against graph beside single against single.
cd "$(dirname "$0")/../.." || exit 1
mkdir -p /tmp/b && tar xJf .device/s13/bin2.tar.xz -C /tmp/b
F=vit-n1024-b1-win64,vit-n4096-b1-win64,vit-n16384-b1-win64,vit-n1024-b8-win64,vit-n4096-b8-win64,stack-full-896,stack-ariadne-896
/tmp/b/bin/bench_attention_cuda bench/cases.json $F >$OUT/ours.json 2>$OUT/ours.log
python3 -c "import json,sys; p=sys.argv[1]; r=json.load(open(p)); [x.update(impl='ariadne') for x in r]; json.dump(r,open(p,'w'))" $OUT/ours.json
PYTHONUNBUFFERED=1 timeout 400 python3 bench/anchors.py --graph --out $OUT/anchors.json --only $F --budget-s 380 >$OUT/anchors.log 2>&1
echo "anchors rc $?"
grep -i "capture failed" $OUT/anchors.json | head -3
python3 scripts/bench-report --anchors $OUT/anchors.json --ours $OUT/ours.json --print >$OUT/table.md
sed -n '/graph replays (`ms`/,$p' $OUT/table.md
