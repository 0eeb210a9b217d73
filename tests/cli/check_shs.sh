#!/usr/bin/env bash
# `ariadne shs` on q/k dumps with planted heads (FG-, BG-attending and uniform) over a real VOC
# photo and mask of labelme-examples, in block_row token order; then bad second images (nothing
# written, or the written files named), argument and file errors.
source "$(dirname "$0")/lib.sh"

voc=/usr/share/doc/labelme-examples/examples/instance_segmentation/data_dataset_voc
[ -d "$voc" ] || fail "$voc is missing: install labelme-examples (scripts/setup)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/img" "$tmp/qk/2011_000003"
cp "$voc/JPEGImages/2011_000003.jpg" "$tmp/img/"

# Dumps for a 12x18 grid: patch labels computed here independently (nearest resize of the .npy
# class mask to 168x252, pure patches), q/k [heads, tokens, dim] f32 in block_row order.
python3 - "$voc/SegmentationClass/2011_000003.npy" "$tmp/qk/2011_000003" <<'PY'
import struct, sys
def read_npy(path):
    b = open(path, 'rb').read()
    n = struct.unpack('<H', b[8:10])[0]
    hdr = b[10:10 + n].decode()
    shape = tuple(int(x) for x in hdr.split('(')[1].split(')')[0].split(',') if x.strip())
    data = struct.unpack('<%di' % (shape[0] * shape[1]), b[10 + n:])
    return shape, data
def write_npy(path, shape, values):
    hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }" % ', '.join(map(str, shape))
    hdr += ' ' * (63 - (10 + len(hdr)) % 64) + '\n'
    open(path, 'wb').write(b'\x93NUMPY\x01\x00' + struct.pack('<H', len(hdr)) + hdr.encode() + struct.pack('<%df' % len(values), *values))
(H, W), m = read_npy(sys.argv[1])
gh, gw, P = 12, 18, 14
lab = []
for r in range(gh):
    for c in range(gw):
        ids = [m[((2 * y + 1) * H // (2 * gh * P)) * W + (2 * x + 1) * W // (2 * gw * P)]
               for y in range(r * P, r * P + P) for x in range(c * P, c * P + P)]
        fg = sum(1 for v in ids if v not in (0, 255, -1)); bg = sum(1 for v in ids if v == 0)
        lab.append(1 if fg == P * P else (0 if bg == P * P else -1))
# block_row: 2x2 merge units in raster order, patches of a unit in raster order
perm = [(2 * ur + dr) * gw + 2 * uc + dc for ur in range(gh // 2) for uc in range(gw // 2) for dr in (0, 1) for dc in (0, 1)]
n, heads, dim = gh * gw, 3, 4
for layer in range(2):
    q = [0.0] * (heads * n * dim); k = [0.0] * (heads * n * dim)
    for i in range(n):
        fg = lab[perm[i]] == 1
        for h in (0, 1):
            q[(h * n + i) * dim] = 4.0
        k[(0 * n + i) * dim] = 3.0 if fg else 0.0
        k[(1 * n + i) * dim] = 0.0 if fg else 3.0
    write_npy('%s/q_%d.npy' % (sys.argv[2], layer), (heads, n, dim), q)
    write_npy('%s/k_%d.npy' % (sys.argv[2], layer), (heads, n, dim), k)
write_npy('%s/sink_1.npy' % sys.argv[2], (heads,), [1.0, 1.0, 1.0])
PY

"$ARIADNE" shs --json --image "$tmp/img" --masks "$voc/SegmentationClass" --qk "$tmp/qk" --grid 12x18 \
  --order block_row --schedule "RF" --window 8 --out "$tmp/out" | python3 -c '
import json, sys
d = json.load(sys.stdin)
ph, pa = d["per_head"], d["per_head_auroc"]
assert d["layers"] == 2 and d["heads"] == 3, d
for l in range(2):
    assert ph[l][0] > 0.99 and pa[l][0] > 0.99, ph   # attends to FG: FG specialist
    assert ph[l][1] > 0.99 and pa[l][1] < 0.01, ph   # attends to BG: BG specialist
assert abs(ph[0][2] - 0.5) < 0.05, ph   # q = 0 under a window: near 1/2 (edge tokens receive less)
assert abs(ph[1][2] - 0.5) < 1e-9, ph   # q = 0 under full attention (+ sink): every key ties
assert abs(d["fg_dominant_share"] - 1/3) < 1e-9, d["fg_dominant_share"]
assert "sink_allocation" in d and d["source"]["random_weights"] is False, d.keys()
assert d["images"][0]["fg_patches"] > 0 and d["images"][0]["bg_patches"] > 0
' || fail "planted q/k dumps do not give SHS 1, 1, 0.5 with the right signs"
[ -s "$tmp/out/summary.json" ] && [ -s "$tmp/out/2011_000003/received.npy" ] && [ -s "$tmp/out/2011_000003/layer01.png" ] \
  || fail "--out did not write summary.json, received.npy and heatmaps"
# received.npy: [layers, heads, patches] f32 = 10-byte preamble + header + 2*3*216*4 bytes.
python3 -c '
import struct, sys
b = open(sys.argv[1], "rb").read(); n = struct.unpack("<H", b[8:10])[0]
assert "(2, 3, 216)" in b[10:10 + n].decode() and len(b) == 10 + n + 2 * 3 * 216 * 4
' "$tmp/out/2011_000003/received.npy" || fail "received.npy has the wrong shape"

# The same dumps with COCO polygons as masks (the same objects, drawn by our rasterizer).
coco=/usr/share/doc/labelme-examples/examples/instance_segmentation/data_dataset_coco/annotations.json
"$ARIADNE" shs --json --image "$tmp/img" --coco "$coco" --qk "$tmp/qk" --grid 12x18 --order block_row | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["per_head"][0][0] > 0.9 and d["per_head_auroc"][0][1] < 0.1, d["per_head"]
assert d["masks"]["coco"].endswith("annotations.json") and "sink_allocation" in d
' || fail "COCO masks do not reproduce the planted specialists"

# Every image is checked before any output is written: a corrupt second image, a second image
# without a mask, or two images with one stem fail with nothing in --out.
for bad in corrupt nomask samestem; do
  rm -rf "$tmp/img2" "$tmp/out2" && mkdir -p "$tmp/img2"
  cp "$voc/JPEGImages/2011_000003.jpg" "$tmp/img2/"
  case $bad in
    corrupt) printf 'not a JPEG' >"$tmp/img2/zz_bad.jpg"; want="zz_bad.jpg" ;;
    nomask) cp "$voc/JPEGImages/2011_000003.jpg" "$tmp/img2/zz_nomask.jpg"; want="no mask for image 'zz_nomask'" ;;
    samestem) cp "$tmp/img2/2011_000003.jpg" "$tmp/img2/2011_000003.jpeg"; want="have the same stem '2011_000003'" ;;
  esac
  rc=0
  msg=$("$ARIADNE" shs --image "$tmp/img2" --masks "$voc/SegmentationClass" --schedule full --config small --layers 1 \
    --out "$tmp/out2" 2>&1 >/dev/null) || rc=$?
  [ "$rc" -eq 1 ] || fail "shs with a bad second image ($bad) exited $rc, expected 1"
  grep -qF "$want" <<<"$msg" || fail "shs with a bad second image ($bad): the error does not say '$want': $msg"
  [ -z "$(find "$tmp/out2" -type f 2>/dev/null)" ] || fail "shs with a bad second image ($bad) wrote $(find "$tmp/out2" -type f)"
done
# A checkpoint whose depth is not the --config preset's: the schedule is checked against the file's
# own 4 layers (the parity tower of tests/data/vit), before anything is loaded.
weights="$tmp/small.safetensors"
with_small_vision_config "$(cd "$(dirname "$0")/../data/vit" && pwd)/weights.safetensors" "$weights"
rm -rf "$tmp/img2" && mkdir -p "$tmp/img2" && cp "$voc/JPEGImages/2011_000003.jpg" "$tmp/img2/"
"$ARIADNE" shs --json --image "$tmp/img2" --masks "$voc/SegmentationClass" --weights "$weights" --schedule R+R+C+F \
  --window 3 --max-pixels 50000 | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["layers"] == 4 and d["source"]["random_weights"] is False and len(d["per_layer"]) == 4, d
' || fail "shs did not take a schedule of the checkpoint's depth"
msg=$("$ARIADNE" shs --image "$tmp/img2" --masks "$voc/SegmentationClass" --weights "$weights" --schedule ariadne \
  2>&1 >/dev/null) && fail "shs took the 32-layer ariadne schedule for a 4-layer checkpoint"
grep -q -- "--schedule.*32 layers but the encoder has 4" <<<"$msg" || fail "the length error is not the checkpoint's: $msg"
msg=$("$ARIADNE" shs --image "$tmp/img2" --masks "$voc/SegmentationClass" --weights "$tmp/img2/2011_000003.jpg" \
  --schedule full 2>&1 >/dev/null) && fail "shs took an image as weights"
grep -q -- "--weights.*2011_000003.jpg" <<<"$msg" || fail "the bad checkpoint's error does not name it: $msg"
# A failure after the first image's outputs (a truncated dump of the second image, found when its
# layer is read) names the files already written.
rm -rf "$tmp/img2" "$tmp/out2" "$tmp/masks2" "$tmp/qk2" && mkdir -p "$tmp/img2" "$tmp/masks2" "$tmp/qk2"
for stem in 2011_000003 zz_copy; do
  cp "$voc/JPEGImages/2011_000003.jpg" "$tmp/img2/$stem.jpg"
  cp "$voc/SegmentationClass/2011_000003.npy" "$tmp/masks2/$stem.npy"
  cp -r "$tmp/qk/2011_000003" "$tmp/qk2/$stem"
done
head -c 200 "$tmp/qk/2011_000003/k_1.npy" >"$tmp/qk2/zz_copy/k_1.npy"
msg=$("$ARIADNE" shs --image "$tmp/img2" --masks "$tmp/masks2" --qk "$tmp/qk2" --grid 12x18 --order block_row \
  --out "$tmp/out2" 2>&1 >/dev/null) && fail "shs with a truncated second dump succeeded"
grep -q "zz_copy/k_1.npy: data size" <<<"$msg" || fail "the truncated dump's error does not name it: $msg"
grep -q "had already written .* $tmp/out2/2011_000003/received.npy" <<<"$msg" \
  || fail "the error does not name the outputs already written: $msg"

expect_error "no mask source" shs --image "$tmp/img" --qk "$tmp/qk" --grid 12x18 --order block_row
expect_error "grid mismatch" shs --image "$tmp/img" --masks "$voc/SegmentationClass" --qk "$tmp/qk" --grid 12x16 --order block_row
expect_error "schedule order mismatch" shs --image "$tmp/img" --masks "$voc/SegmentationClass" --qk "$tmp/qk" \
  --grid 12x18 --order block_row --schedule CC
head -c 200 "$tmp/qk/2011_000003/k_1.npy" > "$tmp/k.npy" && mv "$tmp/k.npy" "$tmp/qk/2011_000003/k_1.npy"
expect_error "truncated dump" shs --image "$tmp/img" --masks "$voc/SegmentationClass" --qk "$tmp/qk" --grid 12x18 --order block_row
msg=$("$ARIADNE" shs --image "$tmp/img" --masks "$voc/SegmentationClass" --qk "$tmp/qk" --grid 12x18 \
  --order block_row 2>&1 || true)
grep -q "k_1.npy: data size" <<<"$msg" || fail "a truncated dump's error does not name the file and the field: $msg"
expect_error "purity out of range" shs --image "$tmp/img" --masks "$voc/SegmentationClass" --schedule full --layers 1 --purity 0.3
