// Token orders of packed patch grids (order.hpp) and the row gathers that move tensors between them.
#include "ariadne/order.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "ariadne/error.hpp"

namespace ariadne {

namespace {

constexpr const char* kOrderNames[] = {"raster", "qwen_window", "block_row", "block_col"};

// Appends the m×m patches of merge unit (ur, uc) of an image, in raster order inside the unit.
void push_unit(std::vector<int32_t>& perm, int64_t base, int w, int m, int ur, int uc) {
  for (int dr = 0; dr < m; ++dr)
    for (int dc = 0; dc < m; ++dc)
      perm.push_back(int32_t(base + int64_t(ur * m + dr) * w + (uc * m + dc)));
}

// Byte range [lo, hi) a host view can touch (strides are non-negative in this library).
std::pair<const char*, const char*> byte_extent(const TensorView& t) {
  int64_t last = 0;
  for (int d = 0; d < t.rank; ++d) {
    if (t.shape[d] == 0) return {nullptr, nullptr};
    last += (t.shape[d] - 1) * t.stride[d];
  }
  const char* p = static_cast<const char*>(t.data);
  return {p, p + (last + 1) * dtype_size(t.dtype)};
}

}  // namespace

const char* order_name(OrderKind k) { return kOrderNames[int(k)]; }

OrderKind parse_order(std::string_view name) {
  for (int i = 0; i < 4; ++i)
    if (name == kOrderNames[i]) return OrderKind(i);
  detail::fail("unknown token order '", name, "' (expected raster, qwen_window, block_row or block_col)");
}

TokenOrder make_order(OrderKind kind, const std::vector<Grid>& grids, int merge, int window) {
  ARIADNE_CHECK(merge >= 1, "token order: merge size is ", merge, ", expected >= 1");
  ARIADNE_CHECK(window >= 1, "token order: qwen window is ", window, " merge units, expected >= 1");
  ARIADNE_CHECK(!grids.empty(), "token order: no image grid given");
  TokenOrder o;
  o.kind = kind;
  o.merge = merge;
  o.window = window;
  o.grids = grids;
  o.cu_seqlens.push_back(0);
  int64_t total = 0;
  for (size_t i = 0; i < grids.size(); ++i) {
    const Grid& g = grids[i];
    ARIADNE_CHECK(g.h > 0 && g.w > 0, "token order: image ", i, " grid is ", g.h, "x", g.w,
                  ", expected positive sides");
    ARIADNE_CHECK(g.h % merge == 0 && g.w % merge == 0, "token order: image ", i, " grid is ", g.h,
                  "x", g.w, " patches, expected both sides multiples of the merge size ", merge,
                  " (Qwen-style grids are rounded to whole merge units)");
    total += g.tokens();
    ARIADNE_CHECK(total <= INT32_MAX, "token order: ", total, " tokens exceed the int32 index range");
    o.cu_seqlens.push_back(int32_t(total));
  }
  o.perm.reserve(size_t(total));
  if (kind == OrderKind::qwen_window) o.cu_windows.push_back(0);

  for (size_t i = 0; i < grids.size(); ++i) {
    const int h = grids[i].h, w = grids[i].w, m = merge;
    const int64_t base = o.cu_seqlens[i];
    const int uh = h / m, uw = w / m;  // merge-unit grid
    switch (kind) {
      case OrderKind::raster:
        for (int64_t s = 0; s < int64_t(h) * w; ++s) o.perm.push_back(int32_t(base + s));
        break;
      case OrderKind::block_row:
        for (int ur = 0; ur < uh; ++ur)
          for (int uc = 0; uc < uw; ++uc) push_unit(o.perm, base, w, m, ur, uc);
        break;
      case OrderKind::block_col:
        for (int uc = 0; uc < uw; ++uc)
          for (int ur = 0; ur < uh; ++ur) push_unit(o.perm, base, w, m, ur, uc);
        break;
      case OrderKind::qwen_window: {
        // The unit grid padded to whole windows; only real units become tokens, so a window that
        // holds no real unit contributes nothing and is not recorded (Qwen drops it likewise).
        const int wh = (uh + window - 1) / window, ww = (uw + window - 1) / window;
        for (int wr = 0; wr < wh; ++wr)
          for (int wc = 0; wc < ww; ++wc) {
            const size_t before = o.perm.size();
            for (int ur = wr * window; ur < std::min(uh, (wr + 1) * window); ++ur)
              for (int uc = wc * window; uc < std::min(uw, (wc + 1) * window); ++uc)
                push_unit(o.perm, base, w, m, ur, uc);
            if (o.perm.size() > before) o.cu_windows.push_back(int32_t(o.perm.size()));
          }
        break;
      }
    }
  }

  o.inverse.assign(o.perm.size(), -1);
  for (size_t p = 0; p < o.perm.size(); ++p) o.inverse[size_t(o.perm[p])] = int32_t(p);
  o.coords.resize(2 * o.perm.size());
  size_t img = 0;
  for (size_t p = 0; p < o.perm.size(); ++p) {
    while (int64_t(p) >= o.cu_seqlens[img + 1]) ++img;
    const int64_t local = o.perm[p] - o.cu_seqlens[img];
    o.coords[2 * p] = float(local / grids[img].w);
    o.coords[2 * p + 1] = float(local % grids[img].w);
  }
  return o;
}

std::vector<int32_t> order_conversion(const TokenOrder& from, const TokenOrder& to) {
  ARIADNE_CHECK(from.grids == to.grids, "order conversion: the orders '", order_name(from.kind),
                "' and '", order_name(to.kind), "' are of different image grids");
  std::vector<int32_t> index(to.perm.size());
  for (size_t i = 0; i < index.size(); ++i) index[i] = from.inverse[size_t(to.perm[i])];
  return index;
}

void gather_rows(const TensorView& src, const TensorView& dst, const std::vector<int32_t>& index) {
  ARIADNE_CHECK(src.device == Device::cpu && dst.device == Device::cpu,
                "gather_rows: src and dst must be host tensors");
  ARIADNE_CHECK(src.rank >= 1 && src.rank <= 4, "gather_rows: src has rank ", src.rank, ", expected 1..4");
  ARIADNE_CHECK(dst.rank == src.rank, "gather_rows: dst has rank ", dst.rank, ", expected ", src.rank,
                " (the rank of src)");
  ARIADNE_CHECK(dst.dtype == src.dtype, "gather_rows: dst dtype ", dtype_name(dst.dtype),
                " differs from src dtype ", dtype_name(src.dtype));
  for (int d = 1; d < src.rank; ++d)
    ARIADNE_CHECK(dst.shape[d] == src.shape[d], "gather_rows: dst dim ", d, " is ", dst.shape[d],
                  ", expected ", src.shape[d], " (as src)");
  ARIADNE_CHECK(int64_t(index.size()) == dst.shape[0], "gather_rows: index has ", index.size(),
                " entries, expected dst dim 0 = ", dst.shape[0]);
  for (int d = 0; d < src.rank; ++d)
    ARIADNE_CHECK(src.stride[d] >= 0 && dst.stride[d] >= 0, "gather_rows: negative stride in dim ", d);
  for (size_t i = 0; i < index.size(); ++i)
    ARIADNE_CHECK(index[i] >= 0 && index[i] < src.shape[0], "gather_rows: index[", i, "] = ", index[i],
                  ", expected a row of src in [0, ", src.shape[0], ")");
  const auto [s_lo, s_hi] = byte_extent(src);
  const auto [d_lo, d_hi] = byte_extent(dst);
  if (s_lo == nullptr || d_lo == nullptr) return;  // an empty dimension: nothing to move
  ARIADNE_CHECK(d_hi <= s_lo || s_hi <= d_lo, "gather_rows: dst overlaps src (gather out of place)");

  const int es = dtype_size(src.dtype);
  // Trailing dimensions padded to three so one loop nest serves ranks 1..4.
  int64_t n[3] = {1, 1, 1}, ss[3] = {0, 0, 0}, ds[3] = {0, 0, 0};
  for (int d = 1; d < src.rank; ++d) {
    n[d + 3 - src.rank] = src.shape[d];
    ss[d + 3 - src.rank] = src.stride[d];
    ds[d + 3 - src.rank] = dst.stride[d];
  }
  // Rows whose innermost dimension is dense in both views move as runs of n[2] elements.
  const bool inner_dense = (n[2] == 1) || (ss[2] == 1 && ds[2] == 1);
  const char* sp = static_cast<const char*>(src.data);
  char* dp = static_cast<char*>(dst.data);
  for (size_t i = 0; i < index.size(); ++i) {
    const char* srow = sp + int64_t(index[i]) * src.stride[0] * es;
    char* drow = dp + int64_t(i) * dst.stride[0] * es;
    for (int64_t a = 0; a < n[0]; ++a)
      for (int64_t b = 0; b < n[1]; ++b) {
        const char* s = srow + (a * ss[0] + b * ss[1]) * es;
        char* d = drow + (a * ds[0] + b * ds[1]) * es;
        if (inner_dense) {
          std::memcpy(d, s, size_t(n[2] * es));
        } else {
          for (int64_t c = 0; c < n[2]; ++c) std::memcpy(d + c * ds[2] * es, s + c * ss[2] * es, size_t(es));
        }
      }
  }
}

void permute_tokens(const TensorView& src, const TensorView& dst, const TokenOrder& from,
                    const TokenOrder& to) {
  ARIADNE_CHECK(src.rank >= 1 && src.shape[0] == from.tokens(), "permute_tokens: src dim 0 is ",
                src.rank >= 1 ? src.shape[0] : 0, ", expected ", from.tokens(), " tokens of the order");
  gather_rows(src, dst, order_conversion(from, to));
}

void permute_rope(const TensorView& cos, const TensorView& sin, const TensorView& cos_out,
                  const TensorView& sin_out, const TokenOrder& from, const TokenOrder& to) {
  ARIADNE_CHECK(cos.rank == 2 && sin.rank == 2, "permute_rope: cos and sin must be [tokens, rotary_dim]",
                " (ranks ", cos.rank, " and ", sin.rank, ")");
  ARIADNE_CHECK(cos.shape[0] == from.tokens() && sin.shape[0] == from.tokens(), "permute_rope: cos/sin have ",
                cos.shape[0], "/", sin.shape[0], " rows, expected ", from.tokens(), " tokens of the order");
  ARIADNE_CHECK(cos.shape[1] == sin.shape[1], "permute_rope: cos rotary_dim ", cos.shape[1],
                " differs from sin rotary_dim ", sin.shape[1]);
  const std::vector<int32_t> index = order_conversion(from, to);
  gather_rows(cos, cos_out, index);
  gather_rows(sin, sin_out, index);
}

}  // namespace ariadne
