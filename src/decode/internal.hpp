// Shared by the decode backends and the page selection (include/ariadne/decode.hpp).
#pragma once

#include <cstdint>

#include "ariadne/decode.hpp"
#include "ariadne/device.hpp"

namespace ariadne::decode_detail {

// The tokens of a sequence of `length` that a decode query (at position length − 1) sees under
// `window`: [first, length); and the logical pages holding them: [page_lo, page_hi].
struct Visible {
  int64_t first = 0, length = 0;
  int64_t page_lo = 0, page_hi = -1;  // page_hi < page_lo: none
  int64_t pages() const { return page_hi - page_lo + 1; }
};
Visible visible_of(int64_t length, int64_t window, int page_size);

// One stored K or V element of the cache as float.
inline float load(const unsigned char* base, DType dtype, int64_t index) {
  switch (dtype) {
    case DType::f32: return reinterpret_cast<const float*>(base)[index];
    case DType::bf16: return bf16_to_float(reinterpret_cast<const uint16_t*>(base)[index]);
    default: return f16_to_float(reinterpret_cast<const uint16_t*>(base)[index]);
  }
}

// The inverse of load: x stored as element `index` of dtype f32, bf16 or f16 (rounded once).
inline void store(unsigned char* base, DType dtype, int64_t index, float x) {
  switch (dtype) {
    case DType::f32: reinterpret_cast<float*>(base)[index] = x; break;
    case DType::bf16: reinterpret_cast<uint16_t*>(base)[index] = float_to_bf16(x); break;
    default: reinterpret_cast<uint16_t*>(base)[index] = float_to_f16(x); break;
  }
}

// Writes one output row (batch b, head h) of a host `out` in its dtype.
inline void store_row(const TensorView& out, int64_t b, int64_t h, const float* row, int64_t d) {
  unsigned char* base = static_cast<unsigned char*>(out.data);
  for (int64_t i = 0; i < d; ++i) store(base, out.dtype, b * out.stride[0] + h * out.stride[1] + i, row[i]);
}

void decode_reference(const DecodeParams& p);
void decode_cpu(const DecodeParams& p);
// The device cache's kernels (src/decode/cuda); builds without CUDA throw.
void decode_cuda(const DecodeParams& p);
size_t decode_cuda_workspace(const DecodeParams& p, int64_t extra_tokens);
// The page selection on the device (src/decode/cuda/select_cuda.cu) into buffers reserved for it;
// p and config are validated by the caller.
void select_cuda(const DecodeParams& p, const PageSelectConfig& config, CudaPageSelection::Device& out);

// Per-call device arrays of the CUDA decode and selection (src/decode/cuda/decode_cuda.cu). On the
// legacy stream (stream null) they come from the stream-ordered pool and the copies are
// asynchronous: no device-wide synchronization per step. On a caller's stream, whose order with
// the legacy stream's pool is not known, they are plain allocations (freed with a synchronization).
// scratch: n 4-byte words (at least one); upload: a copy of n host ints on `stream`.
DeviceBuffer scratch_words(int64_t n, void* stream);
DeviceBuffer upload_ints(const int32_t* host, size_t n, void* stream);
int sm_count();  // the current device's SMs, read once

// What every device append reads and writes: the new rows (strides in elements over the first dim,
// a batch entry or a token, and the head; the head dim is contiguous), the pools and their key
// summaries, the geometry. dtype: the cache's (bf16 or f16).
struct AppendPool {
  const void* k;
  const void* v;
  int64_t k_s0, k_sh, v_s0, v_sh;
  void* k_pool;
  void* v_pool;
  float* sum;  // [capacity, kv_heads, strides_per_page, head_dim]
  float* min;  // [capacity, kv_heads, head_dim]
  float* max;
  int kv_heads, head_dim, page_size, summary_stride;
  DType dtype;
  void* stream;  // cudaStream_t; null: the legacy default stream
};

// One decode step's appends on the device (src/decode/cuda/append_cuda.cu): batch entry b writes
// its token into row lengths[seqs[b]] of its reserved page, refreshes that page's key summaries,
// then every entry's length grows by one.
struct AppendArgs : AppendPool {
  const int32_t* table;
  int max_pages;
  int32_t* lengths;
  const int32_t* seqs;  // [batch], device
  int batch;
};
void append_cuda(const AppendArgs& a);

// A bulk append of n rows of one sequence (CudaKVCache::append_rows): tokens t0 … t0 + n − 1, whose
// pages are reserved.
struct AppendRowsArgs : AppendPool {
  const int32_t* table_row;  // the sequence's row of the block table, device
  int32_t* length;           // the sequence's device length
  int64_t t0;
  int n;
};
void append_rows_cuda(const AppendRowsArgs& a);

}  // namespace ariadne::decode_detail
