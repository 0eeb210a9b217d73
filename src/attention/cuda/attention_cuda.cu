// The CUDA backend's entry points: what it supports, and the choice of kernel instantiation.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "attention/backends.hpp"
#include "attention/cuda/attention_band.cuh"
#include "attention/cuda/attention_bandwg.cuh"
#include "attention/cuda/attention_fwd.cuh"
#include "attention/cuda/attention_wgmma.cuh"

namespace ariadne {
namespace {

bool fail_why(std::string* why, const std::string& msg) {
  if (why != nullptr) *why = msg;
  return false;
}

template <int D>
cudaError_t launch_dim(const cuda::FwdParams& fp, DType dtype, bool wide, cudaStream_t st) {
  using namespace cuda;
  // Diagnostics are compiled into the 64-row configuration only.
  const bool diag = fp.entropy != nullptr || fp.distance != nullptr;
  if (dtype == DType::bf16) {
    if (diag) return launch_fwd<D, Bf16, BandConfig, true>(fp, st);
    return wide ? launch_fwd<D, Bf16, WideConfig, false>(fp, st) : launch_fwd<D, Bf16, BandConfig, false>(fp, st);
  }
  if (diag) return launch_fwd<D, F16, BandConfig, true>(fp, st);
  return wide ? launch_fwd<D, F16, WideConfig, false>(fp, st) : launch_fwd<D, F16, BandConfig, false>(fp, st);
}

template <int D>
cudaError_t launch_received_dim(const cuda::FwdParams& fp, DType dtype, cudaStream_t st) {
  return dtype == DType::bf16 ? cuda::launch_received<D, cuda::Bf16>(fp, st)
                              : cuda::launch_received<D, cuda::F16>(fp, st);
}

// 128-row query tiles share each K/V tile load among more rows and suit long dense rows; 64-row
// tiles suit bands (window, chunk), whose key range grows with the tile height, and grids too
// small to fill the 132 multiprocessors with 128-row tiles.
bool choose_wide(const AttentionParams& p) {
  const Pattern& pat = p.pattern;
  if (p.entropy.defined() || p.distance.defined()) return false;  // compiled into 64-row tiles only
  if (pat.blocks.defined()) return pat.blocks.block % cuda::WideConfig::BM == 0;
  if (pat.window_left != kUnbounded || pat.chunk > 0) return false;
  const int64_t ctas = (p.q.shape[0] + cuda::WideConfig::BM - 1) / cuda::WideConfig::BM * p.heads_q();
  return ctas >= 2 * 132;
}

// The band-walking kernels (attention_band.cuh, attention_bandwg.cuh) take narrow local patterns:
// no block mask, no entropy/distance, head dim 64/80/96, rows and keys below 2^30 (their row bounds
// are int32), and 16 consecutive rows seeing at most kMaxRowSpan keys (window left + right <= 129,
// or chunk <= 65). Empty when the per-warp band kernel can take p, else why not.
std::string band_refuses(const AttentionParams& p) {
  const int d = p.head_dim();
  if (d != 64 && d != 80 && d != 96) return "head_dim " + std::to_string(d) + " (the band kernel has 64, 80 and 96)";
  const Pattern& pat = p.pattern;
  if (pat.blocks.defined()) return "a block-sparse mask (the band kernels walk windows and chunks)";
  if (p.entropy.defined() || p.distance.defined()) return "entropy/distance (tile kernel only)";
  if (p.q.shape[0] >= (int64_t(1) << 30) || p.k.shape[0] >= (int64_t(1) << 30))
    return "2^30 rows or more (int32 row bounds)";
  int64_t span = -1;  // keys 16 consecutive query rows may see
  if (pat.window_left != kUnbounded && pat.window_right != kUnbounded) span = pat.window_left + pat.window_right + 16;
  if (pat.chunk > 0 && (span < 0 || 2 * pat.chunk + 14 < span)) span = 2 * pat.chunk + 14;
  if (span < 0 || span > cuda::BandShape<64>::kMaxRowSpan)
    return "a pattern that is not a narrow band (window left + right <= 129 or chunk <= 65)";
  return {};
}

// The wgmma band kernel (attention_bandwg.cuh) takes the band kernel's calls at head dim 80 (ViT's)
// on compute capability 9.0: sliding windows with left + right <= 129 (a 64-row tile's hull then
// meets at most 4 chunks of 64 keys) and chunks of <= 65 tokens, alone or with a window (BandRule
// clips each row's keys to its chunk), with or without a token order (the producer then gathers
// rows with cp.async), for q/k/v views whose strides increase from head dim to heads to rows (its
// tensor maps need that).
std::string bandwg_refuses(const AttentionParams& p, bool sm90) {
  if (std::string why = band_refuses(p); !why.empty()) return why;
  if (p.head_dim() != 80) return "head_dim " + std::to_string(p.head_dim()) + " (the wgmma band kernel has 80 only)";
  const Pattern& pat = p.pattern;
  if (pat.chunk != 0 && pat.chunk > cuda::BandWgShape<80>::kMaxChunk) return "chunk above 65";
  if (pat.chunk == 0 && (pat.window_left == kUnbounded || pat.window_right == kUnbounded ||
                         pat.window_left + pat.window_right > cuda::BandWgShape<80>::kMaxSpan))
    return "a window wider than left + right = 129";
  for (const TensorView* t : {&p.q, &p.k, &p.v})
    if (t->stride[2] != 1 || t->stride[1] < t->shape[2] || t->stride[0] < t->stride[1] * t->shape[1])
      return "q/k/v strides that do not increase from head dim to heads to rows (tensor maps)";
  if (!sm90) return "a device that is not compute capability 9.0";
  return {};
}

// The wgmma kernel (attention_wgmma.cuh) runs dense rows (full, causal, any window_right without a
// left bound, varlen, GQA, sinks) at head dims 64, 80 and 128 on compute capability 9.0, and
// block-sparse rows on those patterns when the block is a multiple of its 128-row tiles (128,
// RRAttention's default, 256, ...); blocks of 64 or 192 stay on the mma.sync kernel, whose 64-key
// tiles divide them. A token order runs elsewhere: its gathers are in the other kernels' loads.
std::string wgmma_refuses(const AttentionParams& p, bool sm90) {
  const int d = p.head_dim();
  if (d != 64 && d != 80 && d != 128) return "head_dim " + std::to_string(d) + " (the wgmma kernel has 64, 80 and 128)";
  const Pattern& pat = p.pattern;
  if (pat.window_left != kUnbounded) return "a left window bound (the wgmma kernel runs dense rows)";
  if (pat.chunk > 0) return "a chunked pattern (the wgmma kernel runs dense rows)";
  if (pat.blocks.defined() && pat.blocks.block % cuda::WgShape<64>::BM != 0)
    return "block size " + std::to_string(pat.blocks.block) + " (the wgmma kernel needs a multiple of 128)";
  if (p.entropy.defined() || p.distance.defined()) return "entropy/distance (tile kernel only)";
  if (p.order != nullptr) return "a token order (the wgmma kernel has no gathers)";
  if (!sm90) return "a device that is not compute capability 9.0";
  return {};
}

// Why kernel `k` cannot run p (empty: it can). The tile kernel runs every supported call.
std::string kernel_refuses(CudaKernel k, const AttentionParams& p, bool sm90) {
  switch (k) {
    case CudaKernel::bandwg: return bandwg_refuses(p, sm90);
    case CudaKernel::band: return band_refuses(p);
    case CudaKernel::wgmma: return wgmma_refuses(p, sm90);
    default: return {};
  }
}

// The routing decision, the one place it is made. The wgmma band kernel where it applies; then the
// per-warp band kernel for sliding windows (its hot path, 9 chunks of 16 keys per 16-row warp with
// masks on the two edge chunks, suits 16-aligned windows such as ViT's ±64; chunks at other head
// dims measure faster on the tile kernel); then the wgmma kernel for dense rows; else the tile kernel.
CudaKernel route(const AttentionParams& p, bool sm90) {
  if (bandwg_refuses(p, sm90).empty()) return CudaKernel::bandwg;
  if (band_refuses(p).empty() && p.pattern.chunk == 0) return CudaKernel::band;
  if (wgmma_refuses(p, sm90).empty()) return CudaKernel::wgmma;
  return CudaKernel::tile;
}

template <int D>
cudaError_t launch_band_dim(const cuda::FwdParams& fp, DType dtype, int run, cudaStream_t st) {
  return dtype == DType::bf16 ? cuda::launch_band<D, cuda::Bf16>(fp, run, st) : cuda::launch_band<D, cuda::F16>(fp, run, st);
}

// The tensor map of one of q, k, v [tokens, heads, D] for the wgmma kernel's TMA copies: dims
// (D, tokens, heads), box (W/2 columns, 128 rows, 1 head), swizzle W (WgShape). TMA needs a 16-byte
// aligned base and token/head strides that are multiples of 16 bytes (rows_aligned, which
// attention_cuda_supports requires, already guarantees both), strides below 2^40 bytes and at most
// 2^32 rows; the driver checks the rest. False when it cannot be built.
template <int D>
bool encode_map(CUtensorMap* map, const TensorView& t, int box_rows = cuda::WgShape<D>::BN) {
  constexpr int W = cuda::WgShape<D>::W;
  const cuda::EncodeTiled encode = cuda::encode_tiled();
  if (encode == nullptr || !rows_aligned(t, 8) || t.shape[0] == 0 || t.shape[0] > (int64_t(1) << 31)) return false;
  const cuuint64_t dims[3] = {cuuint64_t(D), cuuint64_t(t.shape[0]), cuuint64_t(t.shape[1])};
  const cuuint64_t strides[2] = {cuuint64_t(t.stride[0]) * 2, cuuint64_t(t.stride[1]) * 2};
  const cuuint32_t box[3] = {W / 2, cuuint32_t(box_rows), 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r = encode(map, t.dtype == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                            3, t.data, dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            W == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_32B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}

bool encode_map_dim(int d, CUtensorMap* map, const TensorView& t, int box_rows = 0) {
  switch (d) {
    case 64: return box_rows > 0 ? encode_map<64>(map, t, box_rows) : encode_map<64>(map, t);
    case 80: return box_rows > 0 ? encode_map<80>(map, t, box_rows) : encode_map<80>(map, t);
    default: return box_rows > 0 ? encode_map<128>(map, t, box_rows) : encode_map<128>(map, t);
  }
}

// The mean number of 128-key tiles a 128-row query tile of the wgmma kernel visits, where the host
// knows it without reading device memory: one sequence of dense rows (no window on the left: the
// kernel's patterns) from the shapes, block-sparse rows from AttentionParams::blocks_nnz. −1 when
// unknown (varlen dense rows, a mask without the hint).
double mean_key_tiles(const AttentionParams& p) {
  constexpr double kTile = 128;
  const Pattern& pat = p.pattern;
  const int64_t total_q = p.q.shape[0], total_k = p.k.shape[0];
  if (total_q <= 0) return -1;
  if (pat.blocks.defined()) {
    if (p.blocks_nnz < 0 || pat.blocks.block <= 0) return -1;
    // Rows: heads × query blocks (exact for one sequence, close for a varlen batch).
    const double rows = double(pat.blocks.heads) * std::ceil(double(total_q) / pat.blocks.block);
    return rows > 0 ? double(p.blocks_nnz) * (pat.blocks.block / kTile) / rows : -1;
  }
  if (pat.cu_seqlens_q != nullptr) return -1;
  if (pat.window_right == kUnbounded) return std::ceil(double(total_k) / kTile);  // full rows
  // Query tile t sees keys up to off + 128 t + 127 + right: (off + right) / 128 + t + 1 tiles on
  // average over the tiles, capped by the keys there are.
  const double tiles_q = std::ceil(double(total_q) / kTile);
  const double mean = double(total_k - total_q + pat.window_right) / kTile + (tiles_q + 1) / 2;
  return std::min(mean, std::ceil(double(total_k) / kTile));
}

// Consumer ping-pong (WgMaps::pingpong) on the d 128 kernel when its query tiles visit at most this
// many key tiles on average: short rows gain from it (block-sparse 32K at 10% kept, ~13 tiles, 3%
// faster; causal 8K, ~32 tiles, 1.9%), long rows lose (causal 128K, ~512 tiles, 2% slower). At
// head dims 64 and 80 the softmax is a larger share of a tile and ping-pong always pays.
constexpr double kPingPongTiles = 40;

bool wgmma_default_pingpong(const AttentionParams& p) {
  if (p.head_dim() <= 80) return true;
  const double mean = mean_key_tiles(p);
  return mean >= 0 && mean <= kPingPongTiles;
}

// Whether a block_col hint lets the wgmma band kernel copy the ordered tiles with the copy engine:
// one sequence (no cu_seqlens, or one) of grid.h x grid.w tokens, even sides, unit-grid height a
// multiple of 16 (a 64-row tile is 16 units of one unit column). Empty when it does, else why not.
std::string ordered_tiles_refuse(const AttentionParams& p, BlockColGrid grid) {
  if (p.order == nullptr) return "no token order (AttentionParams::order)";
  if (grid.h <= 0 || grid.w <= 0) return "no block_col grid (AttentionOptions::block_col)";
  const bool one_seq = p.pattern.cu_seqlens_q == nullptr || p.pattern.num_seqs == 1;
  if (!one_seq) return "more than one sequence";
  if (grid.h % 32 != 0 || grid.w % 2 != 0) return "a grid whose height is not a multiple of 32 or width not even";
  if (int64_t(grid.h) * grid.w != p.q.shape[0] || p.q.shape[0] != p.k.shape[0])
    return "a grid of h x w != the rows of q and k";
  return {};
}

// The knob values a forced toggle gives, or the automatic value; a toggle forced on where `why`
// says it cannot apply is an error naming the field.
bool resolve(Toggle t, bool automatic_value, const char* field, const std::string& why_not) {
  if (t == Toggle::on) ARIADNE_CHECK(why_not.empty(), "overrides.", field, " = on: this call cannot: ", why_not);
  if (t == Toggle::automatic) return automatic_value && why_not.empty();
  return t == Toggle::on;
}

void require_kernel(Toggle t, const char* field, CudaKernel k, CudaKernel chosen) {
  ARIADNE_CHECK(t == Toggle::automatic || chosen == k, "overrides.", field, " applies to the ", cuda_kernel_name(k),
                " kernel; this call runs on the ", cuda_kernel_name(chosen), " kernel");
}

}  // namespace

// Whether the current device is compute capability 9.0: wgmma and setmaxnreg are sm_90a
// instructions, which the Hopper kernels (wgmma, bandwg) are built for.
bool current_device_is_sm90() {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
    return false;
  return major == 9 && minor == 0;
}

int current_cuda_device() {
  int dev = -1;
  return cudaGetDevice(&dev) == cudaSuccess ? dev : -1;
}

// The CUDA backend's plan (AttentionPlan's state for Backend::cuda).
struct CudaPlan {
  CudaKernel kernel = CudaKernel::tile;
  bool wide = false;        // tile kernel: 128-row query tiles
  int band_run = 0;         // band kernels: tiles per run (0: the launcher's choice)
  bool chunk_pass = false;  // bandwg: the one-chunk-pass kernel
  int units_h = 0, units_w = 0;  // bandwg: the block_col merge-unit grid (ordered tiles), 0: none
  cuda::WgMaps maps{};      // wgmma: tensor maps for the pointers below, and the schedule knobs
  const void* mapped[4] = {nullptr, nullptr, nullptr, nullptr};  // q, k, v, out the maps address
  float* lse_scratch = nullptr;  // the received pass's LSE when the caller asks for none (owned)
  CudaPlan() = default;
  CudaPlan(const CudaPlan&) = delete;
  CudaPlan& operator=(const CudaPlan&) = delete;
  ~CudaPlan() {
    if (lse_scratch != nullptr) cudaFree(lse_scratch);
  }
};

bool attention_cuda_supports(const AttentionParams& p, std::string* why) {
  if (p.q.device != Device::cuda || p.k.device != Device::cuda || p.v.device != Device::cuda ||
      p.out.device != Device::cuda)
    return fail_why(why, "cuda: q, k, v and out must be device tensors");
  if (p.q.dtype != DType::bf16 && p.q.dtype != DType::f16)
    return fail_why(why, std::string("cuda: q dtype ") + dtype_name(p.q.dtype) +
                             " not supported, expected bf16 or f16");
  if (p.k.dtype != p.q.dtype || p.v.dtype != p.q.dtype)
    return fail_why(why, "cuda: k and v must have the dtype of q");
  if (p.out.dtype != p.q.dtype && p.out.dtype != DType::f32)
    return fail_why(why, "cuda: out dtype must be the dtype of q or f32");
  const int d = p.head_dim();
  if (d != 64 && d != 80 && d != 96 && d != 128)
    return fail_why(why, "cuda: head_dim " + std::to_string(d) + " not supported, expected 64, 80, 96 or 128");
  if (!rows_aligned(p.q, 8) || !rows_aligned(p.k, 8) || !rows_aligned(p.v, 8))
    return fail_why(why, "cuda: q/k/v rows must start on 16-byte boundaries (pointer and token/head "
                         "strides multiples of 8 elements)");
  for (const TensorView* t : {&p.q, &p.k, &p.v})
    if (t->stride[0] >= (int64_t(1) << 24) || t->stride[1] >= (int64_t(1) << 24))
      return fail_why(why, "cuda: q/k/v strides must be below 2^24 elements (32-bit tile offsets)");
  if (!rows_aligned(p.out, p.out.dtype == DType::f32 ? 2 : 8))
    return fail_why(why, "cuda: out rows must be 16-byte aligned (8-byte for f32 out)");
  if (p.pattern.blocks.defined() && p.pattern.blocks.block % cuda::kMaxBlockN != 0)
    return fail_why(why, "cuda: block-sparse block size " + std::to_string(p.pattern.blocks.block) +
                             " not supported, expected a multiple of 64");
  for (const auto& [t, name] : {std::pair{&p.entropy, "entropy"}, std::pair{&p.distance, "distance"},
                                 std::pair{&p.received, "received"}, std::pair{&p.coords_q, "coords_q"},
                                 std::pair{&p.coords_k, "coords_k"}})
    if (t->defined() && (t->device != Device::cuda || !t->contiguous()))
      return fail_why(why, std::string("cuda: ") + name + " must be a contiguous device tensor");
  if (p.sink_mode != SinkMode::none && p.sink.device != Device::cuda)
    return fail_why(why, "cuda: sink must be a device tensor");
  if (p.lse.defined() && p.lse.device != Device::cuda)
    return fail_why(why, "cuda: lse must be a device tensor");
  return true;
}

std::shared_ptr<CudaPlan> plan_cuda(const AttentionParams& p, const AttentionOptions& options, detail::PlanState& info) {
  const AttentionOverrides& ov = options.overrides;
  const bool sm90 = current_device_is_sm90();
  auto plan = std::make_shared<CudaPlan>();
  CudaKernel k = route(p, sm90);
  if (ov.cuda_kernel != CudaKernel::automatic) {
    const std::string no = kernel_refuses(ov.cuda_kernel, p, sm90);
    ARIADNE_CHECK(no.empty(), "overrides.cuda_kernel = ", cuda_kernel_name(ov.cuda_kernel), ": this call cannot run there: ",
                  no);
    k = ov.cuda_kernel;
  }
  plan->kernel = k;
  for (auto [t, field] : {std::pair{ov.tma, "tma"}, {ov.out_tma, "out_tma"}, {ov.pingpong, "pingpong"}})
    require_kernel(t, field, CudaKernel::wgmma, k);
  ARIADNE_CHECK(ov.launch_order == LaunchOrder::automatic || k == CudaKernel::wgmma,
                "overrides.launch_order applies to the wgmma kernel; this call runs on the ", cuda_kernel_name(k), " kernel");
  require_kernel(ov.tile_128_rows, "tile_128_rows", CudaKernel::tile, k);
  require_kernel(ov.ordered_tiles, "ordered_tiles", CudaKernel::bandwg, k);
  require_kernel(ov.chunk_pass, "chunk_pass", CudaKernel::bandwg, k);
  ARIADNE_CHECK(ov.band_run >= 0, "overrides.band_run = ", ov.band_run, ", expected >= 0 (0: the launcher's choice)");
  ARIADNE_CHECK(ov.band_run == 0 || k == CudaKernel::band || k == CudaKernel::bandwg,
                "overrides.band_run applies to the band kernels; this call runs on the ", cuda_kernel_name(k), " kernel");

  const int d = p.head_dim();
  switch (k) {
    case CudaKernel::tile: {
      std::string no_wide;
      if (p.entropy.defined() || p.distance.defined()) no_wide = "entropy/distance are compiled into 64-row tiles only";
      else if (p.pattern.blocks.defined() && p.pattern.blocks.block % cuda::WideConfig::BM != 0)
        no_wide = "a block size that is not a multiple of 128";
      plan->wide = resolve(ov.tile_128_rows, choose_wide(p), "tile_128_rows", no_wide);
      info.query_tile_rows = plan->wide ? cuda::WideConfig::BM : cuda::BandConfig::BM;
      info.key_tile_rows = plan->wide ? cuda::WideConfig::BN : cuda::BandConfig::BN;
      break;
    }
    case CudaKernel::band:
      plan->band_run = ov.band_run;
      info.query_tile_rows = 16;  // each warp computes its own 16 rows' 16-key chunks
      info.key_tile_rows = cuda::BandShape<64>::CK;
      break;
    case CudaKernel::bandwg: {
      plan->band_run = ov.band_run;
      if (resolve(ov.ordered_tiles, true, "ordered_tiles", ordered_tiles_refuse(p, options.block_col))) {
        plan->units_h = options.block_col.h / 2;
        plan->units_w = options.block_col.w / 2;
      }
      const std::string no_pass = p.pattern.chunk == 0 ? std::string("no chunk in the pattern")
                                  : plan->units_h > 0  ? std::string("ordered tiles (the block_col kernel has no chunk pass)")
                                                       : std::string();
      plan->chunk_pass = resolve(ov.chunk_pass, true, "chunk_pass", no_pass);
      info.ordered_tiles = plan->units_h > 0;
      info.query_tile_rows = cuda::BandWgShape<80>::BM;
      info.key_tile_rows = cuda::BandWgShape<80>::CK;
      break;
    }
    case CudaKernel::wgmma: {
      cuda::WgMaps& m = plan->maps;
      std::string no_tma;
      if (ov.tma != Toggle::off) {
        const bool built = encode_map_dim(d, &m.q, p.q) && encode_map_dim(d, &m.k, p.k) && encode_map_dim(d, &m.v, p.v);
        if (!built) no_tma = "the driver could not build the q/k/v tensor maps";
      }
      m.enabled = resolve(ov.tma, true, "tma", no_tma) ? 1 : 0;
      // d 128 and 80: the output's map, boxes of one consumer's 64 rows (WgMaps::out_tma), for 16-bit out.
      std::string no_out;
      if (d == 64) no_out = "head_dim 64 (its kernel stores per thread)";
      else if (m.enabled == 0) no_out = "q/k/v not copied with TMA";
      else if (p.out.dtype == DType::f32) no_out = "f32 out";
      else if (ov.out_tma != Toggle::off && !encode_map_dim(d, &m.o, p.out, 64))
        no_out = "the driver could not build the out tensor map";
      m.out_tma = resolve(ov.out_tma, true, "out_tma", no_out) ? 1 : 0;
      m.pingpong = ov.pingpong == Toggle::automatic ? wgmma_default_pingpong(p) : ov.pingpong == Toggle::on;
      m.order = ov.launch_order == LaunchOrder::tile_major      ? cuda::kOrderTileMajor
                : ov.launch_order == LaunchOrder::heads_fastest ? cuda::kOrderHeadsFastest
                                                                : cuda::kOrderAuto;
      plan->mapped[0] = p.q.data;
      plan->mapped[1] = p.k.data;
      plan->mapped[2] = p.v.data;
      plan->mapped[3] = p.out.data;
      info.uses_tma = m.enabled != 0;
      info.stores_by_tma = m.out_tma != 0;
      info.pingpong = m.pingpong != 0;
      info.query_tile_rows = cuda::WgShape<64>::BM;
      info.key_tile_rows = cuda::WgShape<64>::BN;
      break;
    }
    case CudaKernel::automatic: break;
  }
  info.kernel = k;
  // The received pass needs the forward's LSE: scratch owned by the plan when the caller asks for none.
  if (p.received.defined() && !p.lse.defined() && p.q.shape[0] > 0) {
    const cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&plan->lse_scratch),
                                     size_t(p.q.shape[0]) * p.heads_q() * sizeof(float));
    ARIADNE_CHECK(e == cudaSuccess, "cuda: LSE scratch for the received pass: ", cudaGetErrorString(e));
  }
  return plan;
}

void run_cuda(const CudaPlan& plan, const AttentionParams& p) {
  for (auto [t, name] : {std::pair{&p.q, "q"}, {&p.k, "k"}, {&p.v, "v"}})
    ARIADNE_CHECK(rows_aligned(*t, 8), "cuda: ", name, " data must start on a 16-byte boundary");
  ARIADNE_CHECK(rows_aligned(p.out, p.out.dtype == DType::f32 ? 2 : 8), "cuda: out data must be 16-byte aligned");
  const int64_t total_q = p.q.shape[0];
  const auto st = static_cast<cudaStream_t>(p.stream);
  if (total_q == 0) {  // no query: every key receives nothing
    if (p.received.defined()) {
      const cudaError_t e = cudaMemsetAsync(p.received.data, 0, size_t(p.received.numel()) * sizeof(float), st);
      ARIADNE_CHECK(e == cudaSuccess, "cuda: clearing received: ", cudaGetErrorString(e));
    }
    return;
  }

  cuda::FwdParams fp{};
  fp.q = p.q.data;
  fp.k = p.k.data;
  fp.v = p.v.data;
  fp.out = p.out.data;
  fp.lse = p.lse.defined() ? static_cast<float*>(p.lse.data) : plan.lse_scratch;
  fp.order = p.order;
  fp.order_units_h = plan.units_h;
  fp.order_units_w = plan.units_w;
  fp.sink = p.sink_mode != SinkMode::none ? static_cast<const float*>(p.sink.data) : nullptr;
  fp.q_tok = p.q.stride[0];
  fp.q_head = p.q.stride[1];
  fp.k_tok = p.k.stride[0];
  fp.k_head = p.k.stride[1];
  fp.v_tok = p.v.stride[0];
  fp.v_head = p.v.stride[1];
  fp.o_tok = p.out.stride[0];
  fp.o_head = p.out.stride[1];
  fp.total_q = total_q;
  fp.total_k = p.k.shape[0];
  fp.heads_q = p.heads_q();
  fp.group = p.heads_q() / p.heads_kv();
  fp.scale_log2 = p.resolved_scale() * 1.4426950408889634f;
  fp.sink_kind = p.sink_mode == SinkMode::denominator ? cuda::kSinkDenominator
                 : p.sink_mode == SinkMode::key0_bias ? cuda::kSinkKey0
                                                      : cuda::kSinkNone;
  fp.out_f32 = p.out.dtype == DType::f32;
  fp.entropy = p.entropy.defined() ? static_cast<float*>(p.entropy.data) : nullptr;
  fp.distance = p.distance.defined() ? static_cast<float*>(p.distance.data) : nullptr;
  fp.received = p.received.defined() ? static_cast<float*>(p.received.data) : nullptr;
  if (fp.distance != nullptr) {
    fp.coords_q = static_cast<const float2*>(p.coords_q.data);
    fp.coords_k = static_cast<const float2*>(p.coords_k.data);
  }
  fp.pattern = p.pattern;

  const int d = p.head_dim();
  const bool bf16 = p.q.dtype == DType::bf16;
  cudaError_t err = cudaSuccess;
  switch (plan.kernel) {
    case CudaKernel::bandwg:
      err = bf16 ? cuda::launch_bandwg<80, cuda::Bf16>(fp, plan.band_run, plan.chunk_pass, st)
                 : cuda::launch_bandwg<80, cuda::F16>(fp, plan.band_run, plan.chunk_pass, st);
      break;
    case CudaKernel::band:
      switch (d) {
        case 64: err = launch_band_dim<64>(fp, p.q.dtype, plan.band_run, st); break;
        case 80: err = launch_band_dim<80>(fp, p.q.dtype, plan.band_run, st); break;
        default: err = launch_band_dim<96>(fp, p.q.dtype, plan.band_run, st); break;
      }
      break;
    case CudaKernel::wgmma: {
      // The maps address the tensors given to plan_attention; others are re-encoded here (host only).
      cuda::WgMaps maps = plan.maps;
      if (maps.enabled != 0) {
        const void* now[4] = {p.q.data, p.k.data, p.v.data, p.out.data};
        bool ok = true;
        if (now[0] != plan.mapped[0]) ok = ok && encode_map_dim(d, &maps.q, p.q);
        if (now[1] != plan.mapped[1]) ok = ok && encode_map_dim(d, &maps.k, p.k);
        if (now[2] != plan.mapped[2]) ok = ok && encode_map_dim(d, &maps.v, p.v);
        if (maps.out_tma != 0 && now[3] != plan.mapped[3]) ok = ok && encode_map_dim(d, &maps.o, p.out, 64);
        ARIADNE_CHECK(ok, "cuda: the driver could not encode the wgmma tensor maps for these tensors");
      }
      switch (d) {
        case 64:
          err = bf16 ? cuda::launch_wgmma<64, cuda::Bf16>(fp, maps, st) : cuda::launch_wgmma<64, cuda::F16>(fp, maps, st);
          break;
        case 80:
          err = bf16 ? cuda::launch_wgmma<80, cuda::Bf16>(fp, maps, st) : cuda::launch_wgmma<80, cuda::F16>(fp, maps, st);
          break;
        default:
          err = bf16 ? cuda::launch_wgmma<128, cuda::Bf16>(fp, maps, st) : cuda::launch_wgmma<128, cuda::F16>(fp, maps, st);
          break;
      }
      break;
    }
    default:
      switch (d) {
        case 64: err = launch_dim<64>(fp, p.q.dtype, plan.wide, st); break;
        case 80: err = launch_dim<80>(fp, p.q.dtype, plan.wide, st); break;
        case 96: err = launch_dim<96>(fp, p.q.dtype, plan.wide, st); break;
        default: err = launch_dim<128>(fp, p.q.dtype, plan.wide, st); break;
      }
      break;
  }
  ARIADNE_CHECK(err == cudaSuccess, "cuda: attention kernel launch failed: ", cudaGetErrorString(err));
  if (fp.received == nullptr) return;

  // Received attention: a second, transposed pass over the forward's sink-inclusive LSE.
  switch (d) {
    case 64: err = launch_received_dim<64>(fp, p.q.dtype, st); break;
    case 80: err = launch_received_dim<80>(fp, p.q.dtype, st); break;
    case 96: err = launch_received_dim<96>(fp, p.q.dtype, st); break;
    default: err = launch_received_dim<128>(fp, p.q.dtype, st); break;
  }
  ARIADNE_CHECK(err == cudaSuccess, "cuda: received-attention pass failed: ", cudaGetErrorString(err));
}

}  // namespace ariadne
