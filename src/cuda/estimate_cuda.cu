// The CUDA estimator's host side: geometry (shared with the CPU estimator), device tables, the
// kernel sequence with CUDA-event stage times, the CSR in device memory and the optional copies
// back into the host result.
//
// Stages (stream 0, the legacy default stream, so it orders against any caller's work):
//   sampling   rr: key-stride sums K̄ (one pass over k); xattn: nothing (the scoring kernel reads
//              q and k in place, no re-layout and no repeated KV heads)
//   scoring    logits, row softmax, block sums (estimate_score.cu)
//   selection  per-row sort and threshold, counts → scan → col_idx (estimate_select.cu); one
//              host round trip reads row_ptr back (the nnz sizes col_idx; the per-row counts give
//              the density per head)
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "cuda/estimate.cuh"
#include "estimate/internal.hpp"

namespace ariadne::est {
namespace {

void check(cudaError_t e, const char* what) {
  ARIADNE_CHECK(e == cudaSuccess, "estimate (cuda): ", what, " failed: ", cudaGetErrorString(e));
}

// Raw device bytes in a DeviceBuffer (4-byte elements).
DeviceBuffer device_bytes(size_t bytes) { return DeviceBuffer(DType::f32, {int64_t((bytes + 3) / 4)}); }

template <class T>
DeviceBuffer upload(const std::vector<T>& v) {
  DeviceBuffer d = device_bytes(v.size() * sizeof(T));
  if (!v.empty()) check(cudaMemcpy(d.data(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
  return d;
}

// cu_seqlens may be host or device pointers (the CUDA attention reads device ones); unified
// addressing lets one cudaMemcpyDefault read either.
std::vector<int32_t> read_ints(const int32_t* p, int64_t n) {
  std::vector<int32_t> v(size_t(n), 0);
  check(cudaMemcpy(v.data(), p, size_t(n) * sizeof(int32_t), cudaMemcpyDefault), "reading cu_seqlens");
  return v;
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
  double ms(int a, int b) const {
    float t = 0;
    check(cudaEventElapsedTime(&t, ev[a], ev[b]), "cudaEventElapsedTime");
    return double(t);
  }
};

}  // namespace

std::string estimate_cuda_refusal(const TensorView& q, const EstimateConfig* config) {
  if (q.device != Device::cuda) return "the CUDA estimator needs device tensors (q is in host memory)";
  if (q.rank == 3 && q.shape[2] > 256)
    return "head_dim " + std::to_string(q.shape[2]) + " exceeds the CUDA estimator's 256 (shared-memory tiles)";
  if (config == nullptr) return "";
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
  // The oracle is XAttention's computation at S = 1: every query a row, every key a column, the
  // exact causal softmax per query summed into blocks (divided by the queries of the block).
  const bool oracle = config.method == Estimator::oracle;
  const int64_t stride = oracle ? 1 : config.stride;
  const Geometry g = make_geometry(q, k, host_layout, config.block, stride, Device::cuda);
  const float scale = config.scale > 0 ? config.scale : float(1.0 / std::sqrt(double(g.dim)));
  const bool rr = config.method == Estimator::rr;
  const int spb = int(config.block / stride);

  EstimateResult r;
  init_rows(g, r);
  std::vector<float>().swap(r.scores);  // filled on the device; copied back only if asked

  // ---- host tables: sequences, query blocks ----
  std::vector<cuda::EstSeq> seqs;
  std::vector<int32_t> qb_seq, qb_m, sbb{0};
  int max_visible = 0;
  for (size_t s = 0; s < g.seqs.size(); ++s) {
    const Seq& e = g.seqs[s];
    seqs.push_back(cuda::EstSeq{e.q0, e.k0, e.lq, e.lk, e.off, e.row_base, int32_t(e.nqb), int32_t(e.nqs),
                                int32_t(e.nks), int32_t(e.ks_base)});
    for (int64_t m = 0; m < e.nqb; ++m) {
      qb_seq.push_back(int32_t(s));
      qb_m.push_back(int32_t(m));
      max_visible = std::max(max_visible, int(g.diag(e, m) + 1));
    }
    sbb.push_back(sbb.back() + int32_t(e.nqb));
  }
  ARIADNE_CHECK(max_visible <= cuda::kMaxSortBlocks, "estimate (cuda): a query block sees ", max_visible,
                " key blocks, more than the ", cuda::kMaxSortBlocks,
                " the selection sorts in shared memory: raise the block size or use the cpu backend");
  ARIADNE_CHECK(g.total_ks < (int64_t(1) << 31) && g.rows < (int64_t(1) << 31),
                "estimate (cuda): too many key strides or rows for 32-bit grids");
  const int64_t total_qblocks = int64_t(qb_seq.size());
  const int64_t nvis_total = r.score_ptr.back();
  std::vector<double> tau(size_t(g.heads_q));
  for (int h = 0; h < g.heads_q; ++h) tau[size_t(h)] = config.tau_of(h);

  DeviceBuffer d_seqs = upload(seqs), d_qb_seq = upload(qb_seq), d_qb_m = upload(qb_m);
  DeviceBuffer d_tau = upload(tau);
  DeviceEstimate& dev = r.device;
  dev.block = config.block;
  dev.heads = g.heads_q;
  dev.seq_block_base = upload(sbb);
  dev.score_ptr = upload(r.score_ptr);
  dev.scores = device_bytes(size_t(nvis_total) * sizeof(float));
  dev.row_ptr = device_bytes(size_t(g.rows + 1) * sizeof(int32_t));
  DeviceBuffer d_keep = device_bytes(size_t(nvis_total));
  DeviceBuffer d_counts = device_bytes(size_t(g.rows + 1) * sizeof(int32_t));
  // Scoring scratch: (max, Σexp) per (row of a CTA, visible key block), see estimate.cuh.
  const int hpc = std::max(1, std::min(g.group, cuda::kScoreRows / spb));
  const int64_t zc = (g.group + hpc - 1) / hpc;
  std::vector<int64_t> scratch_base(size_t(total_qblocks), 0);
  int64_t scratch_pairs = 0;
  for (int64_t gb = 0; gb < total_qblocks; ++gb) {
    scratch_base[size_t(gb)] = scratch_pairs;
    scratch_pairs += (g.diag(g.seqs[size_t(qb_seq[size_t(gb)])], qb_m[size_t(gb)]) + 1) * g.heads_kv * zc * cuda::kScoreRows;
  }
  DeviceBuffer d_scratch_base = upload(scratch_base);
  DeviceBuffer d_scratch = device_bytes(size_t(scratch_pairs) * 2 * sizeof(float));
  DeviceBuffer d_ksum;
  if (rr) d_ksum = device_bytes(size_t(g.heads_kv) * size_t(g.total_ks) * size_t(g.dim) * sizeof(float));

  cuda::ScoreParams sp{};
  sp.q = q.data;
  sp.k = k.data;
  sp.dtype = int(q.dtype);
  sp.q_tok = q.stride[0];
  sp.q_head = q.stride[1];
  sp.k_tok = k.stride[0];
  sp.k_head = k.stride[1];
  sp.ksum = static_cast<float*>(d_ksum.data());
  sp.total_ks = g.total_ks;
  sp.seqs = static_cast<const cuda::EstSeq*>(d_seqs.data());
  sp.num_seqs = int(seqs.size());
  sp.qblock_seq = static_cast<const int32_t*>(d_qb_seq.data());
  sp.qblock_m = static_cast<const int32_t*>(d_qb_m.data());
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
  sp.scratch = static_cast<float2*>(d_scratch.data());
  sp.scratch_base = static_cast<const int64_t*>(d_scratch_base.data());
  sp.row_split = spb > cuda::kScoreRows ? spb / cuda::kScoreRows : 1;
  sp.rr = rr;
  sp.paper = config.offset == RROffset::paper;
  sp.qmul = scale / float(stride);

  const Protections prot = config.protections();
  cuda::SelectParams sel{};
  sel.seqs = sp.seqs;
  sel.num_seqs = sp.num_seqs;
  sel.qblock_seq = sp.qblock_seq;
  sel.qblock_m = sp.qblock_m;
  sel.score_ptr = sp.score_ptr;
  sel.scores = sp.scores;
  sel.tau = static_cast<const double*>(d_tau.data());
  sel.keep = static_cast<uint8_t*>(d_keep.data());
  sel.counts = static_cast<int32_t*>(d_counts.data());
  sel.row_ptr = static_cast<const int32_t*>(dev.row_ptr.data());
  sel.heads_q = g.heads_q;
  sel.block = int(config.block);
  sel.last_row = prot.last_row;
  sel.sink = prot.sink;
  sel.diagonal = prot.diagonal;
  sel.forced_first = config.method == Estimator::xattn;

  const cudaStream_t st = nullptr;
  Events ev;
  check(cudaEventRecord(ev.ev[0], st), "cudaEventRecord");
  if (rr) check(cuda::launch_key_stride_sums(sp, st), "key-stride sums");
  check(cudaEventRecord(ev.ev[1], st), "cudaEventRecord");
  check(cudaMemsetAsync(sp.scores, 0, size_t(nvis_total) * sizeof(float), st), "clearing scores");
  check(cuda::launch_scores(sp, total_qblocks, st), "scoring kernel");
  check(cudaEventRecord(ev.ev[2], st), "cudaEventRecord");
  check(cudaMemsetAsync(sel.counts, 0, size_t(g.rows + 1) * sizeof(int32_t), st), "clearing counts");
  check(cuda::launch_select(sel, total_qblocks, max_visible, st), "selection kernel");
  check(cuda::exclusive_scan(sel.counts, static_cast<int32_t*>(dev.row_ptr.data()), g.rows + 1, st),
        "row_ptr scan");
  std::vector<int32_t> row_ptr(size_t(g.rows + 1));
  check(cudaMemcpyAsync(row_ptr.data(), dev.row_ptr.data(), row_ptr.size() * sizeof(int32_t),
                        cudaMemcpyDeviceToHost, st),
        "reading row_ptr");
  check(cudaStreamSynchronize(st), "selection");
  dev.col_idx = device_bytes(size_t(row_ptr.back()) * sizeof(int32_t));
  sel.col_idx = static_cast<int32_t*>(dev.col_idx.data());
  check(cuda::launch_compact(sel, g.rows, st), "CSR compaction");
  check(cudaEventRecord(ev.ev[3], st), "cudaEventRecord");
  check(cudaEventSynchronize(ev.ev[3]), "estimate");

  EstimateStats& s = r.stats;
  s.ms_sampling = ev.ms(0, 1);
  s.ms_scoring = ev.ms(1, 2);
  s.ms_selection = ev.ms(2, 3);

  // Density per head and the multiply-add count of the cost model (as the CPU estimator counts).
  const int64_t len = rr ? g.dim : stride * g.dim;
  std::vector<int64_t> kept(size_t(g.heads_q), 0), vis(size_t(g.heads_q), 0);
  for (const Seq& e : g.seqs)
    for (int h = 0; h < g.heads_q; ++h)
      for (int64_t m = 0; m < e.nqb; ++m) {
        const int64_t row = e.row_base + h * e.nqb + m;
        kept[size_t(h)] += row_ptr[size_t(row) + 1] - row_ptr[size_t(row)];
        vis[size_t(h)] += r.visible(row);
        const int64_t i0 = m * spb, i1 = std::min(e.nqs, i0 + spb);
        s.mac += double(i1 - i0) * double(last_key_stride(config, stride, e, i1 - 1, h) + 1) * double(len);
      }
  s.density_per_head.resize(size_t(g.heads_q));
  for (int h = 0; h < g.heads_q; ++h) {
    s.kept_blocks += kept[size_t(h)];
    s.visible_blocks += vis[size_t(h)];
    s.density_per_head[size_t(h)] = vis[size_t(h)] ? double(kept[size_t(h)]) / double(vis[size_t(h)]) : 0.0;
  }
  s.density = s.visible_blocks ? double(s.kept_blocks) / double(s.visible_blocks) : 0.0;

  if (config.host_copy) {
    BlockMask& mask = r.mask;
    mask.block = config.block;
    mask.heads = g.heads_q;
    mask.seq_block_base = sbb;
    mask.row_ptr = std::move(row_ptr);
    mask.col_idx.resize(size_t(mask.row_ptr.back()));
    if (!mask.col_idx.empty()) dev.col_idx.copy_to_host(mask.col_idx.data(), mask.col_idx.size() * sizeof(int32_t));
    r.scores.resize(size_t(nvis_total));
    if (!r.scores.empty()) dev.scores.copy_to_host(r.scores.data(), r.scores.size() * sizeof(float));
  }
  s.ms_total = ms_since(t0);
  return r;
}

}  // namespace ariadne::est
