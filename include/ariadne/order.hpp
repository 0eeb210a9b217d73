// ariadne/order.hpp — token orders (serializations) of one or several images' patch grids.
//
// A vision encoder sees an image as an h×w grid of patches. Local attention (sliding window, chunk)
// works on a 1D sequence, so the grid must be flattened; which flattening is used decides which
// patches are sequence neighbours (SPEC A.3). Four orders, for merge size m (m×m patches form a
// *merge unit*, the smallest unit Qwen2.5-VL moves; m = 2 for Qwen and MiMo):
//   raster       patch rows top to bottom, each left to right.
//   block_row    merge units left→right, top→bottom; inside a unit its m×m patches in raster order.
//                Qwen2.5-VL's native input order ("SWA-1D"). With m = 1 it equals raster.
//   block_col    the merge-unit grid transposed (units top→bottom, then left→right), each unit's
//                inner order KEPT (MiMo-V2.5's column order, also used for Ariadne's C layers).
//                With m = 1 it is column-major raster.
//   qwen_window  Qwen2.5-VL's window order ("chunk-2D"): the merge-unit grid is padded logically to
//                multiples of `window` units per side; windows in raster order, units in raster order
//                inside a window, patches of a unit in raster order. Pads never become tokens, and a
//                window with no real unit is dropped. `cu_windows` gives the window boundaries
//                (Qwen's cu_window_seqlens): a 14×16 patch grid gives [0, 64, 128, 176, 224].
//
// Several images are packed one after another: image i occupies sequence positions
// [cu_seqlens[i], cu_seqlens[i+1]) in every order (orders never mix images). A video clip is packed
// as one grid per temporal patch (vit.hpp, PixelBatch), so every order, and Ariadne's row/column
// walks over it, stays inside one temporal patch. The *spatial index* of
// patch (r, c) of image i is cu_seqlens[i] + r·w_i + c (raster inside the image).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ariadne/tensor.hpp"

namespace ariadne {

// Patch grid of one image: h rows and w columns of patches.
struct Grid {
  int h = 0, w = 0;
  int64_t tokens() const { return int64_t(h) * w; }
  bool operator==(const Grid&) const = default;
};

enum class OrderKind : uint8_t { raster, qwen_window, block_row, block_col };

const char* order_name(OrderKind k);  // "raster", "qwen_window", "block_row", "block_col"
OrderKind parse_order(std::string_view name);  // throws ariadne::Error listing the valid names

struct TokenOrder {
  OrderKind kind = OrderKind::raster;
  int merge = 2;   // merge-unit side in patches
  int window = 4;  // qwen_window: window side in merge units (unused by the other orders)
  std::vector<Grid> grids;

  // All arrays are over the packed sequence of every image (total = Σ h·w tokens).
  std::vector<int32_t> perm;        // [total] sequence position -> spatial index
  std::vector<int32_t> inverse;     // [total] spatial index -> sequence position
  std::vector<int32_t> cu_seqlens;  // [images + 1] image boundaries (same in every order)
  std::vector<int32_t> cu_windows;  // qwen_window only: [windows + 1] window boundaries; else empty
  std::vector<float> coords;        // [total, 2] (row, col) of each position's patch, sequence order

  int64_t tokens() const { return int64_t(perm.size()); }
  int images() const { return int(grids.size()); }
};

// Builds an order of the packed images. Every side must be a positive multiple of `merge` (Qwen
// grids are even: an odd side with merge 2 is an error, not silently padded); window >= 1.
TokenOrder make_order(OrderKind kind, const std::vector<Grid>& grids, int merge = 2, int window = 4);

// Gather index converting a sequence in order `from` to order `to` (same grids):
//   x_to[i] = x_from[index[i]],  index[i] = from.inverse[to.perm[i]].   [total]
std::vector<int32_t> order_conversion(const TokenOrder& from, const TokenOrder& to);

// Row gather on host tensors: dst[i, ...] = src[index[i], ...] for every i < dst.shape[0].
// src, dst: [tokens, ...] (rank 1..4), same dtype (any) and same trailing shape; every stride is
// free (rows may be strided views into wider tensors), dst must not overlap src. index: [dst.shape[0]]
// entries in [0, src.shape[0]).
void gather_rows(const TensorView& src, const TensorView& dst, const std::vector<int32_t>& index);

// Reorders a tensor whose rows are in order `from` into order `to`: gather_rows with
// order_conversion(from, to). src, dst: [total, ...].
void permute_tokens(const TensorView& src, const TensorView& dst, const TokenOrder& from,
                    const TokenOrder& to);

// RoPE tables travel with the tokens: cos and sin are [total, rotary_dim] (any dtype, strides
// free), both rows gathered with the same index. cos_out/sin_out have the shapes of cos/sin.
void permute_rope(const TensorView& cos, const TensorView& sin, const TensorView& cos_out,
                  const TensorView& sin_out, const TokenOrder& from, const TokenOrder& to);

}  // namespace ariadne
