// ariadne/schedule.hpp — per-layer attention specs of a vision encoder: which token order a layer
// runs in, which pattern it uses there, and whether it has a sink.
//
// Presets (SPEC A.2, A.5, C.1, C.2; window = SWA half-width, 64 unless given):
//   full          32 full layers                                  "32xF"
//   full+sink     32 full layers, sink on every layer             "32xF+"
//   chunk         Qwen2.5-VL: chunks of the window order, full at 7, 15, 23, 31   "4x(7xW F)"
//   chunk+sink    chunk, sink on the 28 chunk layers              "4x(7xW+ F)"
//   swa2d         SWA on the window order, full at 7, 15, 23, 31  "4x(7xQ F)"
//   swa2d+sink    swa2d, sink on the 28 local layers              "4x(7xQ+ F)"
//   swa1d         SWA on block_row, full at 7, 15, 23, 31         "4x(7xR F)"
//   swa1d+sink    swa1d, sink on the 28 local layers              "4x(7xR+ F)"
//   ariadne       4 × (4 row SWA+sink, 3 column SWA+sink, 1 full) "4x(4xR+ 3xC+ F)"
//   mimo          MiMo-V2.5: 28 layers [F R×4 C×4]×3 + F, sinks on the 24 local layers
//                                                                 "3x(F 4xR+ 4xC+) F"
// The sink placement follows Ariadne (sink on local layers, the full anchors without); full+sink is
// the one preset with sinks on full layers, as in the paper's full+sink model.
//
// Short syntax (custom schedules, e.g. "4x(RRRRCCCF)" with a window argument):
//   R  sliding window ±window on block_row (row-major merge units, Qwen's native order)
//   C  sliding window ±window on block_col (column-major merge units, inner 2×2 kept)
//   Q  sliding window ±window on qwen_window (SWA-2D)
//   W  chunk: Qwen2.5-VL windows on qwen_window (block-diagonal, window size set by the order)
//   F  full attention within each image; it keeps the previous layer's order (full attention does
//      not depend on the order, so no re-permutation), block_row when it comes first
//   +  after a letter: the layer has a sink (e.g. "R+")
//   Nx before a letter or a parenthesized group: repeat N times ("4xR", "4x(RRRRCCCF)")
//   spaces, '-' and '_' separate items and mean nothing ("RRRR-CCC-F").
// Letters are upper case. Parse errors name the 1-based character position in the string.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ariadne/order.hpp"
#include "ariadne/pattern.hpp"

namespace ariadne {

enum class LayerKind : uint8_t { full, window, chunk };
const char* layer_kind_name(LayerKind k);  // "full", "window", "chunk"

struct LayerSpec {
  OrderKind order = OrderKind::block_row;  // the order the layer's tokens are in
  LayerKind kind = LayerKind::full;
  int64_t window = 0;  // window layers: query at position p sees p−window … p+window in `order`
  bool sink = false;   // the layer has a per-head sink (attention.hpp SinkMode)
  char letter = 'F';   // the layer's letter in the short syntax
};

struct Schedule {
  std::string name;
  std::vector<LayerSpec> layers;

  // Layers whose order differs from the previous layer's: each costs one token gather.
  int order_changes() const;
  // The schedule in the short syntax, one letter (+ suffix) per layer, e.g. "R+R+R+R+C+C+C+F...".
  std::string letters() const;
};

std::vector<std::string> schedule_presets();  // the preset names above, in that order

// A preset by name (window = SWA half-width of its window layers). Throws naming the valid presets.
Schedule preset_schedule(std::string_view name, int64_t window = 64);

// A schedule in the short syntax. Throws ariadne::Error naming the position of the problem.
Schedule parse_schedule(std::string_view spec, int64_t window = 64);

// A preset when `text` names one, else the short syntax.
Schedule resolve_schedule(std::string_view text, int64_t window = 64);

// The pattern a layer uses on tokens in `order` (packed images):
//   full   -> Pattern::full() per image (varlen over order.cu_seqlens)
//   window -> Pattern::window(w, w) per image (varlen over order.cu_seqlens)
//   chunk  -> Pattern::full() per Qwen window (varlen over order.cu_windows)
// The returned pattern points into `order`'s arrays: keep `order` alive and unmodified while it is
// used. Window and chunk layers require order.kind == layer.order; full layers accept any order.
Pattern layer_pattern(const LayerSpec& layer, const TokenOrder& order);

}  // namespace ariadne
