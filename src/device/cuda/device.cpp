// DeviceBuffer over the CUDA runtime (compiled only when the CUDA backend is built).
#include "ariadne/device.hpp"

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>

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
// The stream-ordered pool of the current device, created on first use; nullptr when the device
// has no memory-pool support. Never destroyed (like the estimator's workspace: freeing from a
// static destructor could run after the runtime shut down; the process's end returns the memory).
// Its release threshold is unbounded: freed blocks stay in the pool for the next allocation
// instead of going back to the driver at every synchronization (the default pool's threshold 0
// would unmap them each time, and a prefill synchronizes per layer).
cudaMemPool_t pool_of_current_device(int* device_out) {
  static std::mutex mu;
  static auto* pools = new std::map<int, cudaMemPool_t>();
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  *device_out = device;
  const std::lock_guard<std::mutex> lock(mu);
  const auto it = pools->find(device);
  if (it != pools->end()) return it->second;
  int supported = 0;
  check(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device), "memory-pool support query");
  cudaMemPool_t pool = nullptr;
  if (supported != 0) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    check(cudaMemPoolCreate(&pool, &props), "cudaMemPoolCreate");
    uint64_t keep_all = UINT64_MAX;
    check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all), "pool release threshold");
  }
  (*pools)[device] = pool;
  return pool;
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

DeviceBuffer DeviceBuffer::stream_ordered(DType dtype, std::vector<int64_t> shape) {
  int device = 0;
  cudaMemPool_t pool = pool_of_current_device(&device);
  if (pool == nullptr) return DeviceBuffer(dtype, std::move(shape));
  DeviceBuffer d;
  d.bytes_ = byte_count(dtype, shape);
  d.dtype_ = dtype;
  d.shape_ = std::move(shape);
  check(cudaMallocFromPoolAsync(&d.ptr_, d.bytes_ ? d.bytes_ : 16, pool, nullptr), "cudaMallocFromPoolAsync");
  d.pooled_ = true;
  d.device_ = device;
  return d;
}

void DeviceBuffer::trim_stream_ordered_pool() {
  int device = 0;
  cudaMemPool_t pool = pool_of_current_device(&device);
  if (pool == nullptr) return;
  check(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize");  // pending frees complete first
  check(cudaMemPoolTrimTo(pool, 0), "cudaMemPoolTrimTo");
}

// Errors are dropped here (a destructor must not throw); a failed free leaks, as cudaFree's did.
void DeviceBuffer::release() noexcept {
  if (ptr_ == nullptr) return;
  if (!pooled_) {
    cudaFree(ptr_);
  } else {
    // Stream-ordered on the owning device's legacy stream: after all work enqueued there so far.
    int current = device_;
    cudaGetDevice(&current);
    if (current != device_) cudaSetDevice(device_);
    cudaFreeAsync(ptr_, nullptr);
    if (current != device_) cudaSetDevice(current);
  }
  ptr_ = nullptr;
  pooled_ = false;
}

DeviceBuffer::~DeviceBuffer() { release(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    release();
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    dtype_ = o.dtype_;
    shape_ = std::move(o.shape_);
    pooled_ = o.pooled_;
    device_ = o.device_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
    o.pooled_ = false;
  }
  return *this;
}

DeviceBuffer DeviceBuffer::from_host(const Buffer& host) {
  DeviceBuffer d(host.dtype(), host.shape());
  check(cudaMemcpy(d.ptr_, host.data(), d.bytes_, cudaMemcpyHostToDevice), "cudaMemcpy to device");
  return d;
}

DeviceBuffer DeviceBuffer::from_host(const void* data, DType dtype, std::vector<int64_t> shape) {
  DeviceBuffer d(dtype, std::move(shape));
  if (d.bytes_) check(cudaMemcpy(d.ptr_, data, d.bytes_, cudaMemcpyHostToDevice), "cudaMemcpy to device");
  return d;
}

DeviceBuffer DeviceBuffer::from_ints(const std::vector<int32_t>& values) {
  DeviceBuffer d(DType::f32, {int64_t(values.size())});  // 4-byte elements; viewed as int32 by callers
  if (!values.empty())
    check(cudaMemcpy(d.ptr_, values.data(), d.bytes_, cudaMemcpyHostToDevice), "cudaMemcpy to device");
  return d;
}

TensorView DeviceBuffer::view() const { return make_view(ptr_, dtype_, shape_, Device::cuda); }

void copy_device_to_host(void* dst, const void* device_src, size_t bytes) {
  check(cudaMemcpy(dst, device_src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
}

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
