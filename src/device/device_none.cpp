// DeviceBuffer in builds without the CUDA backend: no device is available and every allocation
// says so plainly.
#if !defined(ARIADNE_WITH_CUDA)
#include "ariadne/device.hpp"

namespace ariadne {

namespace {
[[noreturn]] void no_cuda() { detail::fail("this build of ariadne has no CUDA backend (configure with nvcc present)"); }
}  // namespace

bool cuda_available() { return false; }
void cuda_synchronize() { no_cuda(); }
void copy_device_to_host(void*, const void*, size_t) { no_cuda(); }
DeviceBuffer::DeviceBuffer(DType, std::vector<int64_t>) { no_cuda(); }
DeviceBuffer::~DeviceBuffer() = default;
DeviceBuffer::DeviceBuffer(DeviceBuffer&&) noexcept = default;
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&&) noexcept = default;
DeviceBuffer DeviceBuffer::from_host(const Buffer&) { no_cuda(); }
DeviceBuffer DeviceBuffer::from_host(const void*, DType, std::vector<int64_t>) { no_cuda(); }
DeviceBuffer DeviceBuffer::from_ints(const std::vector<int32_t>&) { no_cuda(); }
DeviceBuffer DeviceBuffer::stream_ordered(DType, std::vector<int64_t>) { no_cuda(); }
void DeviceBuffer::trim_stream_ordered_pool() { no_cuda(); }
TensorView DeviceBuffer::view() const { no_cuda(); }
void DeviceBuffer::copy_to_host(void*, size_t) const { no_cuda(); }
Buffer DeviceBuffer::to_host() const { no_cuda(); }
void DeviceBuffer::fill_bytes(int) { no_cuda(); }

}  // namespace ariadne
#endif
