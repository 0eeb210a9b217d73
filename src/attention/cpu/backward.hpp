// Internal: the fast CPU backend's backward (attention_backward.hpp for the math), in three parts:
//   backward.cpp         entry points, the call's setup, the preprocess (packing, base-2 LSE, the
//                        denominator sink's probabilities)
//   backward_passes.cpp  the query-tile pass (D, dq, the denominator sink's terms), then the
//                        key-tile pass (dk, dv, the key-0 bias terms)
// It reuses the forward's tile walk (runner.hpp) and the ISA table's Q·Kᵀ, P·V and probability
// primitives (attention_kernels.hpp): every product of the backward is one of those two shapes, in
// fp32 (qk_f32, pv_f32) or, when q, k, v and dout are all bf16 and the table has bf16 products, in
// bf16 (qk_bf16, pv_bf16 / pv_bf16_batch: the tile unit on the AMX table). The table's backward
// primitives (grad_s, transpose32, row_sums) take the element-wise work where it has them.
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
    std::vector<double> z, dsum;      // query pass, per row: Σ_j p_j (+ the sink's), Σ_j p_j dP_j, then D
    std::vector<float> pt, dst;       // [32][32]: Pᵀ, dSᵀ (key pass), zero past the chunk's rows
    std::vector<float> pad_q, pad_do; // [32][dv]: a short chunk's rows, zero-padded to 32
    std::vector<float> acc_a, acc_b;  // [64][dv]: dq (query pass); [32][dv] dk, dv (key pass)
    std::vector<int64_t> row_lo, row_hi;
    std::vector<int32_t> lo, hi;
    std::vector<float> off, D;        // per row: the base-2 LSE (0 for rows without keys), D
    std::vector<uint8_t> nan_row;     // per row: the saved LSE is NaN (a poisoned forward row)
    std::vector<TileVisit> visits;
    // bf16 path, key pass: the pending chunks of one pv_bf16_batch call ([kPvBatch][32][32] Pᵀ and
    // dSᵀ) and the B operands of chunks that cannot be read in place ([kPvBatch][16][dv] row pairs).
    std::vector<float> pt_batch, dst_batch;
    std::vector<uint32_t> q_pairs, do_pairs;
  };
  Scratch make_scratch() const;

  // ---- preprocess (backward.cpp) ----
  void prepare();
  void pack_rows(const TensorView& t, int heads, float* dst) const;  // [heads][tokens][dv]
  // Where call-wide key tile gtile of KV head g lies: its slot in the packed arrays, its first key
  // token and its key count (< kKeyTile past a sequence's end).
  struct TileSpot {
    int64_t slot, tok0;
    int n;
  };
  TileSpot locate(int g, int64_t gtile) const;
  void pack_tiles(int g, int64_t gtile);
  void pack_tiles_bf16(int g, int64_t gtile);
  void pack_rows_bf16(const TensorView& t, uint16_t* rows, uint32_t* pairs) const;

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
  // bf16 path (bf16_: q, k, v and dout all bf16 and the table has bf16 products), the same operands
  // in the layouts of the bf16 primitives:
  //   kbt_, vbt_  [dp][32] pairs of head-dim entries: S = Q·Kᵀ and dP = dO·Vᵀ through qk_bf16
  //   kbr_        [16][dv] pairs of keys: dq += dS·K through pv_bf16
  // and per query head Q and dO as bf16 rows [total_q][dv] (the A operand of qk_bf16, zero past d)
  // and as pairs of rows [(total_q + 1) / 2][dv] (the B operand of dk += dSᵀ·Q and dv += Pᵀ·dO, read
  // in place by a key-pass chunk of 32 rows that starts at an even row).
  const uint32_t* kbt(int g, int32_t s, int64_t t) const { return kbt_ + tile_index(g, s, t) * ktile_b_; }
  const uint32_t* vbt(int g, int32_t s, int64_t t) const { return vbt_ + tile_index(g, s, t) * ktile_b_; }
  const uint32_t* kbr(int g, int32_t s, int64_t t) const { return kbr_ + tile_index(g, s, t) * krtile_b_; }
  const uint16_t* q_rows_b(int h, int64_t row) const { return qb_ + (int64_t(h) * total_q_ + row) * dv_; }
  const uint16_t* do_rows_b(int h, int64_t row) const { return dob_ + (int64_t(h) * total_q_ + row) * dv_; }
  const uint32_t* q_pairs(int h, int64_t row) const { return qpr_ + (int64_t(h) * qpairs_ + row / 2) * dv_; }
  const uint32_t* do_pairs(int h, int64_t row) const { return dopr_ + (int64_t(h) * qpairs_ + row / 2) * dv_; }

  // ---- the passes (backward_passes.cpp) ----
  // One parallel region: the query-tile items (they write the D that the key pass reads), then
  // the key-tile items.
  void passes();
  void key_item(Scratch& sc, int32_t s, int g, int64_t t);
  void query_item(Scratch& sc, int32_t s, int h, int64_t q_lo, int64_t q_hi);
  // Rows [0, rows) from local query row q_lo of head h: their key intervals, LSE offsets, D.
  void load_rows(Scratch& sc, const SeqExtent& e, int h, int64_t q_lo, int rows) const;
  // P and dP of rows [r0, r1) (of those load_rows loaded) against key tile t into p and dp (rows
  // from r0); the query rows start at row0 of head h.
  void p_dp(Scratch& sc, const RowMask& mk, int g, int32_t s, int64_t t, int h, int64_t row0, int r0, int r1,
            float* p, float* dp) const;
  // dS = P ∘ (dP − D) of rows [r0, r1) into ds (rows from r0; ds may be dp).
  void d_s(const Scratch& sc, const float* p, const float* dp, int r0, int r1, float* ds) const;
  // bf16 path, key pass: dv += Σ Pᵀ·dO and dk += Σ dSᵀ·Q over the `count` pending chunks.
  void flush_key_batch(Scratch& sc, const uint32_t* const* qb, const uint32_t* const* dob, int count, float* dk,
                       float* dv) const;
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
  int hq_ = 0, hkv_ = 0, group_ = 1, d_ = 0, dv_ = 0, dp_ = 0, threads_ = 1;
  bool bf16_ = false;
  float scale_ = 1.f, scale2_ = 1.f;
  std::vector<SeqExtent> seqs_;
  std::vector<int64_t> tile_base_;
  int64_t total_tiles_ = 0, ktile_ = 0, krtile_ = 0;
  float* kt_ = nullptr;
  float* vt_ = nullptr;
  float* kr_ = nullptr;
  float* qp_ = nullptr;
  float* dop_ = nullptr;
  int64_t ktile_b_ = 0, krtile_b_ = 0, qpairs_ = 0;
  uint32_t* kbt_ = nullptr;
  uint32_t* vbt_ = nullptr;
  uint32_t* kbr_ = nullptr;
  uint16_t* qb_ = nullptr;
  uint16_t* dob_ = nullptr;
  uint32_t* qpr_ = nullptr;
  uint32_t* dopr_ = nullptr;
  std::vector<float> lse2_, D_;       // [heads_q][total_q]: base-2 LSE, D = Σ_j p_j dP_j / z (see passes)
  std::vector<float> psink_;          // [heads_q][total_q]: exp(sink − lse) (denominator sink), else 0
  std::vector<double> sink_rows_;     // [heads_q][total_q]: denominator sink terms −p_sink·D
  std::vector<double> sink_seqs_;     // [num_seqs][heads_q]: key-0 bias terms Σ dS_i0
};

}  // namespace ariadne::cpu
