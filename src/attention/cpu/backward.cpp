// The fast CPU backend's backward: entry points, the call's setup and the preprocess
// (backward.hpp lists the parts; docs/cpu-backend.md describes the design).
//
// The preprocess turns every input into the operand layouts of the tile primitives once per call,
// O(N·d) memory like the forward's packed K and V: K and V tiles transposed ([d][32], the
// Q·Kᵀ primitive computes S = Q·Kᵀ and dP = dO·Vᵀ with them), K tiles as rows ([32][dv], the P·V
// primitive computes dq += dS·K), Q and dO as fp32 rows padded to dv (the V operand of
// dk += dSᵀ·Q and dv += Pᵀ·dO, and the Q operand of both dot products). Per row it also takes the
// base-2 LSE and the denominator sink's probability from the saved LSE.
// When q, k, v and dout are all bf16 and the table has bf16 products (AMX, AVX-512-BF16), the
// operands stay bf16 instead, in the layouts of qk_bf16 and pv_bf16 (backward.hpp); fp32 and f16
// inputs keep the fp32 path, so no input is rounded.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "attention/backends.hpp"
#include "attention/cpu/backward.hpp"

namespace ariadne {
namespace cpu {
namespace {

// The packed operands live in a per-calling-thread workspace that only grows, so repeated calls
// (training steps, a benchmark) neither page-fault nor zero-fill; prepare() writes every element
// the passes read, padding included.
struct BackwardWorkspace {
  std::vector<float> kt, vt, kr, qp, dop;
  std::vector<uint32_t> kbt, vbt, kbr, qpr, dopr;
  std::vector<uint16_t> qb, dob;
};

template <class T>
T* grown(std::vector<T>& v, int64_t n) {
  if (v.size() < size_t(n)) v.resize(size_t(n));
  return v.data();
}

uint32_t pair_of(uint16_t lo, uint16_t hi) { return uint32_t(lo) | uint32_t(hi) << 16; }

}  // namespace

BackwardRunner::BackwardRunner(const AttentionParams& p, const AttentionGrads& g)
    : p_(p), g_(g), pat_(p.pattern), k_(active_tile_kernels()) {
  total_q_ = p.q.shape[0];
  total_k_ = p.k.shape[0];
  hq_ = p.heads_q();
  hkv_ = p.heads_kv();
  group_ = hq_ / hkv_;
  d_ = p.head_dim();
  dv_ = (d_ + 15) / 16 * 16;
  scale_ = float(p.resolved_scale());
  scale2_ = float(double(p.resolved_scale()) * kLog2e);
  dp_ = (d_ + 1) / 2;
  threads_ = cpu_threads();
  bf16_ = p.q.dtype == DType::bf16 && p.k.dtype == DType::bf16 && p.v.dtype == DType::bf16 &&
          g.dout.dtype == DType::bf16 && k_.qk_bf16 != nullptr && k_.pv_bf16 != nullptr;
  for (int32_t s = 0; s < pat_.num_seqs; ++s) {
    seqs_.push_back(pat_.seq(s, total_q_, total_k_));
    tile_base_.push_back(total_tiles_);
    total_tiles_ += (seqs_.back().lk + kKeyTile - 1) / kKeyTile;
  }
  ktile_ = int64_t(d_) * kKeyTile;
  krtile_ = int64_t(kKeyTile) * dv_;
  ktile_b_ = int64_t(dp_) * kKeyTile;
  krtile_b_ = int64_t(kKeyTile / 2) * dv_;
  qpairs_ = (total_q_ + 1) / 2;
}

BackwardRunner::Scratch BackwardRunner::make_scratch() const {
  Scratch sc;
  for (auto* v : {&sc.s, &sc.p, &sc.dp, &sc.ds}) v->assign(size_t(kBwdQueryTile) * kKeyTile, 0.f);
  for (auto* v : {&sc.pt, &sc.dst}) v->assign(size_t(kBwdChunk) * kKeyTile, 0.f);
  for (auto* v : {&sc.pad_q, &sc.pad_do}) v->assign(size_t(kBwdChunk) * size_t(dv_), 0.f);
  sc.acc_a.assign(size_t(kBwdQueryTile) * size_t(dv_), 0.f);
  sc.acc_b.assign(size_t(kKeyTile) * size_t(dv_), 0.f);
  sc.row_lo.resize(kBwdQueryTile);
  sc.row_hi.resize(kBwdQueryTile);
  sc.lo.resize(kBwdQueryTile);
  sc.hi.resize(kBwdQueryTile);
  sc.off.resize(kBwdQueryTile);
  sc.D.resize(kBwdQueryTile);
  sc.nan_row.resize(kBwdQueryTile);
  sc.z.resize(kBwdQueryTile);
  sc.dsum.resize(kBwdQueryTile);
  if (bf16_) {
    sc.pt_batch.assign(size_t(kPvBatch) * kBwdChunk * kKeyTile, 0.f);
    sc.dst_batch.assign(size_t(kPvBatch) * kBwdChunk * kKeyTile, 0.f);
    sc.q_pairs.assign(size_t(kPvBatch) * (kBwdChunk / 2) * size_t(dv_), 0u);
    sc.do_pairs.assign(size_t(kPvBatch) * (kBwdChunk / 2) * size_t(dv_), 0u);
  }
  return sc;
}

void BackwardRunner::run() {
  prepare();
  passes();
  if (!g_.dsink.defined()) return;
  float* out = static_cast<float*>(g_.dsink.data);
  for (int h = 0; h < hq_; ++h) {
    double sum = 0;  // in row (denominator) or sequence (key-0 bias) order: fixed
    if (p_.sink_mode == SinkMode::denominator)
      for (int64_t row = 0; row < total_q_; ++row) sum += sink_rows_[size_t(int64_t(h) * total_q_ + row)];
    else
      for (int32_t s = 0; s < pat_.num_seqs; ++s) sum += sink_seqs_[size_t(int64_t(s) * hq_ + h)];
    out[h] = float(sum);
  }
}

// Rows of t ([tokens, heads, d], any dtype, strided) as fp32 [heads][tokens][dv], zero past d.
void BackwardRunner::pack_rows(const TensorView& t, int heads, float* dst) const {
  const int64_t tokens = t.shape[0];
#pragma omp parallel for schedule(static) num_threads(threads_)
  for (int64_t i = 0; i < int64_t(heads) * tokens; ++i) {
    const int64_t h = i / tokens, row = i % tokens;
    float* out = dst + i * dv_;
    convert_row(t, row_offset(t, row, h), d_, out);
    std::fill(out + d_, out + dv_, 0.f);
  }
}

BackwardRunner::TileSpot BackwardRunner::locate(int g, int64_t gtile) const {
  const int32_t s = int32_t(std::upper_bound(tile_base_.begin(), tile_base_.end(), gtile) - tile_base_.begin()) - 1;
  const int64_t t = gtile - tile_base_[size_t(s)];
  const SeqExtent& e = seqs_[size_t(s)];
  const int n = int(std::min<int64_t>(kKeyTile, e.lk - t * kKeyTile));
  return {int64_t(g) * total_tiles_ + gtile, e.k0 + t * kKeyTile, n};
}

// Key tile gtile (call-wide index) of KV head g into its three layouts; keys past the sequence
// end are zero.
void BackwardRunner::pack_tiles(int g, int64_t gtile) {
  const auto [i, tok0, n] = locate(g, gtile);
  float* ktp = kt_ + i * ktile_;
  float* vtp = vt_ + i * ktile_;
  float* krp = kr_ + i * krtile_;
  std::vector<float> vrow(static_cast<size_t>(d_));
  for (int j = 0; j < kKeyTile; ++j) {
    float* krow = krp + int64_t(j) * dv_;
    if (j < n) {
      convert_row(p_.k, row_offset(p_.k, tok0 + j, g), d_, krow);
      convert_row(p_.v, row_offset(p_.v, tok0 + j, g), d_, vrow.data());
    } else {
      std::fill(krow, krow + d_, 0.f);
      std::fill(vrow.begin(), vrow.end(), 0.f);
    }
    std::fill(krow + d_, krow + dv_, 0.f);
    for (int c = 0; c < d_; ++c) {
      ktp[c * kKeyTile + j] = krow[c];
      vtp[c * kKeyTile + j] = vrow[size_t(c)];
    }
  }
}

// Key tile gtile of KV head g in the bf16 layouts (kbt_, vbt_, kbr_); keys past the sequence end
// and head-dim entries past d are zero.
void BackwardRunner::pack_tiles_bf16(int g, int64_t gtile) {
  const auto [i, tok0, n] = locate(g, gtile);
  const uint16_t* kin = static_cast<const uint16_t*>(p_.k.data);
  const uint16_t* vin = static_cast<const uint16_t*>(p_.v.data);
  // Element (key j, head-dim c) of K or V, 0 outside the tile's keys and the head dim.
  // The bindings are copied into the capture: clang 14 does not capture structured bindings.
  auto at = [&, n = n, tok0 = tok0](const uint16_t* in, const TensorView& v, int j, int c) -> uint16_t {
    return j < n && c < d_ ? in[row_offset(v, tok0 + j, g) + c] : uint16_t(0);
  };
  uint32_t* kt = kbt_ + i * ktile_b_;
  uint32_t* vt = vbt_ + i * ktile_b_;
  uint32_t* kr = kbr_ + i * krtile_b_;
  if (k_.pack_k_bf16 != nullptr && k_.pack_v_bf16 != nullptr && n > 0) {
    const uint16_t* kb = kin + row_offset(p_.k, tok0, g);
    const uint16_t* vb = vin + row_offset(p_.v, tok0, g);
    k_.pack_k_bf16(kb, p_.k.stride[0], n, d_, kt);
    k_.pack_k_bf16(vb, p_.v.stride[0], n, d_, vt);  // V in K's layout: the B operand of dP = dO·Vᵀ
    k_.pack_v_bf16(kb, p_.k.stride[0], n, d_, dv_, kr);
    return;
  }
  for (int c2 = 0; c2 < dp_; ++c2)
    for (int j = 0; j < kKeyTile; ++j) {
      kt[c2 * kKeyTile + j] = pair_of(at(kin, p_.k, j, 2 * c2), at(kin, p_.k, j, 2 * c2 + 1));
      vt[c2 * kKeyTile + j] = pair_of(at(vin, p_.v, j, 2 * c2), at(vin, p_.v, j, 2 * c2 + 1));
    }
  for (int jp = 0; jp < kKeyTile / 2; ++jp)
    for (int c = 0; c < dv_; ++c) kr[jp * dv_ + c] = pair_of(at(kin, p_.k, 2 * jp, c), at(kin, p_.k, 2 * jp + 1, c));
}

// Rows of the bf16 view t ([tokens, hq, d]) as bf16 rows [hq][tokens][dv] and as pairs of rows
// [hq][(tokens + 1) / 2][dv], zero past d and past the last token.
void BackwardRunner::pack_rows_bf16(const TensorView& t, uint16_t* rows, uint32_t* pairs) const {
  const uint16_t* in = static_cast<const uint16_t*>(t.data);
#pragma omp parallel for schedule(static) num_threads(threads_)
  for (int64_t i = 0; i < int64_t(hq_) * qpairs_; ++i) {
    const int64_t h = i / qpairs_, row = 2 * (i % qpairs_);
    uint16_t* out0 = rows + (h * total_q_ + row) * dv_;
    uint16_t* out1 = out0 + dv_;
    const bool second = row + 1 < total_q_;
    std::memcpy(out0, in + row_offset(t, row, h), size_t(d_) * 2);
    std::fill(out0 + d_, out0 + dv_, uint16_t(0));
    if (second) {
      std::memcpy(out1, in + row_offset(t, row + 1, h), size_t(d_) * 2);
      std::fill(out1 + d_, out1 + dv_, uint16_t(0));
    }
    uint32_t* pr = pairs + i * dv_;
    for (int c = 0; c < dv_; ++c) pr[c] = pair_of(out0[c], second ? out1[c] : uint16_t(0));
  }
}

void BackwardRunner::prepare() {
  static thread_local BackwardWorkspace ws;
  const int64_t tiles = int64_t(hkv_) * total_tiles_, rows = int64_t(hq_) * total_q_;
  if (bf16_) {
    kbt_ = grown(ws.kbt, tiles * ktile_b_);
    vbt_ = grown(ws.vbt, tiles * ktile_b_);
    kbr_ = grown(ws.kbr, tiles * krtile_b_);
    qb_ = grown(ws.qb, rows * dv_);
    dob_ = grown(ws.dob, rows * dv_);
    qpr_ = grown(ws.qpr, int64_t(hq_) * qpairs_ * dv_);
    dopr_ = grown(ws.dopr, int64_t(hq_) * qpairs_ * dv_);
#pragma omp parallel for schedule(static) num_threads(threads_)
    for (int64_t i = 0; i < tiles; ++i) pack_tiles_bf16(int(i / total_tiles_), i % total_tiles_);
    pack_rows_bf16(p_.q, qb_, qpr_);
    pack_rows_bf16(g_.dout, dob_, dopr_);
  } else {
    kt_ = grown(ws.kt, tiles * ktile_);
    vt_ = grown(ws.vt, tiles * ktile_);
    kr_ = grown(ws.kr, tiles * krtile_);
    qp_ = grown(ws.qp, rows * dv_);
    dop_ = grown(ws.dop, rows * dv_);
#pragma omp parallel for schedule(static) num_threads(threads_)
    for (int64_t i = 0; i < tiles; ++i) pack_tiles(int(i / total_tiles_), i % total_tiles_);
    pack_rows(p_.q, hq_, qp_);
    pack_rows(g_.dout, hq_, dop_);
  }

  lse2_.assign(size_t(rows), 0.f);
  D_.assign(size_t(rows), 0.f);  // written by the query pass
  psink_.assign(size_t(rows), 0.f);
  const bool denom = p_.sink_mode == SinkMode::denominator;
  if (denom) sink_rows_.assign(size_t(rows), 0.0);
  sink_seqs_.assign(size_t(pat_.num_seqs) * size_t(hq_), 0.0);
  const float* lse = static_cast<const float*>(p_.lse.data);
#pragma omp parallel for schedule(static) num_threads(threads_)
  for (int64_t i = 0; i < rows; ++i) {
    const int h = int(i / total_q_);
    const float l = lse[h * p_.lse.stride[0] + (i % total_q_) * p_.lse.stride[1]];
    // −inf: no key and no sink (the passes skip the row); NaN: a poisoned row (kept NaN).
    lse2_[size_t(i)] = std::isinf(l) ? l : float(double(l) * kLog2e);
    if (denom && !std::isnan(l) && l != -std::numeric_limits<float>::infinity()) {
      // The sink's probability, 1 when it takes all the mass (a +inf sink: lse = sink).
      const float sk = sink(h);
      psink_[size_t(i)] = sk == l ? 1.f : float(std::exp(double(sk) - double(l)));
    }
  }
}

}  // namespace cpu

bool attention_backward_cpu_supports(const AttentionParams& p, const AttentionGrads&, std::string* why) {
  // Every host call validate_backward accepts (any head dim, dtype mix, pattern, sink and stride):
  // the forward's rule.
  return attention_cpu_supports(p, why);
}

void attention_backward_cpu(const AttentionParams& p, const AttentionGrads& g) {
  ARIADNE_CHECK(p.q.device == Device::cpu, "attention_backward_cpu: q is on ",
                p.q.device == Device::cuda ? "cuda" : "?", ", expected host memory");
  cpu::BackwardRunner(p, g).run();
}

}  // namespace ariadne
