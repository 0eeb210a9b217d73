// ariadne/vit.hpp — a Qwen2.5-VL-compatible vision encoder whose attention layers follow a schedule.
//
// The tower is Qwen2.5-VL's (SPEC C.1): patch embed (Conv3d with kernel = stride, as a GEMM on rows
// of C·T·P·P values), `depth` pre-norm blocks
//     x += proj(attention(rope(qkv(RMSNorm1(x)))));   x += down(silu(gate(h)) · up(h)),  h = RMSNorm2(x)
// with 2D RoPE, then the merger (RMSNorm, the merge² tokens of a merge unit concatenated, Linear,
// exact GELU, Linear). Only the attention of each layer changes with the schedule (schedule.hpp):
// its token order, its pattern (full / sliding window / Qwen chunk) and its sink. Tokens are
// re-permuted only where consecutive layers use different orders; RoPE cos/sin travel with them.
// Several images form one packed batch; attention never crosses images.
//
// Token layout. The native order is block_row (order.hpp): merge units in raster order, the m×m
// patches of a unit in raster order inside it — the order of Qwen2.5-VL's pixel_values rows and of
// the encoder's output rows. Images follow each other in the batch.
//
// Numerics (CPU): fp32 activations and weights (bf16/f16 checkpoints are widened exactly), GEMMs
// through OpenBLAS sgemm, RMSNorm with a double sum, RoPE in fp32, attention through
// ariadne::attention() on the chosen backend.
// Numerics (CUDA, EncodeOptions::attention = Backend::cuda): bf16 weights and activations as HF's
// bf16 tower, GEMMs through cuBLASLt with fp32 accumulation and the bias (and residual) in the
// epilogue, RMSNorm / RoPE / SwiGLU / GELU in fp32 rounded to bf16 where HF rounds, attention
// through the CUDA kernels (head_dim 64, 80, 96, 128; other head dims run attention on the host,
// reported as "cuda+host"). docs/encoder.md has the measured parity and speed.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ariadne/attention.hpp"
#include "ariadne/image.hpp"
#include "ariadne/order.hpp"
#include "ariadne/schedule.hpp"

namespace ariadne {

// Architecture. Sizes that a checkpoint holds (hidden, depth, intermediate, out_hidden, patch,
// temporal, in_channels, merge) are read from the file when one is loaded; the rest (heads,
// window, full layers, θ) come from the file's "vision_config" metadata when present, else from
// the named preset.
struct VitConfig {
  int depth = 32;
  int hidden = 1280;
  int heads = 16;
  int intermediate = 3420;
  int out_hidden = 2048;        // 3B: 2048, 7B: 3584
  int in_channels = 3;
  int patch = 14;               // pixels per patch side
  int temporal = 2;             // frames per temporal patch (a still image is repeated)
  int merge = 2;                // merge-unit side in patches
  int window_px = 112;          // Qwen chunk window side in pixels (112 = 4 merge units)
  std::vector<int> full_layers{7, 15, 23, 31};  // layers with full attention in Qwen's own layout
  double rope_theta = 10000;
  float eps = 1e-6f;            // RMSNorm epsilon

  int head_dim() const { return hidden / heads; }
  int patch_dim() const { return in_channels * temporal * patch * patch; }  // 1176 for Qwen
  int window_units() const { return window_px / (patch * merge); }          // 4 for Qwen
  int unit_dim() const { return hidden * merge * merge; }                   // merger width
  int factor() const { return patch * merge; }  // image sides are multiples of this (28)
  void validate() const;  // throws naming the field
  std::string describe() const;

  static VitConfig qwen25_vl();  // the 3B tower (out 2048)
  static VitConfig small();      // the CI parity size: depth 4, hidden 32, 2 heads, window 56 px
  static VitConfig named(std::string_view name);  // "qwen2.5-vl" | "small"
};

// ---------------------------------------------------------------- preprocessing
struct PreprocessOptions {
  int64_t min_pixels = 3136;      // 56·56
  int64_t max_pixels = 12845056;  // 28·28·16384
  std::array<float, 3> mean{0.48145466f, 0.4578275f, 0.40821073f};  // CLIP
  std::array<float, 3> std{0.26862954f, 0.26130258f, 0.27577711f};
};

// HF's smart_resize: sides rounded (half to even) to multiples of `factor`, then scaled down or up
// to keep height·width within [min_pixels, max_pixels] with the aspect ratio kept. Returns
// {height, width}. Throws for an aspect ratio above 200 or non-positive sizes.
std::pair<int, int> smart_resize(int height, int width, int factor, int64_t min_pixels, int64_t max_pixels);

// Bicubic resize matching PIL's Image.resize(BICUBIC) on 8-bit images bit for bit: separable
// Keys kernel with a = −0.5, support 2·max(1, scale) (antialiasing when shrinking), weights
// normalized per output pixel and quantized to 22-bit fixed point, horizontal pass first with its
// result rounded and clamped to 8 bits, then the vertical pass. A pass whose size is unchanged is
// skipped, as PIL does.
Image resize_bicubic(const Image& src, int out_width, int out_height);

// Pixel rows of a batch, as the Qwen2.5-VL image and video processors make them.
//
// Video. A clip of grid_t temporal patches (`temporal` frames each) enters the batch as grid_t
// consecutive grids of the same h×w, one per temporal patch, in time order. That is exactly how
// Qwen2.5-VL treats it: its rows are (t, merge unit, patch) with t outermost, RoPE positions
// restart at (0, 0) in every temporal patch, windows are built per temporal patch and even the full
// layers attend within one (cu_seqlens = h·w repeated grid_t times). The tower is block-diagonal
// over time, so every part of the encoder (orders, row/column walks, patterns, backends) that keeps
// images apart keeps temporal patches apart with no code of its own.
struct PixelBatch {
  std::vector<Grid> grids;   // per temporal patch: patch rows h and columns w (h, w multiples of
                             // merge); an image has one, a clip grid_t
  std::vector<int> grid_t;   // per input (image or clip), in order: its temporal patches (an image: 1);
                             // Σ grid_t = grids.size() (HF's grid_thw is {grid_t, h, w} per input)
  int patch_dim = 0;
  std::vector<float> values;  // [tokens, patch_dim]; rows in block_row order, image after image;
                              // columns ordered (channel, t, py, px)
  int64_t tokens() const { return patch_dim ? int64_t(values.size()) / patch_dim : 0; }
};

// smart_resize → resize_bicubic → ×1/255 (in double, then rounded to float) → (x − mean) / std
// (float) → `temporal` identical frames → patch rows. Bit-compatible with HF's PIL-backend
// Qwen2VLImageProcessor (tests/data/vit holds the evidence).
PixelBatch preprocess(const std::vector<Image>& images, const VitConfig& config,
                      const PreprocessOptions& options = {});

// One video clip: its frames, in time order, all of one size. The size is resized as an image's
// (smart_resize of frame 0's size with the same options, then resize_bicubic per frame) and
// normalized the same way; the frame count is rounded up to a multiple of `temporal` by repeating
// the last frame (HF's video processor rule); frame pair k (frames k·T … k·T+T−1) becomes temporal
// patch k, its frames in the t column of the rows. Returns one input: grid_t = ⌈frames / T⌉ grids.
// Frame sampling (fps) is the caller's: every frame given is used. Errors name the frame.
PixelBatch preprocess_video(const std::vector<Image>& frames, const VitConfig& config,
                            const PreprocessOptions& options = {});

// ---------------------------------------------------------------- weights
struct VitLayerWeights {
  std::vector<float> norm1, norm2;    // [hidden]
  std::vector<float> qkv_w, qkv_b;    // [3·hidden, hidden], [3·hidden]; rows [Q | K | V], head-major
  std::vector<float> proj_w, proj_b;  // [hidden, hidden], [hidden]
  std::vector<float> gate_w, gate_b, up_w, up_b;  // [intermediate, hidden], [intermediate]
  std::vector<float> down_w, down_b;  // [hidden, intermediate], [hidden]
  std::vector<float> sinks;           // [heads] sink logits (scaled-score units)
  bool sinks_from_file = false;
};

// The weights' bf16 copy on the GPU with the encoder's CUDA context (stream, cuBLASLt plans,
// scratch buffers): made by the first encode() with Backend::cuda (src/vit/cuda/vit_cuda.cu).
struct VitDeviceWeights;

struct VitWeights {
  VitConfig config;
  bool random = false;  // true: made by random_vit_weights, not a checkpoint
  uint64_t seed = 0;
  std::string source;   // file names, or "random(seed)"
  std::string prefix;   // "visual." or "model.visual."
  float sink_init = 0;  // value given to sinks absent from the file
  std::vector<float> patch_embed;  // [hidden, patch_dim]: Conv3d weight [hidden, C, T, P, P] flattened
  std::vector<VitLayerWeights> layers;
  std::vector<float> merger_norm;          // [hidden]
  std::vector<float> merger_w1, merger_b1; // [unit_dim, unit_dim], [unit_dim]
  std::vector<float> merger_w2, merger_b2; // [out_hidden, unit_dim], [out_hidden]
  // Uploaded once, by the first CUDA encode, and shared by copies of this struct: change no host
  // weight after that (reset `device` to upload again). One CUDA encode at a time per device copy
  // (encode() serializes them).
  mutable std::shared_ptr<VitDeviceWeights> device;
};

// Loads the tower from one or more safetensors files (sharded checkpoints: a name is looked up in
// every file). The prefix ("visual." or "model.visual.") is detected. Sizes come from the tensors'
// shapes and are checked against each other; heads, window, full layers and θ come from the
// metadata key "vision_config" (a JSON object with HF's field names) when present, else from
// `defaults`. `blocks.{i}.attn.sinks` ([heads]) are loaded where present; absent ones get
// `sink_init`. Errors name the file and the tensor.
VitWeights load_vit_weights(const std::vector<std::string>& files, const VitConfig& defaults, float sink_init = 0);

// The architecture load_vit_weights would report for `files`, read from the headers alone (no tensor
// data is read): for checking a schedule against a checkpoint's depth before loading it.
VitConfig read_vit_config(const std::vector<std::string>& files, const VitConfig& defaults);

// Seeded random weights: Linear weights and biases uniform in ±1/sqrt(fan_in) (PyTorch's Linear
// initialization), norm weights 1 + U(±0.1), sinks `sink_init`. Reported as random everywhere.
VitWeights random_vit_weights(const VitConfig& config, uint64_t seed, float sink_init = 0);

// Writes weights in the checkpoint layout (names with `prefix`, Conv3d weight 5-D, "vision_config"
// metadata), as f32 or bf16. Sinks are written when `with_sinks`.
void save_vit_weights(const std::string& path, const VitWeights& w, DType dtype = DType::f32,
                      const std::string& prefix = "visual.", bool with_sinks = false);

// ---------------------------------------------------------------- schedules
// The schedule for an encoder of config.depth layers. When `text` resolves (schedule.hpp) to
// config.depth layers it is used as is. The uniform presets adapt to the model: full and full+sink
// repeat F; chunk, swa2d, swa1d (and their +sink forms) put their local layer everywhere except
// config.full_layers, which are F — Qwen2.5-VL's own layout. Other mismatches throw.
Schedule vit_schedule(std::string_view text, const VitConfig& config, int64_t window = 64);

// ---------------------------------------------------------------- RoPE
// 2D rotary tables of the packed batch in native (block_row) order: cos, sin [tokens, head_dim],
// row-major. With q = head_dim/4 frequencies inv_freq[k] = θ^(−k/q) (fp32, as HF computes them),
// token at patch (r, c) has angles [r·inv_freq, c·inv_freq] (head_dim/2 values) duplicated to
// head_dim.
void vit_rope_tables(const std::vector<Grid>& grids, int merge, int head_dim, double theta,
                     std::vector<float>& cos, std::vector<float>& sin);

// x ← x·cos + rotate_half(x)·sin for `heads` vectors of head_dim per row, fp32; rotate_half(x) =
// [−x[d/2:], x[:d/2]]. x: rows of `row_stride` floats, head h at x + h·head_dim. cos/sin: [rows,
// head_dim].
void apply_rope(float* x, int64_t rows, int64_t row_stride, int heads, int head_dim, const float* cos,
                const float* sin);

// ---------------------------------------------------------------- forward
struct EncodeOptions {
  Backend attention = Backend::cpu;  // backend of ariadne::attention(); cpu falls back to reference
                                     // when the fast CPU kernels do not support a layer (reported)
  SinkMode sink_mode = SinkMode::denominator;  // for layers with a sink
  // Optional observer of each layer's attention (diagnostics, shs.hpp), called right after the
  // layer's attention() with the layer index, its AttentionParams (q and k after RoPE, v: strided
  // views of the packed qkv rows in the layer's token order; pattern; sink) and that order. The
  // views are valid only during the call; its time is not counted in EncodeTimes.
  // With Backend::cuda the views are device memory; with cuda_fused_order they stay in the native
  // order and params.order (device int32) maps the layer's order onto them.
  std::function<void(int layer, const AttentionParams& params, const TokenOrder& order)> on_attention;
  // CUDA only: true keeps the tokens in the native order and hands each window / chunk layer its
  // order as the attention's fused row index (AttentionParams::order), so nothing is ever
  // gathered; false gathers the hidden states where the order changes, as the CPU path does.
  bool cuda_fused_order = true;
  // CUDA only: false records no event between stages (EncodeTimes then holds the total, upload and
  // download only), so that the total carries no timing overhead.
  bool cuda_stage_times = true;
};

struct EncodeTimes {  // milliseconds, summed over layers
  double patch_embed = 0, rope = 0, norm = 0, qkv = 0, attention = 0, proj = 0, mlp = 0, permute = 0, merger = 0;
  double total = 0;
  double upload = 0, download = 0;  // CUDA: pixels to the device, output back (not in total)
};

struct EncodeResult {
  std::vector<float> out;  // [units, out_hidden] in native order, units = tokens / merge²
  int64_t tokens = 0, units = 0;
  int out_hidden = 0;
  int order_changes = 0;          // token re-permutations done (at layer boundaries and the merger)
  std::string attention_backend;  // what ran: "cpu", "reference", "cpu+reference", "cuda" or "cuda+host"
  EncodeTimes times;
  std::vector<float> hidden;      // [tokens, hidden] last block's output in native order (only
                                  // when requested: keep_hidden)
};

// Runs the encoder on pixel rows (preprocess(), preprocess_video()) with `schedule` (vit_schedule()).
// pixels: [tokens, patch_dim] block_row rows, image after image, matching `grids`; a clip's
// temporal patches are consecutive grids (PixelBatch), so its output rows are temporal patch after
// temporal patch, as HF's.
EncodeResult encode(const VitWeights& weights, const std::vector<float>& pixels,
                    const std::vector<Grid>& grids, const Schedule& schedule,
                    const EncodeOptions& options = {}, bool keep_hidden = false);

// The attention pattern and cu_seqlens each layer of `schedule` uses on `grids` (for tests and
// the CLI): per layer, the order and the cu array its pattern splits tokens by.
struct LayerPlan {
  OrderKind order;
  LayerKind kind;
  int64_t window;
  bool sink;
  std::vector<int32_t> cu;  // images (full / window) or Qwen windows (chunk)
};
std::vector<LayerPlan> vit_layer_plan(const VitConfig& config, const std::vector<Grid>& grids,
                                      const Schedule& schedule);

}  // namespace ariadne
