// Tensor views, 16-bit float conversions and the owning host buffer.
#include "ariadne/tensor.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <sstream>
#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace ariadne {

namespace {
std::string shape_string(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}
}  // namespace

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::f64: return "f64";
  }
  return "?";
}

DType parse_dtype(std::string_view s) {
  if (s == "f32" || s == "fp32" || s == "float32") return DType::f32;
  if (s == "bf16" || s == "bfloat16") return DType::bf16;
  if (s == "f16" || s == "fp16" || s == "float16") return DType::f16;
  if (s == "f64" || s == "fp64" || s == "float64") return DType::f64;
  detail::fail("dtype: '", s, "' is not one of f32, bf16, f16, f64");
}

// IEEE half conversions written out (no reliance on compiler _Float16 support); round to nearest even.
float f16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ffu, u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    u = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;
  } else {  // subnormal: normalize
    int e = -1;
    do {
      ++e;
      man <<= 1;
    } while (!(man & 0x400u));
    u = sign | uint32_t(112 - e) << 23 | ((man & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t float_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) return uint16_t(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0));  // inf / nan
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520: overflow to inf
  if (a < 0x38800000u) {  // below the smallest normal half: subnormal or zero
    if (a < 0x33000000u) return sign;  // < 2^-25 rounds to zero
    const uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
    const int shift = int(126 - e);  // 14..24
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return uint16_t(sign | r);
  }
  uint32_t r = a - 0x38000000u;  // rebias exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);
  return uint16_t(sign | (r >> 13));
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  bool empty = false;
  for (int i = 0; i < rank; ++i) {
    ARIADNE_CHECK(shape[i] >= 0, "tensor ", describe(), ": dim ", i, " has negative size ", shape[i]);
    if (__builtin_mul_overflow(n, std::max<int64_t>(shape[i], 1), &n))
      detail::fail("tensor ", describe(), ": element count overflows 64-bit integers");
    empty = empty || shape[i] == 0;
  }
  return empty ? 0 : n;
}

bool TensorView::contiguous() const {
  int64_t s = 1;
  for (int i = rank - 1; i >= 0; --i) {
    if (shape[i] != 1 && stride[i] != s) return false;
    if (__builtin_mul_overflow(s, shape[i], &s)) return false;
  }
  return true;
}

static double load_as_double(const void* base, DType t, int64_t off) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(base)[off];
    case DType::bf16: return bf16_to_float(static_cast<const uint16_t*>(base)[off]);
    case DType::f16: return f16_to_float(static_cast<const uint16_t*>(base)[off]);
    case DType::f64: return static_cast<const double*>(base)[off];
  }
  return 0;
}

static void store_from_double(void* base, DType t, int64_t off, double v) {
  switch (t) {
    case DType::f32: static_cast<float*>(base)[off] = float(v); break;
    case DType::bf16: static_cast<uint16_t*>(base)[off] = float_to_bf16(float(v)); break;
    case DType::f16: static_cast<uint16_t*>(base)[off] = float_to_f16(float(v)); break;
    case DType::f64: static_cast<double*>(base)[off] = v; break;
  }
}

float TensorView::get(std::initializer_list<int64_t> idx) const { return float(load_as_double(data, dtype, offset(idx))); }
void TensorView::set(std::initializer_list<int64_t> idx, float value) const {
  store_from_double(data, dtype, offset(idx), value);
}
double TensorView::get_f64(std::initializer_list<int64_t> idx) const { return load_as_double(data, dtype, offset(idx)); }
void TensorView::set_f64(std::initializer_list<int64_t> idx, double value) const {
  store_from_double(data, dtype, offset(idx), value);
}

std::string TensorView::describe() const {
  std::ostringstream os;
  os << dtype_name(dtype) << "[";
  for (int i = 0; i < rank; ++i) os << (i ? ", " : "") << shape[i];
  os << "] strides [";
  for (int i = 0; i < rank; ++i) os << (i ? ", " : "") << stride[i];
  os << "] " << (device == Device::cpu ? "cpu" : "cuda");
  return os.str();
}

TensorView make_view(void* data, DType dtype, const std::vector<int64_t>& shape, Device device) {
  ARIADNE_CHECK(shape.size() <= 4, "make_view: rank ", shape.size(), " exceeds the maximum of 4");
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.rank = int(shape.size());
  int64_t s = 1;
  for (int i = t.rank - 1; i >= 0; --i) {
    ARIADNE_CHECK(shape[i] >= 0, "make_view: dim ", i, " has negative size ", shape[i]);
    t.shape[i] = shape[i];
    t.stride[i] = s;
    // The stride of the next dimension out; checked even past a zero dimension (see checked_numel).
    if (__builtin_mul_overflow(s, std::max<int64_t>(shape[i], 1), &s))
      detail::fail("make_view: shape ", shape_string(shape), ": element count overflows 64-bit integers");
  }
  return t;
}

TensorView make_view(void* data, DType dtype, std::initializer_list<int64_t> shape, Device device) {
  return make_view(data, dtype, std::vector<int64_t>(shape), device);
}

namespace {
// Host memory of a Buffer: 64-byte aligned; from 2 MiB on, aligned to 2 MiB and marked for
// transparent huge pages (Linux, madvise: a hint, ignored where THP is off or set to never). The
// attention kernels walk [tokens, heads, d] tensors head by head, one row per heads·d elements,
// so with 4 KiB pages each row is a new page and its TLB miss: huge pages made a bf16 ±64 window at
// N 4096, 16 heads 10-18 % faster and chunks 20-23 % (docs/cpu-backend.md, "Huge pages").
void* allocate_host(size_t bytes) {
  constexpr size_t kHuge = size_t(2) << 20;
  if (bytes < kHuge) return std::aligned_alloc(64, bytes);
  void* p = nullptr;
  if (posix_memalign(&p, kHuge, bytes) != 0) return nullptr;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  madvise(p, bytes / kHuge * kHuge, MADV_HUGEPAGE);  // whole huge pages only; a refusal changes nothing
#endif
  return p;
}
}  // namespace

void Buffer::Free::operator()(void* p) const { std::free(p); }

Buffer::Buffer(DType dtype, std::vector<int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
  const int64_t n = checked_numel(shape_, "Buffer of ", dtype_name(dtype));
  const int64_t bytes = checked_mul(n, dtype_size(dtype), "Buffer of ", dtype_name(dtype), ": byte size");
  const int64_t rounded = checked_add(bytes, 63, "Buffer of ", dtype_name(dtype), ": byte size") / 64 * 64;
  mem_.reset(allocate_host(size_t(rounded ? rounded : 64)));
  ARIADNE_CHECK(mem_ != nullptr, "Buffer ", dtype_name(dtype), shape_string(shape_), ": could not allocate ",
                bytes, " bytes");
}

int64_t Buffer::numel() const {
  int64_t n = 1;
  for (int64_t s : shape_) n *= s;  // checked in the constructor
  return n;
}

TensorView Buffer::view() const { return make_view(mem_.get(), dtype_, shape_); }

void Buffer::fill(float value) {
  const int64_t n = numel();
  for (int64_t i = 0; i < n; ++i) store_from_double(mem_.get(), dtype_, i, value);
}

void Buffer::fill_random(uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  const int64_t n = numel();
  for (int64_t i = 0; i < n; ++i) store_from_double(mem_.get(), dtype_, i, dist(rng));
}

void require_rank(const TensorView& t, const char* name, int rank) {
  ARIADNE_CHECK(t.defined(), name, ": tensor is missing (null data)");
  ARIADNE_CHECK(t.rank == rank, name, ": rank is ", t.rank, ", expected ", rank, " (", t.describe(), ")");
}

void require_dim(const TensorView& t, const char* name, int dim, int64_t expected, const char* what) {
  ARIADNE_CHECK(t.shape[dim] == expected, name, ": dim ", dim, " (", what, ") is ", t.shape[dim],
                ", expected ", expected, " (", t.describe(), ")");
}

void require_dtype(const TensorView& t, const char* name, std::initializer_list<DType> allowed) {
  for (DType d : allowed)
    if (t.dtype == d) return;
  std::ostringstream os;
  int i = 0;
  for (DType d : allowed) os << (i++ ? " or " : "") << dtype_name(d);
  detail::fail(name, ": dtype is ", dtype_name(t.dtype), ", expected ", os.str());
}

void require_device(const TensorView& t, const char* name, Device device) {
  ARIADNE_CHECK(t.device == device, name, ": is on ", t.device == Device::cpu ? "cpu" : "cuda",
                ", expected ", device == Device::cpu ? "cpu" : "cuda", " like the other operands");
}

void require_inner_contiguous(const TensorView& t, const char* name) {
  ARIADNE_CHECK(t.rank > 0 && t.stride[t.rank - 1] == 1, name, ": innermost dimension must be contiguous (stride 1), got stride ",
                t.rank > 0 ? t.stride[t.rank - 1] : 0, " (", t.describe(), ")");
  for (int i = 0; i < t.rank; ++i)
    ARIADNE_CHECK(t.stride[i] >= 0, name, ": dim ", i, " has negative stride ", t.stride[i]);
}

}  // namespace ariadne
