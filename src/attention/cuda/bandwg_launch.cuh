// Internal: the wgmma band kernel's tensor maps and launch (attention_bandwg.cuh).
#pragma once

#include "attention/cuda/bandwg_kernel.cuh"

namespace ariadne::cuda {

// A tensor map over rows x heads x head dim (strides in elements, head dim contiguous) whose
// box is box_cols columns x 1 head x 64 rows (64 with the 128-byte swizzle, 16 with the 32-byte one:
// the two regions of a tile, as the producer copies them), encoded by the driver's
// cuTensorMapEncodeTiled (tensor_map.hpp). bandwg_refuses (attention_cuda.cu) admits only
// layouts it accepts: 16-byte aligned rows, strides increasing from head dim to heads to rows.
inline cudaError_t encode_tile_map(CUtensorMap* map, const void* base, bool bf16, int d, int heads, int64_t rows,
                                   int64_t head_stride, int64_t tok_stride, int box_cols, CUtensorMapSwizzle swizzle) {
  const EncodeTiled encode = encode_tiled();
  if (encode == nullptr) return cudaErrorNotSupported;
  const cuuint64_t dims[3] = {cuuint64_t(d), cuuint64_t(heads), cuuint64_t(rows)};
  const cuuint64_t strides[2] = {cuuint64_t(head_stride) * 2, cuuint64_t(tok_stride) * 2};  // bytes
  const cuuint32_t box[3] = {cuuint32_t(box_cols), 1, 64}, unit[3] = {1, 1, 1};
  const CUresult r = encode(map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3,
                            const_cast<void*>(base), dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// The 5-D map of a block_col order's tiles (BandWgMaps::units_h): dims (head dim, heads, 4 rows of
// a merge unit, units_w unit columns, units_h unit rows) over the block_row storage, where unit
// (ur, uc) holds packed rows 4 (ur · units_w + uc) .. + 3; box (box_cols, 1, 4, 1, 16): one 64-row
// tile of the order, its rows in order (unit row, then row in the unit), the same shared-memory
// layout as encode_tile_map's box.
inline cudaError_t encode_block_col_map(CUtensorMap* map, const void* base, bool bf16, int d, int heads,
                                        int units_h, int units_w, int64_t head_stride, int64_t tok_stride,
                                        int box_cols, CUtensorMapSwizzle swizzle) {
  const EncodeTiled encode = encode_tiled();
  if (encode == nullptr) return cudaErrorNotSupported;
  const cuuint64_t dims[5] = {cuuint64_t(d), cuuint64_t(heads), 4, cuuint64_t(units_w), cuuint64_t(units_h)};
  const cuuint64_t strides[4] = {cuuint64_t(head_stride) * 2, cuuint64_t(tok_stride) * 2,
                                 cuuint64_t(tok_stride) * 2 * 4, cuuint64_t(tok_stride) * 2 * 4 * units_w};
  const cuuint32_t box[5] = {cuuint32_t(box_cols), 1, 4, 1, 16}, unit[5] = {1, 1, 1, 1, 1};
  const CUresult r = encode(map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 5,
                            const_cast<void*>(base), dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// Virtual tiles (the tile kernel's varlen cover) cut into runs; grid (runs, heads_q), one CTA per
// SM (~221 KB of shared memory). `run` <= 0 picks the length: the longest runs that still give
// every SM work in one wave. chunk_pass_on: chunked calls take the kernel with the one-chunk pass
// (AttentionOverrides::chunk_pass).
template <int D, class E>
cudaError_t launch_bandwg(const FwdParams& p, int run, bool chunk_pass_on, cudaStream_t stream) {
  using S = BandWgShape<D>;
  // A block_col order the copy engine can follow (FwdParams::order_units_h; the dispatcher checks
  // the shape): the BC kernel and 5-D maps; other orders gather.
  const bool block_col = p.order != nullptr && p.order_units_h > 0;
  // A chunked call (not block_col) takes the kernel with the one-chunk pass unless the plan turned
  // it off (AttentionOverrides::chunk_pass).
  const bool chunk_pass = !block_col && p.pattern.chunk > 0 && chunk_pass_on;
  // The storage-order kernel, the block_col kernel and the chunk kernel.
  constexpr auto storage = attention_bandwg_kernel<D, E>, bc = attention_bandwg_kernel<D, E, true>,
                 ch = attention_bandwg_kernel<D, E, false, true>;
  const auto kernel = block_col ? bc : chunk_pass ? ch : storage;
  constexpr size_t smem = S::smem_bytes;
  static const cudaError_t configured = allow_dynamic_smem({storage, bc, ch}, smem);
  if (configured != cudaSuccess) return configured;
  static const int slots = resident_cta_slots(storage, S::threads, smem);
  if (slots <= 0) return cudaErrorInvalidConfiguration;
  const int64_t runs = band_runs(p, S::BM, slots, run);
  const bool bf16 = std::is_same_v<E, Bf16>;
  const int heads_kv = p.heads_q / p.group;
  BandWgMaps maps{};
  struct Src {
    CUtensorMap *lo, *hi;
    const void* base;
    int heads;
    int64_t rows, head_stride, tok_stride;
  };
  // A tensor's two maps (columns 0-63 with the 128-byte swizzle, 64-79 with the 32-byte one):
  // tiles of rows, or the 5-D merge-unit boxes of a block_col order.
  const auto encode_pair = [&](const Src& t) {
    const auto encode = [&](CUtensorMap* m, int cols, CUtensorMapSwizzle sw) {
      return block_col ? encode_block_col_map(m, t.base, bf16, D, t.heads, p.order_units_h, p.order_units_w,
                                              t.head_stride, t.tok_stride, cols, sw)
                       : encode_tile_map(m, t.base, bf16, D, t.heads, t.rows, t.head_stride, t.tok_stride, cols, sw);
    };
    cudaError_t err = encode(t.lo, 64, CU_TENSOR_MAP_SWIZZLE_128B);
    if (err == cudaSuccess) err = encode(t.hi, 16, CU_TENSOR_MAP_SWIZZLE_32B);
    return err;
  };
  maps.units_h = block_col ? p.order_units_h : 0;
  maps.units_w = block_col ? p.order_units_w : 0;
  if (p.order == nullptr || block_col) {
    for (const Src& t : {Src{&maps.q_lo, &maps.q_hi, p.q, p.heads_q, p.total_q, p.q_head, p.q_tok},
                         Src{&maps.k_lo, &maps.k_hi, p.k, heads_kv, p.total_k, p.k_head, p.k_tok},
                         Src{&maps.v_lo, &maps.v_hi, p.v, heads_kv, p.total_k, p.v_head, p.v_tok}}) {
      const cudaError_t err = encode_pair(t);
      if (err != cudaSuccess) return err;
    }
  }
  {
    // The output's maps, for 16-bit out whose layout the copy engine can address (16-byte aligned
    // base and strides, strides increasing from head dim to heads to rows, as for q/k/v); else (or
    // if the encoder refuses) every tile stores per thread. Rows = total_q: the store clips the rest.
    const int64_t o_head = p.o_head, o_tok = p.o_tok;
    // A block_col order's output gets the 5-D maps of its q/k/v (one box per tile).
    if ((p.order == nullptr || block_col) && !p.out_f32 && reinterpret_cast<uintptr_t>(p.out) % 16 == 0 &&
        o_head % 8 == 0 && o_tok % 8 == 0 && o_head >= D && o_tok >= o_head * p.heads_q) {
      maps.out_tma = encode_pair(Src{&maps.o_lo, &maps.o_hi, p.out, p.heads_q, p.total_q, o_head, o_tok}) == cudaSuccess;
    }
    // Gathered orders copy O row by row (bulk copies need 16-byte aligned rows and base).
    maps.out_rows = p.order != nullptr && !block_col && !p.out_f32 && reinterpret_cast<uintptr_t>(p.out) % 16 == 0 &&
                    o_head % 8 == 0 && o_tok % 8 == 0;
  }
  kernel<<<dim3(unsigned(runs), unsigned(p.heads_q)), S::threads, smem, stream>>>(p, run, maps);
  return cudaGetLastError();
}

#define ARIADNE_BANDWG_KERNELS(X, D) X(launch_bandwg<D, Bf16>) X(launch_bandwg<D, F16>)
#define ARIADNE_BANDWG_INSTANTIATE_ONE(...) \
  template cudaError_t __VA_ARGS__(const FwdParams&, int, bool, cudaStream_t);
#define ARIADNE_BANDWG_DECLARE_ONE(...) \
  extern template cudaError_t __VA_ARGS__(const FwdParams&, int, bool, cudaStream_t);
#define ARIADNE_INSTANTIATE_BANDWG(D) ARIADNE_BANDWG_KERNELS(ARIADNE_BANDWG_INSTANTIATE_ONE, D)
ARIADNE_BANDWG_KERNELS(ARIADNE_BANDWG_DECLARE_ONE, 80)

}  // namespace ariadne::cuda
