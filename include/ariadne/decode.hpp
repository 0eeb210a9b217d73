// ariadne/decode.hpp — decode-phase attention over a paged KV cache: each step, one new query per
// sequence reads that sequence's cached keys and values, either all of them (dense decode) or only
// the pages a selection keeps (sparse decode, the RRAttention paper's named future work: in decode
// attention is bound by the bytes of the cache it reads, so the only lever is pages not read).
//
// The cache (PagedKVCache)
//   K pool, V pool   [capacity_pages, kv_heads, page_size, head_dim]   f32, bf16 or f16 (host); a
//                    page's rows of one KV head are contiguous, so a decode task that reads one
//                    head streams whole blocks instead of a 1/kv_heads slice of every row
//   page table       per sequence: the pool page of each of its logical pages 0 … pages−1
//   length           per sequence: cached tokens; token t lives in logical page t / page_size, row
//                    t % page_size; the last page may be partly filled
//   key summaries    per pool page and KV head, kept current at append time (f32):
//     key_sum        [capacity_pages, kv_heads, strides_per_page, head_dim]  Σ k over each key stride
//                    of `summary_stride` rows of the page (RR's key-stride sums; a page's sum is
//                    the sum over its strides)
//     key_min/max    [capacity_pages, kv_heads, head_dim]  per-dim min / max of the page's keys
//                    (Quest's bound)
//
// Decode (decode_attention), for sequence b of the batch and query head h (KV head g = h / (Hq/Hkv)):
//   out[b,h] = Σ_{t ∈ N(b,g)} exp(s_t − m) v_t / Z,   s_t = scale · q[b,h] · k_t
//   N(b,g)   = the sequence's tokens t ≥ len − 1 − window (all when window < 0), and, with a
//              selection, only those in the pages the selection keeps for (b, g)
//   Z        = Σ_{t ∈ N} exp(s_t − m) (+ exp(sink_h − m) with SinkMode::denominator;
//              key0_bias adds sink_h to s_0 when token 0 is in N)
//   lse[b,h] = m + log Z
// The query is the sequence's newest token: append its k, v before decoding it (as a model does),
// so the query sits at position len − 1 and sees itself. A row with no key and no sink gets out 0
// and lse −inf, as in attention().
//
// Sparse decode (select_pages), per sequence and KV head — one selection per GQA group, so that the
// group's query heads share every page read and the bytes read really fall:
//   score every visible page (oracle: exact attention mass; rr: the key-stride sums; quest: the
//   min/max bound), normalize per query head, average over the group, keep the smallest set of
//   pages whose score mass reaches τ, then add the first `sink_pages` pages and the last
//   `recent_pages` visible pages (always kept, as RR keeps its sink column and diagonal).
//   rr scores key stride j of a page with the mean key of the stride, n_j · exp(scale · q·k̄_j)
//   (RR's stride-level importance with stride-level softmax; n_j the stride's filled rows): one
//   q·k̄ per stride instead of one per token, so scoring reads 1/summary_stride of the keys'
//   bytes. With rotate (the default, RR's head round-robin turned to the key side), stride j of
//   page p is scored by one query head of the group only, head (j + p + step) mod group, so the
//   scoring cost does not grow with the group size and over a page every head is consulted.
// The estimator runs on the host for host caches and on the device for device caches
// (CudaPageSelection); docs/decode.md has the design and the measurements.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ariadne/attention.hpp"
#include "ariadne/tensor.hpp"

namespace ariadne {

struct KVCacheConfig {
  int page_size = 64;       // tokens per page (> 0); the prefill block or a divisor of it
  int kv_heads = 0, head_dim = 0;
  DType dtype = DType::f32;  // storage of K and V: f32, bf16 or f16
  int summary_stride = 8;    // rows per key-stride sum (divides page_size)
};

class PagedKVCache {
 public:
  explicit PagedKVCache(const KVCacheConfig& config);
  const KVCacheConfig& config() const { return cfg_; }
  int strides_per_page() const { return cfg_.page_size / cfg_.summary_stride; }

  // A new empty sequence; returns its id (ids of released sequences are reused).
  int add_sequence();
  // Returns the sequence's pages to the pool; the id becomes free.
  void release(int seq);
  // Appends n tokens: k, v [n, kv_heads, head_dim] host f32, bf16 or f16 (any token stride),
  // converted to the cache's dtype; updates the touched pages' key summaries from the stored values.
  void append(int seq, const TensorView& k, const TensorView& v);
  // Drops every token of the sequence (its pages go back to the pool); the id stays valid.
  void clear(int seq);

  int64_t length(int seq) const;
  int64_t pages(int seq) const;                              // ⌈length / page_size⌉
  const std::vector<int32_t>& page_table(int seq) const;     // pool page per logical page
  int sequence_slots() const { return int(seqs_.size()); }  // every id handed out is below it
  int64_t capacity_pages() const { return capacity_; }
  bool live(int seq) const;
  // The pool pages no sequence holds, in the order they are taken from the back.
  const std::vector<int64_t>& free_pages() const { return free_pages_; }

  // Host views of the pools [capacity, kv_heads, page_size, head_dim] and the summaries. Valid until the next append, which may
  // grow the pool.
  TensorView k_pool() const;
  TensorView v_pool() const;
  const float* key_sum(int64_t pool_page) const;   // [kv_heads, strides_per_page, head_dim]
  const float* key_min(int64_t pool_page) const;   // [kv_heads, head_dim]
  const float* key_max(int64_t pool_page) const;   // [kv_heads, head_dim]
  // Bytes of K and V one full page holds (both pools).
  int64_t page_bytes() const;

 private:
  int64_t take_page();
  void summarize(int64_t pool_page, int64_t row0, int64_t rows);
  KVCacheConfig cfg_;
  int64_t capacity_ = 0;
  std::vector<unsigned char> k_, v_;  // [capacity, page_size, kv_heads, head_dim] in dtype
  std::vector<float> sum_, min_, max_;
  std::vector<int64_t> free_pages_;
  struct Sequence {
    bool live = false;
    int64_t length = 0;
    std::vector<int32_t> pages;
  };
  std::vector<Sequence> seqs_;
};

// Pages kept per (batch entry b, KV head g): row r = b · kv_heads + g lists logical page indices
// of sequence seqs[b], ascending, in pages[row_ptr[r] … row_ptr[r+1]).
struct PageSelection {
  int kv_heads = 0;
  std::vector<int32_t> row_ptr, pages;
  // Per row: the visible pages (those holding a token the window lets the query see) and the
  // selection's normalized score mass of the pages it keeps.
  std::vector<int32_t> visible;
  std::vector<float> kept_mass;
  int64_t rows() const { return int64_t(row_ptr.size()) - 1; }
  int64_t kept() const { return int64_t(pages.size()); }
  int64_t visible_total() const;
  double density() const;  // kept / visible pages over every row
  double ms_select = 0;    // host wall time of select_pages
};

// The paged cache in device memory (CUDA builds): the pools and key summaries in PagedKVCache's
// layout, and the tables the kernels read,
//   block_table  int32 [sequences, max_pages]  the pool page of each logical page (−1 past the end)
//   lengths      int32 [sequences]             cached tokens
// sync() copies a host PagedKVCache, its twin: pools, summaries, tables and free pages (a prefill
// on the host, then decode on the device); ids are the twin's sequence ids. From there the device
// cache can grow by itself, a decode step at a time, with no host cache involved:
//   reserve(seqs, n)   pages for n more tokens of each sequence, taken from the free pages in the
//                      twin's order (the pools double as the host's do when none is left); the
//                      block table goes up. Host bookkeeping and synchronous copies.
//   append(k, v, ...)  one token per batch entry at its sequence's current length, into reserved
//                      pages: the rows, the page's key summaries (the same values PagedKVCache::
//                      append computes, bit for bit), then the lengths. Two kernels on the legacy
//                      stream, no copy and no synchronization; the positions come from the device
//                      lengths, so a step needs nothing from the host but the kernel launches.
// So a sequence appended here holds, page for page, what the twin would after the same appends.
class CudaKVCache {
 public:
  CudaKVCache();
  explicit CudaKVCache(const PagedKVCache& twin);
  ~CudaKVCache();
  CudaKVCache(CudaKVCache&&) noexcept;
  CudaKVCache& operator=(CudaKVCache&&) noexcept;
  void sync(const PagedKVCache& twin);

  const KVCacheConfig& config() const { return cfg_; }
  int sequences() const { return int(lengths_.size()); }
  int max_pages() const { return max_pages_; }
  int64_t capacity_pages() const { return capacity_; }
  bool live(int seq) const;
  int64_t length(int seq) const;  // the host mirror of lengths()
  // Device pointers.
  const void* k_pool() const;
  const void* v_pool() const;
  const int32_t* block_table() const;
  const int32_t* lengths() const;
  const float* key_sum() const;  // [capacity, kv_heads, strides_per_page, head_dim]
  const float* key_min() const;  // [capacity, kv_heads, head_dim]
  const float* key_max() const;

  // Makes room for `tokens` more tokens of each sequence in `seqs` (live ids).
  void reserve(std::span<const int32_t> seqs, int64_t tokens);
  // Appends one token to each sequence seqs[b]: k, v [batch, kv_heads, head_dim] device tensors of
  // the cache's dtype (bf16 or f16; any batch and head stride, contiguous head dim); seqs distinct
  // live ids, also in device memory as device_seqs (int32 [batch]). The token's page must be
  // reserved. The host mirror of the lengths advances by one per call; refresh_lengths() reads the
  // device's back (synchronous), for work that moved them without a call here.
  // `stream`: a cudaStream_t for the two kernels (null: the legacy default stream).
  void append(const TensorView& k, const TensorView& v, std::span<const int32_t> seqs, const int32_t* device_seqs,
              void* stream = nullptr);
  // Appends n tokens to one sequence at once (a prefill's keys and values): k, v [n, kv_heads,
  // head_dim] device tensors of the cache's dtype (any token and head stride, contiguous head dim).
  // Reserves the pages itself (growing the pools when needed, which synchronizes), then copies the
  // rows and summarizes every page they touch on `stream`, with the host twin's summaries bit for
  // bit; the device length moves on the stream, the host mirror at once.
  void append_rows(int seq, const TensorView& k, const TensorView& v, void* stream = nullptr);
  void refresh_lengths();
  // Advances the host mirror of each of seqs by one, as append() does: for the replays of a CUDA
  // graph that captured an append (the device lengths move in each replay, the mirror here).
  void appended(std::span<const int32_t> seqs);

  struct Device;  // the device buffers (src/decode/cuda)

 private:
  int64_t take_page();
  void upload_table();
  KVCacheConfig cfg_;
  int64_t capacity_ = 0;
  int max_pages_ = 0;
  std::vector<int64_t> lengths_;  // −1: not a live sequence
  std::vector<int32_t> table_;    // host copy of block_table, [sequences, max_pages_]
  std::vector<int64_t> free_;     // free pool pages, taken from the back
  Device* dev_ = nullptr;
};

struct DecodeParams;
struct PageSelectConfig;

// A page selection in device memory (CUDA builds), the device counterpart of PageSelection:
// select_pages on a device cache writes it with kernels on DecodeParams::stream, and decode_attention
// reads it through DecodeParams::device_selection, so a sparse step (select, then decode) needs nothing
// from the host, neither a copy nor a synchronization, and captures into a CUDA graph. Device arrays,
// PageSelection's layout with room for every visible page of every row r = b · kv_heads + g:
//   row_ptr    int32 [rows + 1]
//   pages      int32 [rows · max_pages]  logical pages of each row, ascending
//   visible    int32 [rows]              visible pages of each row
//   kept_mass  f32   [rows]              the selection's normalized score mass of the kept pages
// and the scoring scratch. A select_pages call that needs more room than the buffers hold (more
// rows, a cache with more pages per sequence, a larger GQA group) allocates; one that fits
// allocates nothing, so capture after a call of the same geometry, or after reserve().
class CudaPageSelection {
 public:
  CudaPageSelection();
  ~CudaPageSelection();
  CudaPageSelection(CudaPageSelection&&) noexcept;
  CudaPageSelection& operator=(CudaPageSelection&&) noexcept;
  CudaPageSelection(const CudaPageSelection&) = delete;
  CudaPageSelection& operator=(const CudaPageSelection&) = delete;

  // Room for rows of up to `max_pages` pages (the device cache's max_pages() bounds a row), scored
  // by GQA groups of `group` query heads.
  void reserve(int64_t rows, int max_pages, int group);
  int64_t rows() const { return rows_; }       // rows of the last selection written (0: none)
  int kv_heads() const { return kv_heads_; }
  const int32_t* row_ptr() const;
  const int32_t* pages() const;
  const int32_t* visible() const;
  const float* kept_mass() const;
  // The rotation counter that PageSelectConfig::advance_step adds to the step (device memory; 0 at
  // construction). reset_step() sets it to `step` with a synchronous copy.
  void reset_step(int64_t step = 0);
  // A host copy of the last selection (synchronous; ms_select is 0): tests and reports.
  PageSelection to_host() const;

  struct Device;  // the device buffers (src/decode/cuda)

 private:
  friend void select_pages(const DecodeParams&, const PageSelectConfig&, CudaPageSelection&);
  int64_t rows_ = 0;
  int kv_heads_ = 0;
  Device* dev_ = nullptr;
};

struct DecodeParams {
  TensorView q;    // [batch, heads_q, head_dim] host f32 (bf16/f16 read exactly); device bf16/f16 with device_cache
  TensorView out;  // [batch, heads_q, head_dim] f32, bf16 or f16 in q's memory; written (rounded once from f32)
  TensorView lse;  // optional: [batch, heads_q] f32 in q's memory
  const PagedKVCache* cache = nullptr;
  // The device cache (Backend::cuda): q, out, lse and sink are device memory, `cache` may stay null,
  // and a selection is read from the host (it is uploaded per call).
  const CudaKVCache* device_cache = nullptr;
  std::span<const int32_t> seqs;  // [batch]: the cache sequence of each query row
  // Optional with device_cache: the same ids in device memory, int32 [batch]. The call then uploads
  // nothing for a dense step (a CUDA graph can capture it); without it seqs is copied per call.
  const int32_t* device_seqs = nullptr;
  SinkMode sink_mode = SinkMode::none;
  TensorView sink;       // [heads_q] f32 when sink_mode != none
  int64_t window = -1;   // the query sees its `window` previous tokens and itself; < 0: all
  float scale = 0;       // 0: 1/sqrt(head_dim)
  const PageSelection* selection = nullptr;  // null: dense; else only the kept pages
  // Device cache only, instead of `selection`: a selection written on the device by select_pages
  // (its rows must be this call's batch × kv_heads). The split of the rows' pages follows the
  // visible pages, as for dense decode, since the kept counts stay on the device.
  const CudaPageSelection* device_selection = nullptr;
  // Device cache only. The stream the kernels and copies go to (a cudaStream_t; null: the legacy
  // default stream, which CUDA cannot capture into a graph). The split partials: with a workspace
  // (device memory of at least decode_workspace_bytes(params) bytes) the call allocates nothing, so
  // a dense step with device_seqs captures into a CUDA graph and replays with the workspace it was
  // captured with; without one they are allocated per call, ordered on the legacy stream.
  void* stream = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// Bytes of the split partials a device-cache decode_attention with these parameters needs now
// (0 when one split covers every row), or once every row holds extra_tokens more tokens (a call
// captured into a graph after that step's append, asked before the append). A step's split follows
// the longest row as it is when the call is made (or captured), and the kernels read the lengths
// as they are when they run, so a graph keeps the split it was captured with.
size_t decode_workspace_bytes(const DecodeParams& p, int64_t extra_tokens = 0);

// Checks q/out/lse/sink shapes and dtypes, the sequence ids, the cache's KV heads and head dim
// against q, and a selection's geometry and page indices; throws ariadne::Error naming the field.
void validate(const DecodeParams& p);

// Dense or selected decode. Backend::reference: one row at a time in double over the gathered
// tokens (the oracle of the tests). Backend::cpu / automatic: split-K over pages, each task
// reading its pages once for every query head of the GQA group, partial results merged by their
// log-sum-exp, OpenMP over (sequence, KV head, split).
void decode_attention(const DecodeParams& p, Backend backend = Backend::automatic);

enum class PageScorer : uint8_t { oracle, rr, quest };
const char* page_scorer_name(PageScorer s);
PageScorer parse_page_scorer(const std::string& s);  // "oracle" | "rr" | "quest"

struct PageSelectConfig {
  PageScorer scorer = PageScorer::rr;
  double tau = 0.9;        // in (0, 1]
  int sink_pages = 1;      // first pages always kept (≥ 0)
  int recent_pages = 1;    // last visible pages always kept (≥ 0); the newest page holds the query
  bool rotate = true;      // rr: one query head per key stride, rotated (see the header comment)
  int64_t step = 0;        // rr: the decode step, which advances the rotation
  // Device selection only: the rotation step is step + the CudaPageSelection's device counter, which
  // the call then advances by one, so the replays of a captured graph rotate as a host loop that
  // passes step = 0, 1, 2, … does.
  bool advance_step = false;
};

// The selection for this step's queries (p.selection is ignored; p.out is not written).
PageSelection select_pages(const DecodeParams& p, const PageSelectConfig& config);
// The same selection computed on the device from a device cache (p.device_cache; q device memory),
// written into `out` by kernels on p.stream: rr and quest (the oracle reads every key: use the host
// cache). Scores in double as on the host, so the kept pages equal select_pages' on the twin host
// cache unless a decision lies within rounding of its threshold; kept_mass from the f32 scores.
// Rows of at most 4096 visible pages and groups of at most 64 query heads.
void select_pages(const DecodeParams& p, const PageSelectConfig& config, CudaPageSelection& out);

// Per-row (b, g) exact attention mass of each visible page, normalized per query head and averaged
// over the group (the oracle's score; tests and measurements): masses[r] has visible[r] entries.
std::vector<std::vector<double>> page_masses(const DecodeParams& p);

// Per row of `sel`: the share of the exact attention mass (masses = page_masses(p)) that the pages
// it keeps hold, 1 for a selection that keeps every visible page. The selection's recall.
std::vector<double> kept_page_mass(const DecodeParams& p, const PageSelection& sel,
                                   const std::vector<std::vector<double>>& masses);

}  // namespace ariadne
