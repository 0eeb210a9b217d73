// The fast CPU backend: tiled online-softmax attention (flash style) over every pattern.
//
// Work is split into items (sequence, query head, query tile of up to 64 rows); OpenMP threads take
// items dynamically, and each item is computed start to end by one thread in a fixed order, so the
// result is bit-identical for any thread count. Per item:
//   1. the query tile is read in place (fp32), converted to fp32 (f16, or bf16 without a bf16 dot
//      product), or copied as bf16 pairs for vdpbf16ps;
//   2. each row's allowed key interval comes from Pattern::key_range (window and chunk make it one
//      interval), and the key tiles to visit are those the tile's key range covers, intersected
//      with the CSR row of its query block when the pattern is block-sparse;
//   3. per key tile only the rows whose interval reaches the tile are computed, so a ±64 window
//      pays for about 161 keys per query (129 allowed) instead of 192 for a 64-row tile;
//   4. S = Q·Kᵀ, online softmax (base 2, scale folded into the exponent), O = α·O + P·V through
//      the ISA's tile primitives (attention_kernels.hpp);
//   5. finalize: the denominator sink joins the normalizer, out = O / Z, LSE, entropy, distance.
// K and V are packed into key tiles (transposed / pair-interleaved, see the kernels header): once
// per call for wide patterns, shared by every query tile and, with GQA, by every query head of a
// group; for narrow bands (stream mode) per work item into a small per-thread ring, with the next
// query tile's rows prefetched (docs/cpu-backend.md).
// Received attention is a second, transposed pass: items (sequence, head, key tile) recompute the
// scores of every query tile that sees the key tile and add 2^(t − lse) column-wise in query-tile
// order, again one thread per item (no atomics, no N×N).
#include <omp.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "attention/backends.hpp"
#include "attention/cpu/attention_kernels.hpp"

namespace ariadne {

// ---------------------------------------------------------------------------------------------
// Threads
// ---------------------------------------------------------------------------------------------
namespace {

std::atomic<int> g_threads{0};  // 0: not chosen yet

int threads_from_environment() {
  const char* env = std::getenv("ARIADNE_THREADS");
  if (env != nullptr && *env != '\0') {
    char* end = nullptr;
    const long n = std::strtol(env, &end, 10);
    ARIADNE_CHECK(end != env && *end == '\0' && n >= 1 && n <= 4096, "ARIADNE_THREADS: '", env,
                  "' is not a thread count (expected an integer in 1..4096)");
    return int(n);
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return hw > 0 ? int(hw) : 1;
}

}  // namespace

int cpu_threads() {
  int n = g_threads.load();
  if (n == 0) {
    n = threads_from_environment();
    g_threads.store(n);
  }
  return n;
}

void set_cpu_threads(int n) {
  ARIADNE_CHECK(n >= 1, "set_cpu_threads: ", n, " threads requested, expected >= 1");
  g_threads.store(n);
}

// ---------------------------------------------------------------------------------------------
// Instruction-set dispatch
// ---------------------------------------------------------------------------------------------
namespace cpu {
namespace {

std::atomic<const TileKernels*> g_kernels{nullptr};

const TileKernels* table_by_name(const std::string& name) {
  if (name == "generic") return tile_kernels_generic();
  if (name == "avx2") return tile_kernels_avx2();
  if (name == "avx512") return tile_kernels_avx512();
  return nullptr;
}

const TileKernels* best_table() {
  if (tile_kernels_available("avx512")) return tile_kernels_avx512();
  if (tile_kernels_available("avx2")) return tile_kernels_avx2();
  return tile_kernels_generic();
}

}  // namespace

bool tile_kernels_available(const char* name) {
  const std::string n = name;
  if (n == "generic") return true;
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (n == "avx2")
    return tile_kernels_avx2() != nullptr && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (n == "avx512")
    return tile_kernels_avx512() != nullptr && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bf16") &&
           __builtin_cpu_supports("fma");
#endif
  return false;
}

void force_tile_kernels(const char* name) {
  const std::string n = name ? name : "";
  if (n.empty()) {
    g_kernels.store(best_table());
    return;
  }
  ARIADNE_CHECK(table_by_name(n) != nullptr, "cpu kernels: '", n, "' is not one of generic, avx2, avx512");
  ARIADNE_CHECK(tile_kernels_available(n.c_str()), "cpu kernels: this CPU cannot run the '", n, "' kernels");
  g_kernels.store(table_by_name(n));
}

const TileKernels& active_tile_kernels() {
  const TileKernels* k = g_kernels.load();
  if (k == nullptr) {
    const char* env = std::getenv("ARIADNE_CPU_ISA");
    if (env != nullptr && *env != '\0') {
      ARIADNE_CHECK(table_by_name(env) != nullptr, "ARIADNE_CPU_ISA: '", env,
                    "' is not one of generic, avx2, avx512");
      ARIADNE_CHECK(tile_kernels_available(env), "ARIADNE_CPU_ISA: this CPU cannot run the '", env, "' kernels");
      k = table_by_name(env);
    } else {
      k = best_table();
    }
    g_kernels.store(k);
  }
  return *k;
}

}  // namespace cpu

// ---------------------------------------------------------------------------------------------
// The driver
// ---------------------------------------------------------------------------------------------
namespace {

using cpu::kKeyTile;
constexpr int kQueryTile = 64;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr double kLog2e = 1.4426950408889634;
constexpr double kLn2 = 0.6931471805599453;

// Writes n fp32 values, each multiplied by `mul`, as a row of t starting at element `off`.
void store_row(const TensorView& t, int64_t off, int n, const float* src, float mul, const cpu::TileKernels& k) {
  switch (t.dtype) {
    case DType::f32: {
      float* dst = static_cast<float*>(t.data) + off;
#if defined(__SSE2__)
      // Streaming stores: the output is written once and is usually far larger than the caches,
      // so skipping the read-for-ownership of each line saves a third of the output traffic.
      // The worker loops end with an sfence (attention_cpu below).
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
  }
}

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
  }
}

// Element offset of (token, head, 0) in a [tokens, heads, dim] view.
int64_t row_offset(const TensorView& t, int64_t token, int64_t head) {
  return token * t.stride[0] + head * t.stride[1];
}

struct WorkItem {
  int32_t seq;
  int32_t head;     // query head (stream mode: KV head)
  int64_t lo, hi;  // local query rows (forward) or the key tile index (received pass)
};

// One (query tile, key tile) visit: the tile index and which of its keys the block mask allows.
struct TileVisit {
  int64_t tile;
  uint32_t keymask;
};

class Runner {
 public:
  explicit Runner(const AttentionParams& p)
      : p_(p), pat_(p.pattern), k_(cpu::active_tile_kernels()) {
    total_q_ = p.q.shape[0];
    total_k_ = p.k.shape[0];
    hq_ = p.heads_q();
    group_ = hq_ / p.heads_kv();
    d_ = p.head_dim();
    dp_ = (d_ + 1) / 2;
    dv_ = (d_ + 15) / 16 * 16;
    bf16_ = p.q.dtype == DType::bf16 && k_.qk_bf16 != nullptr && k_.pv_bf16 != nullptr;
    // V is read in place only for narrow patterns: there each V tile serves a few query tiles, so
    // copying it costs more memory traffic than it saves; wide patterns reuse the tile many times
    // and gain from a contiguous copy (input rows sit heads·d apart and collide in L1 sets).
    const Pattern& pt = p.pattern;
    const bool narrow = (pt.window_left != kUnbounded && pt.window_right != kUnbounded &&
                         pt.window_left + pt.window_right <= 1024) ||
                        (pt.chunk > 0 && pt.chunk <= 1024);
    direct_v_ = !bf16_ && p.v.dtype == DType::f32 && d_ % 16 == 0 && narrow;
    // Narrow patterns also pack K and V just in time into a small per-thread ring of key tiles
    // (stream mode, see forward) instead of once per call: a tile then serves only the few query
    // tiles next to it, and the call-wide packed copy, written out and read back, was 15-20 % of a
    // bf16 ±64-window call. The received pass reads the call-wide copy, so it keeps it.
    stream_ = narrow && !p.received.defined();
    // bf16 tiles in stream mode are computed 8 rows at a time (Q·Kᵀ, softmax, P·V), with a few
    // prefetches between those steps: measured 4-7 % faster than whole-tile steps with one
    // prefetch burst per tile at d 80 and 128; fp32 measured 2 % slower that way.
    chunk_rows_ = stream_ && bf16_ ? 8 : kQueryTile;
    scale2_ = float(double(p.resolved_scale()) * kLog2e);
    threads_ = cpu_threads();
    diag_ = p.entropy.defined() || p.distance.defined();
    for (int32_t s = 0; s < pat_.num_seqs; ++s) {
      seqs_.push_back(pat_.seq(s, total_q_, total_k_));
      tile_base_.push_back(total_tiles_);
      total_tiles_ += (seqs_.back().lk + kKeyTile - 1) / kKeyTile;
    }
    ktile_ = bf16_ ? int64_t(dp_) * 2 * kKeyTile : int64_t(d_) * kKeyTile;
    vtile_ = int64_t(kKeyTile) * dv_;
    if (stream_) {
      // Ring slots: the most key tiles one query tile spans, plus the two that the next query
      // tile adds, so a band's tiles stay in the ring while consecutive query tiles need them.
      int64_t span = 0;
      for (const SeqExtent& e : seqs_)
        for_query_tiles(e, [&](int64_t lo, int64_t hi) {
          const KeyRange kr = pat_.key_range(e, lo, hi);
          if (!kr.empty()) span = std::max(span, (kr.hi - 1) / kKeyTile - kr.lo / kKeyTile + 1);
        });
      ring_ = int(span) + 2;
    }
    if (p.distance.defined()) load_coords();
  }

  void run() {
    pack_kv();
    if (p_.received.defined()) lse2_.assign(size_t(hq_ * total_q_), kNegInf);
    forward();
    if (p_.received.defined()) received();
  }

 private:
  // ---- packing K and V into key tiles (layouts in attention_kernels.hpp) ----
  // The packed copies live in a per-calling-thread workspace that only grows, so repeated calls
  // (a model's layers, a benchmark) neither page-fault nor zero-fill; every element, padding
  // included, is written below.
  struct Workspace {
    std::vector<float> kf, vf;
    std::vector<uint32_t> kb, vb;  // bf16 pairs, as 32-bit words
  };

  void pack_kv() {
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

  // Sequence, first local key and number of valid keys of key tile t of sequence s.
  struct TileSpan {
    const SeqExtent* e;
    int64_t k_lo;
    int n;
  };
  TileSpan tile_span(int32_t s, int64_t t) const {
    const SeqExtent& e = seqs_[size_t(s)];
    const int64_t k_lo = t * kKeyTile;
    return {&e, k_lo, int(std::min<int64_t>(kKeyTile, e.lk - k_lo))};
  }

  // K as [d][32] (transposed), V as [32][dv]; keys past the sequence end and columns past d are 0.
  void pack_tile_f32(int g, int32_t s, int64_t t, float* kt, float* vt) const {
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
  void pack_tile_bf16(int g, int32_t s, int64_t t, uint32_t* kt, uint32_t* vt) const {
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

  void load_coords() {
    auto read = [](const TensorView& t, int64_t n, std::vector<float>& out) {
      const float* base = static_cast<const float*>(t.data);
      out.resize(size_t(2 * n));
      for (int64_t i = 0; i < n; ++i) {
        out[size_t(2 * i)] = base[i * t.stride[0]];
        out[size_t(2 * i + 1)] = base[i * t.stride[0] + t.stride[1]];
      }
    };
    read(p_.coords_q, total_q_, cq_);
    read(p_.coords_k, total_k_, ck_);
  }

  // ---- prefetching the next query tile's rows (stream mode) ----
  // In stream mode each key tile's input rows are read when the tile is first packed, and a query
  // tile's Q and output rows when it starts; all are cold (written by another layer or read once)
  // and sit heads·d elements apart, which the hardware prefetchers did not follow (packing stalled
  // on them: about a fifth of a bf16 ±64-window call). So while one query tile is computed the
  // rows the next one will touch first are prefetched, a few rows per key-tile visit rather than
  // all at once, which would fill the miss queue and stall.
  struct RowRun {
    const char* base;  // first row
    int64_t stride;    // bytes between rows
    int64_t rows;
    int bytes;  // per row
    bool write;
  };

  // ---- per-thread scratch ----
  struct Scratch {
    std::vector<float> qf, s, t, o, m, l, alpha, m_old, l_old, colsum;
    std::vector<uint16_t> qb;
    std::vector<float> ring_kf, ring_vf;     // stream mode: packed key tiles, ring_ slots
    std::vector<uint32_t> ring_kb, ring_vb;
    std::vector<int64_t> ring_tag;           // key tile held by each slot (−1: none)
    std::vector<RowRun> ahead;               // stream mode: input/output rows of the next query tile
    size_t ahead_run = 0;                    // prefetch cursor: run, row within it
    int64_t ahead_row = 0, ahead_step = 0;   // rows prefetched per step (prefetch_some call)
    std::vector<int64_t> row_lo, row_hi;
    std::vector<int32_t> lo, hi;
    std::vector<double> ent, dist;
    std::vector<TileVisit> visits;
    bool dense = false;            // set by clip_rows
    const float* q_f32 = nullptr;  // the current query tile, fp32 path (qf or the input rows)
    const uint16_t* q_b16 = nullptr;  // the same, bf16 path (qb or the input rows)
    int64_t ldq = 0;
  };

  Scratch make_scratch() const {
    Scratch sc;
    const size_t R = kQueryTile;
    if (bf16_) sc.qb.resize(R * size_t(2 * dp_));
    else sc.qf.resize(R * size_t(d_));
    sc.s.resize(R * kKeyTile);
    sc.t.resize(R * kKeyTile);
    sc.o.resize(R * size_t(dv_));
    for (auto* v : {&sc.m, &sc.l, &sc.alpha, &sc.m_old, &sc.l_old}) v->resize(R);
    sc.colsum.resize(kKeyTile);
    sc.row_lo.resize(R);
    sc.row_hi.resize(R);
    sc.lo.resize(R);
    sc.hi.resize(R);
    sc.ent.resize(R);
    sc.dist.resize(R);
    if (stream_) {
      const size_t n = size_t(ring_);
      if (bf16_) {
        sc.ring_kb.resize(n * size_t(ktile_ / 2));
        sc.ring_vb.resize(n * size_t(vtile_ / 2));
      } else {
        sc.ring_kf.resize(n * size_t(ktile_));
        sc.ring_vf.resize(n * size_t(vtile_));
      }
      sc.ring_tag.assign(n, -1);
    }
    return sc;
  }

  RowRun rows_of(const TensorView& t, int64_t tok0, int64_t n, int head, bool write) const {
    const int es = dtype_size(t.dtype);
    return {static_cast<const char*>(t.data) + row_offset(t, tok0, head) * es, t.stride[0] * es, n, d_ * es, write};
  }

  void prefetch_some(Scratch& sc) const {
    for (int64_t budget = sc.ahead_step; budget > 0 && sc.ahead_run < sc.ahead.size(); --budget) {
      const RowRun& r = sc.ahead[sc.ahead_run];
      const char* row = r.base + sc.ahead_row * r.stride;
      const uintptr_t a = reinterpret_cast<uintptr_t>(row) & ~uintptr_t(63);
      for (uintptr_t b = a; b < reinterpret_cast<uintptr_t>(row) + r.bytes; b += 64) {
        if (r.write) __builtin_prefetch(reinterpret_cast<const char*>(b), 1);
        else __builtin_prefetch(reinterpret_cast<const char*>(b), 0);
      }
      if (++sc.ahead_row == r.rows) {
        ++sc.ahead_run;
        sc.ahead_row = 0;
      }
    }
  }

  // Queues the rows query tile [nlo, nhi) of KV head g will touch first: Q and output rows of
  // every head of the group, and K and V rows of the key tiles it needs past those of [lo, hi).
  void plan_prefetch(Scratch& sc, const SeqExtent& e, int g, int64_t lo, int64_t hi, int64_t nlo, int64_t nhi) const {
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
        sc.ahead.push_back(rows_of(p_.k, e.k0 + k_lo, k_hi - k_lo, g, false));
        sc.ahead.push_back(rows_of(p_.v, e.k0 + k_lo, k_hi - k_lo, g, false));
        rows += 2 * (k_hi - k_lo);
      }
    }
    for (int h = g * group_; h < (g + 1) * group_; ++h) {
      sc.ahead.push_back(rows_of(p_.q, e.q0 + nlo, nhi - nlo, h, false));
      sc.ahead.push_back(rows_of(p_.out, e.q0 + nlo, nhi - nlo, h, true));
      rows += 2 * (nhi - nlo);
    }
    // Spread over the steps of this query tile: its key tiles, each in row chunks, for every head
    // of the group (an estimate: rows that see none of a tile skip it).
    const int64_t tiles = cur.empty() ? 1 : (cur.hi - 1) / kKeyTile - cur.lo / kKeyTile + 1;
    const int64_t steps = tiles * group_ * ((hi - lo + chunk_rows_ - 1) / chunk_rows_);
    sc.ahead_step = (rows + steps - 1) / steps;
  }

  // Key tile t of sequence s, KV head g, as the kernels read it: packed K, and V with its row
  // stride (fp32 V may be the input rows themselves when direct_v_ and the tile is complete). In
  // stream mode the tile is packed into the thread's ring on first use (slot t mod ring_).
  struct Tile {
    const void* k;
    const void* v;
    int64_t ldv;
  };
  Tile tile(Scratch& sc, int g, int32_t s, int64_t t) const {
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
    const size_t slot = size_t(t % ring_);
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

  // Query tiles: rows [0, lq) in steps of 64; with a block mask, tiles never cross a query block,
  // so each tile reads exactly one CSR row.
  template <class F>
  void for_query_tiles(const SeqExtent& e, F&& f) const {
    for (int64_t lo = 0; lo < e.lq;) {
      const int64_t hi = query_tile_end(e, lo);
      f(lo, hi);
      lo = hi;
    }
  }
  // One past the last row of the query tile that starts at row lo.
  int64_t query_tile_end(const SeqExtent& e, int64_t lo) const {
    const int64_t seg = pat_.blocks.defined() ? int64_t(pat_.blocks.block) : std::max<int64_t>(e.lq, 1);
    return std::min({lo + kQueryTile, (lo / seg + 1) * seg, e.lq});
  }

  void load_q(Scratch& sc, const SeqExtent& e, int h, int64_t q_lo, int rows) const {
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
    } else if (p_.q.dtype == DType::f32) {  // fp32 rows are read in place
      sc.q_f32 = static_cast<const float*>(p_.q.data) + row_offset(p_.q, e.q0 + q_lo, h);
      sc.ldq = p_.q.stride[0];
    } else {
      for (int r = 0; r < rows; ++r)
        convert_row(p_.q, row_offset(p_.q, e.q0 + q_lo + r, h), d_, sc.qf.data() + int64_t(r) * d_);
      sc.q_f32 = sc.qf.data();
      sc.ldq = d_;
    }
  }

  void qk(Scratch& sc, const void* kt, int r0, int n) const {
    if (bf16_)
      k_.qk_bf16(sc.q_b16 + r0 * sc.ldq, sc.ldq, static_cast<const uint16_t*>(kt), dp_, n, sc.s.data() + r0 * kKeyTile);
    else
      k_.qk_f32(sc.q_f32 + r0 * sc.ldq, sc.ldq, static_cast<const float*>(kt), d_, n, sc.s.data() + r0 * kKeyTile);
  }

  void prefetch_tile(const Tile& tl) const {
    const int64_t kbytes = ktile_ * (bf16_ ? 2 : 4);
    for (int64_t b = 0; b < kbytes; b += 64) __builtin_prefetch(static_cast<const char*>(tl.k) + b);
    if (bf16_ || !direct_v_) {
      const int64_t vbytes = vtile_ * (bf16_ ? 2 : 4);
      for (int64_t b = 0; b < vbytes; b += 64) __builtin_prefetch(static_cast<const char*>(tl.v) + b);
    }
  }

  // Key-block bits of key tile t for one CSR row (block-sparse patterns).
  uint32_t block_bits(int64_t row, int64_t t, int64_t lk) const {
    const int64_t B = pat_.blocks.block, k_lo = t * kKeyTile, k_hi = std::min(k_lo + kKeyTile, lk);
    uint32_t bits = 0;
    for (int64_t kb = k_lo / B; kb * B < k_hi; ++kb) {
      if (!pat_.block_listed(row, kb)) continue;
      const int64_t a = std::max(kb * B, k_lo) - k_lo, b = std::min((kb + 1) * B, k_hi) - k_lo;
      for (int64_t j = a; j < b; ++j) bits |= 1u << j;
    }
    return bits;
  }

  // Key tiles one query tile visits, in increasing order.
  void plan_visits(Scratch& sc, int32_t s, const SeqExtent& e, int h, int64_t q_lo, int64_t q_hi) const {
    sc.visits.clear();
    const KeyRange kr = pat_.key_range(e, q_lo, q_hi);
    if (kr.empty()) return;
    if (!pat_.blocks.defined()) {
      for (int64_t t = kr.lo / kKeyTile; t * kKeyTile < kr.hi; ++t) sc.visits.push_back({t, ~0u});
      return;
    }
    const int64_t row = pat_.block_row(s, e, h, q_lo / pat_.blocks.block), B = pat_.blocks.block;
    for (int32_t i = pat_.blocks.row_ptr[row]; i < pat_.blocks.row_ptr[row + 1]; ++i) {
      const int64_t kb = pat_.blocks.col_idx[i];
      const int64_t a = std::max(kb * B, kr.lo), b = std::min((kb + 1) * B, kr.hi);
      for (int64_t t = a / kKeyTile; a < b && t * kKeyTile < b; ++t) {
        const int64_t j0 = std::max(a, t * kKeyTile) - t * kKeyTile, j1 = std::min(b, (t + 1) * kKeyTile) - t * kKeyTile;
        uint32_t bits = 0;
        for (int64_t j = j0; j < j1; ++j) bits |= 1u << j;
        if (!sc.visits.empty() && sc.visits.back().tile == t) sc.visits.back().keymask |= bits;
        else sc.visits.push_back({t, bits});
      }
    }
  }

  // Rows' allowed intervals clipped to key tile t; returns the first and one past the last row
  // that sees any key of it (first >= last: none). sc.dense: those rows all see the whole tile.
  std::pair<int, int> clip_rows(Scratch& sc, int rows, int64_t t) const {
    const int64_t base = t * kKeyTile;
    int first = rows, last = 0;
    sc.dense = true;
    for (int r = 0; r < rows; ++r) {
      const int64_t lo = std::clamp<int64_t>(sc.row_lo[r] - base, 0, kKeyTile);
      const int64_t hi = std::clamp<int64_t>(sc.row_hi[r] - base, 0, kKeyTile);
      sc.lo[r] = int32_t(lo);
      sc.hi[r] = int32_t(hi);
      if (lo < hi) {
        first = std::min(first, r);
        last = r + 1;
      }
    }
    for (int r = first; r < last; ++r) sc.dense = sc.dense && sc.lo[r] == 0 && sc.hi[r] == kKeyTile;
    return {first, last};
  }

  float sink(int h) const { return static_cast<const float*>(p_.sink.data)[h * p_.sink.stride[0]]; }

  // ---- forward ----
  // Items: (sequence, query head, query tile); in stream mode (sequence, KV head, a run of
  // kStreamRun consecutive query tiles), computed query tile by query tile and, inside, head by
  // head of the KV group, so each key tile is packed into the ring once per item. Either way each
  // (query head, query tile) is computed by the same code in the same order: the results do not
  // depend on the mode or the thread count.
  static constexpr int kStreamRun = 16;

  void forward() {
    std::vector<WorkItem> items;
    for (int32_t s = 0; s < pat_.num_seqs; ++s) {
      const SeqExtent& e = seqs_[size_t(s)];
      if (!stream_) {
        for (int h = 0; h < hq_; ++h)
          for_query_tiles(e, [&](int64_t lo, int64_t hi) { items.push_back({s, h, lo, hi}); });
        continue;
      }
      std::vector<int64_t> starts;  // first row of every kStreamRun-th query tile, then lq
      int count = 0;
      for_query_tiles(e, [&](int64_t lo, int64_t) {
        if (count++ % kStreamRun == 0) starts.push_back(lo);
      });
      starts.push_back(e.lq);
      for (int g = 0; g < hq_ / group_; ++g)
        for (size_t i = 0; i + 1 < starts.size(); ++i) items.push_back({s, g, starts[i], starts[i + 1]});
    }
#pragma omp parallel num_threads(threads_)
    {
      Scratch sc = make_scratch();
#pragma omp for schedule(dynamic, 1)
      for (size_t i = 0; i < items.size(); ++i) {
        const WorkItem& it = items[i];
        if (!stream_) {
          forward_tile(sc, it.seq, it.head, it.lo, it.hi);
          continue;
        }
        std::fill(sc.ring_tag.begin(), sc.ring_tag.end(), -1);  // the ring holds another head's tiles
        const SeqExtent& e = seqs_[size_t(it.seq)];
        for (int64_t lo = it.lo; lo < it.hi;) {
          const int64_t hi = query_tile_end(e, lo);
          plan_prefetch(sc, e, it.head, lo, hi, hi, hi < it.hi ? query_tile_end(e, hi) : hi);
          for (int h = it.head * group_; h < (it.head + 1) * group_; ++h) forward_tile(sc, it.seq, h, lo, hi);
          lo = hi;
        }
      }
#if defined(__SSE2__)
      _mm_sfence();  // order this thread's streaming stores before the region ends
#endif
    }
  }

  // Query rows [q_lo, q_hi) of sequence s, head h: one query tile.
  void forward_tile(Scratch& sc, int32_t s, int h, int64_t q_lo, int64_t q_hi) const {
    const int g = h / group_;
    const SeqExtent& e = seqs_[size_t(s)];
    const int rows = int(q_hi - q_lo);
    load_q(sc, e, h, q_lo, rows);
    for (int r = 0; r < rows; ++r) {
      const KeyRange kr = pat_.key_range(e, q_lo + r, q_lo + r + 1);
      sc.row_lo[r] = kr.lo;
      sc.row_hi[r] = kr.empty() ? kr.lo : kr.hi;
      sc.m[r] = kNegInf;
      sc.l[r] = 0.f;
      sc.ent[r] = sc.dist[r] = 0.0;
    }
    std::fill(sc.o.begin(), sc.o.begin() + int64_t(rows) * dv_, 0.f);
    plan_visits(sc, s, e, h, q_lo, q_hi);

    cpu::RowMask mk;
    mk.scale2 = scale2_;
    mk.bias2 = p_.sink_mode == SinkMode::key0_bias ? float(double(sink(h)) * kLog2e) : 0.f;
    mk.moving_max = stream_;
    for (size_t vi = 0; vi < sc.visits.size(); ++vi) {
      const TileVisit& v = sc.visits[vi];
      // Block-sparse visits jump between key tiles, which the hardware prefetcher cannot follow
      // (in stream mode the next tile is packed only when it is reached).
      if (pat_.blocks.defined() && !stream_ && vi + 1 < sc.visits.size())
        prefetch_tile(tile(sc, g, s, sc.visits[vi + 1].tile));
      const auto [r0, r1] = clip_rows(sc, rows, v.tile);
      if (r0 >= r1) continue;
      const Tile tl = tile(sc, g, s, v.tile);
      mk.keymask = v.keymask;
      mk.dense = sc.dense && v.keymask == ~0u;
      mk.apply_bias = p_.sink_mode == SinkMode::key0_bias && v.tile == 0;
      for (int c0 = r0; c0 < r1; c0 += chunk_rows_) {
        const int c1 = std::min(r1, c0 + chunk_rows_), n = c1 - c0;
        if (stream_) prefetch_some(sc);
        qk(sc, tl.k, c0, n);
        mk.lo = sc.lo.data() + c0;
        mk.hi = sc.hi.data() + c0;
        if (diag_) {
          std::copy(sc.m.begin() + c0, sc.m.begin() + c1, sc.m_old.begin() + c0);
          std::copy(sc.l.begin() + c0, sc.l.begin() + c1, sc.l_old.begin() + c0);
        }
        float* S = sc.s.data() + c0 * kKeyTile;
        k_.softmax(S, mk, n, sc.m.data() + c0, sc.l.data() + c0, sc.alpha.data() + c0,
                   diag_ ? sc.t.data() + c0 * kKeyTile : nullptr);
        if (diag_) accumulate_diagnostics(sc, e, q_lo, v.tile, c0, c1);
        float* O = sc.o.data() + int64_t(c0) * dv_;
        if (bf16_)
          k_.pv_bf16(S, static_cast<const uint16_t*>(tl.v), dv_, n, sc.alpha.data() + c0, O);
        else
          k_.pv_f32(S, static_cast<const float*>(tl.v), tl.ldv, dv_, n, sc.alpha.data() + c0, O);
      }
    }
    finalize(sc, e, h, q_lo, rows);
  }

  // Entropy and distance ride on the online softmax: A = Σ_j p_j (t_j − m) and D = Σ_j p_j ‖c_i − c_j‖
  // are rescaled with the same α as l; at the end H = ln l − ln2·A/l and distance = D/l. Keeping t − m
  // (not t) avoids cancellation when logits are large.
  void accumulate_diagnostics(Scratch& sc, const SeqExtent& e, int64_t q_lo, int64_t tile, int r0, int r1) const {
    const bool want_dist = p_.distance.defined();
    for (int r = r0; r < r1; ++r) {
      if (sc.m[r] == kNegInf) continue;
      const double a = sc.alpha[r], m_new = sc.m[r];
      const float* p = sc.s.data() + r * kKeyTile;
      const float* t = sc.t.data() + r * kKeyTile;
      double acc = 0, dist = 0;
      for (int j = 0; j < kKeyTile; ++j) {
        if (p[j] == 0.f) continue;
        acc += double(p[j]) * (double(t[j]) - m_new);
        if (want_dist) {
          const int64_t qi = e.q0 + q_lo + r, kj = e.k0 + tile * kKeyTile + j;
          const double dr = double(cq_[size_t(2 * qi)]) - ck_[size_t(2 * kj)];
          const double dc = double(cq_[size_t(2 * qi + 1)]) - ck_[size_t(2 * kj + 1)];
          dist += double(p[j]) * std::sqrt(dr * dr + dc * dc);
        }
      }
      const double shift = sc.l_old[r] > 0.f ? (double(sc.m_old[r]) - m_new) * sc.l_old[r] : 0.0;
      sc.ent[r] = a * (sc.ent[r] + shift) + acc;
      sc.dist[r] = a * sc.dist[r] + dist;
    }
  }

  void finalize(Scratch& sc, const SeqExtent& e, int h, int64_t q_lo, int rows) const {
    const bool denom = p_.sink_mode == SinkMode::denominator;
    const double sink2 = denom ? double(sink(h)) * kLog2e : 0.0;
    float* lse_out = static_cast<float*>(p_.lse.data);
    float* ent_out = static_cast<float*>(p_.entropy.data);
    float* dist_out = static_cast<float*>(p_.distance.data);
    const bool want_lse = lse_out != nullptr || !lse2_.empty();
    for (int r = 0; r < rows; ++r) {
      const int64_t row = e.q0 + q_lo + r;
      const int64_t out_off = row_offset(p_.out, row, h);
      const double l = sc.l[r], m = sc.m[r];
      double lse2;  // base-2 log of the normalizer, sink included
      float lse;
      if (std::isnan(l)) {  // a NaN or +inf logit poisoned the row (softmax kernels): out and LSE NaN
        lse2 = l;
        store_row(p_.out, out_off, d_, sc.o.data() + int64_t(r) * dv_, float(l), k_);
        lse = float(l);
      } else if (l > 0 && !denom) {  // Z = l·2^m: out = O / l; the logarithm only when it is output
        store_row(p_.out, out_off, d_, sc.o.data() + int64_t(r) * dv_, float(1.0 / l), k_);
        lse2 = want_lse ? m + std::log2(l) : 0.0;
        lse = float(lse2 * kLn2);
      } else if (l > 0) {
        lse2 = m + std::log2(l);
        if (std::isinf(sink2)) {
          if (sink2 > 0) lse2 = sink2;  // +inf takes all the mass: out 0, lse +inf
        } else {
          const double hi = std::max(lse2, sink2);
          lse2 = hi + std::log2(std::exp2(lse2 - hi) + std::exp2(sink2 - hi));
        }
        const float inv = float(std::exp2(m - lse2));  // out = O·2^m / Z
        store_row(p_.out, out_off, d_, sc.o.data() + int64_t(r) * dv_, inv, k_);
        lse = float(lse2 * kLn2);
      } else {  // no allowed key: out 0; LSE is the sink alone or −inf
        store_row(p_.out, out_off, d_, sc.o.data() + int64_t(r) * dv_, 0.f, k_);
        lse2 = denom ? sink2 : -std::numeric_limits<double>::infinity();
        lse = denom ? sink(h) : kNegInf;
      }
      const int64_t si = int64_t(h) * total_q_ + row;
      if (lse_out) lse_out[si] = lse;
      // NaN rows keep NaN in every output (l > 0 is false for NaN; `live` is not).
      const bool live = l > 0 || std::isnan(l);
      if (!lse2_.empty()) lse2_[size_t(si)] = live ? float(lse2) : kNegInf;
      if (ent_out) ent_out[si] = live ? float(std::log(l) - kLn2 * sc.ent[r] / l) : 0.f;
      if (dist_out) dist_out[si] = live ? float(sc.dist[r] / l) : 0.f;
    }
  }

  // ---- received attention: the transposed pass ----
  void received() {
    std::vector<WorkItem> items;
    for (int32_t s = 0; s < pat_.num_seqs; ++s) {
      const int64_t nt = (seqs_[size_t(s)].lk + kKeyTile - 1) / kKeyTile;
      for (int h = 0; h < hq_; ++h)
        for (int64_t t = 0; t < nt; ++t) items.push_back({s, h, t, t + 1});
    }
    float* recv = static_cast<float*>(p_.received.data);
    // Keys of sequences without key tiles do not exist; every other key is written by its item.
#pragma omp parallel num_threads(threads_)
    {
      Scratch sc = make_scratch();
#pragma omp for schedule(dynamic, 1)
      for (size_t i = 0; i < items.size(); ++i) received_item(sc, items[i], recv);
    }
  }

  void received_item(Scratch& sc, const WorkItem& it, float* recv) const {
    const int32_t s = it.seq;
    const int h = it.head, g = h / group_;
    const SeqExtent& e = seqs_[size_t(s)];
    const int64_t t = it.lo, k_lo = t * kKeyTile, k_hi = std::min(k_lo + kKeyTile, e.lk);
    std::fill(sc.colsum.begin(), sc.colsum.end(), 0.f);
    cpu::RowMask mk;
    mk.scale2 = scale2_;
    mk.bias2 = p_.sink_mode == SinkMode::key0_bias ? float(double(sink(h)) * kLog2e) : 0.f;
    mk.apply_bias = p_.sink_mode == SinkMode::key0_bias && t == 0;
    for_query_tiles(e, [&](int64_t q_lo, int64_t q_hi) {
      const KeyRange kr = pat_.key_range(e, q_lo, q_hi);
      if (kr.hi <= k_lo || kr.lo >= k_hi) return;
      uint32_t bits = ~0u;
      if (pat_.blocks.defined()) {
        bits = block_bits(pat_.block_row(s, e, h, q_lo / pat_.blocks.block), t, e.lk);
        if (bits == 0) return;
      }
      const int rows = int(q_hi - q_lo);
      float* off = sc.m.data();  // per-row base-2 LSE
      for (int r = 0; r < rows; ++r) {
        const KeyRange rr = pat_.key_range(e, q_lo + r, q_lo + r + 1);
        off[r] = lse2_[size_t(int64_t(h) * total_q_ + e.q0 + q_lo + r)];
        const bool none = rr.empty() || off[r] == kNegInf;
        sc.row_lo[r] = rr.lo;
        sc.row_hi[r] = none ? rr.lo : rr.hi;
      }
      const auto [r0, r1] = clip_rows(sc, rows, t);
      if (r0 >= r1) return;
      load_q(sc, e, h, q_lo, rows);
      qk(sc, tile(sc, g, s, t).k, r0, r1 - r0);
      mk.lo = sc.lo.data() + r0;
      mk.hi = sc.hi.data() + r0;
      mk.keymask = bits;
      mk.dense = sc.dense && bits == ~0u;
      k_.colsum(sc.s.data() + r0 * kKeyTile, mk, r1 - r0, off + r0, sc.colsum.data());
    });
    for (int64_t k = k_lo; k < k_hi; ++k) recv[int64_t(h) * total_k_ + e.k0 + k] = sc.colsum[size_t(k - k_lo)];
  }

  const AttentionParams& p_;
  const Pattern& pat_;
  const cpu::TileKernels& k_;
  int64_t total_q_ = 0, total_k_ = 0;
  int hq_ = 0, group_ = 1, d_ = 0, dp_ = 0, dv_ = 0, threads_ = 1;
  bool bf16_ = false, diag_ = false, direct_v_ = false, stream_ = false;
  int ring_ = 0;  // stream mode: key-tile slots per thread
  int chunk_rows_ = kQueryTile;  // rows per Q·Kᵀ / softmax / P·V step
  float scale2_ = 1.f;
  std::vector<SeqExtent> seqs_;
  std::vector<int64_t> tile_base_;
  int64_t total_tiles_ = 0, ktile_ = 0, vtile_ = 0;
  const float* kf_ = nullptr;  // packed K / V (fp32 path)
  const float* vf_ = nullptr;
  const uint16_t* kb_ = nullptr;  // packed K / V (bf16 path)
  const uint16_t* vb_ = nullptr;
  std::vector<float> cq_, ck_;
  mutable std::vector<float> lse2_;  // [heads_q, total_q] base-2 LSE for the received pass; rows written by one item each
};

}  // namespace

bool attention_cpu_supports(const AttentionParams& p, std::string* why) {
  if (p.q.device != Device::cpu) {
    if (why) *why = "the cpu backend needs host tensors";
    return false;
  }
  return true;
}

void attention_cpu(const AttentionParams& p) {
  ARIADNE_CHECK(p.q.device == Device::cpu, "attention_cpu: q is on ", p.q.device == Device::cuda ? "cuda" : "?",
                ", expected host memory");
  Runner(p).run();
}

}  // namespace ariadne
