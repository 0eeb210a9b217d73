// ariadne/context_parallel.hpp — context-parallel (ring) prefill: the pieces every ring needs, the
// zig-zag sharding, the balance of block-sparse work, and a ring over ranks.
//
// A ring shards each sequence over N ranks. Every rank keeps its query rows, passes its K/V chunk to
// the next rank N times, attends its queries to each chunk it holds (a *piece*) and merges the
// partial results by their log-sum-exp (natural log):
//   lse = log(e^{lse_a} + e^{lse_b}),   out = e^{lse_a − lse} · out_a + e^{lse_b − lse} · out_b
// A partial with no allowed key has out = 0 and lse = −inf and changes nothing. Sinks are applied
// exactly once across the ring: a denominator sink by finish_partials (lse ← log(e^{lse} + e^{sink_h}),
// out scaled to match), a key-0 bias by the one piece whose keys hold position 0.
//
// Positions. A piece belongs to one self-attention sequence (lq == lk): query i and key i both sit
// at position i. Its queries are the positions [q_pos, q_pos + n_q), its keys [k_pos, k_pos + n_k);
// the rule (window, chunk, block mask) is the sequence's, in those positions, so the merge of the
// pieces over every key chunk equals attention over the whole sequence (docs/context-parallel.md).
//
// Zig-zag sharding (causal load balance): a sequence of L tokens is cut into 2N chunks of C tokens,
// C = ceil(L / 2N) rounded up to `align` (the last chunks may be short or empty); rank r holds
// chunks r and 2N − 1 − r, so every rank has one early and one late chunk and, under a causal
// mask, the same number of (query, key) pairs up to one chunk's rounding.
#pragma once

#include <cstdint>
#include <vector>

#include "ariadne/attention.hpp"
#include "ariadne/estimate.hpp"
#include "ariadne/prefill.hpp"

namespace ariadne {

// ---- the pieces ----

// One piece: queries of one sequence against one run of its keys, partial out and LSE in f32.
struct PieceParams {
  TensorView q;     // [n_q, heads_q, head_dim]: queries at positions q_pos … q_pos + n_q − 1
  TensorView k, v;  // [n_k, heads_kv, head_dim]: keys at positions k_pos … k_pos + n_k − 1
  int64_t q_pos = 0, k_pos = 0;
  // The sequence's rule in positions: window and chunk (window_left/right, chunk); no varlen and
  // no blocks here (those come from `blocks`).
  Pattern rule;
  // Optional: the sequence's block mask restricted to this piece's query blocks. Rows
  // h · ceil(n_q / block) + m for query head h and local query block m (the block at positions
  // q_pos + m·block …), columns the sequence's key blocks (position / block); seq_block_base
  // {0, ceil(n_q / block)}. q_pos and k_pos must then be multiples of block. Host arrays.
  BlockSparseView blocks;
  SinkMode sink_mode = SinkMode::none;  // key0_bias is applied here when the keys hold position 0;
  TensorView sink;                      // denominator sinks are left to finish_partials
  float scale = 0.f;                    // 0 selects 1/sqrt(head_dim)
  TensorView out;  // f32 [n_q, heads_q, head_dim], written
  TensorView lse;  // f32 [heads_q, n_q] contiguous, written (−inf where a query sees no key)
  void* stream = nullptr;  // cudaStream_t for device tensors
  // Optional: f32 scratch of >= heads_q · n_q elements on q's device for the calls' LSE (attention()
  // writes a contiguous one); without it the piece allocates one per call.
  TensorView lse_scratch;
};

// What a piece computed: score entries (query head, query, key) its rule allows. Under the element
// rule the count is exact; it is the work the piece gives a kernel.
struct PieceWork {
  int64_t calls = 0;    // attention calls the piece made (0 when its rule allows nothing)
  int64_t entries = 0;  // allowed (head, query, key) triples
};

// Runs one piece on `backend`: host tensors on cpu or reference, device tensors on cuda (every
// output enqueued on p.stream; `blocks` stays a host array, its slice is uploaded per call, which
// synchronizes). The piece is cut into at most one call per attention chunk (one call without
// chunks); each call takes views of q, k, v trimmed to the rows the window can reach and a local
// pattern whose window is the sequence's shifted by the views' offset. Throws ariadne::Error naming
// the field when shapes, dtypes, devices or positions disagree.
PieceWork attention_piece(const PieceParams& p, Backend backend = Backend::automatic);

// acc ← merge(acc, part) row by row as above; all f32 on one device, out [n, heads, dim] (rows
// strided, dim contiguous), lse [heads, n] (columns contiguous). Device tensors: a kernel on `stream`.
void merge_partial(const TensorView& acc_out, const TensorView& acc_lse, const TensorView& part_out,
                   const TensorView& part_lse, void* stream = nullptr);

// The final result of merged partials: `out` (any attention dtype) and, when defined, `lse` (f32
// [heads, n], may be strided along n) from acc_out / acc_lse, with a denominator sink added once.
// sink_mode key0_bias and none add nothing here.
void finish_partials(const TensorView& acc_out, const TensorView& acc_lse, SinkMode sink_mode, const TensorView& sink,
                     const TensorView& out, const TensorView& lse, void* stream = nullptr);

// ---- sharding ----

// A half-open run of positions of one sequence.
struct PosRange {
  int64_t lo = 0, hi = 0;
  int64_t size() const { return hi > lo ? hi - lo : 0; }
};

// The zig-zag chunks of a sequence of `len` tokens over `ranks` ranks, chunk sizes rounded up to
// `align` (>= 1): element r is rank r's pair {chunk r, chunk 2·ranks − 1 − r}.
std::vector<std::pair<PosRange, PosRange>> zigzag_shards(int64_t len, int ranks, int64_t align);

// One rank's rows of a packed batch of sequences of `lengths` tokens: for each sequence in order,
// its zig-zag chunks (zigzag_shards) that are not empty, each with the row where it starts in the
// rank's tensors (the rows of all its runs, back to back). What every ring shards by.
struct ShardRun {
  int32_t seq = 0;
  PosRange pos;
  int64_t row = 0;
};
std::vector<ShardRun> zigzag_runs(const std::vector<int64_t>& lengths, int rank, int ranks, int64_t align);
int64_t rows_of(const std::vector<ShardRun>& runs);  // the rank's row count

// The rows of p's block mask (host arrays) for queries [q0, q0 + n) of sequence s, q0 a multiple
// of the block, as a mask of their own: rows head · ceil(n / block) + local block, columns the
// sequence's key blocks. The mask a piece, or a ring's query run, takes.
BlockMask mask_rows(const Pattern& p, int32_t s, int64_t total_q, int64_t total_k, int64_t q0, int64_t n);

// Query blocks handed between ranks so that each rank's block-sparse work is close to the mean.
// work[r][i]: the work of rank r's i-th query block (any unit, >= 0). The result assigns every
// (owner, index) to one rank: blocks stay with their owner while the owner is under the mean
// (heaviest first); what is left goes, heaviest first, to the rank with the least work so far
// (ties to the lower rank). Deterministic.
struct BlockAssignment {
  std::vector<std::vector<int>> rank_of;  // [owner][index] → the rank that computes it
  std::vector<double> load;               // [rank]: work assigned
  std::vector<double> load_before;        // [rank]: work owned (no hand-off)
  int64_t moved = 0;                      // blocks computed away from their owner
  double imbalance() const;               // max / mean of load (1 when all zero)
  double imbalance_before() const;        // the same of load_before
};
BlockAssignment balance_query_blocks(const std::vector<std::vector<double>>& work);

// ---- the ring on the CPU ----

struct RingConfig {
  int ranks = 2;              // N >= 1
  int64_t align = 0;          // chunk sizes are multiples of this; 0: the mask's block (or 1 when dense)
  Backend backend = Backend::cpu;  // each piece's attention (cpu or reference)
  bool balance = true;        // ring_prefill: hand query blocks between ranks (balance_query_blocks)
};

struct RingRankStats {
  int64_t entries = 0;          // allowed score entries this rank computed
  int64_t calls = 0;            // attention calls
  int64_t bytes_sent = 0;       // K/V (and, in ring_prefill, K̄, queries and outputs) it sent
  std::vector<int64_t> step_entries;  // [N]: entries per ring step
};

struct RingStats {
  std::vector<RingRankStats> ranks;
  double imbalance() const;  // max / mean of entries over ranks
  double ms_total = 0;
};

// Ring attention simulated on the host: N ranks as threads, each holding its zig-zag shards of q,
// k, v of every sequence, K/V passed to the next rank by copy N − 1 times, partials merged by LSE,
// sinks applied once. `p` is the whole problem as attention() takes it (host tensors; self-attention
// sequences, lq == lk; any window, chunk, block mask, sink mode and GQA); p.out and p.lse receive
// what attention(p) would give, within the tolerance of docs/numerics.md (the merge reorders sums).
// Only the K/V heads travel. With a block mask the chunk alignment is its block.
RingStats ring_attention(const AttentionParams& p, const RingConfig& config);

// Block-sparse prefill under context parallelism, simulated on the host: each rank sums its own
// keys' strides (rr_key_sums), the sums are all-gathered (never K), each rank estimates its query
// chunks (estimate_rr_from_key_sums: the same mask rows as a one-device estimate), query blocks are
// handed between ranks to balance the masks' work (config.balance), then the ring runs with each
// rank's mask rows and the outputs go back to their owners. RR only; config.dense runs the dense
// causal ring. Writes p.out / p.lse; returns the estimate gathered into one mask (equal to
// prefill()'s, exactly) in result.estimate.mask and the ring's statistics.
struct RingPrefillResult {
  PrefillResult prefill;  // estimate.mask, stats.density (the gathered mask)
  RingStats ring;
  BlockAssignment assignment;  // empty when dense
};
RingPrefillResult ring_prefill(const AttentionParams& p, const PrefillConfig& config, const RingConfig& ring);

}  // namespace ariadne
