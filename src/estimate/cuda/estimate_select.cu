// CUDA selection of the stride-level estimators: per (query head, query block) the smallest set of
// key blocks holding τ of the row's score mass, the protections, and the CSR mask in device
// memory (counts → exclusive scan → col_idx ascending). The rule is est's select_blocks
// (src/estimate/estimate.cpp); the CPU estimator is the test oracle.
//
// The kept set is a prefix of the row in sort order (score descending, index ascending; forced
// blocks first where their mass counts first): block i is kept when the mass of the blocks before
// it in that order is < τ·total. So no sort is needed, only the last kept block: a CTA per row
// finds it by a radix descent over the 48-bit sort keys (score bits, index), 8 bits a pass. Each
// pass histograms, per digit, the count and the mass of the blocks still in the running range,
// scans the 256 digits and keeps the last non-empty digit whose first block starts below τ·total;
// the descent stops as soon as that digit holds one block. The masses are 64-bit fixed point
// (every score scaled by one power of two per row so that the row's total fits in 63 bits, then
// truncated: an error below 2^-38 of the total), so the sums are exact in any order: the kernel is
// deterministic, and its decisions are the CPU's (double sums) whenever none is within rounding of
// the threshold, and exactly the CPU's when the scores are dyadic (tests/cuda, crafted rows).
// Rows have at most kMaxSelectBlocks visible blocks (512K tokens at B 128).
//
// A bitonic sort moves 16 bytes of shared memory per key and step (55 steps at 1024 blocks) and
// takes ~1.2 ms at 128K tokens (docs/design/estimate.md).
#include <cub/device/device_scan.cuh>

#include <cstdint>
#include <type_traits>

#include "estimate/cuda/estimate.cuh"

namespace ariadne::cuda {
namespace {

constexpr int kSelectThreads = 256;
constexpr int kSelectWarps = kSelectThreads / 32;
static_assert(kSelectThreads == 256, "one histogram digit (8 bits) per thread");

// Which blocks of a row are kept whatever their mass (the estimators' protections).
struct Forced {
  bool sink, diagonal;
  __device__ bool operator()(int i, int n) const { return (sink && i == 0) || (diagonal && i == n - 1 && i != 0); }
};

// One row's selection by the CTA: keep[i] for its n blocks (scores sc) and *count, the kept
// blocks. PER: blocks of a row per thread (rows of up to 256·PER blocks), registers for PER keys
// and masses; the launch takes the smallest that fits the longest row, so short rows keep the
// occupancy of few registers. keep_all: every block is kept (τ = 1, a protected row).
template <int PER>
__device__ void select_row(const float* sc, const int n, uint8_t* keep, int32_t* count, const double tau,
                           const bool keep_all, const Forced forced, const bool forced_first) {
  // This pass's mass per digit in three parts, bits 0-16, 17-33 and 34 up (a block's mass is below
  // 2^51 and a row's total below 2^63, so each part's sum over a digit stays below 2^32), so that
  // the histogram takes native 32-bit shared atomics (a 64-bit add is a compare-and-swap loop,
  // which the skewed digits of the first passes made spin), and the block count; reset as read.
  __shared__ unsigned h_mass[3][256];
  __shared__ unsigned h_cnt[256];
  __shared__ unsigned long long ex_mass[256]; // per digit: mass before the digit's first block
  __shared__ unsigned ex_cnt[256];
  __shared__ unsigned long long warp_tot[kSelectWarps];
  __shared__ unsigned max_bits;
  __shared__ int chosen[2];                   // the pass's digit, alternating (reset a pass ahead)
  __shared__ int kept;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (keep_all || tau >= 1.0) {
    // τ = 1 (or a protected row) keeps every visible block by definition.
    for (int i = tid; i < n; i += kSelectThreads) keep[i] = 1;
    if (tid == 0) *count = n;
    return;
  }

  // This thread's blocks i = tid + 256·j: sort keys (ascending = the greedy's order) and scores.
  // Scores are >= 0, so their bit patterns order like their values; XAttention's forced blocks
  // take key 0 so that their mass is counted first.
  uint64_t key[PER];
  float val[PER];
  unsigned mx = 0;
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    const int i = tid + j * kSelectThreads;
    key[j] = 0;
    val[j] = 0.f;
    if (i < n) {
      val[j] = sc[i];
      const unsigned bits = __float_as_uint(val[j]);
      const uint32_t hi = (forced_first && forced(i, n)) ? 0u : ~bits;
      key[j] = (uint64_t(hi) << 16) | uint32_t(i);
      mx = bits > mx ? bits : mx;
    }
  }
  h_mass[0][tid] = h_mass[1][tid] = h_mass[2][tid] = 0;
  h_cnt[tid] = 0;
  if (tid == 0) {
    max_bits = 0;
    chosen[0] = chosen[1] = -1;
    kept = 0;
  }
  __syncthreads();
  if (mx != 0) atomicMax(&max_bits, mx);
  __syncthreads();
  // Fixed point: scores < 2^(x − 126) for the largest's exponent field x, scaled by 2^(177 − x)
  // stay below 2^51, so 4096 of them sum below 2^63.
  const int xf = int(max_bits >> 23);
  const int scale = 177 - (xf == 0 ? 1 : xf);
  uint64_t q[PER];
#pragma unroll
  for (int j = 0; j < PER; ++j) q[j] = __double2ull_rz(ldexp(double(val[j]), scale));

  // Radix descent: the running range is the keys whose bits above `sh + 8` equal `prefix`;
  // `below` is the mass of the keys under it. The last kept key lies in the range throughout.
  uint64_t prefix = 0, upper = 0;
  unsigned long long below = 0, need = 0;
  bool any = true;
  int pass = 0;
  for (int sh = 40;; sh -= 8, ++pass) {
    // This thread's blocks in range, those with equal digits merged first (the first passes'
    // digits are skewed: most of a row shares a few exponents), then one native 32-bit shared add
    // per part and digit.
    int dg[PER];
    unsigned long long ms[PER];
    unsigned ct[PER];
#pragma unroll
    for (int a = 0; a < PER; ++a) {
      const int i = tid + a * kSelectThreads;
      dg[a] = i < n && (key[a] >> (sh + 8)) == prefix ? int(key[a] >> sh) & 255 : -1;
      ms[a] = q[a];
      ct[a] = 1;
#pragma unroll
      for (int b = 0; b < a; ++b)
        if (dg[a] >= 0 && dg[b] == dg[a]) {
          ms[b] += ms[a];
          ct[b] += 1;
          dg[a] = -1;
        }
    }
#pragma unroll
    for (int a = 0; a < PER; ++a)
      if (dg[a] >= 0) {
        atomicAdd(&h_mass[0][dg[a]], unsigned(ms[a]) & 0x1ffffu);
        atomicAdd(&h_mass[1][dg[a]], unsigned(ms[a] >> 17) & 0x1ffffu);
        atomicAdd(&h_mass[2][dg[a]], unsigned(ms[a] >> 34));
        atomicAdd(&h_cnt[dg[a]], ct[a]);
      }
    __syncthreads();
    if (tid == 0) chosen[(pass + 1) & 1] = -1;  // read by every thread before this pass's barrier
    const unsigned long long mass = (unsigned long long)h_mass[0][tid] + ((unsigned long long)h_mass[1][tid] << 17) +
                                    ((unsigned long long)h_mass[2][tid] << 34);
    const unsigned cnt = h_cnt[tid];
    h_mass[0][tid] = h_mass[1][tid] = h_mass[2][tid] = 0;  // ready for the next pass (no thread reads
    h_cnt[tid] = 0;                                         // another's digit here)
    unsigned long long inc = mass;  // inclusive scan over the digits (digit = tid)
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned long long v = __shfl_up_sync(0xffffffffu, inc, o);
      if (lane >= o) inc += v;
    }
    if (lane == 31) warp_tot[warp] = inc;
    __syncthreads();
    unsigned long long before = 0, all = 0;
#pragma unroll
    for (int w = 0; w < kSelectWarps; ++w) {
      const unsigned long long t = warp_tot[w];
      before += w < warp ? t : 0ull;
      all += t;
    }
    // First pass: every block is in the range, so `all` is the row's total; the greedy keeps
    // block i while (mass before i) < τ·total, i.e. below ceil(τ·total) for integer masses.
    if (pass == 0) need = __double2ull_ru(tau * double(all));
    const unsigned long long start = below + before + inc - mass;
    ex_mass[tid] = start;
    ex_cnt[tid] = cnt;
    if (cnt > 0 && start < need) atomicMax(&chosen[pass & 1], tid);
    __syncthreads();
    const int d = chosen[pass & 1];
    if (d < 0) {  // no block starts below τ·total (an all-zero row): only the forced ones stay
      any = false;
      break;
    }
    below = ex_mass[d];
    prefix = (prefix << 8) | uint64_t(d);
    if (ex_cnt[d] == 1 || sh == 0) {
      upper = (prefix + 1) << sh;  // keys below this are kept: the range's one block and all before
      break;
    }
  }

  int mine = 0;
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    const int i = tid + j * kSelectThreads;
    if (i < n) {
      const bool kp = (any && key[j] < upper) || forced(i, n);
      keep[i] = kp ? 1 : 0;
      mine += kp;
    }
  }
  if (mine) atomicAdd(&kept, mine);  // an integer count: the order of the additions does not matter
  __syncthreads();
  if (tid == 0) *count = kept;
}

// Grid (total query blocks, heads_q): the row of query head blockIdx.y and global query block
// blockIdx.x, with the estimator's protections.
template <int PER>
__global__ void __launch_bounds__(kSelectThreads) select_kernel(SelectParams p) {
  const int gb = blockIdx.x, h = blockIdx.y;
  const EstSeq e = p.seqs[p.qblock_seq[gb]];
  const int64_t m = p.qblock_m[gb];
  const int64_t row = e.row_base + int64_t(h) * e.nqb + m;
  const int64_t sp = p.score_ptr[row];
  select_row<PER>(p.scores + sp, int(p.score_ptr[row + 1] - sp), p.keep + sp, p.counts + row, p.tau[h],
                  p.last_row && m == e.nqb - 1, Forced{p.sink, p.diagonal}, p.forced_first);
}

// Grid (rows): row blockIdx.x with its own τ, nothing forced.
template <int PER>
__global__ void __launch_bounds__(kSelectThreads) select_rows_kernel(RowSelectParams p) {
  const int64_t row = blockIdx.x;
  const int64_t sp = p.score_ptr[row];
  select_row<PER>(p.scores + sp, int(p.score_ptr[row + 1] - sp), p.keep + sp, p.counts + row, p.tau[row], false,
                  Forced{false, false}, false);
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

// The selection kernels' width for rows of up to max_visible blocks: `run` gets PER (blocks a
// thread) as an integral constant, the smallest of 4, 8 and 16 that holds the longest row, so
// short rows keep the occupancy of few registers.
template <class F>
void with_width(int max_visible, F&& run) {
  if (max_visible <= 4 * kSelectThreads)
    run(std::integral_constant<int, 4>{});
  else if (max_visible <= 8 * kSelectThreads)
    run(std::integral_constant<int, 8>{});
  else
    run(std::integral_constant<int, kMaxSelectBlocks / kSelectThreads>{});
}

}  // namespace

cudaError_t launch_select(const SelectParams& p, int64_t total_qblocks, int max_visible, cudaStream_t stream) {
  if (total_qblocks == 0) return cudaSuccess;
  if (max_visible > kMaxSelectBlocks) return cudaErrorInvalidValue;  // the host refuses such rows first
  const dim3 grid(unsigned(total_qblocks), unsigned(p.heads_q));
  with_width(max_visible, [&](auto per) { select_kernel<per()><<<grid, kSelectThreads, 0, stream>>>(p); });
  return cudaGetLastError();
}

cudaError_t launch_select_rows(const RowSelectParams& p, int64_t rows, int max_visible, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (max_visible > kMaxSelectBlocks || rows > int64_t(INT32_MAX)) return cudaErrorInvalidValue;
  with_width(max_visible, [&](auto per) {
    select_rows_kernel<per()><<<unsigned(rows), kSelectThreads, 0, stream>>>(p);
  });
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
