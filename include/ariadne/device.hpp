// ariadne/device.hpp — owning device memory for clients of the CUDA backend (CLI, tests, benches).
//
// Only a thin RAII wrapper over cudaMalloc/cudaMemcpy so that the public headers stay free of
// CUDA includes. cuda_available() is false in builds without CUDA and on machines without a GPU;
// every other call then throws ariadne::Error.
#pragma once

#include <cstddef>
#include <vector>

#include "ariadne/tensor.hpp"

namespace ariadne {

bool cuda_available();
void cuda_synchronize();

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
  // A device copy of a host array (cu_seqlens, CSR arrays).
  static DeviceBuffer from_ints(const std::vector<int32_t>& values);

  TensorView view() const;  // contiguous, device = cuda
  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  void copy_to_host(void* dst, size_t bytes) const;
  Buffer to_host() const;  // same dtype and shape
  void fill_bytes(int byte_value);  // cudaMemset, e.g. 0xFF poisons bf16/f32 with NaN

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  DType dtype_ = DType::f32;
  std::vector<int64_t> shape_;
};

}  // namespace ariadne
