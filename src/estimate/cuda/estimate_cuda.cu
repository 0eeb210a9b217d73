// The CUDA estimator's host side: geometry (shared with the CPU estimator), device tables, the
// kernel sequence with CUDA-event stage times, the CSR in device memory and the optional copies
// back into the host result.
//
// Stages (stream 0, the legacy default stream, so it orders against any caller's work):
//   sampling   rr: key-stride sums K̄ (one pass over k); xattn: nothing (the scoring kernel reads
//              q and k in place, no re-layout and no repeated KV heads)
//   scoring    logits, row softmax, block sums (score_*.cu; route_scoring picks the kernel)
//   selection  per-row sort and threshold, counts → scan → row_ptr → col_idx, kept blocks per
//              head (estimate_select.cu); all on the device: col_idx is sized for every visible
//              block, so nothing waits for the host between the scan and the compaction
//
// Host overhead (what the wall time adds to the kernels). The scratch, the key-stride sums, the
// per-block flags and counts, the scan's temporary storage, the geometry tables and a pinned
// staging buffer live in a workspace cached per device (see Workspace below), so a call with a
// shape no larger than an earlier one allocates only the result's own device arrays (cudaMalloc,
// or with EstimateConfig::cuda_pooled_result stream-ordered from a pool, which neither their
// allocation nor their release waits on). The tables go up in one asynchronous copy from the
// pinned staging; the one host synchronization is at the end (the stage times and the density
// are results of the call).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "estimate/cuda/estimate.cuh"
#include "estimate/internal.hpp"

namespace ariadne::est {
namespace {

void check(cudaError_t e, const char* what) {
  ARIADNE_CHECK(e == cudaSuccess, "estimate (cuda): ", what, " failed: ", cudaGetErrorString(e));
}

// Raw device bytes in a DeviceBuffer (4-byte elements); `pooled`: stream-ordered from the library's
// pool (EstimateConfig::cuda_pooled_result), so neither this allocation nor the result's release
// waits for the device.
DeviceBuffer device_bytes(size_t bytes, bool pooled) {
  const std::vector<int64_t> shape{int64_t((bytes + 3) / 4)};
  return pooled ? DeviceBuffer::stream_ordered(DType::f32, shape) : DeviceBuffer(DType::f32, shape);
}

// cu_seqlens may be host or device pointers (the CUDA attention reads device ones); unified
// addressing lets one cudaMemcpyDefault read either.
std::vector<int32_t> read_ints(const int32_t* p, int64_t n) {
  std::vector<int32_t> v(size_t(n), 0);
  check(cudaMemcpy(v.data(), p, size_t(n) * sizeof(int32_t), cudaMemcpyDefault), "reading cu_seqlens");
  return v;
}

// The largest dynamic shared memory a CTA of the current device may ask for.
size_t smem_optin() {
  int dev_id = 0, optin = 0;
  check(cudaGetDevice(&dev_id), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev_id), "shared memory limit");
  return size_t(optin);
}

// The scoring kernel for the case `p` describes (its kernel field ignored): the override when one
// is set (an error saying why when it cannot run the case), else the first of wgmma (its exact
// build under cuda_exact_scoring, else its approximate one), mma_grouped, mma_rr and mma_generic
// that can, and f32 under cuda_f32_scoring or where no tensor-core kernel fits. estimate.hpp's
// CudaScoring lists the cases each serves.
CudaScoring route_scoring(const EstimateConfig& c, const cuda::ScoreParams& p, size_t optin) {
  const CudaScoring forced = c.overrides.scoring;
  if (forced != CudaScoring::automatic) {
    const std::string why = cuda::scoring_refusal(p, forced, optin);
    ARIADNE_CHECK(why.empty(), "estimate (cuda): EstimateConfig::overrides.scoring = ", cuda_scoring_name(forced),
                  " cannot run this case: ", why);
    return forced;
  }
  if (c.cuda_f32_scoring || !cuda::scoring_refusal(p, CudaScoring::mma_generic, optin).empty())
    return CudaScoring::f32;
  const CudaScoring wgmma = c.cuda_exact_scoring ? CudaScoring::wgmma_exact : CudaScoring::wgmma_approximate;
  for (const CudaScoring k : {wgmma, CudaScoring::mma_grouped, CudaScoring::mma_rr})
    if (cuda::scoring_refusal(p, k, optin).empty()) return k;
  return CudaScoring::mma_generic;
}

int64_t last_key_stride(const EstimateConfig& c, int64_t stride, const Seq& e, int64_t i, int h) {
  const int64_t q = c.method == Estimator::rr ? rr_sample_position(c.offset, int32_t(stride), i, h, e.lq)
                                              : std::min(i * stride + stride - 1, e.lq - 1);
  return (q + e.off) / stride;
}

struct Events {
  cudaEvent_t ev[4] = {};
  Events() {
    for (auto& e : ev) check(cudaEventCreate(&e), "cudaEventCreate");
  }
  ~Events() {
    for (auto& e : ev) cudaEventDestroy(e);
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
  double ms(int a, int b) const {
    float t = 0;
    check(cudaEventElapsedTime(&t, ev[a], ev[b]), "cudaEventElapsedTime");
    return double(t);
  }
};

constexpr size_t kAlign = 256;
size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// Device memory that only grows: get(n) returns at least n bytes; a larger request frees the old
// allocation (its contents are not kept) and allocates exactly the new size.
class GrowDevice {
 public:
  void* get(size_t bytes) {
    bytes = align_up(std::max<size_t>(bytes, 1));
    if (bytes > cap_) {
      release();
      check(cudaMalloc(&ptr_, bytes), "growing the workspace (cudaMalloc)");
      cap_ = bytes;
    }
    return ptr_;
  }
  void release() {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = nullptr;
    cap_ = 0;
  }

 private:
  void* ptr_ = nullptr;
  size_t cap_ = 0;
};

// The same for pinned host memory (the source and target of asynchronous copies).
class GrowPinned {
 public:
  char* get(size_t bytes) {
    bytes = align_up(std::max<size_t>(bytes, 1));
    if (bytes > cap_) {
      release();
      void* p = nullptr;
      check(cudaMallocHost(&p, bytes), "growing the pinned staging (cudaMallocHost)");
      ptr_ = static_cast<char*>(p);
      cap_ = bytes;
    }
    return ptr_;
  }
  void release() {
    if (ptr_ != nullptr) cudaFreeHost(ptr_);
    ptr_ = nullptr;
    cap_ = 0;
  }

 private:
  char* ptr_ = nullptr;
  size_t cap_ = 0;
};

// Everything one estimate needs besides its inputs and its result. Owned by the library: one per
// device, created on that device's first call, grown when a call needs more, kept until the
// process ends (or released by a call with EstimateConfig::keep_workspace = false). A call holds
// `mu` from before its first copy until its last synchronization, so the buffers are never in use
// by two calls, and a buffer is only freed (growth, release) while no work of ours reads it:
// every call ends with a synchronization (also when it throws: DrainOnExit).
struct Workspace {
  std::mutex mu;
  GrowDevice scratch;  // scoring partials (max, Σexp) per (CTA row, visible key block)
  GrowDevice ksum;     // rr: key-stride sums [heads_kv, total_ks, d] f32
  GrowDevice keep;     // selection flags, one byte per visible block
  GrowDevice counts;   // kept blocks per row, int32 [rows + 1]
  GrowDevice scan;     // CUB's temporary storage for the row_ptr scan
  GrowDevice tables;   // geometry tables (uploaded) and the kept blocks per head (computed)
  GrowDevice flex;     // FlexPrefill: K̄, the probe's partials and scores, the per-head choices
  GrowPinned staging;  // host side of the tables' upload and of the per-head counts' read-back
  std::unique_ptr<Events> events;

  void release() {
    for (GrowDevice* b : {&scratch, &ksum, &keep, &counts, &scan, &tables, &flex}) b->release();
    staging.release();
    events.reset();
  }
};

// The current device's workspace. The map and its workspaces are never destroyed: freeing device
// memory from a static destructor can run after the CUDA runtime has shut down; the process's end
// returns the memory.
Workspace& workspace_of_current_device() {
  static std::mutex map_mu;
  static auto* spaces = new std::map<int, std::unique_ptr<Workspace>>();
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  const std::lock_guard<std::mutex> lock(map_mu);
  std::unique_ptr<Workspace>& w = (*spaces)[device];
  if (!w) w = std::make_unique<Workspace>();
  return *w;
}

// Waits for the stream when a call leaves early (an exception after work was enqueued), so the
// next call never rewrites buffers that kernels or copies of this one still use. Destroyed
// before the workspace lock is released and before the result's buffers are freed.
struct DrainOnExit {
  bool armed = true;
  DrainOnExit() = default;
  DrainOnExit(const DrainOnExit&) = delete;
  DrainOnExit& operator=(const DrainOnExit&) = delete;
  ~DrainOnExit() {
    if (armed) cudaStreamSynchronize(nullptr);
  }
};

// q and k as the kernels read them (ScoreParams, FlexParams): pointers, dtype, element strides.
template <class P>
void set_operands(P& p, const TensorView& q, const TensorView& k) {
  p.q = q.data;
  p.k = k.data;
  p.dtype = int(q.dtype);
  p.q_tok = q.stride[0];
  p.q_head = q.stride[1];
  p.k_tok = k.stride[0];
  p.k_head = k.stride[1];
}

// CUB's temporary storage for the row_ptr scan of `rows` rows.
size_t scan_storage_bytes(int64_t rows) {
  size_t bytes = 0;
  check(cuda::exclusive_scan(nullptr, nullptr, rows + 1, nullptr, bytes, nullptr), "row_ptr scan (size)");
  return bytes;
}

Events& events_of(Workspace& ws) {
  if (!ws.events) ws.events = std::make_unique<Events>();
  return *ws.events;
}

// A call's hold on the workspace: its lock until the call returns, a drain of the stream when the
// call leaves early (destroyed first), and the stage events.
struct CallScope {
  Workspace& ws;
  std::lock_guard<std::mutex> lock;
  DrainOnExit drain;
  const Events& ev;
  explicit CallScope(Workspace& w) : ws(w), lock(w.mu), ev(events_of(w)) {}
};

// The workspace buffers every call takes: device tables (then the per-head kept counts), the
// selection flags, the row counts, the scan's storage, and the pinned staging.
struct CallBuffers {
  char* tables;
  int64_t* kept;
  void *keep, *counts, *scan;
  char* host;
};
CallBuffers call_buffers(Workspace& ws, size_t tables_end, size_t kept_bytes, int64_t nvis_total, int64_t rows,
                         size_t scan_bytes, size_t staging_bytes) {
  CallBuffers b{};
  b.tables = static_cast<char*>(ws.tables.get(tables_end + kept_bytes));
  b.kept = reinterpret_cast<int64_t*>(b.tables + tables_end);
  b.keep = ws.keep.get(size_t(nvis_total));
  b.counts = ws.counts.get(size_t(rows + 1) * sizeof(int32_t));
  b.scan = ws.scan.get(scan_bytes);
  b.host = ws.staging.get(staging_bytes);
  return b;
}

// The result's device arrays (owned by the result). col_idx is sized for every visible block:
// nnz is only known on the device, and waiting for it would cost a host round trip.
void allocate_result(DeviceEstimate& dev, const Geometry& g, const EstimateConfig& config, size_t sbb_bytes,
                     int64_t nvis_total) {
  const bool pooled = config.cuda_pooled_result;
  dev.block = config.block;
  dev.heads = g.heads_q;
  dev.seq_block_base = device_bytes(sbb_bytes, pooled);
  dev.score_ptr = device_bytes(size_t(g.rows + 1) * sizeof(int64_t), pooled);
  dev.scores = device_bytes(size_t(nvis_total) * sizeof(float), pooled);
  dev.row_ptr = device_bytes(size_t(g.rows + 1) * sizeof(int32_t), pooled);
  dev.col_idx = device_bytes(size_t(nvis_total) * sizeof(int32_t), pooled);
}

// score_ptr and seq_block_base into the pinned staging (at their offsets), then the staged tables
// [0, tables_end) and both arrays up in three asynchronous copies; returns the staged score_ptr.
int64_t* upload_geometry(DeviceEstimate& dev, const Geometry& g, const std::vector<int32_t>& sbb, int64_t nvis_total,
                         char* host, size_t off_score_ptr, size_t off_sbb, char* tables, size_t tables_end,
                         cudaStream_t st) {
  int64_t* sp_host = reinterpret_cast<int64_t*>(host + off_score_ptr);
  est::row_score_ptr(g, sp_host);
  ARIADNE_CHECK(sp_host[g.rows] == nvis_total, "estimate (cuda): visible blocks ", sp_host[g.rows], " against ",
                nvis_total);
  if (!sbb.empty()) std::memcpy(host + off_sbb, sbb.data(), sbb.size() * sizeof(int32_t));
  check(cudaMemcpyAsync(tables, host, tables_end, cudaMemcpyHostToDevice, st), "uploading the tables");
  check(cudaMemcpyAsync(dev.score_ptr.data(), host + off_score_ptr, size_t(g.rows + 1) * sizeof(int64_t),
                        cudaMemcpyHostToDevice, st),
        "uploading score_ptr");
  check(cudaMemcpyAsync(dev.seq_block_base.data(), host + off_sbb, sbb.size() * sizeof(int32_t),
                        cudaMemcpyHostToDevice, st),
        "uploading seq_block_base");
  return sp_host;
}


// The density per head from the device's kept counts and the host's visible counts, and with
// config.host_copy the mask and the scores copied back.
void finish_result(EstimateResult& r, const Geometry& g, const EstimateConfig& config, const std::vector<int32_t>& sbb,
                   const std::vector<int64_t>& kept, const std::vector<int64_t>& vis, int64_t nvis_total) {
  EstimateStats& s = r.stats;
  s.density_per_head.resize(size_t(g.heads_q));
  for (int h = 0; h < g.heads_q; ++h) {
    s.kept_blocks += kept[size_t(h)];
    s.visible_blocks += vis[size_t(h)];
    s.density_per_head[size_t(h)] = vis[size_t(h)] ? double(kept[size_t(h)]) / double(vis[size_t(h)]) : 0.0;
  }
  s.density = s.visible_blocks ? double(s.kept_blocks) / double(s.visible_blocks) : 0.0;
  if (!config.host_copy) return;
  const DeviceEstimate& dev = r.device;
  BlockMask& mask = r.mask;
  mask.block = config.block;
  mask.heads = g.heads_q;
  mask.seq_block_base = sbb;
  mask.row_ptr.resize(size_t(g.rows + 1));
  dev.row_ptr.copy_to_host(mask.row_ptr.data(), mask.row_ptr.size() * sizeof(int32_t));
  ARIADNE_CHECK(int64_t(mask.row_ptr.back()) == s.kept_blocks, "estimate (cuda): row_ptr ends at ",
                mask.row_ptr.back(), " but the per-head counts sum to ", s.kept_blocks);
  mask.col_idx.resize(size_t(s.kept_blocks));
  if (!mask.col_idx.empty()) dev.col_idx.copy_to_host(mask.col_idx.data(), mask.col_idx.size() * sizeof(int32_t));
  r.scores.resize(size_t(nvis_total));
  if (!r.scores.empty()) dev.scores.copy_to_host(r.scores.data(), r.scores.size() * sizeof(float));
}

// The call's start, the end of its host setup, and the return of its one synchronization.
struct CallTimes {
  std::chrono::steady_clock::time_point start, setup, synced;
};

// The end of a call after its synchronization: the per-head kept counts (int64 [heads_q] at
// `kept_src`, read back) into the statistics and the optional host copies, the workspace given
// back under keep_workspace = false (and the pool blocks of earlier, freed results), the host times.
void close_call(EstimateResult& r, const Geometry& g, const EstimateConfig& config, const std::vector<int32_t>& sbb,
                const std::vector<int64_t>& vis, int64_t nvis_total, const char* kept_src, Workspace& ws,
                const CallTimes& t) {
  std::vector<int64_t> kept(size_t(g.heads_q), 0);
  if (!kept.empty()) std::memcpy(kept.data(), kept_src, kept.size() * sizeof(int64_t));
  finish_result(r, g, config, sbb, kept, vis, nvis_total);
  if (!config.keep_workspace) {
    ws.release();
    if (config.cuda_pooled_result) DeviceBuffer::trim_stream_ordered_pool();
  }
  EstimateStats& s = r.stats;
  s.ms_total = ms_since(t.start);
  s.ms_host_setup = std::chrono::duration<double, std::milli>(t.setup - t.start).count();
  s.ms_host_finish = ms_since(t.synced);
}

}  // namespace

std::string estimate_cuda_refusal(const TensorView& q, const EstimateConfig* config) {
  if (q.device != Device::cuda) return "the CUDA estimator needs device tensors (q is in host memory)";
  if (q.rank == 3 && q.shape[2] > 256)
    return "head_dim " + std::to_string(q.shape[2]) + " exceeds the CUDA estimator's 256 (shared-memory tiles)";
  if (config == nullptr) return "";
  if (config->method == Estimator::flexprefill) return "";  // its limits: flexprefill_refusal, at the call
  if (config->method == Estimator::rr && config->schedule != RRSchedule::head)
    return std::string("RR schedule '") + rr_schedule_name(config->schedule) +
           "': the CUDA scoring kernels rotate the sample by head only (the CPU backend runs every schedule)";
  // The oracle runs as XAttention with S = 1 (B rows per block).
  const int spb = config->method == Estimator::oracle ? config->block
                  : config->stride > 0                ? config->block / config->stride
                                                      : 1;
  if (spb > cuda::kScoreRows && spb % cuda::kScoreRows != 0)
    return "block / stride = " + std::to_string(spb) + " query strides per block: the CUDA estimator needs <= " +
           std::to_string(cuda::kScoreRows) + " or a multiple of it (rows of one scoring CTA)";
  return "";
}

double cuda_timed_ms(void* stream, const std::function<void()>& fn) {
  Events ev;
  const auto st = static_cast<cudaStream_t>(stream);
  check(cudaEventRecord(ev.ev[0], st), "cudaEventRecord");
  fn();
  check(cudaEventRecord(ev.ev[1], st), "cudaEventRecord");
  check(cudaEventSynchronize(ev.ev[1]), "cudaEventSynchronize");
  return ev.ms(0, 1);
}

// FlexPrefill (flexprefill.cu): the tables of its kernels from the shared geometry, its scratch in
// the workspace, the three stages timed by the events, then the CSR as for the other estimators.
static EstimateResult estimate_flexprefill_cuda(const TensorView& q, const TensorView& k, const Pattern& host_layout,
                                                const EstimateConfig& config, std::chrono::steady_clock::time_point t0) {
  const Geometry g = make_geometry(q, k, host_layout, config.block, config.stride, Device::cuda);
  const float scale = config.scale > 0 ? config.scale : float(1.0 / std::sqrt(double(g.dim)));
  const int64_t B = config.block;
  const std::string why = cuda::flexprefill_refusal(int(g.dim), int(B), g.group, smem_optin());
  ARIADNE_CHECK(why.empty(), "estimate (cuda): flexprefill cannot run this case: ", why);
  const int64_t min_blocks = (config.flex_min_budget + B - 1) / B;

  // Tables: sequences (both layouts: the kernels' and the shared selection kernels'), and the
  // sequence of every key block, query block and probe chunk.
  std::vector<cuda::FlexSeq> seqs;
  std::vector<cuda::EstSeq> eseqs;
  std::vector<int32_t> probe_seq, kb_seq, qb_seq, qb_m, ch_seq, sbb{0};
  int max_lk = 0;
  int64_t nvis_total = 0;
  for (size_t si = 0; si < g.seqs.size(); ++si) {
    const Seq& e = g.seqs[si];
    const int32_t s = int32_t(si);
    const int64_t nkb = (e.lk + B - 1) / B;
    const bool probe = e.lq > std::max(2 * B, min_blocks * B);
    const int64_t nch = probe ? (e.lk + cuda::kFlexChunk - 1) / cuda::kFlexChunk : 0;
    ARIADNE_CHECK(!probe || nkb <= cuda::kMaxSelectBlocks, "estimate (cuda): flexprefill: a sequence has ", nkb,
                  " key blocks, more than the ", cuda::kMaxSelectBlocks, " its decisions hold: raise the block size");
    seqs.push_back(cuda::FlexSeq{e.q0, e.k0, e.lq, e.lk, e.off, e.row_base, int32_t(e.nqb), int32_t(nkb),
                                 int32_t(kb_seq.size()), probe ? int32_t(probe_seq.size()) : -1, int32_t(nch),
                                 int32_t(ch_seq.size())});
    eseqs.push_back(cuda::EstSeq{e.q0, e.k0, e.lq, e.lk, e.off, e.row_base, int32_t(e.nqb), int32_t(e.nqs),
                                 int32_t(e.nks), int32_t(e.ks_base)});
    if (probe) {
      probe_seq.push_back(s);
      max_lk = std::max(max_lk, int(e.lk));
    }
    kb_seq.insert(kb_seq.end(), size_t(nkb), s);
    ch_seq.insert(ch_seq.end(), size_t(nch), s);
    for (int64_t m = 0; m < e.nqb; ++m) {
      qb_seq.push_back(s);
      qb_m.push_back(int32_t(m));
      nvis_total += (g.diag(e, m) + 1) * g.heads_q;
    }
    sbb.push_back(sbb.back() + int32_t(e.nqb));
  }
  ARIADNE_CHECK(int64_t(ch_seq.size()) < (int64_t(1) << 31) && g.rows < (int64_t(1) << 31),
                "estimate (cuda): too many probe chunks or rows for 32-bit grids");
  const int64_t total_kb = int64_t(kb_seq.size()), total_qb = int64_t(qb_seq.size());
  const int64_t total_ch = int64_t(ch_seq.size()), num_probe = int64_t(probe_seq.size());
  const int64_t L = B, W = L + cuda::kFlexChunk - 1;

  // Staging (bytes): the tables, score_ptr, seq_block_base, then the per-head kept counts coming back.
  size_t off = 0;
  const auto place = [&](size_t bytes) {
    const size_t at = off;
    off = align_up(off + bytes);
    return at;
  };
  const size_t off_seqs = place(seqs.size() * sizeof(cuda::FlexSeq));
  const size_t off_eseqs = place(eseqs.size() * sizeof(cuda::EstSeq));
  const size_t off_probe = place(probe_seq.size() * sizeof(int32_t));
  const size_t off_kb = place(kb_seq.size() * sizeof(int32_t));
  const size_t off_qb = place(qb_seq.size() * sizeof(int32_t));
  const size_t off_qm = place(qb_m.size() * sizeof(int32_t));
  const size_t off_ch = place(ch_seq.size() * sizeof(int32_t));
  const size_t tables_end = off;
  const size_t kept_bytes = size_t(g.heads_q) * sizeof(int64_t);
  const size_t score_ptr_bytes = size_t(g.rows + 1) * sizeof(int64_t);
  const size_t off_score_ptr = place(score_ptr_bytes);
  const size_t sbb_bytes = sbb.size() * sizeof(int32_t);
  const size_t off_sbb = place(sbb_bytes);
  const size_t off_kept = place(kept_bytes);
  const size_t staging_bytes = off;

  // Scratch (bytes, one workspace buffer).
  size_t soff = 0;
  const auto carve = [&](size_t bytes) {
    const size_t at = soff;
    soff = align_up(soff + bytes);
    return at;
  };
  const size_t s_kbar = carve(size_t(g.heads_kv) * size_t(total_kb) * size_t(g.dim) * sizeof(float));
  const size_t s_part = carve(size_t(g.heads_q) * size_t(total_ch) * size_t(L) * sizeof(float2));
  const size_t s_stat = carve(size_t(g.heads_q) * size_t(num_probe) * size_t(L) * sizeof(float2));
  const size_t s_vert = carve(size_t(g.heads_q) * size_t(g.total_k) * sizeof(float));
  const size_t s_slash = carve(size_t(g.heads_q) * size_t(g.total_k) * sizeof(float));
  const size_t s_spart = carve(size_t(g.heads_q) * size_t(total_ch) * size_t(W) * sizeof(float));
  const size_t s_vsel = carve(size_t(g.heads_q) * size_t(total_kb));
  const size_t s_ssel = carve(size_t(g.heads_q) * size_t(total_kb));
  const size_t s_info = carve(size_t(g.heads_q) * size_t(num_probe) * 4 * sizeof(float));
  const size_t scratch_bytes = soff;

  size_t scan_bytes = scan_storage_bytes(g.rows);  // exclusive_scan takes it by reference
  // ---- from here on the workspace is ours until the call returns ----
  CallScope call(workspace_of_current_device());
  Workspace& ws = call.ws;
  const Events& ev = call.ev;

  EstimateResult r;
  DeviceEstimate& dev = r.device;
  allocate_result(dev, g, config, sbb_bytes, nvis_total);

  const CallBuffers cb = call_buffers(ws, tables_end, kept_bytes, nvis_total, g.rows, scan_bytes, staging_bytes);
  char* scratch = static_cast<char*>(ws.flex.get(scratch_bytes));
  for (const auto& [at, src, bytes] : {std::tuple{off_seqs, static_cast<const void*>(seqs.data()),
                                                  seqs.size() * sizeof(cuda::FlexSeq)},
                                       {off_eseqs, eseqs.data(), eseqs.size() * sizeof(cuda::EstSeq)},
                                       {off_probe, probe_seq.data(), probe_seq.size() * sizeof(int32_t)},
                                       {off_kb, kb_seq.data(), kb_seq.size() * sizeof(int32_t)},
                                       {off_qb, qb_seq.data(), qb_seq.size() * sizeof(int32_t)},
                                       {off_qm, qb_m.data(), qb_m.size() * sizeof(int32_t)},
                                       {off_ch, ch_seq.data(), ch_seq.size() * sizeof(int32_t)}})
    if (bytes > 0) std::memcpy(cb.host + at, src, bytes);
  const cudaStream_t st = nullptr;
  char* const tables = cb.tables;
  int64_t* sp_host =
      upload_geometry(dev, g, sbb, nvis_total, cb.host, off_score_ptr, off_sbb, tables, tables_end, st);

  const auto table = [&](size_t at) { return reinterpret_cast<const int32_t*>(tables + at); };
  cuda::FlexParams fp{};
  set_operands(fp, q, k);
  fp.seqs = reinterpret_cast<const cuda::FlexSeq*>(tables + off_seqs);
  fp.probe_seq = table(off_probe);
  fp.kb_seq = table(off_kb);
  fp.qb_seq = table(off_qb);
  fp.qb_m = table(off_qm);
  fp.ch_seq = table(off_ch);
  fp.num_seqs = int(seqs.size());
  fp.num_probe = int(num_probe);
  fp.total_kb = total_kb;
  fp.total_qb = total_qb;
  fp.total_ch = total_ch;
  fp.total_k = g.total_k;
  fp.max_lk = max_lk;
  fp.score_ptr = static_cast<const int64_t*>(dev.score_ptr.data());
  fp.scores = static_cast<float*>(dev.scores.data());
  fp.kbar = reinterpret_cast<float*>(scratch + s_kbar);
  fp.part = reinterpret_cast<float2*>(scratch + s_part);
  fp.stat = reinterpret_cast<float2*>(scratch + s_stat);
  fp.vert = reinterpret_cast<float*>(scratch + s_vert);
  fp.slash = reinterpret_cast<float*>(scratch + s_slash);
  fp.slash_part = reinterpret_cast<float*>(scratch + s_spart);
  fp.vsel = reinterpret_cast<uint8_t*>(scratch + s_vsel);
  fp.ssel = reinterpret_cast<uint8_t*>(scratch + s_ssel);
  fp.head_info = reinterpret_cast<float*>(scratch + s_info);
  fp.keep = static_cast<uint8_t*>(cb.keep);
  fp.counts = static_cast<int32_t*>(cb.counts);
  fp.heads_q = g.heads_q;
  fp.heads_kv = g.heads_kv;
  fp.group = g.group;
  fp.d = int(g.dim);
  fp.block = int(B);
  fp.scale = scale;
  fp.gamma = config.tau;
  fp.js_tau = config.flex_js_tau;
  fp.min_blocks = min_blocks;
  fp.max_blocks = config.flex_max_budget > 0 ? (config.flex_max_budget + B - 1) / B : int64_t(1) << 62;
  const Protections prot = config.protections();
  fp.sink = prot.sink;
  fp.diagonal = prot.diagonal;
  fp.last_row = prot.last_row;

  cuda::SelectParams sel{};  // the CSR assembly shared with the other estimators
  sel.seqs = reinterpret_cast<const cuda::EstSeq*>(tables + off_eseqs);
  sel.num_seqs = int(eseqs.size());
  sel.score_ptr = fp.score_ptr;
  sel.keep = fp.keep;
  sel.counts = fp.counts;
  sel.row_ptr = static_cast<const int32_t*>(dev.row_ptr.data());
  sel.col_idx = static_cast<int32_t*>(dev.col_idx.data());
  sel.heads_q = g.heads_q;

  const auto t_setup = std::chrono::steady_clock::now();
  check(cudaEventRecord(ev.ev[0], st), "cudaEventRecord");
  check(cuda::launch_flexprefill(fp, cuda::FlexStage::sampling, st), "flexprefill probe");
  check(cudaEventRecord(ev.ev[1], st), "cudaEventRecord");
  check(cuda::launch_flexprefill(fp, cuda::FlexStage::scoring, st), "flexprefill map");
  check(cudaEventRecord(ev.ev[2], st), "cudaEventRecord");
  check(cudaMemsetAsync(fp.keep, 0, size_t(nvis_total), st), "clearing the flags");
  check(cudaMemsetAsync(fp.counts, 0, size_t(g.rows + 1) * sizeof(int32_t), st), "clearing counts");
  check(cuda::launch_flexprefill(fp, cuda::FlexStage::selection, st), "flexprefill selection");
  check(cuda::exclusive_scan(fp.counts, static_cast<int32_t*>(dev.row_ptr.data()), g.rows + 1, cb.scan, scan_bytes, st),
        "row_ptr scan");
  check(cuda::launch_compact(sel, g.rows, st), "CSR compaction");
  check(cuda::launch_head_counts(sel, cb.kept, st), "kept blocks per head");
  check(cudaMemcpyAsync(cb.host + off_kept, cb.kept, kept_bytes, cudaMemcpyDeviceToHost, st), "reading the counts");
  check(cudaEventRecord(ev.ev[3], st), "cudaEventRecord");

  // While the kernels run: the host rows, the visible blocks per head, the multiply-adds as the CPU
  // estimator counts them (the map's mean queries and dots, the probe's rows).
  est::init_row_geometry(g, r, sp_host);
  EstimateStats& s = r.stats;
  std::vector<int64_t> vis(size_t(g.heads_q), 0);
  for (size_t si = 0; si < g.seqs.size(); ++si) {
    const Seq& e = g.seqs[si];
    for (int h = 0; h < g.heads_q; ++h) {
      for (int64_t m = 0; m < e.nqb; ++m) {
        const int64_t nv = r.visible(e.row_base + h * e.nqb + m);
        vis[size_t(h)] += nv;
        s.mac += double(g.queries_in(e, m) + nv) * double(g.dim);
      }
      if (seqs[si].probe >= 0) s.mac += double(L) * double(e.lk - L + 1 + e.lk) / 2.0 * double(g.dim);
    }
  }

  check(cudaEventSynchronize(ev.ev[3]), "estimate");
  call.drain.armed = false;
  const auto t_synced = std::chrono::steady_clock::now();
  s.ms_sampling = ev.ms(0, 1);
  s.ms_scoring = ev.ms(1, 2);
  s.ms_selection = ev.ms(2, 3);
  close_call(r, g, config, sbb, vis, nvis_total, cb.host + off_kept, ws, {t0, t_setup, t_synced});
  return r;
}

EstimateResult estimate_cuda(const TensorView& q, const TensorView& k, const Pattern& layout,
                             const EstimateConfig& config) {
  const auto t0 = std::chrono::steady_clock::now();
  ARIADNE_CHECK(k.defined() && k.device == Device::cuda, "estimate (cuda): k must be a device tensor, got ",
                k.describe());
  ARIADNE_CHECK(k.dtype == q.dtype, "estimate (cuda): k dtype ", dtype_name(k.dtype), " differs from q's ",
                dtype_name(q.dtype));
  Pattern host_layout = layout;
  std::vector<int32_t> cq, ck;
  if (layout.cu_seqlens_q != nullptr) {
    ARIADNE_CHECK(layout.num_seqs >= 1, "estimate: layout num_seqs is ", layout.num_seqs, ", expected >= 1");
    cq = read_ints(layout.cu_seqlens_q, layout.num_seqs + 1);
    host_layout.cu_seqlens_q = cq.data();
    if (layout.cu_seqlens_k != nullptr) {
      ck = read_ints(layout.cu_seqlens_k, layout.num_seqs + 1);
      host_layout.cu_seqlens_k = ck.data();
    }
  }
  if (config.method == Estimator::flexprefill) return estimate_flexprefill_cuda(q, k, host_layout, config, t0);
  // The oracle is XAttention's computation at S = 1: every query a row, every key a column, the
  // exact causal softmax per query summed into blocks (divided by the queries of the block).
  const bool oracle = config.method == Estimator::oracle;
  const int64_t stride = oracle ? 1 : config.stride;
  const Geometry g = make_geometry(q, k, host_layout, config.block, stride, Device::cuda);
  const float scale = config.scale > 0 ? config.scale : float(1.0 / std::sqrt(double(g.dim)));
  const bool rr = config.method == Estimator::rr;
  const int spb = int(config.block / stride);

  EstimateResult r;

  // ---- host tables: sequences, query blocks ----
  // qb_vis: the key blocks visible to each query block (global index sbb[s] + m), the same for
  // every head. The result's host rows (score_ptr, row_queries: ~100-250 µs at 128K tokens,
  // mostly fresh pages) are filled after the kernels are enqueued; what the device needs before
  // (score_ptr) is written by est::row_score_ptr straight into the pinned staging below.
  std::vector<cuda::EstSeq> seqs;
  std::vector<int32_t> qb_seq, qb_m, qb_vis, sbb{0};
  int max_visible = 0;
  int64_t nvis_total = 0;
  for (size_t s = 0; s < g.seqs.size(); ++s) {
    const Seq& e = g.seqs[s];
    seqs.push_back(cuda::EstSeq{e.q0, e.k0, e.lq, e.lk, e.off, e.row_base, int32_t(e.nqb), int32_t(e.nqs),
                                int32_t(e.nks), int32_t(e.ks_base)});
    for (int64_t m = 0; m < e.nqb; ++m) {
      const int vis = int(g.diag(e, m) + 1);
      qb_seq.push_back(int32_t(s));
      qb_m.push_back(int32_t(m));
      qb_vis.push_back(vis);
      max_visible = std::max(max_visible, vis);
      nvis_total += int64_t(vis) * g.heads_q;
    }
    sbb.push_back(sbb.back() + int32_t(e.nqb));
  }
  ARIADNE_CHECK(max_visible <= cuda::kMaxSelectBlocks, "estimate (cuda): a query block sees ", max_visible,
                " key blocks, more than the ", cuda::kMaxSelectBlocks,
                " a selection CTA holds in registers: raise the block size or use the cpu backend");
  ARIADNE_CHECK(g.total_ks < (int64_t(1) << 31) && g.rows < (int64_t(1) << 31),
                "estimate (cuda): too many key strides or rows for 32-bit grids");
  const int64_t total_qblocks = int64_t(qb_seq.size());
  std::vector<double> tau(size_t(g.heads_q));
  for (int h = 0; h < g.heads_q; ++h) tau[size_t(h)] = config.tau_of(h);

  // Scoring scratch: (max, Σexp) per (row of a CTA, visible key block), see estimate.cuh.
  const int hpc = std::max(1, std::min(g.group, cuda::kScoreRows / spb));
  const int64_t zc = (g.group + hpc - 1) / hpc;
  std::vector<int64_t> scratch_base(size_t(total_qblocks), 0);
  int64_t scratch_pairs = 0;
  for (int64_t gb = 0; gb < total_qblocks; ++gb) {
    scratch_base[size_t(gb)] = scratch_pairs;
    scratch_pairs += int64_t(qb_vis[size_t(gb)]) * g.heads_kv * zc * cuda::kScoreRows;
  }

  // The case as the routing sees it, then the kernel (route_scoring).
  const int qterms = q.dtype == DType::bf16 ? 1 : q.dtype == DType::f16 ? 2 : 3;
  const int dpad = int((g.dim + 15) / 16 * 16);
  cuda::ScoreParams kind{};
  kind.rr = rr;
  kind.d = int(g.dim);
  kind.dpad = dpad;
  kind.qterms = qterms;
  kind.kterms = rr ? 3 : qterms;
  kind.spb = spb;
  kind.heads_per_cta = hpc;
  kind.row_split = spb > cuda::kScoreRows ? spb / cuda::kScoreRows : 1;
  kind.kernel = route_scoring(config, kind, smem_optin());
  kind.mma = kind.kernel != CudaScoring::f32;
  const bool use_mma = kind.mma;
  // The grouped kernels' CTAs own up to scores_blocks_per_cta adjacent query blocks of one
  // sequence, listed (first global block, blocks) with the longest first (work grows with the
  // block index: the last CTAs to start are then short ones, not whole diagonal sweeps).
  const bool grouped = cuda::scores_grouped(kind.kernel);
  std::vector<int32_t> group_ctas;
  if (grouped) {
    kind.group_blocks = cuda::scores_blocks_per_cta(kind);
    const int per_cta = kind.group_blocks;
    std::vector<std::pair<int64_t, int64_t>> order;  // (last block's visible key blocks, CTA)
    for (size_t s = 0; s < g.seqs.size(); ++s) {
      const Seq& e = g.seqs[s];
      for (int64_t m = 0; m < e.nqb; m += per_cta) {
        const int64_t n = std::min<int64_t>(per_cta, e.nqb - m);
        order.emplace_back(qb_vis[size_t(sbb[s] + m + n - 1)], int64_t(group_ctas.size() / 2));
        group_ctas.push_back(int32_t(sbb[s] + m));
        group_ctas.push_back(int32_t(n));
      }
    }
    std::stable_sort(order.begin(), order.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
    std::vector<int32_t> sorted;
    sorted.reserve(group_ctas.size());
    for (const auto& o : order) {
      sorted.push_back(group_ctas[size_t(2 * o.second)]);
      sorted.push_back(group_ctas[size_t(2 * o.second + 1)]);
    }
    group_ctas.swap(sorted);
  }

  // Staging layout (bytes): the device tables [0, tables_end) mirrored one to one, then the
  // result's score_ptr and seq_block_base (copied into their own buffers), then the per-head
  // kept counts coming back.
  const size_t off_seqs = 0;
  const size_t off_qb_seq = align_up(off_seqs + seqs.size() * sizeof(cuda::EstSeq));
  const size_t off_qb_m = align_up(off_qb_seq + qb_seq.size() * sizeof(int32_t));
  const size_t off_sbase = align_up(off_qb_m + qb_m.size() * sizeof(int32_t));
  const size_t off_tau = align_up(off_sbase + scratch_base.size() * sizeof(int64_t));
  const size_t off_groups = align_up(off_tau + tau.size() * sizeof(double));
  const size_t tables_end = align_up(off_groups + group_ctas.size() * sizeof(int32_t));
  const size_t kept_bytes = size_t(g.heads_q) * sizeof(int64_t);
  const size_t off_score_ptr = tables_end;
  const size_t score_ptr_bytes = size_t(g.rows + 1) * sizeof(int64_t);
  const size_t off_sbb = align_up(off_score_ptr + score_ptr_bytes);
  const size_t sbb_bytes = sbb.size() * sizeof(int32_t);
  const size_t off_kept = align_up(off_sbb + sbb_bytes);
  const size_t staging_bytes = off_kept + kept_bytes;

  size_t scan_bytes = scan_storage_bytes(g.rows);  // exclusive_scan takes it by reference
  // ---- from here on the workspace is ours until the call returns ----
  CallScope call(workspace_of_current_device());
  Workspace& ws = call.ws;
  const Events& ev = call.ev;

  // The result's device arrays (owned by the result). col_idx is sized for every visible block:
  // nnz is only known on the device, and waiting for it would cost a host round trip.
  DeviceEstimate& dev = r.device;
  allocate_result(dev, g, config, sbb_bytes, nvis_total);

  // Host tables into the pinned staging (no copy of the previous call can still read it: that
  // call synchronized before releasing the lock), then up in three asynchronous copies.
  const CallBuffers cb = call_buffers(ws, tables_end, kept_bytes, nvis_total, g.rows, scan_bytes, staging_bytes);
  char* tables = cb.tables;
  int64_t* d_kept = cb.kept;
  void* d_scratch = ws.scratch.get(size_t(scratch_pairs) * 2 * sizeof(float));
  // rr: K̄ as f32 [heads_kv, total_ks, d] or as three bf16 terms [heads_kv, total_ks, 3, dpad].
  const size_t ksum_bytes = size_t(g.heads_kv) * size_t(g.total_ks) *
                            (use_mma ? size_t(3) * size_t(dpad) * 2 : size_t(g.dim) * sizeof(float));
  void* d_ksum = rr ? ws.ksum.get(ksum_bytes) : nullptr;
  void* d_keep = cb.keep;
  void* d_counts = cb.counts;
  void* d_scan = cb.scan;
  char* host = cb.host;
  const auto put = [&](size_t off, const void* src, size_t bytes) {
    if (bytes > 0) std::memcpy(host + off, src, bytes);
  };
  put(off_seqs, seqs.data(), seqs.size() * sizeof(cuda::EstSeq));
  put(off_qb_seq, qb_seq.data(), qb_seq.size() * sizeof(int32_t));
  put(off_qb_m, qb_m.data(), qb_m.size() * sizeof(int32_t));
  put(off_sbase, scratch_base.data(), scratch_base.size() * sizeof(int64_t));
  put(off_tau, tau.data(), tau.size() * sizeof(double));
  put(off_groups, group_ctas.data(), group_ctas.size() * sizeof(int32_t));
  const cudaStream_t st = nullptr;
  int64_t* sp_host = upload_geometry(dev, g, sbb, nvis_total, host, off_score_ptr, off_sbb, tables, tables_end, st);

  cuda::ScoreParams sp{};
  set_operands(sp, q, k);
  sp.ksum = static_cast<float*>(d_ksum);
  sp.total_ks = g.total_ks;
  sp.seqs = reinterpret_cast<const cuda::EstSeq*>(tables + off_seqs);
  sp.num_seqs = int(seqs.size());
  sp.qblock_seq = reinterpret_cast<const int32_t*>(tables + off_qb_seq);
  sp.qblock_m = reinterpret_cast<const int32_t*>(tables + off_qb_m);
  sp.score_ptr = static_cast<const int64_t*>(dev.score_ptr.data());
  sp.scores = static_cast<float*>(dev.scores.data());
  sp.heads_q = g.heads_q;
  sp.heads_kv = g.heads_kv;
  sp.group = g.group;
  sp.d = g.dim;
  sp.stride = int(stride);
  sp.block = int(config.block);
  sp.spb = spb;
  sp.heads_per_cta = hpc;
  sp.scratch = static_cast<float2*>(d_scratch);
  sp.scratch_base = reinterpret_cast<const int64_t*>(tables + off_sbase);
  sp.row_split = kind.row_split;
  sp.rr = rr;
  sp.paper = config.offset == RROffset::paper;
  sp.qmul = scale / float(stride);
  sp.mma = use_mma;
  sp.dpad = dpad;
  sp.qterms = qterms;
  sp.kterms = rr ? 3 : qterms;
  sp.ksplit = use_mma ? d_ksum : nullptr;
  if (use_mma) sp.ksum = nullptr;
  sp.kernel = kind.kernel;
  sp.grouped = grouped;
  sp.approximate = kind.kernel == CudaScoring::wgmma_approximate;
  sp.group_blocks = kind.group_blocks;
  sp.group_ctas = grouped ? reinterpret_cast<const int32_t*>(tables + off_groups) : nullptr;
  sp.num_group_ctas = int(group_ctas.size() / 2);

  const Protections prot = config.protections();
  cuda::SelectParams sel{};
  sel.seqs = sp.seqs;
  sel.num_seqs = sp.num_seqs;
  sel.qblock_seq = sp.qblock_seq;
  sel.qblock_m = sp.qblock_m;
  sel.score_ptr = sp.score_ptr;
  sel.scores = sp.scores;
  sel.tau = reinterpret_cast<const double*>(tables + off_tau);
  sel.keep = static_cast<uint8_t*>(d_keep);
  sel.counts = static_cast<int32_t*>(d_counts);
  sel.row_ptr = static_cast<const int32_t*>(dev.row_ptr.data());
  sel.col_idx = static_cast<int32_t*>(dev.col_idx.data());
  sel.heads_q = g.heads_q;
  sel.block = int(config.block);
  sel.last_row = prot.last_row;
  sel.sink = prot.sink;
  sel.diagonal = prot.diagonal;
  sel.forced_first = config.method == Estimator::xattn;

  const auto t_setup = std::chrono::steady_clock::now();
  check(cudaEventRecord(ev.ev[0], st), "cudaEventRecord");
  if (rr) check(cuda::launch_key_stride_sums(sp, st), "key-stride sums");
  check(cudaEventRecord(ev.ev[1], st), "cudaEventRecord");
  check(cudaMemsetAsync(sp.scores, 0, size_t(nvis_total) * sizeof(float), st), "clearing scores");
  check(cuda::launch_scores(sp, total_qblocks, st), "scoring kernel");
  check(cudaEventRecord(ev.ev[2], st), "cudaEventRecord");
  check(cudaMemsetAsync(sel.counts, 0, size_t(g.rows + 1) * sizeof(int32_t), st), "clearing counts");
  check(cuda::launch_select(sel, total_qblocks, max_visible, st), "selection kernel");
  check(cuda::exclusive_scan(sel.counts, static_cast<int32_t*>(dev.row_ptr.data()), g.rows + 1, d_scan, scan_bytes,
                             st),
        "row_ptr scan");
  check(cuda::launch_compact(sel, g.rows, st), "CSR compaction");
  check(cuda::launch_head_counts(sel, d_kept, st), "kept blocks per head");
  check(cudaMemcpyAsync(host + off_kept, d_kept, kept_bytes, cudaMemcpyDeviceToHost, st), "reading the counts");
  check(cudaEventRecord(ev.ev[3], st), "cudaEventRecord");

  // While the kernels run: the result's host rows (score_ptr from the staging, as uploaded), the
  // visible blocks per head and the multiply-add count of the cost model (as the CPU estimator
  // counts).
  est::init_row_geometry(g, r, sp_host);
  EstimateStats& s = r.stats;
  const int64_t len = rr ? g.dim : stride * g.dim;
  std::vector<int64_t> vis(size_t(g.heads_q), 0);
  for (const Seq& e : g.seqs)
    for (int h = 0; h < g.heads_q; ++h)
      for (int64_t m = 0; m < e.nqb; ++m) {
        const int64_t row = e.row_base + h * e.nqb + m;
        vis[size_t(h)] += r.visible(row);
        const int64_t i0 = m * spb, i1 = std::min(e.nqs, i0 + spb);
        s.mac += double(i1 - i0) * double(last_key_stride(config, stride, e, i1 - 1, h) + 1) * double(len);
      }

  check(cudaEventSynchronize(ev.ev[3]), "estimate");
  call.drain.armed = false;
  const auto t_synced = std::chrono::steady_clock::now();
  s.ms_sampling = ev.ms(0, 1);
  s.ms_scoring = ev.ms(1, 2);
  s.scoring = sp.kernel;
  s.ms_selection = ev.ms(2, 3);
  close_call(r, g, config, sbb, vis, nvis_total, host + off_kept, ws, {t0, t_setup, t_synced});
  return r;
}

}  // namespace ariadne::est
