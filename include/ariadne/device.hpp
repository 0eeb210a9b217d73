// ariadne/device.hpp — owning device memory for clients of the CUDA backend (CLI, tests, benches).
//
// Only a thin RAII wrapper over cudaMalloc/cudaMemcpy (and, for per-call results, over a
// stream-ordered pool: stream_ordered()) so that the public headers stay free of CUDA includes.
// cuda_available() is false in builds without CUDA and on machines without a GPU; every other
// call then throws ariadne::Error.
#pragma once

#include <cstddef>
#include <vector>

#include "ariadne/tensor.hpp"

namespace ariadne {

bool cuda_available();
void cuda_synchronize();
// Copies `bytes` from device memory to host memory (cudaMemcpy; waits for the device).
void copy_device_to_host(void* dst, const void* device_src, size_t bytes);

// A contiguous host copy of the rows of `t`, a view in host or device memory whose dimensions after
// the first are packed (rows may be strided: q of a packed qkv). With `rows` (int32 [t.shape[0]] in
// t's memory, like AttentionParams::order), row i of the copy is row rows[i] of t, each checked
// against t's row count. Observers of device attention (the SHS diagnostics over a CUDA encoder)
// read q and k with it, gathering the fused order's rows into the layer's order.
Buffer host_rows(const TensorView& t, const int32_t* rows = nullptr);

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DType dtype, std::vector<int64_t> shape);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // Same shape, dtype and contents as a host buffer.
  static DeviceBuffer from_host(const Buffer& host);
  // A device copy of `data`, a dense host array of `shape` in `dtype`.
  static DeviceBuffer from_host(const void* data, DType dtype, std::vector<int64_t> shape);
  // A device copy of a host array (cu_seqlens, CSR arrays).
  static DeviceBuffer from_ints(const std::vector<int32_t>& values);
  // A buffer from a library-owned memory pool of the current device, allocated and later freed in
  // the order of the legacy default stream (cudaMallocFromPoolAsync / cudaFreeAsync): unlike the
  // constructor's cudaMalloc and the destructor's cudaFree, which waits for the whole device,
  // neither call waits for anything, so a result allocated per call (EstimateConfig::
  // cuda_pooled_result) costs no device-wide synchronization. The pool keeps freed memory for
  // reuse (trim_stream_ordered_pool gives it back). Contents are uninitialized, as with the
  // constructor. The memory may be reused by work enqueued on the legacy default stream after the
  // free: work on a non-blocking stream (cudaStreamNonBlocking) that reads the buffer must have
  // finished, or be ordered before the legacy stream, when the buffer is destroyed or assigned.
  // The free goes to the legacy stream of the buffer's own device, whichever is current. On devices
  // without memory pools it falls back to the constructor (is_stream_ordered() then says false).
  static DeviceBuffer stream_ordered(DType dtype, std::vector<int64_t> shape);
  // Releases the current device's pool memory not in use by a live buffer (after waiting for the
  // legacy default stream, so pending frees count as released).
  static void trim_stream_ordered_pool();

  TensorView view() const;  // contiguous, device = cuda
  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  void copy_to_host(void* dst, size_t bytes) const;
  Buffer to_host() const;  // same dtype and shape
  void fill_bytes(int byte_value);  // cudaMemset, e.g. 0xFF poisons bf16/f32 with NaN
  bool is_stream_ordered() const { return pooled_; }

 private:
  void release() noexcept;  // frees ptr_ as it was allocated
  void* ptr_ = nullptr;
  bool pooled_ = false;  // from stream_ordered(): freed with cudaFreeAsync on the legacy stream
  int device_ = 0;       // the device whose pool holds ptr_ (when pooled_)
  size_t bytes_ = 0;
  DType dtype_ = DType::f32;
  std::vector<int64_t> shape_;
};

}  // namespace ariadne
