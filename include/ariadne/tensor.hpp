// ariadne/tensor.hpp — non-owning tensor views and an owning host buffer.
//
// A TensorView is a pointer plus dtype, device, shape and strides (in elements, not bytes). It
// never owns memory; kernels take views. Rank is at most 4. The innermost dimension of every
// attention operand must be contiguous (stride 1); the other strides are free, so q, k and v can be
// slices of one packed qkv projection ([tokens, 3, heads, dim]) without a copy.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ariadne/error.hpp"

#if defined(__CUDACC__)
#define ARIADNE_HD __host__ __device__ __forceinline__
#else
#define ARIADNE_HD inline
#endif

namespace ariadne {

// f64 is a host dtype for exact checks (float64 gradcheck of the autograd op): the reference
// backend computes in double anyway and reads and writes it exactly; the fast backends and the
// other features refuse it, naming the tensor.
enum class DType : uint8_t { f32, bf16, f16, f64 };
enum class Device : uint8_t { cpu, cuda };

constexpr int dtype_size(DType t) { return t == DType::f64 ? 8 : t == DType::f32 ? 4 : 2; }
const char* dtype_name(DType t);
// "f32"/"fp32"/"float32", "bf16"/"bfloat16", "f16"/"fp16"/"float16", "f64"/"fp64"/"float64"
DType parse_dtype(std::string_view s);

// ---- 16-bit float conversions (bit exact, round to nearest even; usable in kernels) ----
ARIADNE_HD float bf16_to_float(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
ARIADNE_HD uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu)) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
float f16_to_float(uint16_t h);
uint16_t float_to_f16(float f);

// A view of at most 4 dimensions. shape[i] and stride[i] are valid for i < rank.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device = Device::cpu;
  int rank = 0;
  std::array<int64_t, 4> shape{};
  std::array<int64_t, 4> stride{};

  bool defined() const { return data != nullptr; }
  int64_t numel() const;
  bool contiguous() const;  // row-major dense
  // Element offset of a multi-index (no bounds check; callers validated shapes).
  int64_t offset(std::initializer_list<int64_t> idx) const {
    int64_t o = 0;
    int i = 0;
    for (int64_t x : idx) o += x * stride[i++];
    return o;
  }
  // Reads one element as float (host memory only; slow, for references and tests).
  float get(std::initializer_list<int64_t> idx) const;
  void set(std::initializer_list<int64_t> idx, float value) const;
  // The same in double: exact for f64 (get/set round through float), widened for the others.
  double get_f64(std::initializer_list<int64_t> idx) const;
  void set_f64(std::initializer_list<int64_t> idx, double value) const;
  std::string describe() const;  // "bf16[4096, 16, 80] strides [3840, 80, 1] cpu"
};

// Rows [lo, hi) of a view along its first dimension (same strides; host or device memory).
inline TensorView row_range(TensorView t, int64_t lo, int64_t hi) {
  t.data = static_cast<char*>(t.data) + lo * t.stride[0] * dtype_size(t.dtype);
  t.shape[0] = hi - lo;
  return t;
}

// Contiguous row-major view of `data` with the given shape.
TensorView make_view(void* data, DType dtype, std::initializer_list<int64_t> shape,
                     Device device = Device::cpu);
TensorView make_view(void* data, DType dtype, const std::vector<int64_t>& shape,
                     Device device = Device::cpu);

// Owning, 64-byte aligned host memory with a shape. Movable, not copyable.
class Buffer {
 public:
  Buffer() = default;
  Buffer(DType dtype, std::vector<int64_t> shape);
  TensorView view() const;
  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const;
  void* data() const { return mem_.get(); }
  template <class T>
  T* as() const { return static_cast<T*>(mem_.get()); }
  void fill(float value);  // every element set to `value` (converted to the dtype)
  void fill_random(uint64_t seed, float lo = -1.f, float hi = 1.f);  // uniform, reproducible

 private:
  struct Free {
    void operator()(void* p) const;
  };
  DType dtype_ = DType::f32;
  std::vector<int64_t> shape_;
  std::unique_ptr<void, Free> mem_;
};

// ---- checks with messages that name the tensor, the dimension and the expectation ----
// require_shape(q, "q", {-1, 16, 80}): -1 accepts any size. Checks rank too.
void require_rank(const TensorView& t, const char* name, int rank);
void require_dim(const TensorView& t, const char* name, int dim, int64_t expected, const char* what);
void require_dtype(const TensorView& t, const char* name, std::initializer_list<DType> allowed);
void require_device(const TensorView& t, const char* name, Device device);
void require_inner_contiguous(const TensorView& t, const char* name);

}  // namespace ariadne
