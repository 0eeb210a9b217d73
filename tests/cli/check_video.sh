#!/usr/bin/env bash
# `ariadne encode --video`: the HF video parity clip through the CLI (grid_thw, padding, output
# against HF's within 1e-5), the labelme street-scene frames as a folder, argument errors that name
# the option or the frame.
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
