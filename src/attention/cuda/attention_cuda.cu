// The CUDA backend's entry points: what it supports, and the choice of kernel instantiation.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "attention/backends.hpp"
#include "attention/cuda/internal.hpp"
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

// cp.async and the epilogue move 16 bytes at a time, so every row start must be 16-byte aligned:
// the base pointer and the token/head strides (in 2-byte elements) multiples of 8.
bool rows_aligned(const TensorView& t, int64_t elems) {
  return reinterpret_cast<uintptr_t>(t.data) % (elems * dtype_size(t.dtype)) == 0 &&
         t.stride[0] % elems == 0 && t.stride[1] % elems == 0;
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

// The wgmma kernel (attention_wgmma.cuh) runs dense rows (full, causal, any window_right without a
// left bound, varlen, GQA, sinks) at head dims 64, 80 and 128 on compute capability 9.0, and
// block-sparse rows on those patterns when the block is a multiple of its 128-row tiles (128,
// RRAttention's default, 256, ...); blocks of 64 or 192 stay on the mma.sync kernel, whose 64-key
// tiles divide them. It is the default for those calls; ARIADNE_WGMMA=0 in the environment (read
// per call) keeps them on the mma.sync kernel, which is how device-check still tests that path.
bool wgmma_eligible(const AttentionParams& p) {
  if (env_is("ARIADNE_WGMMA", "0")) return false;
  const int d = p.head_dim();
  if (d != 64 && d != 80 && d != 128) return false;
  const Pattern& pat = p.pattern;
  if (pat.window_left != kUnbounded || pat.chunk > 0) return false;
  if (pat.blocks.defined() && pat.blocks.block % cuda::WgShape<64>::BM != 0) return false;
  if (p.entropy.defined() || p.distance.defined()) return false;  // diagnostics: mma.sync kernel
  return current_device_is_sm90();
}

// The band-walking kernel (attention_band.cuh) can take narrow local patterns: no block mask, no
// entropy/distance, head dim 64/80/96, rows and keys below 2^30 (its row bounds are int32), and 16
// consecutive rows seeing at most kMaxRowSpan keys (window left + right <= 129, or chunk <= 65).
// Default route (v9, bench/cuda-notes.md): sliding windows (both sides bounded, no chunk), where
// its hot path (9 chunks of 16 keys per 16-row warp, masks on the two edge chunks) applies to
// 16-aligned windows such as ViT's ±64; chunked patterns stay on the tile kernel by default (the
// band kernel measured slower there). ARIADNE_BAND=0 in the environment (read per call) keeps
// every call on the tile kernel, ARIADNE_BAND=1 sends every eligible call to the band kernel.
// ARIADNE_BAND_RUN=n fixes its run length (benchmark variants).
// band_fits: the shapes the band kernels can take at all; band_eligible adds the default route.
bool band_fits(const AttentionParams& p) {
  const int d = p.head_dim();
  if (d != 64 && d != 80 && d != 96) return false;
  const Pattern& pat = p.pattern;
  if (pat.blocks.defined() || p.entropy.defined() || p.distance.defined()) return false;
  if (p.q.shape[0] >= (int64_t(1) << 30) || p.k.shape[0] >= (int64_t(1) << 30)) return false;
  int64_t span = -1;  // keys 16 consecutive query rows may see
  if (pat.window_left != kUnbounded && pat.window_right != kUnbounded) span = pat.window_left + pat.window_right + 16;
  if (pat.chunk > 0 && (span < 0 || 2 * pat.chunk + 14 < span)) span = 2 * pat.chunk + 14;
  return span >= 0 && span <= cuda::BandShape<64>::kMaxRowSpan;
}
bool band_eligible(const AttentionParams& p) {
  if (env_is("ARIADNE_BAND", "0") || !band_fits(p)) return false;
  return env_is("ARIADNE_BAND", "1") || p.pattern.chunk == 0;  // by default sliding windows only
}

// The wgmma band kernel (attention_bandwg.cuh) takes the band kernel's sliding windows at head dim
// 80 (ViT's) on compute capability 9.0: window left + right <= 129 (a 64-row tile's hull then meets
// at most 4 chunks of 64 keys), and chunks (below). Default route for those calls (bench/cuda-notes.md, v11);
// ARIADNE_BANDWG=0 in the environment (read per call) keeps them on the per-warp band kernel, and
// ARIADNE_BAND=0 keeps them on the tile kernel as before. ARIADNE_BAND_RUN fixes its run length too.
// Its copies are the copy engine's tiles (TMA); a token order (a gather per row) switches the
// producer to cp.async gathers (bandwg_routes; ARIADNE_BANDWG_ORDER=0 keeps ordered calls on the
// band kernel); q/k/v views whose strides do not increase from head dim to heads to rows stay on
// the band kernel.
// Chunked patterns (session 14, v42: Qwen's 64-token windows): chunk <= 65, alone or with a window,
// take the same kernel (BandRule clips each row's keys to its chunk; a 64-row tile's hull of <= 62 +
// 2 x chunk keys meets at most 4 chunks of 64 keys); variant 3 runs them on its chunk kernel (v43:
// a one-chunk pass for one-chunk hulls). Measured against the tile kernel (bench/cuda-notes.md,
// v42-v43): 33-37% faster from N 4096 x 16 heads on, 2-3% at N 1024 x 16 heads (v42 without the
// one-chunk pass was 8% slower there and routed only calls of >= 32768 rows x heads).
// ARIADNE_BANDWG_CHUNK=0 (read per call) keeps chunked calls on the tile kernel (=1: here, the
// default); ARIADNE_BAND=0 keeps every call off the band kernels.
bool bandwg_eligible(const AttentionParams& p) {
  if (env_is("ARIADNE_BANDWG", "0") || env_is("ARIADNE_BAND", "0")) return false;
  if (!band_fits(p) || p.head_dim() != 80) return false;
  const Pattern& pat = p.pattern;
  const bool window = pat.window_left != kUnbounded && pat.window_right != kUnbounded &&
                      pat.window_left + pat.window_right <= cuda::BandWgShape<80>::kMaxSpan;
  const bool chunk =
      pat.chunk > 0 && pat.chunk <= cuda::BandWgShape<80>::kMaxChunk && !env_is("ARIADNE_BANDWG_CHUNK", "0");
  if (pat.chunk != 0 ? !chunk : !window) return false;
  // The copy engine's tensor maps (encode_tile_map) need strides increasing from the head dim to
  // the heads to the rows.
  for (const TensorView* t : {&p.q, &p.k, &p.v})
    if (t->stride[2] != 1 || t->stride[1] < t->shape[2] || t->stride[0] < t->stride[1] * t->shape[1]) return false;
  return current_device_is_sm90();
}

// Whether a call with this token order (nullptr: none) runs on the wgmma band kernel. An ordered
// call does unless ARIADNE_BANDWG_ORDER=0 in the environment (read per call): the producer
// warpgroup then gathers the rows with cp.async instead of TMA (bench/cuda-notes.md, v13: column
// order at N 4096 0.0279 ms there against 0.0330 on the band kernel, which =0 keeps).
bool bandwg_routes(const AttentionParams& p, const int32_t* order) {
  if (order != nullptr && env_is("ARIADNE_BANDWG_ORDER", "0")) return false;
  return bandwg_eligible(p);
}

// ARIADNE_BAND_RUN=n (read per call): the band kernels' run length (0: their own choice).
int band_run_env() {
  const char* env = std::getenv("ARIADNE_BAND_RUN");
  return env != nullptr ? std::atoi(env) : 0;
}

cudaError_t launch_bandwg_d80(const cuda::FwdParams& fp, DType dtype, cudaStream_t st) {
  const int run = band_run_env();
  const bool bf16 = dtype == DType::bf16;
  switch (cuda_bandwg_variant()) {
    case 1: return bf16 ? cuda::launch_bandwg<80, cuda::Bf16, 1>(fp, run, st) : cuda::launch_bandwg<80, cuda::F16, 1>(fp, run, st);
    case 3: return bf16 ? cuda::launch_bandwg<80, cuda::Bf16, 3>(fp, run, st) : cuda::launch_bandwg<80, cuda::F16, 3>(fp, run, st);
    default: return bf16 ? cuda::launch_bandwg<80, cuda::Bf16, 2>(fp, run, st) : cuda::launch_bandwg<80, cuda::F16, 2>(fp, run, st);
  }
}

template <int D>
cudaError_t launch_band_dim(const cuda::FwdParams& fp, DType dtype, cudaStream_t st) {
  const int run = band_run_env();
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

// The wgmma kernel copies K/V (and Q) with TMA unless ARIADNE_TMA=0 is set (read per call: the
// cp.async producer stays testable and comparable in one binary) or a map cannot be built.
template <int D>
cuda::WgMaps wgmma_maps(const AttentionParams& p) {
  cuda::WgMaps m{};
  if (env_is("ARIADNE_TMA", "0")) return m;
  m.enabled = encode_map<D>(&m.q, p.q) && encode_map<D>(&m.k, p.k) && encode_map<D>(&m.v, p.v);
  // d 128 and 80: the output's map, boxes of one consumer's 64 rows (WgMaps::out_tma), for 16-bit
  // out; ARIADNE_WG_OUT_TMA=0 (read per call) keeps the per-thread stores (at d 80 the other kernel
  // instantiation: bench/cuda-notes.md, v44).
  if (D != 64 && m.enabled && p.out.dtype != DType::f32 && !env_is("ARIADNE_WG_OUT_TMA", "0"))
    m.out_tma = encode_map<D>(&m.o, p.out, 64) ? 1 : 0;
  return m;
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

// Consumer ping-pong (WgMaps::pingpong) on the d 128 kernel when its query tiles visit at most
// this many key tiles on average (bench/cuda-notes.md, session 12, "v34": block-sparse 32K 10%
// (~13 tiles) 3% faster with it, 25% (~32) 1.3%, causal 8K (~32) 1.9%; level at 51-128 tiles,
// causal 128K (~512) 2% slower).
constexpr double kPingPongTiles = 40;

template <int D>
bool wgmma_pingpong(const AttentionParams& p) {
  // ARIADNE_WG_PINGPONG=1/0 in the environment (read per call) forces it on/off.
  const char* pp = std::getenv("ARIADNE_WG_PINGPONG");
  if (pp != nullptr) return std::string(pp) == "1";
  if (D <= 80) return true;  // v12: the softmax is a larger share of a tile (full N 4096 d 80 1.12x)
  const double mean = mean_key_tiles(p);
  return mean >= 0 && mean <= kPingPongTiles;
}

template <int D>
cudaError_t launch_wgmma_dim(const cuda::FwdParams& fp, const AttentionParams& p, cudaStream_t st) {
  cuda::WgMaps maps = wgmma_maps<D>(p);
  // Consumer ping-pong (attention_wgmma.cuh): on for d 64 and 80, and for d 128 on short rows.
  maps.pingpong = wgmma_pingpong<D>(p);
  // Launch order (WgMaps::order): launch_wgmma picks unless ARIADNE_WGMMA_ORDER (read per call)
  // is tiles or heads (tile-major, heads fastest).
  const char* order = std::getenv("ARIADNE_WGMMA_ORDER");
  const std::string o = order != nullptr ? order : "";
  maps.order = o == "tiles" ? cuda::kOrderTileMajor : o == "heads" ? cuda::kOrderHeadsFastest : cuda::kOrderAuto;
  return p.q.dtype == DType::bf16 ? cuda::launch_wgmma<D, cuda::Bf16>(fp, maps, st)
                                  : cuda::launch_wgmma<D, cuda::F16>(fp, maps, st);
}

// The tensor maps the wgmma launcher would build for p (a call it runs: head dim 64, 80 or 128);
// at d 64 out_tma is always 0.
cuda::WgMaps wgmma_maps_of(const AttentionParams& p) {
  switch (p.head_dim()) {
    case 64: return wgmma_maps<64>(p);
    case 80: return wgmma_maps<80>(p);
    default: return wgmma_maps<128>(p);
  }
}

}  // namespace

// A token order (AttentionParams::order) runs on the mma.sync kernel: its gathers are in that
// kernel's loads only.
bool cuda_uses_wgmma(const AttentionParams& p) { return p.order == nullptr && wgmma_eligible(p); }
bool cuda_wgmma_uses_tma(const AttentionParams& p) { return cuda_uses_wgmma(p) && wgmma_maps_of(p).enabled != 0; }
bool cuda_wgmma_pingpong(const AttentionParams& p) {
  if (!cuda_uses_wgmma(p)) return false;
  switch (p.head_dim()) {
    case 64: return wgmma_pingpong<64>(p);
    case 80: return wgmma_pingpong<80>(p);
    default: return wgmma_pingpong<128>(p);
  }
}
bool cuda_wgmma_stores_by_tma(const AttentionParams& p) { return cuda_uses_wgmma(p) && wgmma_maps_of(p).out_tma != 0; }
bool cuda_uses_bandwg(const AttentionParams& p) { return bandwg_routes(p, p.order); }
// Variant 3 (bench/cuda-notes.md, v14: three consumer warpgroups on variant 2's dead-pair skip and
// TMA-store epilogue) is the default since session 4, measured faster or equal on every window
// case (N 4096 0.0211 ms against 0.0235, N 16384 0.0632 against 0.0768). ARIADNE_BANDWG_V (read
// per call) selects 1 (v11) or 2 (v11e: two consumers); any other value, or none, is variant 3.
int cuda_bandwg_variant() {
  const char* env = std::getenv("ARIADNE_BANDWG_V");
  if (env == nullptr) return 3;
  const std::string v(env);
  return v == "1" ? 1 : v == "2" ? 2 : 3;
}
bool cuda_uses_band(const AttentionParams& p) { return band_eligible(p) && !cuda_uses_bandwg(p); }

int cuda_query_tile_rows(const AttentionParams& p) {
  if (cuda_uses_bandwg(p)) return cuda::BandWgShape<80>::BM;
  if (band_eligible(p)) return 16;  // each warp computes its own 16 rows' 16-key chunks
  if (cuda_uses_wgmma(p)) return cuda::WgShape<64>::BM;
  return choose_wide(p) ? cuda::WideConfig::BM : cuda::BandConfig::BM;
}
int cuda_key_tile_rows(const AttentionParams& p) {
  if (cuda_uses_bandwg(p)) return cuda::BandWgShape<80>::CK;
  if (band_eligible(p)) return cuda::BandShape<64>::CK;
  if (cuda_uses_wgmma(p)) return cuda::WgShape<64>::BN;
  return choose_wide(p) ? cuda::WideConfig::BN : cuda::BandConfig::BN;
}

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

void attention_cuda(const AttentionParams& p) { attention_cuda_ordered(p, p.order); }

void attention_cuda_ordered(const AttentionParams& p, const int32_t* order) {
  attention_cuda_ordered(p, order, BlockColGrid{});
}

// Whether a block_col hint lets the wgmma band kernel copy the ordered tiles with the copy engine:
// one sequence (no cu_seqlens, or one) of grid.h x grid.w tokens, even sides, unit-grid height a multiple
// of 16 (a 64-row tile is 16 units of one unit column), variant 3 (the default: v24's BC kernel),
// not switched off by ARIADNE_BANDWG_TMA_ORDER=0 (read per call). Else the rows are gathered (v13).
bool cuda_block_col_tiles(const AttentionParams& p, const int32_t* order, BlockColGrid grid) {
  if (order == nullptr || grid.h <= 0 || grid.w <= 0 || cuda_bandwg_variant() != 3) return false;
  if (env_is("ARIADNE_BANDWG_TMA_ORDER", "0")) return false;
  const bool one_seq = p.pattern.cu_seqlens_q == nullptr || p.pattern.num_seqs == 1;
  return one_seq && grid.h % 32 == 0 && grid.w % 2 == 0 && int64_t(grid.h) * grid.w == p.q.shape[0] &&
         p.q.shape[0] == p.k.shape[0];
}

void attention_cuda_ordered(const AttentionParams& p, const int32_t* order, BlockColGrid block_col) {
  std::string why;
  ARIADNE_CHECK(attention_cuda_supports(p, &why), why);
  ARIADNE_CHECK(order == nullptr || p.q.shape[0] == p.k.shape[0], "cuda: a token order needs total_q == total_k (",
                p.q.shape[0], " vs ", p.k.shape[0], ")");
  const int64_t total_q = p.q.shape[0];
  if (total_q == 0) {  // no query: every key receives nothing
    if (p.received.defined()) {
      const cudaError_t e = cudaMemsetAsync(p.received.data, 0, size_t(p.received.numel()) * sizeof(float),
                                            static_cast<cudaStream_t>(p.stream));
      ARIADNE_CHECK(e == cudaSuccess, "cuda: clearing received: ", cudaGetErrorString(e));
    }
    return;
  }

  cuda::FwdParams fp{};
  fp.q = p.q.data;
  fp.k = p.k.data;
  fp.v = p.v.data;
  fp.out = p.out.data;
  fp.lse = p.lse.defined() ? static_cast<float*>(p.lse.data) : nullptr;
  fp.order = order;
  if (cuda_block_col_tiles(p, order, block_col)) {
    fp.order_units_h = block_col.h / 2;
    fp.order_units_w = block_col.w / 2;
  }
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

  const bool wide = choose_wide(p);
  const auto st = static_cast<cudaStream_t>(p.stream);
  // The received pass needs the LSE: a stream-ordered scratch buffer when the caller asked for none.
  float* scratch = nullptr;
  if (fp.received != nullptr && fp.lse == nullptr) {
    const cudaError_t e = cudaMallocAsync(reinterpret_cast<void**>(&scratch),
                                          size_t(total_q) * p.heads_q() * sizeof(float), st);
    ARIADNE_CHECK(e == cudaSuccess, "cuda: LSE scratch for the received pass: ", cudaGetErrorString(e));
    fp.lse = scratch;
  }
  cudaError_t err = cudaSuccess;
  if (bandwg_routes(p, order)) {
    err = launch_bandwg_d80(fp, p.q.dtype, st);
  } else if (band_eligible(p)) {
    switch (p.head_dim()) {
      case 64: err = launch_band_dim<64>(fp, p.q.dtype, st); break;
      case 80: err = launch_band_dim<80>(fp, p.q.dtype, st); break;
      default: err = launch_band_dim<96>(fp, p.q.dtype, st); break;
    }
  } else if (order == nullptr && wgmma_eligible(p)) {
    switch (p.head_dim()) {
      case 64: err = launch_wgmma_dim<64>(fp, p, st); break;
      case 80: err = launch_wgmma_dim<80>(fp, p, st); break;
      default: err = launch_wgmma_dim<128>(fp, p, st); break;
    }
  } else {
    switch (p.head_dim()) {
      case 64: err = launch_dim<64>(fp, p.q.dtype, wide, st); break;
      case 80: err = launch_dim<80>(fp, p.q.dtype, wide, st); break;
      case 96: err = launch_dim<96>(fp, p.q.dtype, wide, st); break;
      default: err = launch_dim<128>(fp, p.q.dtype, wide, st); break;
    }
  }
  if (err != cudaSuccess && scratch != nullptr) cudaFreeAsync(scratch, st);
  ARIADNE_CHECK(err == cudaSuccess, "cuda: attention kernel launch failed: ", cudaGetErrorString(err));
  if (fp.received == nullptr) return;

  // Received attention: a second, transposed pass over the forward's sink-inclusive LSE.
  switch (p.head_dim()) {
    case 64: err = launch_received_dim<64>(fp, p.q.dtype, st); break;
    case 80: err = launch_received_dim<80>(fp, p.q.dtype, st); break;
    case 96: err = launch_received_dim<96>(fp, p.q.dtype, st); break;
    default: err = launch_received_dim<128>(fp, p.q.dtype, st); break;
  }
  if (scratch != nullptr) cudaFreeAsync(scratch, st);
  ARIADNE_CHECK(err == cudaSuccess, "cuda: received-attention pass failed: ", cudaGetErrorString(err));
}

}  // namespace ariadne
