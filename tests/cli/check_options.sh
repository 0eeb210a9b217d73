#!/usr/bin/env bash
# The declared option tables (apps/ariadne/cli_options.hpp): --help of every command, unknown
# options, missing values, strict numbers and booleans, range-checked narrowing, bounded sizes,
# checks before any work, and --json errors as one JSON object on stdout.
source "$(dirname "$0")/lib.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
data="$(cd "$(dirname "$0")/../data/vit" && pwd)"

# expect_message "what" "text" args...: exit 1 and the error names `text` (a fixed string).
expect_message() {
  local what=$1 text=$2
  shift 2
  local err rc=0
  err=$("$ARIADNE" "$@" 2>&1 >/dev/null) || rc=$?
  [ "$rc" -eq 1 ] || fail "$what: 'ariadne $*' exited $rc, expected 1 (stderr: $err)"
  grep -qF -- "$text" <<<"$err" || fail "$what: 'ariadne $*' does not say '$text' (got: $err)"
}

# ---- help ----
"$ARIADNE" --help >"$tmp/help" || fail "ariadne --help exited non-zero"
"$ARIADNE" help >"$tmp/help2" || fail "ariadne help exited non-zero"
cmp -s "$tmp/help" "$tmp/help2" || fail "ariadne help and ariadne --help differ"
commands=$(sed -n 's/^  \([a-z][a-z-]*\)  .*/\1/p' "$tmp/help")
for c in attn decode-bench demo encode flops llm llm-probe orders prefill rf schedule shs; do
  grep -qx "$c" <<<"$commands" || fail "ariadne --help does not list '$c' (got: $commands)"
done
# Each command's --help exits 0, prints its usage and lists every option it declares (a sample
# of each command's own options, and --json everywhere).
declare -A sample=(
  [attn]="--tokens --heads --kv-heads --dim --pattern --sink --backend --repeat --check"
  [decode-bench]="--context --batch --heads --kv-heads --head-dim --dtype --page-size --summary-stride --decode --decode-tau --repeat --threads"
  [demo]="--out --quick --part"
  [encode]="--image --weights --schedule --backend --config --sink --threads --save-output --cuda-order"
  [flops]="--side --schedule --window --heads --head-dim --tile"
  [llm]="--gguf --task --tokens --depth --seeds --method --tau --stride --offset --protect --new --prompt --threads --decode --decode-tau --page-size --batch --decode-compare --decode-graph"
  [llm-probe]="--probe-tau --probe-stride --probe-protect --probe-outputs --probe-tau-sweep --compare --per-layer --dump --qk --layer --repeat"
  [orders]="--grid --order --merge --qwen-window"
  [prefill]="--tokens --heads --kv-heads --method --tau --tau-sweep --protect --synthetic --metrics --threads"
  [rf]="--grid --window --schedule --merge --qwen-window --start"
  [schedule]="--preset --spec --window"
  [shs]="--image --masks --coco --fg-id --bg-id --ignore-id --cell --out --qk --layers --sink --threads"
)
for c in $commands; do
  out=$("$ARIADNE" "$c" --help) || fail "ariadne $c --help exited non-zero"
  grep -q "^usage: ariadne $c " <<<"$out" || fail "ariadne $c --help prints no usage line"
  for o in --json ${sample[$c]:-}; do
    grep -qE -- "^  $o( |\$)" <<<"$out" || fail "ariadne $c --help does not list $o"
  done
  "$ARIADNE" help "$c" | cmp -s - <(echo "$out") || fail "ariadne help $c differs from ariadne $c --help"
done
"$ARIADNE" attn --help | grep -F -- "--tokens INT" | grep -qF "default 1024" || fail "attn --help lacks the default of --tokens"
"$ARIADNE" prefill --help | grep -F -- "--tau REAL" | grep -qF "(0, 1]" || fail "prefill --help lacks the range of --tau"

# ---- unknown options, missing values ----
expect_message "unknown option" "unknown option --tokenz for 'attn'; did you mean --tokens?" attn --tokenz 5
expect_message "unknown option elsewhere" "unknown option --sidez for 'flops'" flops --sidez 448
rc=0
err=$("$ARIADNE" atn --tokens 4 2>&1 >/dev/null) || rc=$?
[ "$rc" -eq 2 ] && grep -qF "unknown command 'atn'; did you mean 'attn'?" <<<"$err" \
  || fail "unknown command: exit $rc, $err"
expect_message "missing value" "option --tokens needs a value" attn --tokens
expect_message "missing value before an option" "option --tokens needs a value" attn --tokens --heads 2
expect_message "missing weights value" "option --weights needs a value" encode --image "$data/image_0.png" --config small --schedule full --weights
expect_message "positional argument" "unexpected argument 'stray'" attn stray
expect_message "given twice" "option --tokens given twice" attn --tokens 4 --tokens 8

# ---- strict numbers, narrowing, booleans ----
expect_message "prefix integer" "option --tokens: expected an integer in [1, 2147483647], got '256abc'" attn --tokens 256abc
expect_message "prefix real" "option --tau: expected a number in (0, 1], got '0.9x'" prefill --tau 0.9x
expect_message "not a number" "option --tau: expected a number in (0, 1], got 'high'" prefill --tau high
expect_message "nan" "got 'nan'" prefill --tau nan
expect_message "int wrap" "option --heads: expected an integer in [1, 1024], got '4294967298'" prefill --heads 4294967298
expect_message "grid wrap" "option --grid: expected HxW with sides in [1, 65536]" orders --grid 4294967300x8 --order raster
expect_message "grid wrap 2" "got '99999999999x8'" orders --grid 99999999999x8 --order raster
expect_message "grid trailing" "got '4x8x'" orders --grid 4x8x --order raster
expect_message "id wrap" "option --fg-id: expected an integer" shs --image "$data/image_0.png" --masks "$tmp" --fg-id 4294967311
expect_message "huge dim" "option --dim: expected an integer in [1, 1024]" attn --dim 281474976710656
expect_message "huge heads" "option --heads" attn --tokens 4 --heads 4611686018427387904 --dim 4
expect_message "list item" "option --side: expected an integer" flops --side 448,big
expect_message "empty list item" "option --side: empty item" flops --side 448,,896
expect_message "bad bool" "option --json: expected yes, no, true, false, 1 or 0, got 'maybe'" attn --json maybe
expect_message "bad bool value" "option --metrics: expected yes, no" prefill --metrics 2
expect_message "bad choice" "option --sink: expected one of none, denominator, key0, got 'sinks'" attn --sink sinks
out=$("$ARIADNE" attn --tokens 64 --heads 2 --dim 64 --repeat 1 --json false) || fail "--json false failed"
grep -q "^attention full" <<<"$out" || fail "--json false printed JSON or nothing: $out"
"$ARIADNE" attn --tokens 64 --heads 2 --dim 64 --repeat 1 --json=yes | python3 -c 'import json, sys; json.load(sys.stdin)' \
  || fail "--json=yes is not JSON"

# ---- meaningful values, bounded sizes ----
expect_message "threads encode" "option --threads: expected an integer in [1, 1024], got '100000'" \
  encode --image "$data/image_0.png" --config small --schedule full --threads 100000
expect_message "threads prefill" "option --threads: expected an integer in [1, 1024]" prefill --threads 100000
expect_message "threads zero" "option --threads" prefill --threads 0
expect_message "shs cell" "option --cell: expected an integer in [1, 64], got '2000'" \
  shs --image "$data/image_0.png" --masks "$tmp" --schedule full --cell 2000
expect_message "demo part" "option --part: unknown part 'bogus'" demo --out "$tmp/demo" --part bogus
expect_message "flops overflow" "option --side" flops --side 65536
expect_message "repeat 0" "option --repeat" attn --repeat 0
expect_message "kv-heads divide" "option --kv-heads: must divide --heads" attn --heads 6 --kv-heads 4
expect_message "rf start outside" "option --start" rf --grid 10x14 --start 10,0
expect_message "attn memory" "more than 80% of this machine's" attn --tokens 2000000000 --heads 1024 --dim 1024

if ! nvidia-smi -L >/dev/null 2>&1; then  # no GPU (CI): --backend cuda is refused before any work
  expect_message "prefill cuda" "option --backend: cuda: no CUDA device" prefill --backend cuda
  expect_message "attn cuda" "option --backend: cuda: no CUDA device" attn --backend cuda --tokens 64
fi

# ---- checked before any work: files, folders ----
expect_message "missing input" "option --image: /nonexistent.png: no such file" encode --image /nonexistent.png --config small --schedule full
mkfifo "$tmp/fifo.png"
rc=0
timeout 20 "$ARIADNE" encode --image "$tmp/fifo.png" --config small --schedule full 2>"$tmp/err" >/dev/null || rc=$?
[ "$rc" -eq 1 ] || fail "a FIFO input: exit $rc, expected 1 (124: it blocked)"
grep -q "not a regular file" "$tmp/err" || fail "a FIFO input: $(cat "$tmp/err")"
ln -s "$tmp/loop" "$tmp/loop"
expect_message "symlink loop" "option --image: $tmp/loop: Too many levels of symbolic links" encode --image "$tmp/loop" --config small --schedule full
expect_message "folder as a file" "is a folder, expected a file" encode --image "$tmp" --config small --schedule full
: >"$tmp/afile"
expect_message "out is a file" "exists and is not a folder" demo --out "$tmp/afile" --part cost
expect_message "save-output folder" "does not exist" encode --image "$data/image_0.png" --config small --schedule full \
  --save-output "$tmp/no/such/dir/out.safetensors"
# A bad second schedule fails before the first run writes anything.
expect_message "second schedule" "option --schedule" encode --image "$data/image_0.png" --config small \
  --schedule full,bogus --save-output "$tmp/run_"
ls "$tmp"/run_* >/dev/null 2>&1 && fail "a failing encode left outputs: $(ls "$tmp"/run_*)"
expect_message "prefill mix first" "option --synthetic" prefill --tokens 256 --synthetic sink:x --backend reference

# ---- --json errors: one JSON object on stdout, non-zero exit ----
json_error() {  # json_error "what" KEY VALUE args...: stdout is one object with error and KEY == VALUE
  local what=$1 key=$2 want=$3
  shift 3
  local out rc=0
  out=$("$ARIADNE" "$@" 2>/dev/null) || rc=$?
  [ "$rc" -ne 0 ] || fail "$what: 'ariadne $*' exited 0"
  KEY=$key WANT=$want python3 -c '
import json, os, sys
text = sys.stdin.read()
d = json.loads(text)  # exactly one document: json.loads fails on trailing text
assert isinstance(d, dict) and isinstance(d.get("error"), str) and d["error"], d
assert d.get(os.environ["KEY"]) == os.environ["WANT"], (os.environ["KEY"], d)
' <<<"$out" || fail "$what: stdout is not one JSON error object with $key=$want: $out"
}
json_error "bad number" option --tau prefill --tau 0.9x --json
json_error "unknown option" option --tokenz attn --tokenz 5 --json
json_error "missing value" option --tokens attn --json --tokens
json_error "range" option --heads prefill --json --heads 4294967298
json_error "missing file" file /nonexistent.png encode --json --image /nonexistent.png --config small --schedule full
json_error "wrapped library error" option --schedule flops --json --schedule nonsense
json_error "library error" command encode encode --json --image "$data/weights.safetensors" --config small --schedule full
json_error "required option" option --order orders --grid 4x8 --json
