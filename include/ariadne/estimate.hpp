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
//          (clamped to the stride's last query when the final stride is short), with h the
//          rotation index of the RR schedule: the query head (head, the method as published),
//          0 (none: every head samples the same position), the layer ℓ (layer: one position
//          per layer, shared by its heads) or h + ℓ (hybrid); the paper's ablation (its table 6)
//          compares the four, docs/rrattention.md defines them. Key strides are
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
//  flexprefill FlexPrefill (Lai et al., ICLR 2025; src/estimate/cpu/flexprefill.cpp states its
//          rule): an exact probe of the last B queries gives vertical (per key) and slash (per
//          distance) scores; per head, budgets that reach γ = tau of each, and a query-aware test
//          (sqrt JSD of the pooled q̄·K̄ estimate against the pooled vertical scores < flex_js_tau)
//          that adds the blocks of the block-causal q̄·K̄ map up to γ of its mass. Its own selection:
//          select_mask and tau_sweep refuse it (re-run estimate() per γ). The row scores are the
//          q̄·K̄ map's rows. CPU and CUDA backends.
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

enum class Estimator : uint8_t { rr, xattn, oracle, flexprefill };
enum class RROffset : uint8_t { paper, released };
// RR's schedule: which index rotates the sampled position (see above): head, none, layer, hybrid.
enum class RRSchedule : uint8_t { head, none, layer, hybrid };

const char* estimator_name(Estimator e);
Estimator parse_estimator(const std::string& s);  // "rr" | "xattn" | "oracle" | "flexprefill"
const char* rr_offset_name(RROffset o);
RROffset parse_rr_offset(const std::string& s);   // "paper" | "released"
const char* rr_schedule_name(RRSchedule s);
RRSchedule parse_rr_schedule(const std::string& s);  // "head" | "none" | "layer" | "hybrid"

// Always-kept blocks, OR-ed with the estimator's selection.
struct Protections {
  bool last_row = false;  // the last query block of each sequence keeps every visible key block
  bool sink = false;      // key block 0
  bool diagonal = false;  // the diagonal key block diag(m)

  // As each method was released: rr all three, xattn sink + diagonal, oracle none.
  static Protections published(Estimator e);
};

// The CUDA scoring kernels (docs/design/estimate.md describes each). automatic: the routing's
// choice for the case, in this order of preference:
//   wgmma_approximate  RR, bf16 q and k, head_dim 113-128 (padded to 128), B / S = 8 or 16: the
//                      default there (the Llama shape); cuda_exact_scoring picks wgmma_exact
//   wgmma_exact        the same cases; scores bit for bit those of mma_generic
//   mma_grouped        RR, bf16, B / S = 8 or 16, other head dims: 128 rows a CTA, adjacent query
//                      blocks sharing each K̄ tile (mma.sync); bit for bit mma_generic's
//   mma_rr             RR with B / S = 8 or 16, any dtype (f16 and f32 inputs); bit for bit
//                      mma_generic's
//   mma_generic        every method and shape (XAttention, the oracle, RR at other B / S)
//   f32                CUDA-core f32 FMAs: under cuda_f32_scoring, or where the tensor-core tiles
//                      exceed a CTA's shared memory
enum class CudaScoring : uint8_t {
  automatic,
  wgmma_approximate,
  wgmma_exact,
  mma_grouped,
  mma_rr,
  mma_generic,
  f32,
};
const char* cuda_scoring_name(CudaScoring s);
CudaScoring parse_cuda_scoring(const std::string& s);  // the names above

// Explicit choices for tests and benchmarks, never read from the environment.
struct EstimateOverrides {
  // CUDA backend: run this scoring kernel instead of the routing's choice (automatic). It takes
  // precedence over cuda_f32_scoring and cuda_exact_scoring; a kernel that cannot run the case is
  // an ariadne::Error saying why. The CPU backend ignores it.
  CudaScoring scoring = CudaScoring::automatic;
};

struct EstimateConfig {
  Estimator method = Estimator::rr;
  int32_t block = 128;                 // B, tokens per block (query and key blocks)
  int32_t stride = 8;                  // S, must divide B
  double tau = 0.95;                   // τ ∈ (0, 1]: share of each row's score mass to keep
  std::vector<double> tau_per_head;    // empty, or one τ per query head (overrides tau)
  RROffset offset = RROffset::paper;   // rr only: which sampling formula
  RRSchedule schedule = RRSchedule::head;  // rr only: which index rotates it (CPU backend: all;
                                           // CUDA: head)
  int32_t layer = 0;                   // ℓ >= 0, the layer being estimated (schedules layer, hybrid)
  // flexprefill only (γ is tau): the query-aware threshold on sqrt(JSD) and the budgets in tokens
  // (defaults of its released scripts: τ 0.1, min budget 1024, no max budget: 0).
  double flex_js_tau = 0.1;
  int64_t flex_min_budget = 1024;
  int64_t flex_max_budget = 0;
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
  // Numerics of the CUDA scoring (the CPU backend ignores both):
  // cuda_f32_scoring: the stride logits on the f32 CUDA-core kernel (the CPU's products, summed in
  // another order) instead of the tensor-core kernels (bf16 mma on exact bf16 splits of the
  // operands; docs/numerics.md gives the difference). Slower; for a caller who wants f32 FMAs.
  bool cuda_f32_scoring = false;
  // cuda_exact_scoring: where the default is the approximate build of the wgmma kernel (RR, bf16
  // q, head_dim 128, B / S 8 or 16), run its exact build instead, whose scores equal the generic
  // tensor-core kernel's and the f32 kernel's bit for bit on every input (and the CPU's on exact
  // inputs). The approximate build (ex2.approx partials, K̄'s two high bf16 terms) keeps scores
  // within 1e-5 of the exact kernels' and 2e-5 of the CPU's (docs/numerics.md rules 2 and 3) in
  // ~0.8× the scoring time. Every other case is exact either way.
  bool cuda_exact_scoring = false;
  // Choices that tests and benchmarks force; users leave them at their defaults.
  EstimateOverrides overrides;

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
  // CUDA backend: the scoring kernel that ran (automatic on the CPU backend). Only
  // CudaScoring::wgmma_approximate gives approximate scores; f32 is the CUDA-core kernel, the
  // others run on tensor cores.
  CudaScoring scoring = CudaScoring::automatic;
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
  // A host mask copied to the device (no scores), for the CUDA attention; needs a CUDA build.
  static DeviceEstimate from_mask(const BlockMask& mask);
};

// The view of `mask` that attention on `device` reads, for Pattern::with_blocks: the host CSR
// itself on Device::cpu; on Device::cuda a device copy made into `device_copy`, which must outlive
// the attention call.
BlockSparseView mask_view_on(Device device, const BlockMask& mask, DeviceEstimate& device_copy);

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

// ---- RR under context parallelism ----
// RR reads the keys only through their stride sums K̄_j, so a rank that holds some of a sequence's
// queries needs the sums of the keys before them, never the keys. rr_key_sums gives the sums of a
// run of keys that starts on a stride boundary: f32 [ceil(n / S), heads_kv, head_dim], K̄_j =
// Σ_{t<S} k_{jS+t} summed in the order estimate() sums them (t ascending, missing keys of a short
// final stride 0). Host tensors.
Buffer rr_key_sums(const TensorView& k, int32_t stride);
// The RR estimate of the queries at positions [q_pos, q_pos + n_q) of one causal self-attention
// sequence of seq_len tokens, from that sequence's key-stride sums (f32 [>= ceil((q_pos + n_q) / S),
// heads_kv, head_dim], rr_key_sums of its first keys): a one-sequence result of n_q queries whose
// rows, scores and mask rows are, bit for bit, those estimate() gives these query blocks on the
// whole sequence (its last_row protection applies only when q_pos + n_q == seq_len). q_pos must be
// a multiple of config.block. Mask columns are the sequence's key blocks. CPU backend, rr only.
EstimateResult estimate_rr_from_key_sums(const TensorView& q, const TensorView& key_sums, int64_t q_pos,
                                         int64_t seq_len, const EstimateConfig& config);

// RR's sampled query (local index) of query stride i in a sequence of lq queries for rotation
// index r: iS + (S − 1 − (r mod S)) (paper) or iS + (r mod S) (released), clamped to lq − 1. The
// rotation index of query head h at layer ℓ is rr_rotation(schedule, h, ℓ): h, 0, ℓ or h + ℓ.
int64_t rr_sample_position(RROffset offset, int32_t stride, int64_t i, int rotation, int64_t lq);
int rr_rotation(RRSchedule schedule, int head, int32_t layer);

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

// The oracle's mask at another mask's size, row by row: each row keeps as many key blocks as
// `mask` keeps there, the ones of largest exact mass (oracle.scores; ties to the lower block), so
// both masks have the same density and the same count in every row, and no mask of those counts
// keeps more mass. The output error of sparse attention over it is what the estimator's mask is
// compared with at equal density (llm-probe --probe-outputs). `mask` must have the oracle's
// geometry, as for compare_to_oracle. Sorted rows, as every mask.
BlockMask oracle_mask_like(const BlockMask& mask, const EstimateResult& oracle);

// ‖out − ref‖₂ / ‖ref‖₂ over n values (sums in double): the output error of a sparse attention
// run against dense. NaN when it has no meaning: a NaN or infinity in either input, or an
// all-zero `ref` (0/0, or any error against nothing); never a clean-looking 0.
double relative_l2_error(const float* out, const float* ref, size_t n);

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
