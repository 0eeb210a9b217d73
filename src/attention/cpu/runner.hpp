// Internal: the fast CPU backend's per-call state (Runner) shared by its three parts:
//   attention_cpu.cpp  entry points, the call's setup (modes, sequences, scratch)
//   tiles.cpp          K/V packing into key tiles (call-wide or the stream ring), Q loads, prefetching
//   forward.cpp        the forward walk: work items, visited key tiles, online softmax, finalize
//   received.cpp       received attention, the transposed pass
// runtime.cpp holds the process-wide settings (thread count, ISA table). The kernels' operand
// layouts are in attention_kernels.hpp; the design in docs/cpu-backend.md.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <new>
#include <utility>
#include <vector>

#include "ariadne/attention.hpp"
#include "attention/cpu/attention_kernels.hpp"

namespace ariadne::cpu {

constexpr int kQueryTile = 64;
constexpr int kWideQueryTile = 128;  // Runner::qtile_ of wide patterns over long sequences (attention_cpu.cpp)
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr double kLog2e = 1.4426950408889634;
constexpr double kLn2 = 0.6931471805599453;

// Storage aligned to a cache line: the kernels' 512-bit loads of packed tiles and scratch rows then
// never straddle two lines (malloc aligns to 16 bytes only; an offset of 16 made the fp32 tile
// products 7-15 % slower in an in-cache microbenchmark).
template <class T>
struct LineAligned {
  using value_type = T;
  static constexpr std::align_val_t kAlign{64};
  LineAligned() = default;
  template <class U>
  LineAligned(const LineAligned<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlign)); }
  void deallocate(T* p, size_t) { ::operator delete(p, kAlign); }
  template <class U>
  bool operator==(const LineAligned<U>&) const { return true; }
  template <class U>
  bool operator!=(const LineAligned<U>&) const { return false; }
};
template <class T>
using AlignedVector = std::vector<T, LineAligned<T>>;

// Element offset of (token, head, 0) in a [tokens, heads, dim] view.
inline int64_t row_offset(const TensorView& t, int64_t token, int64_t head) {
  return token * t.stride[0] + head * t.stride[1];
}

// Row of `n` elements of t starting at element `off`, widened to fp32 (tiles.cpp).
void convert_row(const TensorView& t, int64_t off, int n, float* dst);
// Writes n fp32 values, each multiplied by `mul`, as a row of t starting at element `off`
// (tiles.cpp). fp32 rows may be written with streaming stores: a worker ends with an sfence.
void store_row(const TensorView& t, int64_t off, int n, const float* src, float mul, const TileKernels& k);

struct WorkItem {
  int32_t seq;
  int32_t head;     // query head (stream mode: the first KV head of a block of kv_block_)
  int64_t lo, hi;  // local query rows (forward) or the key tile index (received pass)
};

// One (query tile, key tile) visit: the tile index and which of its keys the block mask allows.
struct TileVisit {
  int64_t tile;
  uint32_t keymask;
};

// ---- the tile walk, shared by the forward, the received pass and the backward (forward.cpp) ----
// Key tiles query rows [q_lo, q_hi) of head h visit, in increasing order, each with the keys the
// block mask allows (all without one). With a block mask the rows lie in one query block.
void key_tile_visits(const Pattern& pat, int32_t s, const SeqExtent& e, int h, int64_t q_lo, int64_t q_hi,
                     std::vector<TileVisit>& visits);
// Rows' allowed key intervals [row_lo, row_hi) clipped to key tile t into lo/hi (0..32); returns the
// first and one past the last row that sees any key of it (first >= last: none). *dense: those
// rows all see the whole tile.
// Stream mode's KV heads per work item (Runner::kv_block_): the fewest, at most 4, whose rows of
// K and of V side by side end on a 64-byte line when one head's row does not (bf16 d 80: 160-byte
// rows, 2 heads); 1 where the rows already do, or where heads are not side by side in memory.
int stream_kv_block(const TensorView& k, const TensorView& v, int heads_kv);
std::pair<int, int> clip_rows_to_tile(const int64_t* row_lo, const int64_t* row_hi, int rows, int64_t t, int32_t* lo,
                                      int32_t* hi, bool* dense);
// Key-block bits of key tile t for one CSR row (block-sparse patterns; received.cpp).
uint32_t tile_block_bits(const Pattern& pat, int64_t row, int64_t t, int64_t lk);

class Runner {
 public:
  explicit Runner(const AttentionParams& p);
  void run();

 private:
  // ---- prefetching the next query tile's rows (stream mode) ----
  // In stream mode each key tile's input rows are read when the tile is first packed, and a query
  // tile's Q rows when it starts; all are cold (written by another layer or read once)
  // and sit heads·d elements apart, which the hardware prefetchers do not follow (packing stalls
  // on them: about a fifth of a bf16 ±64-window call). So while one query tile is computed the
  // rows the next one will touch first are prefetched, a few rows per key-tile visit rather than
  // all at once, which would fill the miss queue and stall.
  struct RowRun {
    const char* base;  // first row
    int64_t stride;    // bytes between rows
    int64_t rows;
    int bytes;  // per row
  };

  // ---- per-thread scratch ----
  struct Scratch {
    AlignedVector<float> qf, s, t, o, m, l, alpha, m_old, l_old, colsum;
    AlignedVector<float> batch_p, batch_alpha;  // batch_pv_, group_pv_: P and α of each pending key tile
    AlignedVector<uint16_t> qb;
    AlignedVector<float> ring_kf, ring_vf;     // stream mode: packed key tiles, ring_ slots
    AlignedVector<uint32_t> ring_kb, ring_vb;
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
  Scratch make_scratch() const;
  void load_coords();

  // ---- packing K and V into key tiles (tiles.cpp; layouts in attention_kernels.hpp) ----
  void pack_kv();
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
  void pack_tile_f32(int g, int32_t s, int64_t t, float* kt, float* vt) const;
  void pack_tile_bf16(int g, int32_t s, int64_t t, uint32_t* kt, uint32_t* vt) const;

  // Key tile t of sequence s, KV head g, as the kernels read it: packed K, and V with its row
  // stride (fp32 V may be the input rows themselves when direct_v_ and the tile is complete). In
  // stream mode the tile is packed into the thread's ring on first use (slot t mod ring_).
  struct Tile {
    const void* k;
    const void* v;
    int64_t ldv;
  };
  Tile tile(Scratch& sc, int g, int32_t s, int64_t t) const;
  void prefetch_tile(const Tile& tl) const;

  RowRun rows_of(const TensorView& t, int64_t tok0, int64_t n, int head) const {
    const int es = dtype_size(t.dtype);
    return {static_cast<const char*>(t.data) + row_offset(t, tok0, head) * es, t.stride[0] * es, n, d_ * es};
  }
  // Issues the next ahead_step rows of the prefetch queue (called once per row chunk), into L2
  // (locality 2, prefetcht1): the rows are read a query tile later, so L1 keeps the tiles in use;
  // prefetched into L1 (prefetcht0), a bf16 ±64 window measured 3-6 % slower.
  void prefetch_some(Scratch& sc) const {
    for (int64_t budget = sc.ahead_step; budget > 0 && sc.ahead_run < sc.ahead.size(); --budget) {
      const RowRun& r = sc.ahead[sc.ahead_run];
      const char* row = r.base + sc.ahead_row * r.stride;
      const uintptr_t a = reinterpret_cast<uintptr_t>(row) & ~uintptr_t(63);
      for (uintptr_t b = a; b < reinterpret_cast<uintptr_t>(row) + r.bytes; b += 64) {
        __builtin_prefetch(reinterpret_cast<const char*>(b), 0, 2);
      }
      if (++sc.ahead_row == r.rows) {
        ++sc.ahead_run;
        sc.ahead_row = 0;
      }
    }
  }
  void plan_prefetch(Scratch& sc, const SeqExtent& e, int g, int64_t lo, int64_t hi, int64_t nlo, int64_t nhi) const;

  // ---- the query side ----
  // Query tiles: rows [0, lq) in steps of qtile_; with a block mask, tiles never cross a query block,
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
    return std::min({lo + qtile_, (lo / seg + 1) * seg, e.lq});
  }
  void load_q(Scratch& sc, const SeqExtent& e, int h, int64_t q_lo, int rows) const;
  // S = Q·Kᵀ for the rows [r0, r0 + n) of the loaded query tile against packed key tile kt.
  void qk(Scratch& sc, const void* kt, int r0, int n) const {
    if (bf16_)
      k_.qk_bf16(sc.q_b16 + r0 * sc.ldq, sc.ldq, static_cast<const uint16_t*>(kt), dp_, n, sc.s.data() + r0 * kKeyTile);
    else
      k_.qk_f32(sc.q_f32 + r0 * sc.ldq, sc.ldq, static_cast<const float*>(kt), d_, n, sc.s.data() + r0 * kKeyTile);
  }
  float sink(int h) const { return static_cast<const float*>(p_.sink.data)[h * p_.sink.stride[0]]; }

  // ---- forward (forward.cpp) ----
  // Items: (sequence, query head, query tile); in stream mode (sequence, a block of kv_block_ KV
  // heads, a run of kStreamRun consecutive query tiles), computed query tile by query tile and,
  // inside, head by head of the block's KV groups, so each key tile is packed into the ring once per
  // item. Either way each (query head, query tile) is computed by the same code in the same order:
  // the results do not depend on the mode, the block or the thread count.
  static constexpr int kStreamRun = 16;
  void forward();
  void forward_tile(Scratch& sc, int32_t s, int h, int64_t q_lo, int64_t q_hi) const;
  // forward_tile's pending whole key tiles k[j], v[j] on a table with dense_bf16 (forward.cpp).
  void flush_dense(Scratch& sc, const uint16_t* const* k, const uint16_t* const* v, int count, int rows,
                   RowMask mk) const;
  // The visits of the loaded query tile in row groups, P·V batched per group (group_pv_).
  static constexpr int kRowGroup = 16;
  void forward_groups(Scratch& sc, int g, int32_t s, int rows, RowMask mk) const;
  void forward_band(Scratch& sc, int g, int32_t s, int g0, RowMask mk) const;
  void forward_group_tiles(Scratch& sc, int g, int32_t s, int g0, int n, size_t v0, size_t v1, RowMask mk) const;
  void plan_visits(Scratch& sc, int32_t s, const SeqExtent& e, int h, int64_t q_lo, int64_t q_hi) const;
  std::pair<int, int> clip_rows(Scratch& sc, int rows, int64_t t) const;
  void accumulate_diagnostics(Scratch& sc, const SeqExtent& e, int64_t q_lo, int64_t tile, int r0, int r1) const;
  void finalize(Scratch& sc, const SeqExtent& e, int h, int64_t q_lo, int rows) const;

  // ---- received attention: the transposed pass (received.cpp) ----
  void received();
  void received_item(Scratch& sc, const WorkItem& it, float* recv) const;

  const AttentionParams& p_;
  const Pattern& pat_;
  const TileKernels& k_;
  int64_t total_q_ = 0, total_k_ = 0;
  int hq_ = 0, group_ = 1, d_ = 0, dp_ = 0, dv_ = 0, threads_ = 1;
  bool bf16_ = false, diag_ = false, direct_v_ = false, stream_ = false;
  // Whole key tiles of forward_tile through dense_bf16 (a table that has it, a head dim it takes).
  bool fused_ = false;
  bool batch_pv_ = false;  // P·V of consecutive whole tiles in one pv_bf16_batch call (forward_tile)
  bool group_pv_ = false;  // stream mode: 16-row groups over all their tiles, P·V batched (forward_groups)
  bool band_ = false;      // group_pv_ with band_bf16: whole groups in one softmax step per run of tiles
  int ring_ = 0;  // stream mode: key-tile slots per thread and KV head of a block
  // Stream mode: KV heads per work item. Input rows hold the heads side by side, so a head's row
  // that ends inside a cache line shares that line with the next head's row; heads computed
  // together read each such line once instead of once per head (stream_kv_block).
  int kv_block_ = 1;
  int qtile_ = kQueryTile;       // rows per query tile at most
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

}  // namespace ariadne::cpu
