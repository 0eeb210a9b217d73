// The fast CPU backward's two passes (backward.hpp), both over blocks of query rows × one key tile
// whose P = 2^(t − lse) and dP = dO·Vᵀ are recomputed from the saved LSE:
//   query pass  items (sequence, query head, query tile of ≤ 64 rows): over the key tiles the
//               forward's walk visits, P and dP (kept for the item), then per row
//               D = Σ_j p_j dP_j / z with z = Σ_j p_j (+ the denominator sink's p), then
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
// one key gets D = p·dP / p = dP exactly (the products are exact in double), so its dS and dq are
// exactly 0, as in exact arithmetic. On the bf16 path (q, k, v, dout bf16) the five products run on
// the table's bf16 primitives with P and dS rounded to bf16 before theirs, as GPU kernels do; D and
// z still come from the fp32 P and dP. The two passes do 7 tile products per block, as many as a single key-major pass
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
void transpose_block(const TileKernels& k, const float* src, int n, float* dst) {
  if (k.transpose32 != nullptr) {
    k.transpose32(src, n, dst);
    return;
  }
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
template <class T>
double row_sum(const T* x) {
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

void BackwardRunner::p_dp(Scratch& sc, const RowMask& mk, int g, int32_t s, int64_t t, int h, int64_t row0, int r0,
                          int r1, float* p, float* dp) const {
  const int n = r1 - r0;
  float* S = sc.s.data() + r0 * kKeyTile;
  float* P = p + r0 * kKeyTile;
  if (bf16_) {  // exact bf16 products, fp32 sums: the same S and dP as the fp32 path up to summation order
    k_.qk_bf16(q_rows_b(h, row0), dv_, reinterpret_cast<const uint16_t*>(kbt(g, s, t)), dp_, n, S);
    k_.probs(S, mk, n, sc.off.data() + r0, P);
    k_.qk_bf16(do_rows_b(h, row0), dv_, reinterpret_cast<const uint16_t*>(vbt(g, s, t)), dp_, n, dp + r0 * kKeyTile);
  } else {
    k_.qk_f32(q_rows(h, row0), dv_, kt(g, s, t), d_, n, S);
    k_.probs(S, mk, n, sc.off.data() + r0, P);
    k_.qk_f32(do_rows(h, row0), dv_, vt(g, s, t), d_, n, dp + r0 * kKeyTile);
  }
  for (int r = 0; r < n; ++r) {
    if (!sc.nan_row[size_t(r0 + r)]) continue;
    // A NaN LSE or D (the forward poisoned the row, or dout holds a NaN): NaN on every key the
    // row sees, as the reference gives; the exponential primitives do not carry NaN through.
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (int j = mk.lo[r]; j < mk.hi[r]; ++j)
      if ((mk.keymask >> j) & 1u) P[r * kKeyTile + j] = nan;
  }
}

void BackwardRunner::d_s(const Scratch& sc, const float* p, const float* dp, int r0, int r1, float* ds) const {
  if (k_.grad_s != nullptr) {
    k_.grad_s(p + r0 * kKeyTile, dp + r0 * kKeyTile, sc.D.data() + r0, r1 - r0, ds + r0 * kKeyTile);
    return;
  }
  for (int r = r0; r < r1; ++r) {
    const float D = sc.D[size_t(r)];
    const float* pr = p + r * kKeyTile;
    const float* dpr = dp + r * kKeyTile;
    float* dsr = ds + r * kKeyTile;
    // Masked keys (p = 0) stay exactly 0 whatever dP − D is.
    for (int j = 0; j < kKeyTile; ++j) dsr[j] = pr[j] == 0.f ? 0.f : pr[j] * (dpr[j] - D);
  }
}

void BackwardRunner::flush_key_batch(Scratch& sc, const uint32_t* const* qb, const uint32_t* const* dob, int count,
                                     float* dk, float* dv) const {
  if (count == 0) return;
  const float* pt[kPvBatch];
  const float* dst[kPvBatch];
  const uint16_t* qv[kPvBatch];
  const uint16_t* dov[kPvBatch];
  const float* ones[kPvBatch];
  const size_t block = size_t(kBwdChunk) * kKeyTile;
  for (int j = 0; j < count; ++j) {
    pt[j] = sc.pt_batch.data() + size_t(j) * block;
    dst[j] = sc.dst_batch.data() + size_t(j) * block;
    qv[j] = reinterpret_cast<const uint16_t*>(qb[j]);
    dov[j] = reinterpret_cast<const uint16_t*>(dob[j]);
    ones[j] = kOnes.v;
  }
  // α = 1 everywhere: the batch only keeps dk and dv in the accumulators across chunks.
  if (k_.pv_bf16_batch != nullptr) {
    k_.pv_bf16_batch(pt, dov, ones, count, dv_, kKeyTile, dv);
    k_.pv_bf16_batch(dst, qv, ones, count, dv_, kKeyTile, dk);
    return;
  }
  for (int j = 0; j < count; ++j) {
    k_.pv_bf16(pt[j], dov[j], dv_, kKeyTile, kOnes.v, dv);
    k_.pv_bf16(dst[j], qv[j], dv_, kKeyTile, kOnes.v, dk);
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
    const Bf16Session tiles(k_, bf16_, dp_);  // only this runner uses the tile unit inside the region
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
  const uint32_t* qb[kPvBatch];  // bf16 path: the pending chunks' B operands
  const uint32_t* dob[kPvBatch];
  int pending = 0;
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
      p_dp(sc, mk, g, s, t, h, row0, r0, r1, sc.p.data(), sc.dp.data());
      d_s(sc, sc.p.data(), sc.dp.data(), r0, r1, sc.ds.data());
      if (mk.apply_bias)
        for (int r = 0; r < n; ++r) bias_sum += sc.ds[size_t((r0 + r) * kKeyTile)];
      if (bf16_) {
        // The chunk waits in the batch; its B operands are the packed row pairs when the chunk is
        // 32 rows from an even row, else its rows copied into the slot's pairs, zero past n.
        const size_t block = size_t(kBwdChunk) * kKeyTile;
        transpose_block(k_, sc.p.data() + r0 * kKeyTile, n, sc.pt_batch.data() + size_t(pending) * block);
        transpose_block(k_, sc.ds.data() + r0 * kKeyTile, n, sc.dst_batch.data() + size_t(pending) * block);
        if (n == kBwdChunk && row0 % 2 == 0) {
          qb[pending] = q_pairs(h, row0);
          dob[pending] = do_pairs(h, row0);
        } else {
          const size_t slot = size_t(pending) * (kBwdChunk / 2) * size_t(dv_);
          uint32_t* qs = sc.q_pairs.data() + slot;
          uint32_t* ds = sc.do_pairs.data() + slot;
          const uint16_t* qr0 = q_rows_b(h, row0);
          const uint16_t* dr0 = do_rows_b(h, row0);
          for (int i = 0; i < kBwdChunk / 2; ++i)
            for (int c = 0; c < dv_; ++c) {
              const int a0 = 2 * i, a1 = 2 * i + 1;
              const uint32_t q0 = a0 < n ? qr0[a0 * dv_ + c] : 0u, q1 = a1 < n ? qr0[a1 * dv_ + c] : 0u;
              const uint32_t d0 = a0 < n ? dr0[a0 * dv_ + c] : 0u, d1 = a1 < n ? dr0[a1 * dv_ + c] : 0u;
              qs[i * dv_ + c] = q0 | q1 << 16;
              ds[i * dv_ + c] = d0 | d1 << 16;
            }
          qb[pending] = qs;
          dob[pending] = ds;
        }
        if (++pending == kPvBatch) {
          flush_key_batch(sc, qb, dob, pending, dk, dv);
          pending = 0;
        }
        continue;
      }
      const float* q = q_rows(h, row0);
      const float* dout = do_rows(h, row0);
      transpose_block(k_, sc.p.data() + r0 * kKeyTile, n, sc.pt.data());
      transpose_block(k_, sc.ds.data() + r0 * kKeyTile, n, sc.dst.data());
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
    }
    if (mk.apply_bias) sink_seqs_[size_t(int64_t(s) * hq_ + h)] = bias_sum;
  }
  flush_key_batch(sc, qb, dob, pending, dk, dv);
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
    p_dp(sc, mk, g, s, sc.visits[vi].tile, h, row0, r0, r1, P, sc.dp_all.data() + vi * block);
    const float* dP = sc.dp_all.data() + vi * block;
    if (k_.row_sums != nullptr) {
      k_.row_sums(P + r0 * kKeyTile, dP + r0 * kKeyTile, r1 - r0, sc.z.data() + r0, sc.dsum.data() + r0);
      continue;
    }
    for (int r = r0; r < r1; ++r) {
      double pdp[kKeyTile];
      for (int j = 0; j < kKeyTile; ++j) pdp[j] = double(P[r * kKeyTile + j]) * double(dP[r * kKeyTile + j]);
      sc.z[size_t(r)] += row_sum(P + r * kKeyTile);
      sc.dsum[size_t(r)] += row_sum(pdp);
    }
  }
  // D = Σ_j p_j dP_j / z: the products are exact in double, so a row that sees one key gets
  // p·dP / p = dP exactly.
  for (int r = 0; r < rows; ++r) {
    const double z = sc.z[size_t(r)];
    sc.dsum[size_t(r)] = !(z > 0) && z == z ? 0.0 : sc.dsum[size_t(r)] / z;  // no mass on any key: D = 0
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
  if (bf16_) {
    // dS in place of dP; consecutive visits with the same rows go to one pv_bf16_batch call, which
    // keeps dq in the accumulators across them (α = 1).
    const float* batch_p[kPvBatch];
    const uint16_t* batch_k[kPvBatch];
    const float* ones[kPvBatch];
    int pending = 0;
    std::pair<int, int> span{0, 0};
    auto flush = [&] {
      if (pending == 0) return;
      float* o = dq + int64_t(span.first) * dv_;
      const int n = span.second - span.first;
      if (k_.pv_bf16_batch != nullptr) k_.pv_bf16_batch(batch_p, batch_k, ones, pending, dv_, n, o);
      else
        for (int j = 0; j < pending; ++j) k_.pv_bf16(batch_p[j], batch_k[j], dv_, n, kOnes.v, o);
      pending = 0;
    };
    for (size_t vi = 0; vi < sc.visits.size(); ++vi) {
      const auto [r0, r1] = sc.spans[vi];
      if (r0 >= r1) continue;
      float* dS = sc.dp_all.data() + vi * block;
      d_s(sc, sc.p_all.data() + vi * block, dS, r0, r1, dS);
      if (pending == kPvBatch || (pending > 0 && sc.spans[vi] != span)) flush();
      span = sc.spans[vi];
      batch_p[pending] = dS + r0 * kKeyTile;
      batch_k[pending] = reinterpret_cast<const uint16_t*>(kbr(g, s, sc.visits[vi].tile));
      ones[pending] = kOnes.v;
      ++pending;
    }
    flush();
  } else {
    for (size_t vi = 0; vi < sc.visits.size(); ++vi) {
      const auto [r0, r1] = sc.spans[vi];
      if (r0 >= r1) continue;
      d_s(sc, sc.p_all.data() + vi * block, sc.dp_all.data() + vi * block, r0, r1, sc.ds.data());
      k_.pv_f32(sc.ds.data() + r0 * kKeyTile, kr(g, s, sc.visits[vi].tile), dv_, dv_, r1 - r0, kOnes.v,
                dq + int64_t(r0) * dv_);
    }
  }
  for (int r = 0; r < rows; ++r)
    store_row(g_.dq, row_offset(g_.dq, e.q0 + q_lo + r, h), d_, dq + int64_t(r) * dv_, scale_, k_);
}

}  // namespace ariadne::cpu
