// The fast CPU backend's key tiles and query loads: K and V packed into the kernels' tile layouts
// (call-wide, shared by every query tile and every head of a GQA group, or per work item into the
// stream ring), the query tile read in place or converted, and the prefetches that keep the next
// query tile's rows coming (runner.hpp).
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cstring>
#include <vector>

#include "attention/cpu/runner.hpp"

namespace ariadne::cpu {

// Row of `n` elements of t starting at element `off`, widened to fp32.
void convert_row(const TensorView& t, int64_t off, int n, float* dst) {
  switch (t.dtype) {
    case DType::f32: std::memcpy(dst, static_cast<const float*>(t.data) + off, size_t(n) * 4); break;
    case DType::bf16: {
      const uint16_t* src = static_cast<const uint16_t*>(t.data) + off;
      for (int c = 0; c < n; ++c) dst[c] = bf16_to_float(src[c]);
      break;
    }
    case DType::f16: {
      const uint16_t* src = static_cast<const uint16_t*>(t.data) + off;
      for (int c = 0; c < n; ++c) dst[c] = f16_to_float(src[c]);
      break;
    }
    case DType::f64: {  // not a CPU-backend input (attention_cpu_supports refuses it); kept total
      const double* src = static_cast<const double*>(t.data) + off;
      for (int c = 0; c < n; ++c) dst[c] = float(src[c]);
      break;
    }
  }
}

// Writes n fp32 values, each multiplied by `mul`, as a row of t starting at element `off`.
void store_row(const TensorView& t, int64_t off, int n, const float* src, float mul, const TileKernels& k) {
  switch (t.dtype) {
    case DType::f32: {
      float* dst = static_cast<float*>(t.data) + off;
#if defined(__SSE2__)
      // Streaming stores: the output is written once and is usually far larger than the caches,
      // so skipping the read-for-ownership of each line saves a third of the output traffic.
      // The worker loops end with an sfence (forward.cpp, backward.cpp).
      if ((reinterpret_cast<uintptr_t>(dst) & 15) == 0 && n % 4 == 0) {
        const __m128 m = _mm_set1_ps(mul);
        for (int c = 0; c < n; c += 4) _mm_stream_ps(dst + c, _mm_mul_ps(_mm_loadu_ps(src + c), m));
        break;
      }
#endif
      for (int c = 0; c < n; ++c) dst[c] = src[c] * mul;
      break;
    }
    case DType::bf16: {
      uint16_t* dst = static_cast<uint16_t*>(t.data) + off;
      if (k.store_bf16 != nullptr) {
        k.store_bf16(src, mul, n, dst);
        break;
      }
      for (int c = 0; c < n; ++c) dst[c] = float_to_bf16(src[c] * mul);
      break;
    }
    case DType::f16: {
      uint16_t* dst = static_cast<uint16_t*>(t.data) + off;
      for (int c = 0; c < n; ++c) dst[c] = float_to_f16(src[c] * mul);
      break;
    }
    case DType::f64: {  // not a CPU-backend output (refused before any work); kept total
      double* dst = static_cast<double*>(t.data) + off;
      for (int c = 0; c < n; ++c) dst[c] = double(src[c] * mul);
      break;
    }
  }
}

namespace {

// ---- packing K and V into key tiles (layouts in attention_kernels.hpp) ----
// The packed copies live in a per-calling-thread workspace that only grows, so repeated calls
// (a model's layers, a benchmark) neither page-fault nor zero-fill; every element, padding
// included, is written below.
struct Workspace {
  AlignedVector<float> kf, vf;
  AlignedVector<uint32_t> kb, vb;  // bf16 pairs, as 32-bit words
};

}  // namespace

void Runner::pack_kv() {
  if (stream_) return;  // packed per work item (forward_stream)
  static thread_local Workspace ws;
  const int64_t hkv = p_.heads_kv(), n = hkv * total_tiles_;
  const size_t kn = size_t(n * ktile_), vn = size_t(n * vtile_);
  if (bf16_) {
    if (ws.kb.size() < kn / 2) ws.kb.resize(kn / 2);
    if (ws.vb.size() < vn / 2) ws.vb.resize(vn / 2);
    kb_ = reinterpret_cast<const uint16_t*>(ws.kb.data());
    vb_ = reinterpret_cast<const uint16_t*>(ws.vb.data());
  } else {
    if (ws.kf.size() < kn) ws.kf.resize(kn);
    if (ws.vf.size() < vn) ws.vf.resize(vn);
    kf_ = ws.kf.data();
    vf_ = ws.vf.data();
  }
  uint32_t* kb = ws.kb.data();
  uint32_t* vb = ws.vb.data();
  float* kf = ws.kf.data();
  float* vf = ws.vf.data();
#pragma omp parallel for schedule(static) num_threads(threads_)
  for (int64_t i = 0; i < n; ++i) {
    const int g = int(i / total_tiles_);
    const int64_t gtile = i % total_tiles_;
    const int32_t s = int32_t(std::upper_bound(tile_base_.begin(), tile_base_.end(), gtile) - tile_base_.begin()) - 1;
    const int64_t t = gtile - tile_base_[size_t(s)];
    if (bf16_) pack_tile_bf16(g, s, t, kb + i * ktile_ / 2, vb + i * vtile_ / 2);
    else pack_tile_f32(g, s, t, kf + i * ktile_, vf + i * vtile_);
  }
}

// K as [d][32] (transposed), V as [32][dv]; keys past the sequence end and columns past d are 0.
void Runner::pack_tile_f32(int g, int32_t s, int64_t t, float* kt, float* vt) const {
  const TileSpan sp = tile_span(s, t);
  const int64_t tok0 = sp.e->k0 + sp.k_lo;
  const bool simd_k = k_.pack_k_f32 != nullptr && p_.k.dtype == DType::f32;
  if (simd_k)
    k_.pack_k_f32(static_cast<const float*>(p_.k.data) + row_offset(p_.k, tok0, g), p_.k.stride[0], sp.n, d_, kt);
  std::vector<float> row(simd_k ? 0 : size_t(d_));
  for (int j = 0; j < kKeyTile; ++j) {
    float* vrow = vt + int64_t(j) * dv_;
    if (j >= sp.n) {
      if (!simd_k)
        for (int c = 0; c < d_; ++c) kt[c * kKeyTile + j] = 0.f;
      std::fill(vrow, vrow + dv_, 0.f);
      continue;
    }
    if (!simd_k) {
      convert_row(p_.k, row_offset(p_.k, tok0 + j, g), d_, row.data());
      for (int c = 0; c < d_; ++c) kt[c * kKeyTile + j] = row[c];
    }
    if (direct_v_ && sp.n == kKeyTile) continue;  // read in place (vtile_f32)
    convert_row(p_.v, row_offset(p_.v, tok0 + j, g), d_, vrow);
    std::fill(vrow + d_, vrow + dv_, 0.f);
  }
}

// K as [dp][32] pairs of head-dim entries, V as [16][dv] pairs of consecutive keys (low half =
// even key), both zero-padded.
void Runner::pack_tile_bf16(int g, int32_t s, int64_t t, uint32_t* kt, uint32_t* vt) const {
  const TileSpan sp = tile_span(s, t);
  const uint16_t* kin = static_cast<const uint16_t*>(p_.k.data);
  const uint16_t* vin = static_cast<const uint16_t*>(p_.v.data);
  auto key_row = [&](const uint16_t* base, const TensorView& t, int j) -> const uint16_t* {
    return j < sp.n ? base + row_offset(t, sp.e->k0 + sp.k_lo + j, g) : nullptr;
  };
  if (k_.pack_k_bf16 != nullptr) {
    k_.pack_k_bf16(key_row(kin, p_.k, 0), p_.k.stride[0], sp.n, d_, kt);
  } else {
    for (int j = 0; j < kKeyTile; ++j) {
      const uint16_t* kr = key_row(kin, p_.k, j);
      if (kr == nullptr) {
        for (int cp = 0; cp < dp_; ++cp) kt[cp * kKeyTile + j] = 0;
        continue;
      }
      for (int cp = 0; cp < d_ / 2; ++cp)
        kt[cp * kKeyTile + j] = uint32_t(kr[2 * cp]) | (uint32_t(kr[2 * cp + 1]) << 16);
      if (d_ & 1) kt[(dp_ - 1) * kKeyTile + j] = kr[d_ - 1];
    }
  }
  if (k_.pack_v_bf16 != nullptr) {
    k_.pack_v_bf16(key_row(vin, p_.v, 0), p_.v.stride[0], sp.n, d_, dv_, vt);
    return;
  }
  for (int jp = 0; jp < kKeyTile / 2; ++jp) {
    const uint16_t* v0 = key_row(vin, p_.v, 2 * jp);
    const uint16_t* v1 = key_row(vin, p_.v, 2 * jp + 1);
    uint32_t* out = vt + int64_t(jp) * dv_;
    if (v1 != nullptr) {
      for (int c = 0; c < d_; ++c) out[c] = uint32_t(v0[c]) | (uint32_t(v1[c]) << 16);
    } else if (v0 != nullptr) {
      for (int c = 0; c < d_; ++c) out[c] = v0[c];
    } else {
      std::fill(out, out + d_, 0u);
    }
    std::fill(out + d_, out + dv_, 0u);
  }
}

Runner::Tile Runner::tile(Scratch& sc, int g, int32_t s, int64_t t) const {
  const SeqExtent& e = seqs_[size_t(s)];
  const float* v_in = direct_v_ && (t + 1) * kKeyTile <= e.lk
                          ? static_cast<const float*>(p_.v.data) + row_offset(p_.v, e.k0 + t * kKeyTile, g)
                          : nullptr;
  if (!stream_) {
    const int64_t i = g * total_tiles_ + tile_base_[size_t(s)] + t;
    if (bf16_) return {kb_ + i * ktile_, vb_ + i * vtile_, dv_};
    if (v_in != nullptr) return {kf_ + i * ktile_, v_in, p_.v.stride[0]};
    return {kf_ + i * ktile_, vf_ + i * vtile_, dv_};
  }
  const size_t slot = size_t(g % kv_block_) * size_t(ring_) + size_t(t % ring_);  // items start at a block
  if (bf16_) {
    uint32_t* kt = sc.ring_kb.data() + slot * size_t(ktile_ / 2);
    uint32_t* vt = sc.ring_vb.data() + slot * size_t(vtile_ / 2);
    if (sc.ring_tag[slot] != t) pack_tile_bf16(g, s, t, kt, vt);
    sc.ring_tag[slot] = t;
    return {kt, vt, dv_};
  }
  float* kt = sc.ring_kf.data() + slot * size_t(ktile_);
  float* vt = sc.ring_vf.data() + slot * size_t(vtile_);
  if (sc.ring_tag[slot] != t) pack_tile_f32(g, s, t, kt, vt);
  sc.ring_tag[slot] = t;
  if (v_in != nullptr) return {kt, v_in, p_.v.stride[0]};
  return {kt, vt, dv_};
}

void Runner::prefetch_tile(const Tile& tl) const {
  const int64_t kbytes = ktile_ * (bf16_ ? 2 : 4);
  for (int64_t b = 0; b < kbytes; b += 64) __builtin_prefetch(static_cast<const char*>(tl.k) + b);
  if (bf16_ || !direct_v_) {
    const int64_t vbytes = vtile_ * (bf16_ ? 2 : 4);
    for (int64_t b = 0; b < vbytes; b += 64) __builtin_prefetch(static_cast<const char*>(tl.v) + b);
  }
}

// Queues the rows query tile [nlo, nhi) of KV head g will touch first: Q rows of every head of
// the group, and K and V rows of the key tiles it needs past those of [lo, hi). Output rows are
// not fetched: streaming stores write them (store_row), and a line shared with the next head's
// row is read on demand.
void Runner::plan_prefetch(Scratch& sc, const SeqExtent& e, int g, int64_t lo, int64_t hi, int64_t nlo, int64_t nhi) const {
  sc.ahead.clear();
  sc.ahead_run = 0;
  sc.ahead_row = 0;
  if (nlo >= nhi) return;
  const KeyRange cur = pat_.key_range(e, lo, hi), next = pat_.key_range(e, nlo, nhi);
  int64_t rows = 0;
  if (!next.empty()) {
    int64_t k_lo = next.lo / kKeyTile * kKeyTile;
    if (!cur.empty()) k_lo = std::max(k_lo, ((cur.hi - 1) / kKeyTile + 1) * kKeyTile);
    const int64_t k_hi = std::min(e.lk, (next.hi + kKeyTile - 1) / kKeyTile * kKeyTile);
    if (k_lo < k_hi) {
      sc.ahead.push_back(rows_of(p_.k, e.k0 + k_lo, k_hi - k_lo, g));
      sc.ahead.push_back(rows_of(p_.v, e.k0 + k_lo, k_hi - k_lo, g));
      rows += 2 * (k_hi - k_lo);
    }
  }
  for (int h = g * group_; h < (g + 1) * group_; ++h) {
    sc.ahead.push_back(rows_of(p_.q, e.q0 + nlo, nhi - nlo, h));
    rows += nhi - nlo;
  }
  // Spread over the steps of this query tile: its key tiles, each in row chunks, for every head
  // of the group (an estimate: rows that see none of a tile skip it). forward_group_tiles calls
  // twice per step (before Q·Kᵀ and before the softmax), so no burst outgrows the line-fill
  // buffers; forward_band once per tile of a group.
  const int64_t tiles = cur.empty() ? 1 : (cur.hi - 1) / kKeyTile - cur.lo / kKeyTile + 1;
  const int64_t steps = tiles * group_ * ((hi - lo + chunk_rows_ - 1) / chunk_rows_) * (group_pv_ && !band_ ? 2 : 1);
  sc.ahead_step = (rows + steps - 1) / steps;
}

void Runner::load_q(Scratch& sc, const SeqExtent& e, int h, int64_t q_lo, int rows) const {
  if (bf16_) {
    const uint16_t* in = static_cast<const uint16_t*>(p_.q.data);
    if (d_ % 2 == 0) {  // whole pairs: the kernels read the input rows in place
      sc.q_b16 = in + row_offset(p_.q, e.q0 + q_lo, h);
      sc.ldq = p_.q.stride[0];
      return;
    }
    for (int r = 0; r < rows; ++r) {  // odd d: copy, with a zero partner for the last entry
      uint16_t* dst = sc.qb.data() + int64_t(r) * 2 * dp_;
      std::memcpy(dst, in + row_offset(p_.q, e.q0 + q_lo + r, h), size_t(d_) * 2);
      dst[d_] = 0;
    }
    sc.q_b16 = sc.qb.data();
    sc.ldq = 2 * dp_;
  } else if (p_.q.dtype == DType::f32 && stream_) {
    // fp32 rows are read in place in stream mode, where a query tile meets a few key tiles. Wide
    // patterns copy them (below): in place, rows heads·d floats apart (8 KiB at 16 heads, d 128) fall
    // into a few L1 sets and evict each other and the key tile on every key tile; the copy, once per
    // query tile, measured 2-4 % faster for full attention.
    sc.q_f32 = static_cast<const float*>(p_.q.data) + row_offset(p_.q, e.q0 + q_lo, h);
    sc.ldq = p_.q.stride[0];
  } else {
    for (int r = 0; r < rows; ++r)
      convert_row(p_.q, row_offset(p_.q, e.q0 + q_lo + r, h), d_, sc.qf.data() + int64_t(r) * d_);
    sc.q_f32 = sc.qf.data();
    sc.ldq = d_;
  }
}

}  // namespace ariadne::cpu
