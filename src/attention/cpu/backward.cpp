// The fast CPU backend's backward: entry points, the call's setup and the preprocess
// (backward.hpp lists the parts; docs/cpu-backend.md describes the design).
//
// The preprocess turns every input into the operand layouts of the tile primitives once per call,
// O(N·d) memory like the forward's packed K and V: K and V tiles transposed ([d][32], the
// Q·Kᵀ primitive computes S = Q·Kᵀ and dP = dO·Vᵀ with them), K tiles as rows ([32][dv], the P·V
// primitive computes dq += dS·K), Q and dO as fp32 rows padded to dv (the V operand of
// dk += dSᵀ·Q and dv += Pᵀ·dO, and the Q operand of both dot products). Per row it also takes the
// base-2 LSE and the denominator sink's probability from the saved LSE.
#include <omp.h>

#include <algorithm>
#include <cmath>
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
};

float* grown(std::vector<float>& v, int64_t n) {
  if (v.size() < size_t(n)) v.resize(size_t(n));
  return v.data();
}

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
  threads_ = cpu_threads();
  for (int32_t s = 0; s < pat_.num_seqs; ++s) {
    seqs_.push_back(pat_.seq(s, total_q_, total_k_));
    tile_base_.push_back(total_tiles_);
    total_tiles_ += (seqs_.back().lk + kKeyTile - 1) / kKeyTile;
  }
  ktile_ = int64_t(d_) * kKeyTile;
  krtile_ = int64_t(kKeyTile) * dv_;
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

// Key tile gtile (call-wide index) of KV head g into its three layouts; keys past the sequence
// end are zero.
void BackwardRunner::pack_tiles(int g, int64_t gtile) {
  const int32_t s = int32_t(std::upper_bound(tile_base_.begin(), tile_base_.end(), gtile) - tile_base_.begin()) - 1;
  const int64_t t = gtile - tile_base_[size_t(s)];
  const SeqExtent& e = seqs_[size_t(s)];
  const int64_t i = int64_t(g) * total_tiles_ + gtile, tok0 = e.k0 + t * kKeyTile;
  const int n = int(std::min<int64_t>(kKeyTile, e.lk - t * kKeyTile));
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

void BackwardRunner::prepare() {
  static thread_local BackwardWorkspace ws;
  const int64_t tiles = int64_t(hkv_) * total_tiles_, rows = int64_t(hq_) * total_q_;
  kt_ = grown(ws.kt, tiles * ktile_);
  vt_ = grown(ws.vt, tiles * ktile_);
  kr_ = grown(ws.kr, tiles * krtile_);
  qp_ = grown(ws.qp, rows * dv_);
  dop_ = grown(ws.dop, rows * dv_);
#pragma omp parallel for schedule(static) num_threads(threads_)
  for (int64_t i = 0; i < tiles; ++i) pack_tiles(int(i / total_tiles_), i % total_tiles_);
  pack_rows(p_.q, hq_, qp_);
  pack_rows(g_.dout, hq_, dop_);

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
  // Every host call validate_backward accepts: any head dim, dtype mix, pattern, sink and stride.
  if (p.q.device != Device::cpu) {
    if (why) *why = "the cpu backend needs host tensors";
    return false;
  }
  if (p.q.dtype == DType::f64) {
    if (why) *why = "the cpu backend takes f32, bf16 and f16 (f64 runs on the reference backend)";
    return false;
  }
  return true;
}

void attention_backward_cpu(const AttentionParams& p, const AttentionGrads& g) {
  ARIADNE_CHECK(p.q.device == Device::cpu, "attention_backward_cpu: q is on ",
                p.q.device == Device::cuda ? "cuda" : "?", ", expected host memory");
  cpu::BackwardRunner(p, g).run();
}

}  // namespace ariadne
