// Host-side pattern services: validation, names, and the owning block-sparse mask.
#include "ariadne/pattern.hpp"
#include "core/parse.hpp"

#include <random>
#include <sstream>

namespace ariadne {

namespace {

void check_cu(const int32_t* cu, int32_t n, int64_t total, const char* name) {
  ARIADNE_CHECK(cu[0] == 0, "pattern.", name, "[0] is ", cu[0], ", expected 0");
  for (int32_t s = 0; s < n; ++s)
    ARIADNE_CHECK(cu[s + 1] >= cu[s], "pattern.", name, " must be non-decreasing: entry ", s + 1, " is ",
                  cu[s + 1], " < entry ", s, " = ", cu[s]);
  ARIADNE_CHECK(cu[n] == total, "pattern.", name, "[", n, "] is ", cu[n], ", expected the packed length ", total);
}

}  // namespace

void validate_pattern(const Pattern& p, int64_t total_q, int64_t total_k, int heads_q) {
  ARIADNE_CHECK(p.window_left == kUnbounded || p.window_left >= 0, "pattern.window_left is ", p.window_left,
                ", expected >= 0 or unbounded (-1)");
  ARIADNE_CHECK(p.window_right == kUnbounded || p.window_right >= 0, "pattern.window_right is ",
                p.window_right, ", expected >= 0 or unbounded (-1)");
  ARIADNE_CHECK(p.chunk >= 0, "pattern.chunk is ", p.chunk, ", expected >= 0 (0 = no chunks)");
  ARIADNE_CHECK(p.num_seqs >= 1, "pattern.num_seqs is ", p.num_seqs, ", expected >= 1");
  if (p.cu_seqlens_q == nullptr) {
    ARIADNE_CHECK(p.num_seqs == 1, "pattern.num_seqs is ", p.num_seqs, " but cu_seqlens_q is null");
    ARIADNE_CHECK(p.cu_seqlens_k == nullptr, "pattern.cu_seqlens_k is set but cu_seqlens_q is null");
  } else {
    check_cu(p.cu_seqlens_q, p.num_seqs, total_q, "cu_seqlens_q");
    if (p.cu_seqlens_k) check_cu(p.cu_seqlens_k, p.num_seqs, total_k, "cu_seqlens_k");
    else ARIADNE_CHECK(total_q == total_k, "pattern: cu_seqlens_k is null, which means keys follow cu_seqlens_q, but q has ",
                       total_q, " rows and k has ", total_k);
  }
  const BlockSparseView& b = p.blocks;
  if (!b.defined()) return;
  ARIADNE_CHECK(b.block > 0, "pattern.blocks.block is ", b.block, ", expected > 0");
  ARIADNE_CHECK(b.heads == heads_q, "pattern.blocks.heads is ", b.heads, ", expected heads_q = ", heads_q);
  ARIADNE_CHECK(p.cu_seqlens_q == nullptr || b.seq_block_base != nullptr,
                "pattern.blocks.seq_block_base is null for a varlen pattern");
  int64_t expected_base = 0;
  for (int32_t s = 0; s < p.num_seqs; ++s) {
    const SeqExtent e = p.seq(s, total_q, total_k);
    const int64_t nqb = (e.lq + b.block - 1) / b.block, nkb = (e.lk + b.block - 1) / b.block;
    if (p.cu_seqlens_q)
      ARIADNE_CHECK(b.seq_block_base[s] == expected_base, "pattern.blocks.seq_block_base[", s, "] is ",
                    b.seq_block_base[s], ", expected ", expected_base, " (prefix sum of ceil(lq/block))");
    for (int h = 0; h < heads_q; ++h)
      for (int64_t m = 0; m < nqb; ++m) {
        const int64_t row = p.block_row(s, e, h, m);
        const int32_t lo = b.row_ptr[row], hi = b.row_ptr[row + 1];
        ARIADNE_CHECK(lo <= hi, "pattern.blocks.row_ptr decreases at row ", row, " (sequence ", s, ", head ", h,
                      ", query block ", m, ")");
        ARIADNE_CHECK(lo == hi || b.col_idx != nullptr, "pattern.blocks.col_idx is null but row ", row,
                      " lists ", hi - lo, " blocks");
        for (int32_t i = lo; i < hi; ++i) {
          const int32_t c = b.col_idx[i];
          ARIADNE_CHECK(c >= 0 && c < nkb, "pattern.blocks.col_idx[", i, "] = ", c, " is out of range [0, ", nkb,
                        ") for sequence ", s, ", head ", h, ", query block ", m);
          ARIADNE_CHECK(i == lo || c > b.col_idx[i - 1], "pattern.blocks.col_idx row ", row, " (sequence ", s,
                        ", head ", h, ", query block ", m, ") is not strictly increasing at entry ", i);
        }
      }
    expected_base += nqb;
  }
  if (p.cu_seqlens_q)
    ARIADNE_CHECK(b.seq_block_base[p.num_seqs] == expected_base, "pattern.blocks.seq_block_base[", p.num_seqs,
                  "] is ", b.seq_block_base[p.num_seqs], ", expected ", expected_base);
  ARIADNE_CHECK(b.row_ptr[0] == 0, "pattern.blocks.row_ptr[0] is ", b.row_ptr[0], ", expected 0");
}

std::string describe(const Pattern& p) {
  std::ostringstream os;
  auto side = [](int64_t w) { return w == kUnbounded ? std::string("inf") : std::to_string(w); };
  if (p.window_left == kUnbounded && p.window_right == kUnbounded) os << "full";
  else if (p.is_causal()) os << "causal";
  else os << "window(" << side(p.window_left) << "," << side(p.window_right) << ")";
  if (p.chunk > 0) os << "+chunk(" << p.chunk << ")";
  if (p.blocks.defined()) os << "+blocks(" << p.blocks.block << ")";
  if (p.cu_seqlens_q) os << "+varlen(" << p.num_seqs << ")";
  return os.str();
}

BlockSparseView BlockMask::view() const {
  BlockSparseView v;
  v.block = block;
  v.heads = heads;
  v.seq_block_base = seq_block_base.data();
  v.row_ptr = row_ptr.data();
  v.col_idx = col_idx.data();
  return v;
}

BlockMask BlockMask::from_lists(int32_t block, int32_t heads, const std::vector<int64_t>& q_lengths,
                                const std::vector<std::vector<int32_t>>& rows) {
  ARIADNE_CHECK(block > 0, "BlockMask: block is ", block, ", expected > 0");
  ARIADNE_CHECK(heads > 0, "BlockMask: heads is ", heads, ", expected > 0");
  BlockMask m;
  m.block = block;
  m.heads = heads;
  m.seq_block_base.push_back(0);
  for (int64_t lq : q_lengths) m.seq_block_base.push_back(m.seq_block_base.back() + int32_t((lq + block - 1) / block));
  const int64_t expected_rows = int64_t(m.seq_block_base.back()) * heads;
  ARIADNE_CHECK(int64_t(rows.size()) == expected_rows, "BlockMask: ", rows.size(), " rows given, expected ",
                expected_rows, " (sequences x heads x query blocks)");
  m.row_ptr.push_back(0);
  for (const auto& r : rows) {
    m.col_idx.insert(m.col_idx.end(), r.begin(), r.end());
    m.row_ptr.push_back(int32_t(m.col_idx.size()));
  }
  return m;
}

BlockMask BlockMask::all_visible(const Pattern& dense, int32_t block, int32_t heads, int64_t total_q,
                                 int64_t total_k) {
  std::vector<int64_t> lq;
  std::vector<std::vector<int32_t>> rows;
  for (int32_t s = 0; s < dense.num_seqs; ++s) {
    const SeqExtent e = dense.seq(s, total_q, total_k);
    lq.push_back(e.lq);
    const int64_t nqb = (e.lq + block - 1) / block, nkb = (e.lk + block - 1) / block;
    for (int h = 0; h < heads; ++h)
      for (int64_t m = 0; m < nqb; ++m) {
        std::vector<int32_t> r;
        const int64_t q_lo = m * block, q_hi = std::min<int64_t>(e.lq, q_lo + block);
        for (int64_t n = 0; n < nkb; ++n)
          if (dense.classify(e, q_lo, q_hi, n * block, std::min<int64_t>(e.lk, (n + 1) * block)) != TileKind::none)
            r.push_back(int32_t(n));
        rows.push_back(std::move(r));
      }
  }
  return from_lists(block, heads, lq, rows);
}

BlockMask BlockMask::random(const Pattern& dense, int32_t block, int32_t heads, int64_t total_q, int64_t total_k,
                            double density, uint64_t seed, bool keep_diagonal) {
  ARIADNE_CHECK(density >= 0 && density <= 1, "BlockMask::random: density is ", density, ", expected in [0, 1]");
  const BlockMask all = all_visible(dense, block, heads, total_q, total_k);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<int64_t> lq;
  std::vector<std::vector<int32_t>> rows;
  for (int32_t s = 0; s < dense.num_seqs; ++s) {
    const SeqExtent e = dense.seq(s, total_q, total_k);
    lq.push_back(e.lq);
    const int64_t nqb = (e.lq + block - 1) / block;
    for (int h = 0; h < heads; ++h)
      for (int64_t m = 0; m < nqb; ++m) {
        const int64_t row = int64_t(all.seq_block_base[size_t(s)]) * heads + h * nqb + m;
        const int64_t diag = Pattern::floordiv(std::min(e.lq, (m + 1) * block) - 1 + e.offset(), block);
        std::vector<int32_t> kept;
        for (int32_t i = all.row_ptr[size_t(row)]; i < all.row_ptr[size_t(row + 1)]; ++i) {
          const int32_t c = all.col_idx[size_t(i)];
          if (u(rng) < density || (keep_diagonal && c == diag)) kept.push_back(c);
        }
        rows.push_back(std::move(kept));
      }
  }
  return from_lists(block, heads, lq, rows);
}

PatternSpec parse_pattern_spec(const std::string& text) {
  PatternSpec spec;
  const auto colon = text.find(':');
  const std::string kind = text.substr(0, colon), arg = colon == std::string::npos ? "" : text.substr(colon + 1);
  auto number = [&](const std::string& s, const char* what) {
    const auto v = parse_real(s);
    ARIADNE_CHECK(v.has_value(), "pattern '", text, "': ", what, " '", s, "' is not a number");
    return *v;
  };
  auto integer = [&](const std::string& s, const char* what) {
    const double v = number(s, what);
    // Range first: converting NaN, inf or 1e300 to int64 is undefined behaviour.
    ARIADNE_CHECK(v >= 0 && v < 1e9 && v == double(int64_t(v)), "pattern '", text, "': ", what, " must be a non-negative integer, got '", s, "'");
    return int64_t(v);
  };
  if (kind == "full" && arg.empty()) {
    spec.dense = Pattern::full();
  } else if (kind == "causal" && arg.empty()) {
    spec.dense = Pattern::causal();
  } else if (kind == "window" && !arg.empty()) {
    const auto comma = arg.find(',');
    const int64_t l = integer(arg.substr(0, comma), "left window");
    const int64_t r = comma == std::string::npos ? l : integer(arg.substr(comma + 1), "right window");
    spec.dense = Pattern::window(l, r);
  } else if (kind == "chunk" && !arg.empty()) {
    const int64_t c = integer(arg, "chunk size");
    ARIADNE_CHECK(c > 0, "pattern '", text, "': chunk size must be > 0");
    spec.dense = Pattern::chunked(c);
  } else if (kind == "blocks" && !arg.empty()) {
    const auto at = arg.find('@');
    spec.block_density = number(arg.substr(0, at), "block density");
    ARIADNE_CHECK(spec.block_density > 0 && spec.block_density <= 1, "pattern '", text, "': block density must be in (0, 1]");
    if (at != std::string::npos) spec.block = int32_t(integer(arg.substr(at + 1), "block size"));
    ARIADNE_CHECK(spec.block > 0, "pattern '", text, "': block size must be > 0");
    spec.dense = Pattern::causal();
  } else {
    detail::fail("pattern '", text, "': expected full, causal, window:L,R, window:W, chunk:C or blocks:D[@B]");
  }
  return spec;
}

std::vector<uint8_t> BlockMask::to_dense(int32_t s, int32_t head, int64_t lq, int64_t lk) const {
  const int64_t nqb = (lq + block - 1) / block, nkb = (lk + block - 1) / block;
  std::vector<uint8_t> d(size_t(nqb * nkb), 0);
  for (int64_t m = 0; m < nqb; ++m) {
    const int64_t row = int64_t(seq_block_base.at(size_t(s))) * heads + head * nqb + m;
    for (int32_t i = row_ptr.at(size_t(row)); i < row_ptr.at(size_t(row + 1)); ++i)
      d[size_t(m * nkb + col_idx[size_t(i)])] = 1;
  }
  return d;
}

}  // namespace ariadne
