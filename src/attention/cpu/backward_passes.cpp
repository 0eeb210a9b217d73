// The fast CPU backward's two passes (backward.hpp), both over blocks of query rows × one key tile
// whose P = 2^(t − lse) and dP = dO·Vᵀ are recomputed from the saved LSE:
//   query pass  items (sequence, query head, query tile of ≤ 64 rows): over the key tiles the
//               forward's walk visits, P and dP (kept for the item), then per row
//               D = Σ_j (p_j / z) dP_j with z = Σ_j p_j (+ the denominator sink's p), then
//               dS = P ∘ (dP − D) and dq += dS·K; the denominator sink's term −p_sink·D;
//   key pass    items (sequence, KV head, key tile), after the query pass: for every query head of
//               the group and every chunk of ≤ 32 query rows that Pattern::query_range says may
//               see the tile, dv += Pᵀ·dO and dk += dSᵀ·Q (the P·V primitive on the transposed
//               32 × 32 block); tile 0 also sums the key-0 bias sink's dS_i0.
// D comes from the recomputed P and dP rather than from dout · out: P is normalized by the saved
// fp32 LSE and out is rounded to its dtype, and Σ_j dS_ij = D·p_sink (0 without a sink) is the
// difference of two near-equal sums whenever one key holds most of a row's mass (a key-0 bias of
// +10) or logits are large (±1e4): there the rounding of out or of the LSE, amplified by |k| in
// dq, exceeds the gradient tolerance (measured: 0.14–0.21 rel. L2 against 0.02–0.04 with bf16 out).
// With D from the same P and dP that dS uses, the sum cancels to fp32 rounding; and a row that sees
// one key gets p̂ = p/p = 1 and D = dP exactly, so its dS and dq are exactly 0, as in exact
// arithmetic. The two passes do 7 tile products per block, as many as a single key-major pass
// would with this D (it needs a pre-pass for D), and every output belongs to one item: no atomics,
// no per-thread copies, sums in a fixed order.
#include <omp.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "attention/cpu/backward.hpp"

namespace ariadne::cpu {
namespace {

// α = 1 for the P·V primitive, which rescales its accumulator by α (the forward's online softmax).
struct Ones {
  float v[kBwdQueryTile];
  Ones() { std::fill(v, v + kBwdQueryTile, 1.f); }
};
const Ones kOnes;

// dst[j][i] = src[i][j] for i < n (rows of src, 32 columns), zero for i in [n, 32).
void transpose_block(const float* src, int n, float* dst) {
  for (int j = 0; j < kKeyTile; ++j) {
    float* row = dst + j * kBwdChunk;
    for (int i = 0; i < n; ++i) row[i] = src[i * kKeyTile + j];
    for (int i = n; i < kBwdChunk; ++i) row[i] = 0.f;
  }
}

// Σ of one row of 32 in double, in a fixed order: 4 interleaved partials (vectorizable without
// reassociation), then the partials in order. Double because D and z feed the cancellations of
// backward_passes' header: fp32 sums there measured 1.1× the f32 gradient tolerance (a key-0 bias
// of +10).
double row_sum(const float* x) {
  double part[4] = {};
  for (int j = 0; j < kKeyTile; j += 4)
    for (int l = 0; l < 4; ++l) part[l] += double(x[j + l]);
  return (part[0] + part[1]) + (part[2] + part[3]);
}

}  // namespace

void BackwardRunner::load_rows(Scratch& sc, const SeqExtent& e, int h, int64_t q_lo, int rows) const {
  for (int r = 0; r < rows; ++r) {
    const int64_t i = int64_t(h) * total_q_ + e.q0 + q_lo + r;
    const KeyRange kr = pat_.key_range(e, q_lo + r, q_lo + r + 1);
    const float l2 = lse2_[size_t(i)], D = D_[size_t(i)];
    const bool none = kr.empty() || l2 == kNegInf;
    const bool nan = l2 != l2 || D != D;
    sc.row_lo[r] = kr.lo;
    sc.row_hi[r] = none ? kr.lo : kr.hi;
    sc.nan_row[r] = nan;
    sc.off[r] = none || nan ? 0.f : l2;
    sc.D[r] = D;
  }
}

void BackwardRunner::p_dp(Scratch& sc, const RowMask& mk, int g, int32_t s, int64_t t, const float* q,
                          const float* dout, int r0, int r1, float* p, float* dp) const {
  const int n = r1 - r0;
  float* S = sc.s.data() + r0 * kKeyTile;
  float* P = p + r0 * kKeyTile;
  k_.qk_f32(q, dv_, kt(g, s, t), d_, n, S);
  k_.probs(S, mk, n, sc.off.data() + r0, P);
  k_.qk_f32(dout, dv_, vt(g, s, t), d_, n, dp + r0 * kKeyTile);
  for (int r = 0; r < n; ++r) {
    if (!sc.nan_row[size_t(r0 + r)]) continue;
    // A NaN LSE or D (the forward poisoned the row, or dout holds a NaN): NaN on every key the
    // row sees, as the reference gives; the exponential primitives do not carry NaN through.
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (int j = mk.lo[r]; j < mk.hi[r]; ++j)
      if ((mk.keymask >> j) & 1u) P[r * kKeyTile + j] = nan;
  }
}

void BackwardRunner::d_s(Scratch& sc, const float* p, const float* dp, int r0, int r1) const {
  for (int r = r0; r < r1; ++r) {
    const float D = sc.D[size_t(r)];
    const float* pr = p + r * kKeyTile;
    const float* dpr = dp + r * kKeyTile;
    float* dsr = sc.ds.data() + r * kKeyTile;
    // Masked keys (p = 0) stay exactly 0 whatever dP − D is.
    for (int j = 0; j < kKeyTile; ++j) dsr[j] = pr[j] == 0.f ? 0.f : pr[j] * (dpr[j] - D);
  }
}

void BackwardRunner::passes() {
  struct Item {
    int32_t seq;
    int head;  // KV head (key items) or query head (query items)
    int64_t lo, hi;  // key tile (key items: lo) or query rows
  };
  std::vector<Item> key_items, query_items;
  for (int32_t s = 0; s < pat_.num_seqs; ++s) {
    const SeqExtent& e = seqs_[size_t(s)];
    const int64_t tiles = (e.lk + kKeyTile - 1) / kKeyTile;
    for (int g = 0; g < hkv_; ++g)
      for (int64_t t = 0; t < tiles; ++t) key_items.push_back({s, g, t, t + 1});
    for (int h = 0; h < hq_; ++h)
      for (int64_t lo = 0; lo < e.lq;) {
        const int64_t hi = query_tile_end(e, lo, kBwdQueryTile);
        query_items.push_back({s, h, lo, hi});
        lo = hi;
      }
  }
#pragma omp parallel num_threads(threads_)
  {
    Scratch sc = make_scratch();
#pragma omp for schedule(dynamic, 1)
    for (size_t i = 0; i < query_items.size(); ++i) {
      const Item& it = query_items[i];
      query_item(sc, it.seq, it.head, it.lo, it.hi);
    }  // the barrier here: the key pass reads every row's D
#pragma omp for schedule(dynamic, 1) nowait
    for (size_t i = 0; i < key_items.size(); ++i) key_item(sc, key_items[i].seq, key_items[i].head, key_items[i].lo);
#if defined(__SSE2__)
    _mm_sfence();  // order this thread's streaming stores (store_row) before the region ends
#endif
  }
}

void BackwardRunner::key_item(Scratch& sc, int32_t s, int g, int64_t t) {
  const SeqExtent& e = seqs_[size_t(s)];
  const int64_t k_lo = t * kKeyTile, k_hi = std::min(k_lo + kKeyTile, e.lk);
  float* dk = sc.acc_a.data();
  float* dv = sc.acc_b.data();
  std::fill(dk, dk + kKeyTile * dv_, 0.f);
  std::fill(dv, dv + kKeyTile * dv_, 0.f);
  const bool bias = p_.sink_mode == SinkMode::key0_bias;
  RowMask mk;
  mk.scale2 = scale2_;
  mk.apply_bias = bias && t == 0;
  const KeyRange qr = pat_.query_range(e, k_lo, k_hi);
  for (int h = g * group_; h < (g + 1) * group_; ++h) {
    mk.bias2 = bias ? float(double(sink(h)) * kLog2e) : 0.f;
    double bias_sum = 0;
    for (int64_t a = qr.lo; a < qr.hi;) {
      const int64_t b = std::min(query_tile_end(e, a, kBwdChunk), qr.hi);
      const int rows = int(b - a);
      const int64_t q_lo = a;
      a = b;
      uint32_t bits = ~0u;
      if (pat_.blocks.defined()) {
        bits = tile_block_bits(pat_, pat_.block_row(s, e, h, q_lo / pat_.blocks.block), t, e.lk);
        if (bits == 0) continue;
      }
      load_rows(sc, e, h, q_lo, rows);
      bool dense = false;
      const auto [r0, r1] =
          clip_rows_to_tile(sc.row_lo.data(), sc.row_hi.data(), rows, t, sc.lo.data(), sc.hi.data(), &dense);
      if (r0 >= r1) continue;
      mk.lo = sc.lo.data() + r0;
      mk.hi = sc.hi.data() + r0;
      mk.keymask = bits;
      mk.dense = dense && bits == ~0u;
      const int n = r1 - r0;
      const int64_t row0 = e.q0 + q_lo + r0;
      const float* q = q_rows(h, row0);
      const float* dout = do_rows(h, row0);
      p_dp(sc, mk, g, s, t, q, dout, r0, r1, sc.p.data(), sc.dp.data());
      d_s(sc, sc.p.data(), sc.dp.data(), r0, r1);
      transpose_block(sc.p.data() + r0 * kKeyTile, n, sc.pt.data());
      transpose_block(sc.ds.data() + r0 * kKeyTile, n, sc.dst.data());
      if (n < kBwdChunk) {  // the P·V primitive reads 32 operand rows: pad a short chunk with zeros
        const size_t used = size_t(n) * size_t(dv_), all = size_t(kBwdChunk) * size_t(dv_);
        std::memcpy(sc.pad_q.data(), q, used * sizeof(float));
        std::memcpy(sc.pad_do.data(), dout, used * sizeof(float));
        std::fill(sc.pad_q.begin() + used, sc.pad_q.begin() + all, 0.f);
        std::fill(sc.pad_do.begin() + used, sc.pad_do.begin() + all, 0.f);
        q = sc.pad_q.data();
        dout = sc.pad_do.data();
      }
      k_.pv_f32(sc.pt.data(), dout, dv_, dv_, kKeyTile, kOnes.v, dv);
      k_.pv_f32(sc.dst.data(), q, dv_, dv_, kKeyTile, kOnes.v, dk);
      if (mk.apply_bias)
        for (int r = 0; r < n; ++r) bias_sum += sc.ds[size_t((r0 + r) * kKeyTile)];
    }
    if (mk.apply_bias) sink_seqs_[size_t(int64_t(s) * hq_ + h)] = bias_sum;
  }
  for (int64_t j = 0; j < k_hi - k_lo; ++j) {
    const int64_t tok = e.k0 + k_lo + j;
    store_row(g_.dk, row_offset(g_.dk, tok, g), d_, dk + j * dv_, scale_, k_);
    store_row(g_.dv, row_offset(g_.dv, tok, g), d_, dv + j * dv_, 1.f, k_);
  }
}

void BackwardRunner::query_item(Scratch& sc, int32_t s, int h, int64_t q_lo, int64_t q_hi) {
  const SeqExtent& e = seqs_[size_t(s)];
  const int g = h / group_, rows = int(q_hi - q_lo);
  const int64_t i0 = int64_t(h) * total_q_ + e.q0 + q_lo;  // index of row 0 in the per-row arrays
  load_rows(sc, e, h, q_lo, rows);
  key_tile_visits(pat_, s, e, h, q_lo, q_hi, sc.visits);
  const size_t block = size_t(kBwdQueryTile) * kKeyTile, need = sc.visits.size() * block;
  if (sc.p_all.size() < need) {
    sc.p_all.resize(need);
    sc.dp_all.resize(need);
  }
  sc.spans.assign(sc.visits.size(), {0, 0});
  for (int r = 0; r < rows; ++r) {
    sc.z[size_t(r)] = psink_[size_t(i0 + r)];
    sc.dsum[size_t(r)] = 0.0;
  }
  const bool bias = p_.sink_mode == SinkMode::key0_bias;
  RowMask mk;
  mk.scale2 = scale2_;
  mk.bias2 = bias ? float(double(sink(h)) * kLog2e) : 0.f;
  auto set_mask = [&](size_t vi) {
    const TileVisit& v = sc.visits[vi];
    bool dense = false;
    const auto [r0, r1] =
        clip_rows_to_tile(sc.row_lo.data(), sc.row_hi.data(), rows, v.tile, sc.lo.data(), sc.hi.data(), &dense);
    mk.lo = sc.lo.data() + r0;
    mk.hi = sc.hi.data() + r0;
    mk.keymask = v.keymask;
    mk.dense = dense && v.keymask == ~0u;
    mk.apply_bias = bias && v.tile == 0;
    return std::pair<int, int>{r0, r1};
  };
  // P and dP of every visited tile; z = Σ_j p_j per row.
  for (size_t vi = 0; vi < sc.visits.size(); ++vi) {
    const auto [r0, r1] = set_mask(vi);
    if (r0 >= r1) continue;
    sc.spans[vi] = {r0, r1};
    const int64_t row0 = e.q0 + q_lo + r0;
    float* P = sc.p_all.data() + vi * block;
    p_dp(sc, mk, g, s, sc.visits[vi].tile, q_rows(h, row0), do_rows(h, row0), r0, r1, P, sc.dp_all.data() + vi * block);
    for (int r = r0; r < r1; ++r) sc.z[size_t(r)] += row_sum(P + r * kKeyTile);
  }
  // D = Σ_j (p_j / z) dP_j: a row that sees one key divides p by itself (exactly 1).
  for (size_t vi = 0; vi < sc.visits.size(); ++vi) {
    const auto [r0, r1] = sc.spans[vi];
    const float* P = sc.p_all.data() + vi * block;
    const float* dP = sc.dp_all.data() + vi * block;
    for (int r = r0; r < r1; ++r) {
      const float z = float(sc.z[size_t(r)]);
      if (!(z > 0.f) && z == z) continue;  // no mass on any key: D stays 0
      float terms[kKeyTile];
      for (int j = 0; j < kKeyTile; ++j) terms[j] = P[r * kKeyTile + j] / z * dP[r * kKeyTile + j];
      sc.dsum[size_t(r)] += row_sum(terms);
    }
  }
  for (int r = 0; r < rows; ++r) {
    const float D = float(sc.dsum[size_t(r)]);
    sc.D[size_t(r)] = D;
    D_[size_t(i0 + r)] = D;
    // The sink's share of the mass, normalized as the keys' are (z > 0 whenever it has any).
    const double z = sc.z[size_t(r)], ps = psink_[size_t(i0 + r)];
    if (p_.sink_mode == SinkMode::denominator && ps != 0) sink_rows_[size_t(i0 + r)] = -ps / z * D;
  }
  // dS and dq += dS·K.
  float* dq = sc.acc_a.data();
  std::fill(dq, dq + int64_t(rows) * dv_, 0.f);
  for (size_t vi = 0; vi < sc.visits.size(); ++vi) {
    const auto [r0, r1] = sc.spans[vi];
    if (r0 >= r1) continue;
    d_s(sc, sc.p_all.data() + vi * block, sc.dp_all.data() + vi * block, r0, r1);
    k_.pv_f32(sc.ds.data() + r0 * kKeyTile, kr(g, s, sc.visits[vi].tile), dv_, dv_, r1 - r0, kOnes.v,
              dq + int64_t(r0) * dv_);
  }
  for (int r = 0; r < rows; ++r)
    store_row(g_.dq, row_offset(g_.dq, e.q0 + q_lo + r, h), d_, dq + int64_t(r) * dv_, scale_, k_);
}

}  // namespace ariadne::cpu
