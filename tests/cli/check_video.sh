#!/usr/bin/env bash
# `ariadne encode --video`: the HF video parity clip through the CLI (grid_thw, padding, output
# against HF's within 1e-5), the labelme street-scene frames as a folder, argument errors that name
# the option or the frame; `ariadne shs --video` over the labelme frames and their masks.
source "$(dirname "$0")/lib.sh"
data="$(cd "$(dirname "$0")/../data/vit" && pwd)"
labelme=/usr/share/doc/labelme-examples/examples/video_annotation/data_annotated
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

frames="$data/video_frame_0.png,$data/video_frame_1.png,$data/video_frame_2.png"
"$ARIADNE" encode --json --video "$frames" --weights "$data/weights.safetensors" --config small \
  --schedule chunk --backend reference --save-output "$tmp/out.safetensors" \
  --save-pixels "$tmp/pixels.safetensors" | python3 -c '
import json, sys
d = json.load(sys.stdin)
v = d["video"]
assert v["grid_thw"] == [2, 4, 6] and v["frames_padded"] == 4 and len(v["frames"]) == 3, v
assert v["size"] == [56, 84] and v["resized"] == [56, 84], v
assert d["tokens"] == 48 and d["output_shape"] == [12, 32], d
assert "images" not in d, d
' || fail "encode --video of the parity clip printed wrong figures"

# The saved output against HF's (relative L2 <= 1e-5), and the saved grid_thw: read with the
# standard library only (safetensors: 8-byte header length, JSON header, little-endian data).
python3 - "$tmp/out.safetensors" "$data/video_reference.safetensors" "$tmp/pixels.safetensors" <<'PY' \
  || fail "encode --video output differs from HF's"
import json, math, struct, sys
def read(path, name):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        a, b = head[name]["data_offsets"]
        assert head[name]["dtype"] == "F32", head[name]
        f.seek(8 + n + a)
        raw = f.read(b - a)
    return struct.unpack("<%df" % (len(raw) // 4), raw)
ours, ref = read(sys.argv[1], "output"), read(sys.argv[2], "output")
assert len(ours) == len(ref) == 12 * 32, (len(ours), len(ref))
rel = math.sqrt(sum((a - b) ** 2 for a, b in zip(ours, ref)) / sum(b * b for b in ref))
assert rel <= 1e-5, rel
assert read(sys.argv[3], "grid_thw") == (2.0, 4.0, 6.0), read(sys.argv[3], "grid_thw")
PY

# The labelme clip as a folder: five 1000x563 frames in name order, padded to six.
if [ -d "$labelme" ]; then
  "$ARIADNE" encode --json --video "$labelme" --config small --schedule R+C+R+F --max-pixels 9408 | python3 -c '
import json, sys
d = json.load(sys.stdin)
v = d["video"]
assert [f.rsplit("/", 1)[1] for f in v["frames"]] == ["0000010%d.jpg" % i for i in range(5)], v["frames"]
assert v["frames_padded"] == 6 and v["grid_thw"] == [3, 4, 8] and v["size"] == [563, 1000], v
assert d["tokens"] == 96 and d["output_shape"] == [24, 32], d
' || fail "encode --video of the labelme folder printed wrong figures"
  "$ARIADNE" encode --video "$labelme" --config small --schedule full --max-pixels 9408 \
    | grep -q "video: 5 frames (6 after padding" || fail "the text output does not describe the clip"
fi

# SHS over frames: the labelme street-scene clip with its masks, encoded as video. Five frames make
# three temporal patches (the last repeats frame 104); each is scored against its frames' masks.
voc=/usr/share/doc/labelme-examples/examples/video_annotation/data_dataset_voc
if [ -d "$voc" ]; then
  "$ARIADNE" shs --video --image "$voc/JPEGImages" --masks "$voc/SegmentationClassPNG" --config small \
    --schedule R+C+QF --max-pixels 50000 --json yes --out "$tmp/shs" 2>/dev/null | python3 -c '
import json, math, sys
d = json.load(sys.stdin)
dirs = [i["dir"] for i in d["images"]]
assert dirs == ["00000100+00000101", "00000102+00000103", "00000104"], dirs
assert d["images_scored"] == 3 and 0 <= d["shs_index"] <= 1 and len(d["per_layer"]) == 4, d
assert all(i["fg_patches"] > 0 and i["bg_patches"] > 0 for i in d["images"]), d["images"]
' || fail "shs --video on the labelme clip printed wrong figures"
  [ -f "$tmp/shs/00000102+00000103/received.npy" ] || fail "shs --video wrote no received.npy per temporal patch"
  msg=$("$ARIADNE" shs --video --image "$voc/JPEGImages/00000100.jpg" --masks "$voc/SegmentationClassPNG" \
    --config small --schedule full 2>&1 >/dev/null) && fail "shs --video with one frame succeeded"
  grep -q -- "--video" <<<"$msg" || fail "the one-frame error does not name --video: $msg"
fi

expect_error "image and video" encode --image "$data/image_0.png" --video "$frames" --config small --schedule full
expect_error "neither image nor video" encode --config small --schedule full
mkdir "$tmp/empty"
msg=$("$ARIADNE" encode --video "$tmp/empty" --config small --schedule full 2>&1 >/dev/null) \
  && fail "encode --video of an empty folder succeeded"
grep -q -- "--video" <<<"$msg" || fail "the empty-folder error does not name --video: $msg"
# Frames of two sizes (90x61, 57x50) are not one clip: the error names the option and the frame.
msg=$("$ARIADNE" encode --video "$data/image_0.png,$data/image_1.png" --config small --schedule full 2>&1 >/dev/null) \
  && fail "encode --video with frames of two sizes succeeded"
grep -q -- "--video.*image_1.png is 57x50" <<<"$msg" || fail "the frame-size error does not name the frame: $msg"
expect_error "folder in a frame list" encode --video "$data/image_0.png,$tmp/empty" --config small --schedule full
