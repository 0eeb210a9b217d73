// ariadne/shs.hpp — the SHS-Index (semantic head specialization) and its companion diagnostics
// (SPEC A.6): which heads of a vision encoder concentrate the attention they receive on objects
// (foreground) or on background, measured against segmentation masks.
//
// Pipeline for one image:
//   mask (LabelMap, mask.hpp) ─► patch_fractions (resized like the encoder's input, area share per
//   patch) ─► label_patches (FG / BG / excluded by a purity rule)
//   q, k of every layer (after RoPE, in the layer's token order) ─► diagnose_layer (the attention
//   engine with `received`, entropy, distance; a second pass without the sink on sink layers)
//   ─► ShsAccumulator::add (AUROC per head, sink allocation) ─► summary()
// Everything per patch is kept in SPATIAL raster order (patch (r, c) at r·w + c); token orders are
// undone with TokenOrder::perm.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ariadne/attention.hpp"
#include "ariadne/image.hpp"
#include "ariadne/mask.hpp"
#include "ariadne/order.hpp"
#include "ariadne/schedule.hpp"

namespace ariadne {

// ---------------------------------------------------------------------------------------------
// Labels.

// Which mask ids are foreground, background, or void (neither: VOC's 255 border band, COCO crowd
// regions). An id in `ignore` is void; otherwise, when `foreground` is non-empty, an id is FG iff
// listed there (everything else is BG); when it is empty, an id is BG iff listed in `background`
// and FG otherwise (the default: any object class is foreground).
struct ForegroundRule {
  std::vector<int32_t> foreground;
  std::vector<int32_t> background{0};
  std::vector<int32_t> ignore{255, kCrowdLabel};
  int classify(int32_t id) const;  // 1 FG, 0 BG, -1 void
};

// Foreground and background pixel shares of each patch, after resizing the mask (nearest
// neighbour) to the encoder's input size grid·patch (vit.hpp smart_resize gives the grid). fg[i] + bg[i] <= 1 (the rest is void).
struct PatchFractions {
  Grid grid;
  int patch = 14;
  std::vector<float> fg, bg;  // [grid.h · grid.w] spatial raster order
};
PatchFractions patch_fractions(const LabelMap& mask, Grid grid, int patch, const ForegroundRule& rule);

// Patch labels: FG when fg ≥ purity and fg > ½; BG when bg ≥ purity and bg > ½; else excluded.
// purity 1 (the default of SPEC A.6): only pure patches count, every patch on a boundary (or
// touching void) is excluded. purity 0.5: the strict majority decides (exact halves excluded).
// purity must lie in [0.5, 1].
constexpr int8_t kPatchBackground = 0, kPatchForeground = 1, kPatchExcluded = -1;
std::vector<int8_t> label_patches(const PatchFractions& f, double purity);

// Per-token values in the order's sequence order -> spatial raster order of a single-image
// order: out[order.perm[i]] = seq[i]. seq: [order.tokens()].
std::vector<float> to_spatial(const float* seq, const TokenOrder& order);

// ---------------------------------------------------------------------------------------------
// Statistics.

// Mann–Whitney AUROC of `pos` against `neg`: P(X > Y) + ½·P(X = Y), X from pos, Y from neg,
// computed from mid-ranks in O(n log n). Throws when either side is empty or holds a NaN.
double auroc(const std::vector<double>& pos, const std::vector<double>& neg);

// ---------------------------------------------------------------------------------------------
// One layer of one image as the diagnostics see it.
struct LayerInput {
  TensorView q;  // [tokens, heads_q, dim], host, f32/bf16/f16, after RoPE, tokens in `order`'s sequence order
  TensorView k;  // [tokens, heads_kv, dim], same
  const TokenOrder* order = nullptr;  // a single image; coords and perm map positions to patches
  Pattern pattern;                    // who sees whom in that sequence order (schedule.hpp layer_pattern)
  SinkMode sink_mode = SinkMode::none;
  TensorView sink;    // [heads_q] f32 when sink_mode != none
  float scale = 0.f;  // 0: 1/sqrt(dim)
};

// The diagnostics' input for one layer an encoder hands its observer (EncodeOptions::on_attention):
// q, k and the sink copied to host rows in the layer's order (from device memory, and gathered
// through the fused order AttentionParams::order, when the encoder runs on CUDA) and the layer's
// pattern made again from `order` on the host (a CUDA encoder's pattern arrays are device memory).
// `input` points into the buffers and at `order`, which must outlive it.
struct ObservedLayer {
  Buffer q, k, sink;
  LayerInput input;
};
ObservedLayer observed_layer(const AttentionParams& p, const TokenOrder& order, const LayerSpec& spec);

struct LayerDiag {
  int heads = 0;
  int64_t tokens = 0;
  std::vector<float> received;          // [heads, tokens] spatial raster order: Σ_i a_ij (true a, with the sink)
  std::vector<float> received_no_sink;  // [heads, tokens] the same logits without the sink; empty when none
  std::vector<double> distance;         // [heads] mean over queries of Σ_j â_ij ‖c_i − c_j‖, in patches
  std::vector<double> entropy;          // [heads] mean over queries of the row entropy (nats)
};

// Runs the attention engine (CPU backend when it supports the case, else the reference; or the
// backend named) once, and a second time without the sink on a layer that has one.
LayerDiag diagnose_layer(const LayerInput& in, Backend backend = Backend::automatic);

// The diagnostics of every image of a layer over several images that attend only within
// themselves (the images of a batch; a video clip's temporal patches, whose "full" layers are
// block-diagonal over time): q and k (host, packed rows) and the order are cut per image, and each
// image's pattern is made from `spec` on its own order. in.order may hold any number of images;
// in.pattern is not read. Result: one LayerDiag per image, as diagnose_layer gives it alone.
std::vector<LayerDiag> diagnose_images(const LayerInput& in, const LayerSpec& spec,
                                       Backend backend = Backend::automatic);

// ---------------------------------------------------------------------------------------------
// The index over images, layers and heads.

struct HeadScore {
  double auroc = std::numeric_limits<double>::quiet_NaN();   // FG vs BG received attention
  double folded = std::numeric_limits<double>::quiet_NaN();  // max(auroc, 1 − auroc)
  // Sink allocation (sink layers only, else NaN): share of the received attention the sink takes
  // away from FG (BG) tokens, Σ_FG (r₀ − r) / Σ_FG r₀ with r₀ the received attention without sink.
  double sink_fg = std::numeric_limits<double>::quiet_NaN();
  double sink_bg = std::numeric_limits<double>::quiet_NaN();
  double distance = 0, entropy = 0;  // from LayerDiag
  // +1 FG specialist (auroc > ½), −1 BG specialist (auroc < ½), 0 neither.
  int sign() const { return auroc > 0.5 ? 1 : (auroc < 0.5 ? -1 : 0); }
};

struct ImageScores {
  std::string name;
  Grid grid;
  int64_t fg = 0, bg = 0, excluded = 0;  // patch counts
  bool scored = false;                   // false when fg or bg is 0 (AUROC undefined)
  std::vector<HeadScore> heads;          // [layers · heads], layer-major
};

struct ShsSummary {
  int layers = 0, heads = 0, patch = 14;
  int images_scored = 0;
  std::vector<std::string> images_skipped;  // no FG or no BG patch
  double shs_index = 0;                     // mean folded AUROC over scored images, layers, heads
  std::vector<double> per_layer;            // [layers] mean over images and heads
  std::vector<double> per_head;             // [layers · heads] mean over images
  std::vector<double> per_head_auroc;       // [layers · heads] mean unfolded AUROC over images
  double fg_dominant_share = 0;             // share of (image, layer, head) with auroc > ½
  std::vector<double> fg_dominant_per_layer;
  // Over every image (scored or not), layer and head:
  double distance_patches = 0, entropy = 0;
  std::vector<double> distance_per_layer, entropy_per_layer;
  // Sink allocation, over scored images × sink layers × heads (has_sink false: no sink layer).
  bool has_sink = false;
  double sink_fg = 0, sink_bg = 0, sink_bg_heavier_share = 0;
  std::vector<double> sink_fg_per_layer, sink_bg_per_layer;  // NaN on layers without a sink
};

class ShsAccumulator {
 public:
  ShsAccumulator(int layers, int heads, int patch = 14);
  // labels: [grid.h · grid.w] spatial (label_patches); diags: [layers], each with `heads` heads
  // and grid.tokens() tokens. Returns the image's scores.
  const ImageScores& add(const std::string& name, Grid grid, const std::vector<int8_t>& labels,
                         const std::vector<LayerDiag>& diags);
  const std::vector<ImageScores>& images() const { return images_; }
  ShsSummary summary() const;

 private:
  int layers_, heads_, patch_;
  std::vector<ImageScores> images_;
  std::vector<bool> sink_layer_;
};

// The summary as JSON: shs_index, per_layer, per_head ([layers][heads]), fg_dominant_share,
// attention_distance {patches, pixels, per_layer}, entropy {mean, per_layer}, sink_allocation
// (when has_sink), images_scored, images_skipped. NaN becomes null.
nlohmann::json shs_summary_json(const ShsSummary& s);

// ---------------------------------------------------------------------------------------------
// Pictures (RGB, 8 bit).

// Bilinear resize of an RGB image (for picture backgrounds; the encoder has its own resize).
Image resize_rgb(const Image& img, int height, int width);

// Per layer a grid of heads: each tile is `background` (the input image, any size; resized to the
// grid) blended with the head's received attention ([heads, grid.h·grid.w] spatial, min–max
// normalized per head) on a dark-to-bright colour map; `cell` pixels per patch, `cols` tiles per
// row, 2-pixel white gaps.
Image heatmap_grid(const Image& background, const float* received, int heads, Grid grid, int cell, int cols);

// FG / BG / excluded patches over the image: FG tinted orange, BG blue, excluded left gray.
Image label_picture(const Image& background, const std::vector<int8_t>& labels, Grid grid, int cell);

}  // namespace ariadne
