// Internal: the fast CPU backend's backward (attention_backward.hpp for the math), in three parts:
//   backward.cpp         entry points, the call's setup, the preprocess (packing, base-2 LSE, the
//                        denominator sink's probabilities)
//   backward_passes.cpp  the query-tile pass (D, dq, the denominator sink's terms), then the
//                        key-tile pass (dk, dv, the key-0 bias terms)
// It reuses the forward's tile walk (runner.hpp) and the ISA table's Q·Kᵀ, P·V and probability
// primitives (attention_kernels.hpp): every product of the backward is one of those two shapes.
//
// Determinism: every output element is written by exactly one work item, which sums its terms in
// a fixed order (query heads of the group, then query chunks, then keys of a tile); the sink
// gradient is summed per row, then over rows and sequences in index order. So the gradients are
// bit-identical for any thread count, not only run to run.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "ariadne/attention_backward.hpp"
#include "attention/cpu/runner.hpp"

namespace ariadne::cpu {

// Query rows per work item of the query pass (as the forward's tiles) and per chunk of the key
// pass: a chunk is the inner dimension of dk += dSᵀ·Q and dv += Pᵀ·dO, which the P·V primitive
// fixes at 32.
constexpr int kBwdQueryTile = 64;
constexpr int kBwdChunk = kKeyTile;

class BackwardRunner {
 public:
  BackwardRunner(const AttentionParams& p, const AttentionGrads& g);
  void run();

 private:
  // Per-thread scratch of the passes.
  struct Scratch {
    std::vector<float> s, p, dp, ds;  // [64][32]: raw dots, P, dP, dS
    std::vector<float> p_all, dp_all; // query pass: P and dP of every visited key tile, [visits][64][32]
    std::vector<std::pair<int, int>> spans;  // query pass: the rows [r0, r1) of each visit
    std::vector<double> z, dsum;      // query pass, per row: Σ_j p_j (+ the sink's), Σ_j p̂_j dP_j
    std::vector<float> pt, dst;       // [32][32]: Pᵀ, dSᵀ (key pass), zero past the chunk's rows
    std::vector<float> pad_q, pad_do; // [32][dv]: a short chunk's rows, zero-padded to 32
    std::vector<float> acc_a, acc_b;  // [64][dv]: dq (query pass); [32][dv] dk, dv (key pass)
    std::vector<int64_t> row_lo, row_hi;
    std::vector<int32_t> lo, hi;
    std::vector<float> off, D;        // per row: the base-2 LSE (0 for rows without keys), D
    std::vector<uint8_t> nan_row;     // per row: the saved LSE is NaN (a poisoned forward row)
    std::vector<TileVisit> visits;
  };
  Scratch make_scratch() const;

  // ---- preprocess (backward.cpp) ----
  void prepare();
  void pack_rows(const TensorView& t, int heads, float* dst) const;  // [heads][tokens][dv]
  void pack_tiles(int g, int64_t gtile);

  // Packed operands (each [kKeyTile] keys of one KV head):
  //   kt_, vt_  [d][32]  K and V transposed: S = Q·Kᵀ and dP = dO·Vᵀ through the Q·Kᵀ primitive
  //   kr_       [32][dv] K as rows: dq += dS·K through the P·V primitive
  // and per query head, rows [total_q][dv] of Q and dO (zero past d), so the key pass reads them
  // in place as the V operand of dk += dSᵀ·Q and dv += Pᵀ·dO.
  const float* kt(int g, int32_t s, int64_t t) const { return kt_ + tile_index(g, s, t) * ktile_; }
  const float* vt(int g, int32_t s, int64_t t) const { return vt_ + tile_index(g, s, t) * ktile_; }
  const float* kr(int g, int32_t s, int64_t t) const { return kr_ + tile_index(g, s, t) * krtile_; }
  int64_t tile_index(int g, int32_t s, int64_t t) const { return g * total_tiles_ + tile_base_[size_t(s)] + t; }
  const float* q_rows(int h, int64_t row) const { return qp_ + (int64_t(h) * total_q_ + row) * dv_; }
  const float* do_rows(int h, int64_t row) const { return dop_ + (int64_t(h) * total_q_ + row) * dv_; }

  // ---- the passes (backward_passes.cpp) ----
  // One parallel region: the query-tile items (they write the D that the key pass reads), then
  // the key-tile items.
  void passes();
  void key_item(Scratch& sc, int32_t s, int g, int64_t t);
  void query_item(Scratch& sc, int32_t s, int h, int64_t q_lo, int64_t q_hi);
  // Rows [0, rows) from local query row q_lo of head h: their key intervals, LSE offsets, D.
  void load_rows(Scratch& sc, const SeqExtent& e, int h, int64_t q_lo, int rows) const;
  // P and dP of rows [r0, r1) (of those load_rows loaded) against key tile t into p and dp (rows
  // from r0); q and dout point to row r0.
  void p_dp(Scratch& sc, const RowMask& mk, int g, int32_t s, int64_t t, const float* q, const float* dout, int r0,
            int r1, float* p, float* dp) const;
  // dS = P ∘ (dP − D) of rows [r0, r1) into sc.ds (rows from r0).
  void d_s(Scratch& sc, const float* p, const float* dp, int r0, int r1) const;
  int64_t query_tile_end(const SeqExtent& e, int64_t lo, int64_t tile) const {
    const int64_t seg = pat_.blocks.defined() ? int64_t(pat_.blocks.block) : std::max<int64_t>(e.lq, 1);
    return std::min({lo + tile, (lo / seg + 1) * seg, e.lq});
  }
  float sink(int h) const { return static_cast<const float*>(p_.sink.data)[h * p_.sink.stride[0]]; }

  const AttentionParams& p_;
  const AttentionGrads& g_;
  const Pattern& pat_;
  const TileKernels& k_;
  int64_t total_q_ = 0, total_k_ = 0;
  int hq_ = 0, hkv_ = 0, group_ = 1, d_ = 0, dv_ = 0, threads_ = 1;
  float scale_ = 1.f, scale2_ = 1.f;
  std::vector<SeqExtent> seqs_;
  std::vector<int64_t> tile_base_;
  int64_t total_tiles_ = 0, ktile_ = 0, krtile_ = 0;
  float* kt_ = nullptr;
  float* vt_ = nullptr;
  float* kr_ = nullptr;
  float* qp_ = nullptr;
  float* dop_ = nullptr;
  std::vector<float> lse2_, D_;       // [heads_q][total_q]: base-2 LSE, D = Σ_j p̂_j dP_j (see passes)
  std::vector<float> psink_;          // [heads_q][total_q]: exp(sink − lse) (denominator sink), else 0
  std::vector<double> sink_rows_;     // [heads_q][total_q]: denominator sink terms −p_sink·D
  std::vector<double> sink_seqs_;     // [num_seqs][heads_q]: key-0 bias terms Σ dS_i0
};

}  // namespace ariadne::cpu
