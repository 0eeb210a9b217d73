// ariadne/estimate.hpp — block-sparse pattern estimators for causal prefill: RRAttention,
// XAttention and an exact oracle, behind one entry point, plus the metrics that compare them.
//
// Geometry (shared with pattern.hpp). Tokens are packed: q is [total_q, heads_q, head_dim] and k is
// [total_k, heads_kv, head_dim] (head_dim contiguous, other strides free; f32, bf16 or f16; host
// memory for the CPU backend), cut into sequences by the layout pattern's cu_seqlens. Inside a
// sequence of lq queries and lk >= lq keys, local query iq sits at key position p = iq + (lk − lq)
// (bottom-right alignment, so chunked prefill works). Blocks of `block` tokens are counted from
// local index 0 on each side: query block m holds iq ∈ [mB, (m+1)B), key block n holds
// ik ∈ [nB, (n+1)B). Strides of `stride` tokens (S divides B) are counted the same way.
// The diagonal key block of query block m is the key block of its last query's position:
//   diag(m) = (min((m+1)B, lq) − 1 + lk − lq) / B,   visible key blocks: 0 … diag(m).
//
// Estimators (docs/rrattention.md has the derivations and the measured effects):
//  rr      RRAttention. Query head h samples one query per query stride i, at
//            paper:    P(i,h) = iS + (S − 1 − (h mod S))
//            released: P(i,h) = iS + (h mod S)
//          (clamped to the stride's last query when the final stride is short). Key strides are
//          summed per KV head: K̄_j = Σ_{t<S} k_{jS+t} (missing keys of a short final stride are 0).
//          I(i,j) = scale · q_P·K̄_j / S over the visible key strides jS <= P + (lk − lq) (the
//          released code's rule: the diagonal stride's sum includes up to S−1 keys after the
//          query), softmax over j per sampled query, block score = Σ of the softmax over the
//          strides of the (query block, key block) tile. Selection: the smallest set of key
//          blocks, by descending score, whose mass reaches τ of the row; protections are then
//          OR-ed in (B_dynamic ∨ B_static).
//  xattn   XAttention. A(r,c) = scale · Σ_{t<S} q_{rS+S−1−t}·k_{cS+t} / S (one antidiagonal of the
//          S×S tile; tokens past the end count as 0), visible when cS <= (last query of stride r)
//          + (lk − lq) (the diagonal stride whole), row softmax, block sums. Selection as
//          published: forced blocks (sink, diagonal) are counted first, then blocks are added by
//          descending score while the mass before the block is < τ of the row. The KV head is
//          indexed directly (h / group), never repeated.
//  oracle  Exact block mass of full causal softmax attention: per query the LSE of its row, then
//          Σ exp(s − LSE) per key block, one query block at a time (no N×N matrix). Selection as
//          rr without protections (unless asked for): the ground truth of block precision/recall.
//
// Ties in the descending order are broken by the smaller key-block index, so results do not
// depend on the thread count. τ >= 1 keeps every visible block.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ariadne/attention.hpp"
#include "ariadne/device.hpp"
#include "ariadne/pattern.hpp"
#include "ariadne/tensor.hpp"

namespace ariadne {

enum class Estimator : uint8_t { rr, xattn, oracle };
enum class RROffset : uint8_t { paper, released };

const char* estimator_name(Estimator e);
Estimator parse_estimator(const std::string& s);  // "rr" | "xattn" | "oracle"
const char* rr_offset_name(RROffset o);
RROffset parse_rr_offset(const std::string& s);   // "paper" | "released"

// Always-kept blocks, OR-ed with the estimator's selection.
struct Protections {
  bool last_row = false;  // the last query block of each sequence keeps every visible key block
  bool sink = false;      // key block 0
  bool diagonal = false;  // the diagonal key block diag(m)

  // As each method was released: rr all three, xattn sink + diagonal, oracle none.
  static Protections published(Estimator e);
};

struct EstimateConfig {
  Estimator method = Estimator::rr;
  int32_t block = 128;                 // B, tokens per block (query and key blocks)
  int32_t stride = 8;                  // S, must divide B
  double tau = 0.95;                   // τ ∈ (0, 1]: share of each row's score mass to keep
  std::vector<double> tau_per_head;    // empty, or one τ per query head (overrides tau)
  RROffset offset = RROffset::paper;   // rr only: which sampling formula
  std::optional<Protections> protect;  // unset: Protections::published(method)
  float scale = 0.f;                   // softmax scale; 0 selects 1/sqrt(head_dim)
  // CUDA backend: also copy the mask and the scores back into EstimateResult::mask / scores.
  // false leaves them only in EstimateResult::device (what the CUDA attention reads); at 128K
  // tokens and 32 heads the copies are ~130 MB, longer than the estimate itself.
  bool host_copy = true;
  // CUDA backend: keep the estimator's workspace (scoring scratch, key-stride sums, selection
  // flags, geometry tables, pinned staging; ~2.2 GB at 128K tokens with 32/8 heads and B 128, ~4×
  // that for the oracle) cached for the next call on this device. false frees it when this call
  // returns, giving the memory back (the next call allocates it again). See estimate() for who
  // owns it.
  bool keep_workspace = true;
  // CUDA backend: allocate the result's device arrays (EstimateResult::device) with
  // DeviceBuffer::stream_ordered (a library pool, stream-ordered on the legacy default stream)
  // instead of cudaMalloc, so that neither the allocation nor the result's destruction
  // (cudaFree waits for the whole device) synchronizes: a prefill that estimates once per layer
  // then pays no device-wide wait per layer. Same contents. Off by default because of the
  // lifetime rule it brings: work on a non-blocking stream that reads the arrays must be finished
  // when the result is destroyed (see DeviceBuffer::stream_ordered). keep_workspace = false also
  // trims that pool.
  bool cuda_pooled_result = false;
  // CUDA backend: compute the stride logits with the f32 CUDA-core kernel instead of the tensor-
  // core one (bf16 mma.sync on exact bf16 splits of the operands; docs/numerics.md gives the
  // difference). The environment variable ARIADNE_EST_F32=1 sets it for every call.
  bool cuda_f32_scoring = false;
  // CUDA backend, tensor-core scoring: the restructured v2 kernel (docs/rrattention.md, "Scoring
  // kernel v2"; same scores bit for bit, 2.0-2.3x faster at 32K-128K) where it applies: RR with
  // B / S = 8 or 16. Elsewhere, and when false, the v1 kernel runs. ARIADNE_EST_V2=0 or =1 in the
  // environment (read per call) overrides it for every call.
  bool cuda_scoring_v2 = true;
  // CUDA backend, tensor-core scoring: the v3 kernel (docs/rrattention.md, "Scoring kernel v3";
  // adjacent query blocks share each K̄ tile, and at head_dim 128 the logits run on asynchronous
  // wgmma overlapping the softmax partials; same scores bit for bit; 1.4x v2 at 128K S 8, 2.0x at
  // S 16) where it applies: v2's cases with bf16 inputs. It takes precedence over cuda_scoring_v2
  // there; the default since session 4. ARIADNE_EST_V3=0 or =1 in the environment (read per call)
  // overrides it for every call; ARIADNE_EST_V3_KIND=narrow keeps v3's mma.sync variant at
  // head_dim 128 too.
  bool cuda_scoring_v3 = true;
  // CUDA backend, v3 at head_dim 128 (bf16 q, RR with B / S = 8 or 16): true runs the build whose
  // scores equal the v1 kernel's and the f32 kernel's bit for bit on every input (and the CPU's on
  // exact inputs); false (the default since session 7) the approximate one (docs/rrattention.md,
  // "Scoring kernel v3, approximate partials": ex2.approx partials and K̄'s two high bf16 terms;
  // scores within 1e-5 of the exact kernel's and 2e-5 of the CPU's, docs/numerics.md rules 2 and 3;
  // 0.75-0.83x its scoring time at 128K S 8). Other head dims and dtypes are exact either way.
  // ARIADNE_EST_V3_FAST in the environment (read per call) overrides it: 1 exact, 4 approximate.
  bool cuda_exact_scoring = false;

  Protections protections() const { return protect ? *protect : Protections::published(method); }
  double tau_of(int head) const { return tau_per_head.empty() ? tau : tau_per_head[size_t(head)]; }
};

// Throws ariadne::Error when a field is out of range: block > 0, 0 < stride, B % S == 0, τ in
// (0, 1], tau_per_head empty or heads_q entries each in (0, 1], scale finite and >= 0.
void validate(const EstimateConfig& c, int heads_q);

struct EstimateStats {
  // Wall time per stage, milliseconds. sampling: building the operands (rr: gathering sampled
  // queries and summing key strides; xattn: re-laying q/k as stride rows; oracle: converting q/k
  // to f32); scoring: logits, softmax and block sums; selection: sorting, thresholds, the CSR.
  double ms_sampling = 0, ms_scoring = 0, ms_selection = 0, ms_total = 0;
  // CUDA backend: host wall time before the first kernel is enqueued (geometry, tables,
  // allocations, uploads; the device idles behind it) and after the final synchronization
  // (statistics, host copies, workspace release): the parts of ms_total outside the stages.
  double ms_host_setup = 0, ms_host_finish = 0;
  int64_t kept_blocks = 0;     // nonzeros of the mask
  int64_t visible_blocks = 0;  // causally visible (query block, key block) pairs, all heads
  double density = 0;          // kept / visible
  std::vector<double> density_per_head;  // [heads_q]: kept / visible of each query head
  double mac = 0;              // multiply-adds spent on scoring (the cost model of SPEC C.5)
  bool tensor_core_scoring = false;  // CUDA: the logits ran on the tensor-core kernel
  bool scoring_v2 = false;           // CUDA: ... on its v2 variant (EstimateConfig::cuda_scoring_v2)
  bool scoring_v3 = false;           // CUDA: ... on its v3 variant (EstimateConfig::cuda_scoring_v3)
  bool approximate_scoring = false;  // CUDA: ... on an approximate build (EstimateConfig::cuda_exact_scoring)
};

// The CUDA backend's output, in device memory (empty for the CPU backend). The same CSR and score
// layout as EstimateResult::mask / scores; buffers of 4-byte elements hold int32 (row_ptr,
// col_idx, seq_block_base), score_ptr holds int64 (two 4-byte elements each). col_idx holds the
// mask's nnz = row_ptr[rows] entries at its start; the buffer itself has room for every visible
// block (score_ptr[rows]), because it is allocated before the device knows nnz.
struct DeviceEstimate {
  int32_t block = 0, heads = 0;
  DeviceBuffer seq_block_base, row_ptr, col_idx;  // int32 [num_seqs + 1], [rows + 1], [>= nnz]
  DeviceBuffer score_ptr;                         // int64 [rows + 1]
  DeviceBuffer scores;                            // f32 [score_ptr[rows]]
  bool defined() const { return row_ptr.data() != nullptr; }
  // Device pointers, for Pattern::with_blocks on device tensors (Backend::cuda attention).
  BlockSparseView view() const;
};

// The estimate: a mask in the CSR form the attention kernels read, and the scores behind it.
struct EstimateResult {
  BlockMask mask;  // rows (sequence, query head, query block), see pattern.hpp
  // Per row r, the normalized block scores of key blocks 0 … diag(row): score(r, n) =
  // scores[score_ptr[r] + n], n < score_ptr[r+1] − score_ptr[r]. Each row sums to 1 (up to
  // rounding). For the oracle these are the exact attention masses of the blocks, divided by the
  // number of queries in the query block.
  std::vector<int64_t> score_ptr;  // [rows + 1]
  std::vector<float> scores;
  std::vector<int32_t> row_queries;  // [rows]: queries in the row's query block (the row weight)
  int32_t heads = 0;
  EstimateStats stats;
  DeviceEstimate device;  // CUDA backend only: the mask and scores on the device

  int64_t rows() const { return int64_t(row_queries.size()); }
  int64_t visible(int64_t r) const { return score_ptr[size_t(r) + 1] - score_ptr[size_t(r)]; }
  float score(int64_t r, int64_t n) const { return scores[size_t(score_ptr[size_t(r)] + n)]; }
};

// Runs the estimator. `layout` gives the sequences: Pattern::causal(), optionally
// .with_varlen(n, cu_q, cu_k) (host arrays); any other pattern (window, chunk, blocks) is an error,
// as is lq > lk in a sequence. Backend::cpu and reference run the CPU estimator (OpenMP over
// (head, query block), deterministic for any thread count; host tensors). Backend::cuda runs the
// CUDA estimators (rr, xattn and the oracle; device tensors, cu_seqlens in host or device memory;
// fills `device` and, when config.host_copy, mask and scores; deterministic). Backend::automatic picks
// by q's device. estimate_supports says why a backend cannot run.
// CUDA backend, memory and threads: the result owns its `device` arrays. Everything else the call
// needs on the device (see EstimateConfig::keep_workspace) is a workspace owned by the library,
// one per device (the current one), created by the first call, grown by a call that needs more,
// kept until the process ends or a call with keep_workspace = false. Calls may come from any
// thread: a call holds its device's workspace from its first copy until it returns (it
// synchronizes at the end, the stage times and density being results), so calls on one device run
// one after another. The kernels run on the legacy default stream. Do not cudaDeviceReset while the
// workspace is kept (its pointers would dangle): call once with keep_workspace = false first.
EstimateResult estimate(const TensorView& q, const TensorView& k, const Pattern& layout,
                        const EstimateConfig& config, Backend backend = Backend::automatic);
bool estimate_supports(Backend backend, const TensorView& q, std::string* why = nullptr);

// RR's sampled query (local index) of query stride i for query head h in a sequence of lq queries:
// iS + (S − 1 − (h mod S)) (paper) or iS + (h mod S) (released), clamped to lq − 1.
int64_t rr_sample_position(RROffset offset, int32_t stride, int64_t i, int head, int64_t lq);

// The selection rule alone, on one row of normalized scores (tests and other estimators use it).
// scores: the row's visible key blocks 0 … n−1. forced: blocks kept whatever their score.
// forced_first: count the forced blocks' mass before the greedy pass (XAttention) instead of
// OR-ing them in afterwards (RRAttention). Returns sorted key-block indices.
std::vector<int32_t> select_blocks(const float* scores, int64_t n, double tau,
                                   const std::vector<int32_t>& forced, bool forced_first);

// The selection step of estimate() on its own: `config`'s rule (τ or tau_per_head; the
// protections, counted first for xattn and OR-ed in afterwards for rr and the oracle; last_row
// keeps every visible block of each sequence's last query block) applied to select_blocks on every
// row of `scored`. Reads scored.score_ptr, scores and heads, and the row geometry from scored.mask
// (block, heads, seq_block_base; its row_ptr and col_idx are not read), so a finished estimate can
// be selected anew at another τ without scoring again: estimate() itself builds its mask with this
// function, so on the CPU backend select_mask(estimate(c), c') equals estimate(c').mask for any
// c' that differs from c only in τ / tau_per_head / protections. `stats`, when set, receives
// kept_blocks, visible_blocks, density and density_per_head. Needs host scores (CUDA: host_copy).
BlockMask select_mask(const EstimateResult& scored, const EstimateConfig& config,
                      EstimateStats* stats = nullptr);

// ---- metrics against the oracle ----
struct MaskMetrics {
  double mass_recall = 0;  // true attention mass on kept blocks / total mass (all heads)
  double precision = 0, recall = 0, f1 = 0;  // blocks, against the oracle's mask
  double density = 0;      // kept / causally visible blocks
  int64_t kept = 0, oracle_kept = 0, true_positive = 0, visible = 0;
  std::vector<double> mass_recall_per_head;  // [heads]
};
// `mask` must have the oracle's geometry (block, heads, rows, visible counts). The oracle's
// scores are the true masses; its mask is the ground-truth block set at its τ.
MaskMetrics compare_to_oracle(const BlockMask& mask, const EstimateResult& oracle);

// One point of a τ sweep: the estimator's mask and the oracle's mask, both selected anew at `tau`.
struct TauSweepPoint {
  double tau = 0;
  MaskMetrics metrics;                   // the estimator's mask at tau against the oracle's at tau
  std::vector<double> density_per_head;  // [heads]: the estimator's mask
  double oracle_density = 0;             // the oracle's mask at tau
};
// Recall-vs-density curves from one scoring pass: for every τ of `taus` (each in (0, 1]), the
// estimator's scores (`scored`) selected with `config` at τ and the oracle's masses selected with
// `oracle_config` at τ (both with select_mask, tau_per_head dropped: one τ for every head), then
// compared as compare_to_oracle does. The point at τ = config.tau equals
// compare_to_oracle(scored.mask, oracle) for an oracle selected at config.tau.
std::vector<TauSweepPoint> tau_sweep(const EstimateResult& scored, const EstimateConfig& config,
                                     const EstimateResult& oracle, const EstimateConfig& oracle_config,
                                     const std::vector<double>& taus);

}  // namespace ariadne
