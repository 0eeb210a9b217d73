#!/usr/bin/env bash
# `ariadne encode`: the HF parity pair through the CLI (tokens, grids, shape, weights not random),
# random weights reported as such, the output files (none written when an input is bad), argument
# errors.
source "$(dirname "$0")/lib.sh"
data="$(cd "$(dirname "$0")/../data/vit" && pwd)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$ARIADNE" encode --json --image "$data/image_0.png,$data/image_1.png" --weights "$data/weights.safetensors" \
  --config small --schedule chunk --backend reference --save-output "$tmp/out.safetensors" | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["tokens"] == 40, d["tokens"]
assert d["output_shape"] == [10, 32], d["output_shape"]
assert [i["grid"] for i in d["images"]] == [[4, 6], [4, 4]], d["images"]
assert [i["resized"] for i in d["images"]] == [[56, 84], [56, 56]], d["images"]
assert d["weights"]["random"] is False and d["weights"]["prefix"] == "model.visual.", d["weights"]
assert d["layers"] == "WFWF" and d["attention_backend"] == "reference", d
assert len(d["checksum"]["fnv1a"]) == 16 and d["checksum"]["mean_abs"] > 0, d["checksum"]
for k in ("patch_embed", "attention", "mlp", "merger", "encode_total"):
    assert d["times_ms"][k] >= 0, k
' || fail "encode of the parity pair printed wrong figures"
[ -s "$tmp/out.safetensors" ] || fail "--save-output wrote nothing"

"$ARIADNE" encode --json --image "$data/image_0.png" --config small --schedule swa1d+sink --seed 3 | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["weights"]["random"] is True and d["weights"]["seed"] == 3, d["weights"]
assert d["weights"]["sinks"].startswith("initialized"), d["weights"]
assert d["layers"] == "R+FR+F", d["layers"]
' || fail "random weights are not reported as random"

"$ARIADNE" encode --image "$data/image_0.png" --config small --schedule full | grep -q "RANDOM" \
  || fail "the text output does not say the weights are random"

# Several schedules in one call: one JSON object per run, one output file per run, the pixel rows.
"$ARIADNE" encode --json --image "$data/image_0.png,$data/image_1.png" --weights "$data/weights.safetensors" \
  --config small --schedule chunk,full --backend reference --save-output "$tmp/run_" \
  --save-pixels "$tmp/pixels.safetensors" | python3 -c '
import json, sys
runs = json.load(sys.stdin)["runs"]
assert [r["schedule"] for r in runs] == ["chunk", "full"], runs
assert runs[0]["checksum"]["fnv1a"] != runs[1]["checksum"]["fnv1a"], "chunk and full gave the same output"
' || fail "encode with two schedules printed wrong runs"
[ -s "$tmp/run_chunk_fused.safetensors" ] && [ -s "$tmp/run_full_fused.safetensors" ] \
  || fail "--save-output with two schedules did not write one file per run"
[ -s "$tmp/pixels.safetensors" ] || fail "--save-pixels wrote nothing"

expect_error "missing image" encode --schedule full --config small
expect_error "bad schedule" encode --image "$data/image_0.png" --config small --schedule nonsense
expect_error "schedule length" encode --image "$data/image_0.png" --config small --schedule ariadne
expect_error "bad cuda order" encode --image "$data/image_0.png" --config small --schedule full --cuda-order sideways
# Without a usable GPU (CI) --backend cuda fails with a message (no CUDA in the build, or no device).
if ! nvidia-smi -L >/dev/null 2>&1; then
  expect_error "cuda path without a GPU" encode --image "$data/image_0.png" --config small --schedule full --backend cuda
fi
# A bad second image fails before the weights are loaded and before any output is written.
printf 'not an image' >"$tmp/bad.png"
rm -f "$tmp/pixels.safetensors" "$tmp/out.safetensors"
msg=$("$ARIADNE" encode --image "$data/image_0.png,$tmp/bad.png" --config small --schedule full \
  --save-pixels "$tmp/pixels.safetensors" --save-output "$tmp/out.safetensors" 2>&1 >/dev/null) \
  && fail "encode with a bad second image succeeded"
grep -q "bad.png" <<<"$msg" || fail "the bad image's error does not name it: $msg"
[ ! -e "$tmp/pixels.safetensors" ] && [ ! -e "$tmp/out.safetensors" ] || fail "encode with a bad second image wrote outputs"
# Every run's output file is checked up front: a directory in the way of the second run's file.
mkdir -p "$tmp/blocked_full_fused.safetensors"
msg=$("$ARIADNE" encode --image "$data/image_0.png" --config small --schedule chunk,full --save-output "$tmp/blocked_" \
  2>&1 >/dev/null) && fail "encode with a folder in the way of an output succeeded"
grep -q -- "--save-output.*blocked_full_fused.safetensors" <<<"$msg" || fail "the error does not name the output: $msg"

expect_error "not an image" encode --image "$data/weights.safetensors" --config small --schedule full
expect_error "not a checkpoint" encode --image "$data/image_0.png" --weights "$data/image_0.png" --schedule full
# A checkpoint's own depth decides the schedule's length, not the --config preset's (32 layers
# for the default qwen2.5-vl): the 4-layer parity tower takes a 4-layer schedule as it is.
with_small_vision_config "$data/weights.safetensors" "$tmp/small.safetensors"
"$ARIADNE" encode --json --image "$data/image_0.png" --weights "$tmp/small.safetensors" --schedule R+R+C+F \
  --window 3 --backend reference | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["layers"] == "R+R+C+F" and d["weights"]["random"] is False, d
' || fail "encode did not take a schedule of the checkpoint's depth"
msg=$("$ARIADNE" encode --image "$data/image_0.png" --weights "$tmp/small.safetensors" --schedule RRRRRRRR \
  2>&1 >/dev/null) && fail "encode took an 8-layer schedule for a 4-layer checkpoint"
grep -q -- "--schedule.*8 layers but the encoder has 4" <<<"$msg" || fail "the length error is not the checkpoint's: $msg"
