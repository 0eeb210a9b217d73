// DeviceBuffer over the CUDA runtime (compiled only when the CUDA backend is built).
#include "ariadne/device.hpp"

#include <cuda_runtime.h>

namespace ariadne {

namespace {
void check(cudaError_t e, const char* what) {
  ARIADNE_CHECK(e == cudaSuccess, "CUDA: ", what, " failed: ", cudaGetErrorString(e));
}
size_t byte_count(DType dt, const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t s : shape) {
    ARIADNE_CHECK(s >= 0, "DeviceBuffer: negative dimension ", s);
    n *= size_t(s);
  }
  return n * size_t(dtype_size(dt));
}
}  // namespace

bool cuda_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

void cuda_synchronize() { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

DeviceBuffer::DeviceBuffer(DType dtype, std::vector<int64_t> shape)
    : bytes_(byte_count(dtype, shape)), dtype_(dtype), shape_(std::move(shape)) {
  check(cudaMalloc(&ptr_, bytes_ ? bytes_ : 16), "cudaMalloc");
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    dtype_ = o.dtype_;
    shape_ = std::move(o.shape_);
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

DeviceBuffer DeviceBuffer::from_host(const Buffer& host) {
  DeviceBuffer d(host.dtype(), host.shape());
  check(cudaMemcpy(d.ptr_, host.data(), d.bytes_, cudaMemcpyHostToDevice), "cudaMemcpy to device");
  return d;
}

DeviceBuffer DeviceBuffer::from_ints(const std::vector<int32_t>& values) {
  DeviceBuffer d(DType::f32, {int64_t(values.size())});  // 4-byte elements; viewed as int32 by callers
  if (!values.empty())
    check(cudaMemcpy(d.ptr_, values.data(), d.bytes_, cudaMemcpyHostToDevice), "cudaMemcpy to device");
  return d;
}

TensorView DeviceBuffer::view() const { return make_view(ptr_, dtype_, shape_, Device::cuda); }

void DeviceBuffer::copy_to_host(void* dst, size_t bytes) const {
  ARIADNE_CHECK(bytes <= bytes_, "DeviceBuffer: copy of ", bytes, " bytes from a buffer of ", bytes_);
  check(cudaMemcpy(dst, ptr_, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
}

Buffer DeviceBuffer::to_host() const {
  Buffer h(dtype_, shape_);
  copy_to_host(h.data(), bytes_);
  return h;
}

void DeviceBuffer::fill_bytes(int byte_value) { check(cudaMemset(ptr_, byte_value, bytes_), "cudaMemset"); }

}  // namespace ariadne
