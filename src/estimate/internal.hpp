// Internal pieces shared by the CPU estimators (src/estimate/*.cpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ariadne/estimate.hpp"

namespace ariadne::est {

// One sequence of the packed batch, with its block and stride bookkeeping.
struct Seq {
  int64_t q0 = 0, k0 = 0, lq = 0, lk = 0;
  int64_t off = 0;        // lk − lq: key position of local query 0
  int64_t nqb = 0;        // query blocks, ceil(lq / B)
  int64_t nqs = 0;        // query strides, ceil(lq / S)
  int64_t nks = 0;        // key strides, ceil(lk / S)
  int64_t row_base = 0;   // first CSR row of this sequence (seq_block_base · heads)
  int64_t qs_base = 0;    // first query-stride row of this sequence in the packed stride arrays
  int64_t ks_base = 0;    // first key-stride row of this sequence in the packed stride arrays
};

// The whole batch: sequences plus the row enumeration of pattern.hpp.
struct Geometry {
  int64_t total_q = 0, total_k = 0;
  int heads_q = 0, heads_kv = 0, dim = 0, group = 1;
  int64_t block = 0, stride = 0;
  std::vector<Seq> seqs;
  int64_t rows = 0, total_qs = 0, total_ks = 0;

  struct Row {
    int32_t s, h;
    int64_t m;
  };
  Row row(int64_t r) const;  // inverse of row(s, h, m) = row_base[s] + h·nqb[s] + m
  std::vector<Row> rows_of_head(int h) const;  // every (s, h, m), in row order
  // Diagonal key block of query block m: the key block of its last query's position.
  int64_t diag(const Seq& e, int64_t m) const {
    const int64_t last = (m + 1) * block < e.lq ? (m + 1) * block - 1 : e.lq - 1;
    return (last + e.off) / block;
  }
  int64_t queries_in(const Seq& e, int64_t m) const {
    const int64_t hi = (m + 1) * block < e.lq ? (m + 1) * block : e.lq;
    return hi - m * block;
  }
};

// Validates q, k and the layout (causal, varlen, lq <= lk) and builds the geometry. q and k must
// live on `device`; the layout's cu_seqlens are read on the host (the CUDA path copies them first).
Geometry make_geometry(const TensorView& q, const TensorView& k, const Pattern& layout,
                       int64_t block, int64_t stride, Device device = Device::cpu);

// Copies row (token, head) of an attention operand into dst as f32, times `mul`.
void load_row(const TensorView& t, int64_t token, int64_t head, float mul, float* dst);

// C[r·ldc + c] = A[r]·B[c] for r < rows, c < cols; A is [rows × len], B is [cols × len], both
// row-major with row length `len`. Picks an AVX2+FMA kernel when the CPU has one.
void dot_rows(const float* a, int64_t rows, const float* b, int64_t cols, int64_t len, float* c,
              int64_t ldc);
void dot_rows_generic(const float* a, int64_t rows, const float* b, int64_t cols, int64_t len,
                      float* c, int64_t ldc);
// x[i] ← exp(x[i] − mx) for i < n; returns Σ x[i] (double). mx >= every x[i].
double exp_sum(float* x, int64_t n, float mx);
double exp_sum_generic(float* x, int64_t n, float mx);
#if defined(__x86_64__)
// src/estimate/cpu/estimate_dot_avx2.cpp
void dot_rows_avx2(const float* a, int64_t rows, const float* b, int64_t cols, int64_t len,
                   float* c, int64_t ldc);
double exp_sum_avx2(float* x, int64_t n, float mx);
#endif

// score_ptr of the geometry's rows into out[0 .. rows]: the exclusive sum of the key blocks each
// row sees (its scores' offsets). The CUDA path writes it straight into its pinned upload staging.
void row_score_ptr(const Geometry& g, int64_t* out);
// The result's row geometry (heads, score_ptr, row_queries) for the geometry; score_ptr copied from
// `score_ptr` (rows + 1 entries, row_score_ptr's) when given. The CUDA path stops here: it fills
// host scores only when host_copy asks (tens of MB at 128K tokens).
void init_row_geometry(const Geometry& g, EstimateResult& r, const int64_t* score_ptr = nullptr);
// init_row_geometry plus the zeroed host score array [score_ptr.back()] the CPU estimators fill.
void init_rows(const Geometry& g, EstimateResult& r);

// The stride-level estimators (rr, xattn) and the oracle: fill r.scores, return the MAC count.
// `ms_sampling` receives the operand-building time.
// key_sums (rr only): the key-stride sums, f32 [>= total_ks, heads_kv, dim] of the one sequence,
// used instead of summing k (k is then not read).
double score_strided(const Geometry& g, const TensorView& q, const TensorView& k,
                     const EstimateConfig& c, float scale, EstimateResult& r, double& ms_sampling,
                     const TensorView* key_sums = nullptr);
// dst[0 .. d) += k rows first … first + count − 1 of KV head kh, in row order (RR's K̄; tmp holds d floats).
void sum_key_stride(const TensorView& k, int64_t first, int64_t count, int64_t kh, float* tmp, float* dst);
double score_oracle(const Geometry& g, const TensorView& q, const TensorView& k, float scale,
                    EstimateResult& r, double& ms_sampling);
// FlexPrefill (src/estimate/cpu/flexprefill.cpp): fills r.scores (the q̄·K̄ map's rows) and its own
// selection, one sorted key-block list per row, into `lists`; returns the MAC count.
double score_flexprefill(const Geometry& g, const TensorView& q, const TensorView& k, const EstimateConfig& c,
                         float scale, EstimateResult& r, std::vector<std::vector<int32_t>>& lists);
// The CSR mask of per-row key-block lists (sorted) in the result's row geometry (scored.mask's
// seq_block_base), and the density statistics per head (row_head: each row's query head).
BlockMask assemble_mask(const EstimateResult& scored, const std::vector<std::vector<int32_t>>& lists,
                        const std::vector<int32_t>& row_head, EstimateStats* stats);

#if defined(ARIADNE_WITH_CUDA)
// The CUDA estimator (src/estimate/cuda/estimate_cuda.cu): config validated, backend checked; fills the
// whole result (device arrays, stats and, when config.host_copy, mask and scores).
EstimateResult estimate_cuda(const TensorView& q, const TensorView& k, const Pattern& layout,
                             const EstimateConfig& config);
// Why the CUDA estimator cannot run these operands (empty: it can).
std::string estimate_cuda_refusal(const TensorView& q, const EstimateConfig* config);
// Milliseconds the device spends on the work `fn` enqueues on `stream` (CUDA events; synchronizes).
double cuda_timed_ms(void* stream, const std::function<void()>& fn);
#endif

inline double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace ariadne::est
