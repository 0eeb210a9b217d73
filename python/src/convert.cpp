// DLPack array -> ariadne::TensorView (convert.hpp).
#include "convert.hpp"

#include <string>

#include "ariadne/error.hpp"

namespace ariadne::py {

namespace dl = nb::dlpack;

namespace {

// DLPack device types (dlpack.h): kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3 (pinned host memory,
// readable by the CPU backends), kDLCUDAManaged = 13 (treated as device memory).
constexpr int kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13;

}  // namespace

TensorView view_of(const nb::ndarray<nb::ro>& a, const char* name, bool u16_is_bf16) {
  TensorView t;
  const size_t rank = a.ndim();
  ARIADNE_CHECK(rank <= 4, name, ": rank ", rank, " exceeds the maximum of 4");
  const dl::dtype dt = a.dtype();
  ARIADNE_CHECK(dt.lanes == 1, name, ": vector dtypes (lanes = ", int(dt.lanes), ") are not supported");
  if (dt.code == uint8_t(dl::dtype_code::Float) && dt.bits == 32) t.dtype = DType::f32;
  else if (dt.code == uint8_t(dl::dtype_code::Float) && dt.bits == 64) t.dtype = DType::f64;
  else if (dt.code == uint8_t(dl::dtype_code::Float) && dt.bits == 16) t.dtype = DType::f16;
  else if (dt.code == uint8_t(dl::dtype_code::Bfloat) && dt.bits == 16) t.dtype = DType::bf16;
  else if (u16_is_bf16 && dt.code == uint8_t(dl::dtype_code::UInt) && dt.bits == 16) t.dtype = DType::bf16;
  else
    detail::fail(name, ": dtype ", dlpack_dtype_name(dt),
                 " is not supported, expected float32, bfloat16, float16 (or float64 for the reference backend)");

  switch (a.device_type()) {
    case kDLCPU:
    case kDLCUDAHost: t.device = Device::cpu; break;
    case kDLCUDA:
    case kDLCUDAManaged: t.device = Device::cuda; break;
    default: detail::fail(name, ": DLPack device type ", a.device_type(), " is not supported, expected cpu or cuda");
  }
  // data() already includes DLPack's byte_offset. Every array is seen through a read-only handle;
  // outputs were admitted by writable signatures (nb::ndarray<> refuses read-only arrays), and
  // kernels never write through q, k or v.
  t.data = const_cast<void*>(static_cast<const void*>(a.data()));
  t.rank = int(rank);
  bool empty = false;
  for (size_t i = 0; i < rank; ++i) {
    t.shape[i] = int64_t(a.shape(i));
    t.stride[i] = a.stride(i);
    empty = empty || t.shape[i] == 0;
  }
  // Exporters give arbitrary strides (often 0) to dimensions of size 1 and to empty arrays, where
  // no stride is ever used to address memory. They become the row-major values, so that the
  // library's contiguity checks see what the memory really is.
  int64_t dense = 1;
  for (int i = int(rank) - 1; i >= 0; --i) {
    if (empty || t.shape[i] == 1) t.stride[i] = dense;
    dense *= t.shape[i] > 0 ? t.shape[i] : 1;
  }
  return t;
}

std::string dlpack_dtype_name(dl::dtype t) {
  std::string kind;
  switch (dl::dtype_code(t.code)) {
    case dl::dtype_code::Int: kind = "int"; break;
    case dl::dtype_code::UInt: kind = "uint"; break;
    case dl::dtype_code::Float: kind = "float"; break;
    case dl::dtype_code::Bfloat: kind = "bfloat"; break;
    case dl::dtype_code::Complex: kind = "complex"; break;
    case dl::dtype_code::Bool: return "bool";
    default: kind = "code" + std::to_string(int(t.code)) + "_"; break;
  }
  return kind + std::to_string(int(t.bits));
}

std::vector<Grid> to_grids(const std::vector<GridPair>& g) {
  std::vector<Grid> out;
  for (auto [h, w] : g) out.push_back(Grid{h, w});
  return out;
}
std::vector<GridPair> to_pairs(const std::vector<Grid>& g) {
  std::vector<GridPair> out;
  for (const Grid& x : g) out.emplace_back(x.h, x.w);
  return out;
}

}  // namespace ariadne::py
