// CUDA selection of the stride-level estimators: per (query head, query block) the smallest set of
// key blocks holding τ of the row's score mass, the protections, and the CSR mask in device
// memory (counts → exclusive scan → col_idx ascending). The rule is est's select_blocks
// (src/estimate/estimate.cpp); the CPU estimator is the test oracle.
//
// Selection sorts the row exactly instead of searching for a threshold: a CTA per row, a bitonic
// sort of (score descending, index ascending) keys in shared memory, a double prefix sum over the
// sorted scores, and "keep while the mass before the block is < τ·total". Ties therefore break
// by the lower index as on the CPU, and the kept set is the CPU's whenever no decision is within
// rounding of the threshold. Rows have at most kMaxSortBlocks visible blocks (512K tokens at B 128).
#include <cub/device/device_scan.cuh>

#include <cstdint>

#include "cuda/estimate.cuh"

namespace ariadne::cuda {
namespace {

constexpr int kSelectThreads = 256;

// Grid (total query blocks, heads_q). Shared: keys [np] u64, prefix sums [np] f64 (np: the row's
// visible blocks rounded up to a power of two).
__global__ void __launch_bounds__(kSelectThreads) select_kernel(SelectParams p) {
  extern __shared__ uint64_t sel_smem[];
  __shared__ double part[kSelectThreads];
  __shared__ int kept;
  const int gb = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
  const int s = p.qblock_seq[gb];
  const int64_t m = p.qblock_m[gb];
  const EstSeq e = p.seqs[s];
  const int64_t row = e.row_base + int64_t(h) * e.nqb + m;
  const int64_t sp = p.score_ptr[row];
  const int n = int(p.score_ptr[row + 1] - sp);
  const float* sc = p.scores + sp;
  uint8_t* keep = p.keep + sp;
  const double tau = p.tau[h];
  auto forced = [&](int i) { return (p.sink && i == 0) || (p.diagonal && i == n - 1 && i != 0); };

  if ((p.last_row && m == e.nqb - 1) || tau >= 1.0) {
    // τ = 1 (or the protected last row) keeps every visible block by definition.
    for (int i = tid; i < n; i += kSelectThreads) keep[i] = 1;
    if (tid == 0) p.counts[row] = n;
    return;
  }

  int np = 1;
  while (np < n) np <<= 1;
  uint64_t* keys = sel_smem;
  double* cum = reinterpret_cast<double*>(sel_smem + np);
  // Ascending keys = descending scores (scores are >= 0, so their bit patterns order like the
  // values), then ascending index. XAttention's forced blocks sort first: their mass is counted
  // before the greedy pass. Padding sorts last.
  for (int i = tid; i < np; i += kSelectThreads) {
    uint64_t key = ~uint64_t(0);
    if (i < n) {
      const uint32_t hi = (p.forced_first && forced(i)) ? 0u : ~__float_as_uint(sc[i]);
      key = (uint64_t(hi) << 32) | uint32_t(i);
    }
    keys[i] = key;
  }
  __syncthreads();
  // Each step compares np / 2 disjoint pairs (i, i + j), i with bit j clear: pair q has
  // i = (q with a zero inserted at bit log2 j), so every thread works on every pass (the loop
  // over all np indices left half of them idle). Measured 1-9% faster, not the ~45% an
  // instruction count predicted: the sort's issue slots are not what bounds the kernel
  // (docs/rrattention.md, "Selection: pairs per step").
  for (int k = 2; k <= np; k <<= 1)
    for (int j = k >> 1, lj = __ffs(j) - 1; j > 0; j >>= 1, --lj) {
      for (int q = tid; q < np / 2; q += kSelectThreads) {
        const int i = ((q >> lj) << (lj + 1)) | (q & (j - 1));
        const uint64_t a = keys[i], b = keys[i + j];
        if ((a > b) == ((i & k) == 0)) {
          keys[i] = b;
          keys[i + j] = a;
        }
      }
      __syncthreads();
    }

  // Inclusive prefix sum of the sorted scores in double: each thread a run, then the run totals.
  const int per = (np + kSelectThreads - 1) / kSelectThreads;
  const int b0 = min(tid * per, np), b1 = min(b0 + per, np);
  double run = 0;
  for (int i = b0; i < b1; ++i) {
    run += i < n ? double(sc[uint32_t(keys[i])]) : 0.0;
    cum[i] = run;
  }
  part[tid] = run;
  __syncthreads();
  for (int o = 1; o < kSelectThreads; o <<= 1) {
    const double add = tid >= o ? part[tid - o] : 0.0;
    __syncthreads();
    part[tid] += add;
    __syncthreads();
  }
  const double before = tid > 0 ? part[tid - 1] : 0.0;
  for (int i = b0; i < b1; ++i) cum[i] += before;
  if (tid == 0) kept = 0;
  __syncthreads();

  const double need = tau * cum[n - 1];
  int mine = 0;
  for (int k = tid; k < n; k += kSelectThreads) {
    const int idx = int(uint32_t(keys[k]));
    const double mass_before = k > 0 ? cum[k - 1] : 0.0;
    const bool kp = mass_before < need || forced(idx);
    keep[idx] = kp ? 1 : 0;
    mine += kp;
  }
  atomicAdd(&kept, mine);  // an integer count: the order of the additions does not matter
  __syncthreads();
  if (tid == 0) p.counts[row] = kept;
}

// One warp per CSR row: the kept flags in index order, compacted with a ballot, so col_idx is
// strictly ascending.
__global__ void compact_kernel(SelectParams p, int64_t rows) {
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const int64_t sp = p.score_ptr[row];
  const int n = int(p.score_ptr[row + 1] - sp);
  int out = p.row_ptr[row];
  for (int base = 0; base < n; base += 32) {
    const int i = base + lane;
    const bool f = i < n && p.keep[sp + i] != 0;
    const unsigned ballot = __ballot_sync(0xffffffffu, f);
    if (f) p.col_idx[out + __popc(ballot & ((1u << lane) - 1u))] = i;
    out += __popc(ballot);
  }
}

// One thread per query head: its rows are contiguous inside each sequence (row_base + h·nqb + m),
// so its nonzeros are one row_ptr difference per sequence. Integer sums: exact in any order.
__global__ void head_counts_kernel(SelectParams p, int64_t* kept) {
  const int h = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (h >= p.heads_q) return;
  int64_t n = 0;
  for (int s = 0; s < p.num_seqs; ++s) {
    const EstSeq e = p.seqs[s];
    const int64_t r0 = e.row_base + int64_t(h) * e.nqb;
    n += p.row_ptr[r0 + e.nqb] - p.row_ptr[r0];
  }
  kept[h] = n;
}

}  // namespace

cudaError_t launch_select(const SelectParams& p, int64_t total_qblocks, int max_visible, cudaStream_t stream) {
  if (total_qblocks == 0) return cudaSuccess;
  int np = 1;
  while (np < max_visible) np <<= 1;
  const size_t smem = size_t(np) * (sizeof(uint64_t) + sizeof(double));
  cudaError_t err = cudaFuncSetAttribute(select_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (err != cudaSuccess) return err;
  select_kernel<<<dim3(unsigned(total_qblocks), unsigned(p.heads_q)), kSelectThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_compact(const SelectParams& p, int64_t rows, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  constexpr int warps = 8;
  compact_kernel<<<unsigned((rows + warps - 1) / warps), warps * 32, 0, stream>>>(p, rows);
  return cudaGetLastError();
}

cudaError_t launch_head_counts(const SelectParams& p, int64_t* kept, cudaStream_t stream) {
  if (p.heads_q == 0) return cudaSuccess;
  constexpr int threads = 128;
  head_counts_kernel<<<unsigned((p.heads_q + threads - 1) / threads), threads, 0, stream>>>(p, kept);
  return cudaGetLastError();
}

cudaError_t exclusive_scan(const int32_t* counts, int32_t* row_ptr, int64_t n, void* tmp, size_t& tmp_bytes,
                           cudaStream_t stream) {
  return cub::DeviceScan::ExclusiveSum(tmp, tmp_bytes, counts, row_ptr, int(n), stream);
}

}  // namespace ariadne::cuda
