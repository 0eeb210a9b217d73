// Internal: the CUDA estimators' kernels (key_sums.cu, score_*.cu, estimate_select.cu in
// src/estimate/cuda) and the plain-old-data they read. The host side (estimate_cuda.cu) builds these tables from the CPU
// estimator's Geometry, so both backends share one definition of sequences, rows and visibility.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "ariadne/estimate.hpp"

namespace ariadne::cuda {

// One sequence (mirrors est::Seq).
struct EstSeq {
  int64_t q0, k0, lq, lk, off;  // off = lk − lq
  int64_t row_base;             // first CSR row (seq_block_base · heads_q)
  int32_t nqb, nqs, nks;        // query blocks, query strides, key strides
  int32_t ks_base;              // first key-stride row of this sequence in Ksum
};

// Operands and geometry of the scoring kernels. Strides in elements; head_dim contiguous.
struct ScoreParams {
  const void* q;
  const void* k;
  int dtype;  // 0 f32, 1 bf16, 2 f16 (ariadne::DType order)
  int64_t q_tok, q_head, k_tok, k_head;
  float* ksum;                  // rr, f32 scoring: [heads_kv, total_ks, d] f32, Σ of each key stride
  // rr, tensor-core scoring: the same sums split exactly into three bf16 terms (hi, mid, lo,
  // Σ = K̄ for finite sums), [heads_kv, total_ks, 3, dpad] bf16, zero-padded past d.
  void* ksplit;
  int64_t total_ks;             // key-stride rows of all sequences
  const EstSeq* seqs;
  int num_seqs;
  const int32_t* qblock_seq;    // [total query blocks]: sequence of each global query block
  const int32_t* qblock_m;      // [total query blocks]: its block index inside the sequence
  const int64_t* score_ptr;     // [rows + 1]
  float* scores;                // [score_ptr[rows]], zeroed by the caller, accumulated here
  // Per (row, visible key block) partials (max, Σexp): the CTA of (query block gb, KV head, z)
  // owns kScoreRows · nvis(gb) pairs from scratch_base[gb] + (kvh · gridDim.z + z) · kScoreRows · nvis.
  float2* scratch;
  const int64_t* scratch_base;  // [total query blocks]
  int heads_q, heads_kv, group, d;
  int stride, block, spb;       // S, B, B / S
  int heads_per_cta;            // query heads of one KV group handled by one CTA
  int row_split;                // rounds of 64 rows per head (> 1 when B/S > 64; then
                                // heads_per_cta = 1)
  bool rr, paper;               // rr (else xattn); rr sampling offset
  float qmul;                   // scale / S, folded into the queries as on the CPU (f32
                                // scoring) or into the logits (tensor-core scoring)
  // Tensor-core scoring (bf16 operands, f32 accumulation): on when true, else the f32 kernel.
  bool mma;
  int dpad;                     // d rounded up to 16 (the mma k step)
  bool grouped;                 // kernel is mma_grouped or wgmma_* (group_ctas is set)
  int qterms, kterms;           // bf16 terms of each operand: 1 bf16, 2 f16, 3 f32 (rr k: 3)
  // The scoring kernel (never automatic; the host routes, scoring_refusal says where each runs).
  // mma_rr reads ksplit as the [heads_kv, total_ks, 3, dpad] array; the grouped kernels
  // (mma_grouped, wgmma_*) take group_ctas: num_group_ctas pairs (first global query block,
  // query blocks) of one sequence, one per CTA, at most group_blocks blocks each.
  CudaScoring kernel;
  bool approximate;             // kernel is wgmma_approximate
  int group_blocks;
  const int32_t* group_ctas;
  int num_group_ctas;
  // The kernels read none of grouped, kernel, approximate, group_blocks, num_group_ctas. Their
  // offsets and types are those of the fields they replaced: the kernels that take the address of
  // their ScoreParams copy it field by field, so a change here changes their machine code.
};

// Selection and CSR assembly.
struct SelectParams {
  const EstSeq* seqs;
  int num_seqs;
  const int32_t* qblock_seq;
  const int32_t* qblock_m;
  const int64_t* score_ptr;
  const float* scores;
  const double* tau;            // [heads_q]
  uint8_t* keep;                // [score_ptr[rows]] 0/1 per visible block
  int32_t* counts;              // [rows + 1] kept blocks per row (last entry 0, for the scan)
  const int32_t* row_ptr;       // [rows + 1] (compaction)
  int32_t* col_idx;             // [nnz]
  int heads_q, block;
  bool last_row, sink, diagonal, forced_first;
};

// FlexPrefill (flexprefill.cu): one sequence with its key-block, query-block and probe bookkeeping.
struct FlexSeq {
  int64_t q0, k0, lq, lk, off;  // off = lk − lq
  int64_t row_base;             // first CSR row
  int32_t nqb, nkb;             // query blocks, key blocks
  int32_t kb_base;              // first key block of this sequence in K̄ and the per-block flags
  int32_t probe;                // index among the probed sequences; −1: short input, every block kept
  int32_t nch;                  // key chunks of the probe (kFlexChunk keys each)
  int32_t ch_base;              // first chunk of this sequence among all probed sequences' chunks
};

// Operands, tables and the scratch of the FlexPrefill kernels. Strides in elements, head_dim
// contiguous. L, the probe's rows, is the block size B (a probed sequence has lq > 2B).
struct FlexParams {
  const void* q;
  const void* k;
  int dtype;  // 0 f32, 1 bf16, 2 f16
  int64_t q_tok, q_head, k_tok, k_head;
  const FlexSeq* seqs;
  const int32_t* probe_seq;     // [num_probe] sequence of each probed sequence
  const int32_t* kb_seq;        // [total_kb] sequence of each key block
  const int32_t* qb_seq;        // [total_qb] sequence of each query block
  const int32_t* qb_m;          // [total_qb] its index inside the sequence
  const int32_t* ch_seq;        // [total_ch] sequence of each probe chunk
  int num_seqs, num_probe;
  int64_t total_kb, total_qb, total_ch, total_k;
  int max_lk;                   // longest probed key range
  const int64_t* score_ptr;     // [rows + 1]
  float* scores;                // [score_ptr[rows]]: the map's rows, softmax over visible blocks
  float* kbar;                  // [heads_kv, total_kb, d] mean key of each key block
  float2* part;                 // [heads_q, total_ch, L] (max, Σexp) of a probe row over one chunk
  float2* stat;                 // [heads_q, num_probe, L] (max, Σexp) of a probe row
  float* vert;                  // [heads_q, total_k] vertical score per key
  float* slash;                 // [heads_q, total_k] slash score per distance
  float* slash_part;            // [heads_q, total_ch, L + kFlexChunk − 1] diagonal sums per chunk
  uint8_t* vsel;                // [heads_q, total_kb] kept vertical blocks
  uint8_t* ssel;                // [heads_q, total_kb] kept slash distance bins
  float* head_info;             // [heads_q, num_probe, 4]: sqrt JSD, query-aware, n_v, n_s
  uint8_t* keep;                // [score_ptr[rows]] 0/1 per visible block (zeroed by the caller)
  int32_t* counts;              // [rows + 1] kept blocks per row
  int heads_q, heads_kv, group, d, block;
  float scale;
  double gamma, js_tau;
  int64_t min_blocks, max_blocks;  // budgets in blocks: ceil(min_budget / B); ceil(max_budget / B) or 2^62
  bool sink, diagonal, last_row;   // protections asked for, OR-ed in
};
// Keys of one probe chunk (one CTA of the probe kernels).
constexpr int kFlexChunk = 64;
// The FlexPrefill stages, launched in this order on one stream (keep zeroed by the caller):
// sampling (K̄, the probe's two passes, the vertical and slash scores), scoring (the block-causal
// q̄·K̄ map into scores) and selection (the per-head decisions, the query-aware selection, the
// flags and counts of every row).
enum class FlexStage { sampling, scoring, selection };
cudaError_t launch_flexprefill(const FlexParams& p, FlexStage stage, cudaStream_t stream);
// The device's shared memory limit allows these operands (head_dim and block): "" or why not.
std::string flexprefill_refusal(int d, int block, int group, size_t smem_optin);

// Largest key-block count of one row the selection takes (16 per thread of its CTA).
constexpr int kMaxSelectBlocks = 4096;
// Rows (sampled query strides) of one scoring CTA and key strides per chunk.
constexpr int kScoreRows = 64;
constexpr int kScoreCols = 32;
constexpr int kScoreThreads = 256;
// Key strides per chunk of the tensor-core scoring kernel.
constexpr int kMmaCols = 64;

// Dynamic shared memory of the scoring kernel p.kernel for these parameters.
size_t scores_smem_bytes(const ScoreParams& p);
// Why kernel k cannot score the case p describes (p.kernel is ignored), or "" when it can:
// its method, block / stride, dtype and head-dim conditions (estimate.hpp, CudaScoring) and
// its shared memory against `smem_optin`, the device's per-CTA limit.
std::string scoring_refusal(const ScoreParams& p, CudaScoring k, size_t smem_optin);
// The same selection over plain rows (the decode page selection's): row r's blocks are
// scores[score_ptr[r], score_ptr[r + 1]), kept by its own tau[r]; nothing is forced.
struct RowSelectParams {
  const int64_t* score_ptr;     // [rows + 1]
  const float* scores;
  const double* tau;            // [rows]
  uint8_t* keep;                // [score_ptr[rows]] 0/1 per block
  int32_t* counts;              // [rows] kept blocks per row
};

// Adjacent query blocks one CTA of a grouped kernel (p.kernel) owns: its rows / (heads_per_cta · B/S).
int scores_blocks_per_cta(const ScoreParams& p);
inline bool scores_grouped(CudaScoring k) {
  return k == CudaScoring::mma_grouped || k == CudaScoring::wgmma_exact || k == CudaScoring::wgmma_approximate;
}

// Kernel launches on `stream`; each returns the launch error.
cudaError_t launch_key_stride_sums(const ScoreParams& p, cudaStream_t stream);
cudaError_t launch_scores(const ScoreParams& p, int64_t total_qblocks, cudaStream_t stream);
// The scoring kernels of each file (launch_scores dispatches): grid (x, heads_kv, z).
cudaError_t launch_scores_generic(const ScoreParams& p, dim3 grid, size_t smem, cudaStream_t stream);
cudaError_t launch_scores_grouped(const ScoreParams& p, dim3 grid, size_t smem, cudaStream_t stream);
cudaError_t launch_scores_wgmma(const ScoreParams& p, dim3 grid, size_t smem, cudaStream_t stream);
size_t scores_generic_smem_bytes(const ScoreParams& p);
size_t scores_grouped_smem_bytes(const ScoreParams& p);
size_t scores_wgmma_smem_bytes();
// Rows of one CTA of the grouped kernels.
constexpr int kGroupedRows = 128, kWgRows = 64;
cudaError_t launch_select(const SelectParams& p, int64_t total_qblocks, int max_visible, cudaStream_t stream);
cudaError_t launch_select_rows(const RowSelectParams& p, int64_t rows, int max_visible, cudaStream_t stream);
cudaError_t launch_compact(const SelectParams& p, int64_t rows, cudaStream_t stream);
// kept[h] = nonzeros of query head h's rows (from row_ptr), int64 [heads_q]: the density per head
// without reading the mask back to the host.
cudaError_t launch_head_counts(const SelectParams& p, int64_t* kept, cudaStream_t stream);
// counts [n] → row_ptr [n] exclusive prefix sum (n = rows + 1, so row_ptr[rows] = nnz), CUB's
// convention for the temporary storage: tmp == nullptr only sets tmp_bytes (no work is enqueued);
// otherwise tmp holds tmp_bytes (from such a query with the same n) and the scan runs on `stream`.
cudaError_t exclusive_scan(const int32_t* counts, int32_t* row_ptr, int64_t n, void* tmp, size_t& tmp_bytes,
                           cudaStream_t stream);

}  // namespace ariadne::cuda
