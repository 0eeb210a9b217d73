// ariadne/pattern.hpp — the single description of "which query sees which key".
//
// The CPU reference, the fast CPU kernels, the CUDA kernels, the estimators and the cost model all
// read this struct; nothing else decides visibility.
//
// Coordinates. Tokens are packed: a batch of sequences (images, prompts) is one run of total_q
// query rows and total_k key rows, cut by cu_seqlens_q / cu_seqlens_k (FlashAttention's varlen
// convention). Attention never crosses sequences. Inside sequence s, query iq (0-based, local) has
// the key-coordinate position p = iq + (lk − lq): queries are aligned to the *end* of the keys
// (bottom-right), so chunked prefill (lq < lk) with a causal mask does the right thing and lq == lk
// gives p = iq.
//
// The element rule, all conditions together:
//   window:  p − window_left <= ik <= p + window_right      (kUnbounded disables a side)
//   chunk:   ik / chunk == p / chunk                          (chunk > 0 only)
//   blocks:  key block ik / block is listed for (s, head, query block iq / block)  (CSR, optional)
// full = window(∞, ∞); causal = window(∞, 0); sliding window ±64 = window(64, 64).
//
// Pointers (cu_seqlens, CSR arrays) live on the device of the kernel that reads them: host memory
// for the CPU backends, device memory for CUDA. The struct is trivially copyable and is passed to
// kernels by value.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ariadne/tensor.hpp"

namespace ariadne {

constexpr int64_t kUnbounded = -1;

// Tile classification: a (query tile, key tile) pair is skipped, computed with an element mask,
// or computed without one.
enum class TileKind : uint8_t { none, partial, full };

// Block-sparse mask in CSR form. Rows are (sequence, query head, query block), enumerated as
//   row(s, h, m) = seq_block_base[s] * heads + h * nqb(s) + m,     nqb(s) = ceil(lq(s) / block)
// where seq_block_base is the prefix sum of nqb over sequences (num_seqs + 1 entries). Each row
// lists key-block indices (local to the sequence) in strictly increasing order. An estimator's
// output is a kernel's input with no conversion.
struct BlockSparseView {
  int32_t block = 0;  // tokens per block, for query and key blocks alike
  int32_t heads = 0;  // query heads the mask has rows for
  const int32_t* seq_block_base = nullptr;  // [num_seqs + 1]
  const int32_t* row_ptr = nullptr;         // [rows + 1]
  const int32_t* col_idx = nullptr;         // [row_ptr[rows]]
  ARIADNE_HD bool defined() const { return row_ptr != nullptr; }
};

// One sequence's extent in the packed token runs.
struct SeqExtent {
  int64_t q0 = 0, k0 = 0;  // first packed row of this sequence's queries / keys
  int64_t lq = 0, lk = 0;  // lengths
  ARIADNE_HD int64_t offset() const { return lk - lq; }  // key position of query 0
};

struct KeyRange {
  int64_t lo = 0, hi = 0;  // half-open, local key indices
  ARIADNE_HD bool empty() const { return hi <= lo; }
};

struct Pattern {
  int64_t window_left = kUnbounded;
  int64_t window_right = kUnbounded;
  int64_t chunk = 0;  // > 0: a query sees only keys of its own chunk of this many positions
  int32_t num_seqs = 1;
  const int32_t* cu_seqlens_q = nullptr;  // [num_seqs + 1]; null: one sequence of all rows
  const int32_t* cu_seqlens_k = nullptr;  // [num_seqs + 1]; null: same as cu_seqlens_q
  BlockSparseView blocks;                 // undefined: dense

  // ---- constructors of the common patterns ----
  static Pattern full() { return Pattern{}; }
  static Pattern causal() { return window(kUnbounded, 0); }
  static Pattern window(int64_t left, int64_t right) {
    Pattern p;
    p.window_left = left;
    p.window_right = right;
    return p;
  }
  static Pattern chunked(int64_t chunk_size) {
    Pattern p;
    p.chunk = chunk_size;
    return p;
  }
  // Same pattern, applied per sequence of a packed batch.
  Pattern with_varlen(int32_t n, const int32_t* cu_q, const int32_t* cu_k = nullptr) const {
    Pattern p = *this;
    p.num_seqs = n;
    p.cu_seqlens_q = cu_q;
    p.cu_seqlens_k = cu_k;
    return p;
  }
  Pattern with_blocks(const BlockSparseView& b) const {
    Pattern p = *this;
    p.blocks = b;
    return p;
  }
  ARIADNE_HD bool is_causal() const { return window_right == 0 && window_left == kUnbounded; }

  // ---- sequence bookkeeping ----
  ARIADNE_HD SeqExtent seq(int32_t s, int64_t total_q, int64_t total_k) const {
    SeqExtent e;
    if (cu_seqlens_q == nullptr) {
      e.lq = total_q;
      e.lk = total_k;
      return e;
    }
    const int32_t* cuk = cu_seqlens_k ? cu_seqlens_k : cu_seqlens_q;
    e.q0 = cu_seqlens_q[s];
    e.lq = cu_seqlens_q[s + 1] - e.q0;
    e.k0 = cuk[s];
    e.lk = cuk[s + 1] - e.k0;
    return e;
  }

  // ---- element level ----
  // The dense part of the rule (window and chunk), local indices.
  ARIADNE_HD bool allowed_dense(const SeqExtent& e, int64_t iq, int64_t ik) const {
    const int64_t p = iq + e.offset();
    if (window_left != kUnbounded && ik < p - window_left) return false;
    if (window_right != kUnbounded && ik > p + window_right) return false;
    if (chunk > 0 && floordiv(ik, chunk) != floordiv(p, chunk)) return false;
    return ik >= 0 && ik < e.lk;
  }
  // Row of the CSR mask for (sequence, head, query block); only when blocks are defined.
  ARIADNE_HD int64_t block_row(int32_t s, const SeqExtent& e, int32_t head, int64_t qblock) const {
    const int64_t nqb = (e.lq + blocks.block - 1) / blocks.block;
    const int64_t base = cu_seqlens_q ? blocks.seq_block_base[s] : 0;
    return base * blocks.heads + head * nqb + qblock;
  }
  // Whether key block kb is listed in CSR row `row` (binary search; rows are sorted).
  ARIADNE_HD bool block_listed(int64_t row, int64_t kb) const {
    int64_t lo = blocks.row_ptr[row], hi = blocks.row_ptr[row + 1];
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      const int64_t c = blocks.col_idx[mid];
      if (c == kb) return true;
      if (c < kb) lo = mid + 1; else hi = mid;
    }
    return false;
  }
  // The whole rule. `head` is the query head (block-sparse masks are per query head).
  ARIADNE_HD bool allowed(int32_t s, const SeqExtent& e, int32_t head, int64_t iq, int64_t ik) const {
    if (!allowed_dense(e, iq, ik)) return false;
    if (!blocks.defined()) return true;
    return block_listed(block_row(s, e, head, iq / blocks.block), ik / blocks.block);
  }

  // ---- tile level (dense part; block-sparse kernels intersect with their CSR row) ----
  // Keys that any query in [q_lo, q_hi) may see: a superset bound, exact for window and chunk.
  ARIADNE_HD KeyRange key_range(const SeqExtent& e, int64_t q_lo, int64_t q_hi) const {
    KeyRange r{0, e.lk};
    if (q_hi <= q_lo) return KeyRange{0, 0};
    const int64_t p_lo = q_lo + e.offset(), p_hi = q_hi - 1 + e.offset();
    if (window_left != kUnbounded) r.lo = max64(r.lo, p_lo - window_left);
    if (window_right != kUnbounded) r.hi = min64(r.hi, p_hi + window_right + 1);
    if (chunk > 0) {
      r.lo = max64(r.lo, floordiv(p_lo, chunk) * chunk);
      r.hi = min64(r.hi, (floordiv(p_hi, chunk) + 1) * chunk);
    }
    if (r.hi < r.lo) r.hi = r.lo;
    return r;
  }
  // The transpose of key_range: local queries that may see any key in [k_lo, k_hi) (half-open), a
  // superset bound, exact for window and chunk. The backward walks it for each key tile.
  ARIADNE_HD KeyRange query_range(const SeqExtent& e, int64_t k_lo, int64_t k_hi) const {
    if (k_hi <= k_lo) return KeyRange{0, 0};
    int64_t p_lo = 0 + e.offset(), p_hi = e.lq + e.offset();  // positions of the sequence's queries
    if (window_right != kUnbounded) p_lo = max64(p_lo, k_lo - window_right);
    if (window_left != kUnbounded) p_hi = min64(p_hi, k_hi - 1 + window_left + 1);
    if (chunk > 0) {
      p_lo = max64(p_lo, floordiv(k_lo, chunk) * chunk);
      p_hi = min64(p_hi, (floordiv(k_hi - 1, chunk) + 1) * chunk);
    }
    KeyRange r{p_lo - e.offset(), p_hi - e.offset()};
    if (r.hi < r.lo) r.hi = r.lo;
    return r;
  }
  // none: no pair allowed; full: every pair allowed (no element mask needed); else partial.
  // Tiles are clipped to the sequence by the caller (q_hi <= lq, k_hi <= lk).
  ARIADNE_HD TileKind classify(const SeqExtent& e, int64_t q_lo, int64_t q_hi, int64_t k_lo,
                               int64_t k_hi) const {
    const KeyRange r = key_range(e, q_lo, q_hi);
    if (k_hi <= r.lo || k_lo >= r.hi || q_hi <= q_lo || k_hi <= k_lo) return TileKind::none;
    const int64_t p_lo = q_lo + e.offset(), p_hi = q_hi - 1 + e.offset();
    bool full_tile = true;
    // every query's lower bound must be <= k_lo and upper bound >= k_hi - 1
    if (window_left != kUnbounded && k_lo < p_hi - window_left) full_tile = false;
    if (window_right != kUnbounded && k_hi - 1 > p_lo + window_right) full_tile = false;
    if (chunk > 0 && !(floordiv(p_lo, chunk) == floordiv(p_hi, chunk) &&
                       floordiv(k_lo, chunk) == floordiv(p_lo, chunk) &&
                       floordiv(k_hi - 1, chunk) == floordiv(p_lo, chunk)))
      full_tile = false;
    return full_tile ? TileKind::full : TileKind::partial;
  }

  // Number of allowed keys for local query iq (dense part), in O(1).
  ARIADNE_HD int64_t keys_per_query(const SeqExtent& e, int64_t iq) const {
    const KeyRange r = key_range(e, iq, iq + 1);
    return r.hi > r.lo ? r.hi - r.lo : 0;
  }

  ARIADNE_HD static int64_t floordiv(int64_t a, int64_t b) {
    const int64_t q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
  }
  ARIADNE_HD static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
  ARIADNE_HD static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
};

// Host-side checks of a pattern against packed lengths: cu_seqlens monotone and ending at the
// totals, window sides >= 0 or kUnbounded, chunk >= 0, CSR rows sorted, in range and matching the
// number of query blocks. Pointers must be host pointers. Throws ariadne::Error naming the field.
void validate_pattern(const Pattern& p, int64_t total_q, int64_t total_k, int heads_q);

// Visits every key block a block-sparse pattern lists, row by row in CSR order:
// fn(sequence, extent, head, query block, key block). Host pointers only; the pattern must have
// passed validate_pattern. The one walk over the CSR that host-side consumers (the cost model,
// masks, metrics) share.
template <class Fn>
void for_each_listed_block(const Pattern& p, int64_t total_q, int64_t total_k, Fn&& fn) {
  const int64_t B = p.blocks.block;
  for (int32_t s = 0; s < p.num_seqs; ++s) {
    const SeqExtent e = p.seq(s, total_q, total_k);
    const int64_t nqb = (e.lq + B - 1) / B;
    for (int32_t h = 0; h < p.blocks.heads; ++h)
      for (int64_t qb = 0; qb < nqb; ++qb) {
        const int64_t row = p.block_row(s, e, h, qb);
        for (int32_t i = p.blocks.row_ptr[row]; i < p.blocks.row_ptr[row + 1]; ++i)
          fn(s, e, h, qb, int64_t(p.blocks.col_idx[i]));
      }
  }
}

// Short human-readable name: "full", "causal", "window(64,64)", "chunk(64)", "+blocks(128)" ...
std::string describe(const Pattern& p);

// Owning block-sparse mask (host). Built by estimators, tests and the CLI; view() feeds a Pattern.
struct BlockMask {
  int32_t block = 0;
  int32_t heads = 0;
  std::vector<int32_t> seq_block_base;  // [num_seqs + 1]
  std::vector<int32_t> row_ptr;         // [rows + 1]
  std::vector<int32_t> col_idx;

  BlockSparseView view() const;
  int64_t rows() const { return int64_t(row_ptr.size()) - 1; }
  int64_t nnz() const { return row_ptr.empty() ? 0 : row_ptr.back(); }

  // From per-row key-block lists. q_lengths: query length of each sequence.
  static BlockMask from_lists(int32_t block, int32_t heads, const std::vector<int64_t>& q_lengths,
                              const std::vector<std::vector<int32_t>>& rows);
  // Every key block that the dense pattern lets each query block touch (the "all blocks" mask).
  static BlockMask all_visible(const Pattern& dense, int32_t block, int32_t heads,
                               int64_t total_q, int64_t total_k);
  // Random mask over the blocks `dense` lets each query block touch: each kept with probability
  // `density` (seeded). keep_diagonal keeps the block holding each query block's last query
  // position, so no row ends up fully masked by the sampling alone.
  static BlockMask random(const Pattern& dense, int32_t block, int32_t heads, int64_t total_q, int64_t total_k,
                          double density, uint64_t seed, bool keep_diagonal);
  // Dense 0/1 matrix of one (sequence, head): [nqb x nkb] row-major, for tests and pictures.
  std::vector<uint8_t> to_dense(int32_t s, int32_t head, int64_t lq, int64_t lk) const;
};

// A pattern named on a command line or in a benchmark case:
//   full | causal | window:L,R | window:W (= W,W) | chunk:C | blocks:D[@B]
// blocks:D is causal with a random block-sparse mask keeping a share D in (0, 1] of the causal
// blocks of B tokens (default 128). Errors name the text and what was expected.
struct PatternSpec {
  Pattern dense;
  double block_density = 0;  // > 0: add a random block mask (BlockMask::random)
  int32_t block = 128;
};
PatternSpec parse_pattern_spec(const std::string& text);

}  // namespace ariadne
