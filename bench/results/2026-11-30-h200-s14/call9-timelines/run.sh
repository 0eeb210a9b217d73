#!/bin/bash
# session 14 call 9: timelines (diagnostic build, -DARIADNE_BANDWG_TIMELINE=ON) of the chunk kernel
# (v43) and the window kernel at N 4096 batch 1, storage order.
cd "$(dirname "$0")/../.." && mkdir -p /tmp/tl && tar xJf .device/s14/tl.tar.xz -C /tmp/tl
mkdir -p $OUT/tl
for c in vit-n4096-b1-chunk64 vit-n4096-b1-win64; do
  ARIADNE_BENCH_PROFILE=1 ARIADNE_BENCH_TIMELINE=$OUT/tl/tl /tmp/tl/tl/bench_attention_cuda bench/cases.json $c > $OUT/tl/$c.json 2>&1
done
ls $OUT/tl
for f in $OUT/tl/tl.*storage*.txt $OUT/tl/tl.*.txt; do [[ -f $f ]] && echo "== $f" && python3 scripts/bandwg-timeline "$f" | head -40; done 2>&1 | head -120
