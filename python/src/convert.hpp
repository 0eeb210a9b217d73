// Glue between nanobind's DLPack arrays and ariadne's views: no copy in either direction.
//
// Arrays from numpy, PyTorch, CuPy (anything that speaks DLPack or the buffer protocol) arrive as
// nb::ndarray; as_view() describes the same memory as an ariadne::TensorView. Strides are in
// elements on both sides, so strided views (q sliced out of a packed qkv) pass through unchanged.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "ariadne/order.hpp"
#include "ariadne/tensor.hpp"

namespace ariadne::py {

namespace nb = nanobind;

// An argument array of any dtype, rank, device and layout (checked by ariadne, which names the
// argument in its error). Read-only arrays are accepted for inputs.
using AnyIn = nb::ndarray<nb::ro>;
using AnyOut = nb::ndarray<>;

// Small metadata arrays: int32 offsets (cu_seqlens). Contiguous, any device.
using IntsIn = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig>;

// Types of array arguments in the signatures (nb::sig, hence the stubs) of functions whose arrays
// take several dtypes, which an nb::ndarray type cannot say. q/k/v-like tensors: float32, float16
// or bfloat16 (torch's, or ml_dtypes' as uint16 bits with bf16_bits=True), [tokens, heads, head_dim];
// permute_tokens' src/dst: float32 or float16 [tokens, ...]. The library checks dtype and rank and
// names the argument. The other macros spell what their nb::ndarray types already require, as
// nanobind's own signatures do.
#define ARIADNE_SIG_FLOATS "NDArray[numpy.float32 | numpy.float16 | numpy.uint16]"
#define ARIADNE_SIG_QKV "Annotated[" ARIADNE_SIG_FLOATS ", dict(shape=(None, None, None), writable=False)]"
#define ARIADNE_SIG_OUT "Annotated[" ARIADNE_SIG_FLOATS ", dict(shape=(None, None, None))]"
// Attention's operands and gradients: those dtypes, or float64 on the host (the reference backend).
#define ARIADNE_SIG_ATTN_FLOATS "NDArray[numpy.float32 | numpy.float16 | numpy.uint16 | numpy.float64]"
#define ARIADNE_SIG_ATTN_QKV "Annotated[" ARIADNE_SIG_ATTN_FLOATS ", dict(shape=(None, None, None), writable=False)]"
#define ARIADNE_SIG_ATTN_OUT "Annotated[" ARIADNE_SIG_ATTN_FLOATS ", dict(shape=(None, None, None))]"
#define ARIADNE_SIG_TOKENS_IN "Annotated[NDArray[numpy.float32 | numpy.float16], dict(writable=False)]"
#define ARIADNE_SIG_TOKENS_OUT "NDArray[numpy.float32 | numpy.float16]"
#define ARIADNE_SIG_INTS "Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', writable=False)]"
#define ARIADNE_SIG_F32_IN1 "Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', writable=False)]"
// Attention sinks and their gradient: float32, or float64 with float64 q (the reference backend).
#define ARIADNE_SIG_SINK_IN "Annotated[NDArray[numpy.float32 | numpy.float64], dict(shape=(None,), writable=False)]"
#define ARIADNE_SIG_SINK_OUT "Annotated[NDArray[numpy.float32 | numpy.float64], dict(shape=(None,))]"
#define ARIADNE_SIG_F32_IN2 "Annotated[NDArray[numpy.float32], dict(shape=(None, None), writable=False)]"
#define ARIADNE_SIG_F32_OUT2 "Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C')]"

// TensorView of `a`. dtype float32 / bfloat16 / float16, or uint16 when `u16_is_bf16` (the raw
// bits of an ml_dtypes bfloat16 numpy array, which DLPack cannot describe); device cpu (or CUDA
// pinned host memory) or cuda; rank 0..4. Anything else throws ariadne::Error naming `name`.
TensorView view_of(const nb::ndarray<nb::ro>& a, const char* name, bool u16_is_bf16);

// Any ndarray, typed or not, is first seen as an untyped read-only handle of the same array.
template <class... Args>
TensorView as_view(const nb::ndarray<Args...>& a, const char* name, bool u16_is_bf16 = false) {
  return view_of(nb::ndarray<nb::ro>(a), name, u16_is_bf16);
}

// Human-readable dtype of a DLPack array ("float64", "int32", ...), for error messages.
std::string dlpack_dtype_name(nb::dlpack::dtype t);

// A new numpy array holding a copy of `values` (metadata outputs: permutations, offsets).
template <class T>
nb::ndarray<nb::numpy, T> to_numpy(const std::vector<T>& values, std::vector<size_t> shape = {}) {
  if (shape.empty()) shape = {values.size()};
  auto* copy = new std::vector<T>(values);
  nb::capsule owner(copy, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T>(copy->data(), shape.size(), shape.data(), owner);
}

// A new numpy array that takes over `values` (no copy: the array owns the moved vector).
template <class T>
nb::ndarray<nb::numpy, T> take_numpy(std::vector<T>&& values, std::vector<size_t> shape) {
  auto* owned = new std::vector<T>(std::move(values));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T>(owned->data(), shape.size(), shape.data(), owner);
}

// A read-only numpy view of a vector owned by the Python object `owner` (no copy; the object
// stays alive as long as the array does).
template <class T>
nb::ndarray<nb::numpy, const T> view_numpy(const std::vector<T>& v, nb::handle owner, std::vector<size_t> shape = {}) {
  if (shape.empty()) shape = {v.size()};
  return nb::ndarray<nb::numpy, const T>(v.data(), shape.size(), shape.data(), owner);
}

// Image grids cross as (h, w) tuples in patches, everywhere in the package.
using GridPair = std::pair<int, int>;
std::vector<Grid> to_grids(const std::vector<GridPair>& g);
std::vector<GridPair> to_pairs(const std::vector<Grid>& g);

}  // namespace ariadne::py
