// host_rows: a host copy of a row-strided view from either memory, optionally gathered by a row index.
#include <cstring>
#include <vector>

#include "ariadne/device.hpp"

namespace ariadne {

namespace {

// The bytes [0, bytes) of a view's memory, read on the host: the memory itself for host views, a
// copy for device views.
const char* host_bytes(const TensorView& t, size_t bytes, std::vector<char>& copy) {
  if (t.device == Device::cpu) return static_cast<const char*>(t.data);
  copy.resize(bytes);
  copy_device_to_host(copy.data(), t.data, bytes);
  return copy.data();
}

}  // namespace

Buffer host_rows(const TensorView& t, const int32_t* rows) {
  ARIADNE_CHECK(t.defined() && t.rank >= 1, "host_rows: the tensor is missing or has rank 0");
  int64_t inner = 1;
  for (int i = t.rank - 1; i >= 1; --i) {
    ARIADNE_CHECK(t.shape[size_t(i)] == 1 || t.stride[size_t(i)] == inner, "host_rows: dim ", i,
                  " has stride ", t.stride[size_t(i)], ", expected ", inner,
                  " (the dimensions after the first must be packed; ", t.describe(), ")");
    inner *= t.shape[size_t(i)];
  }
  const int64_t n_src = t.shape[0];
  ARIADNE_CHECK(n_src == 0 || t.stride[0] >= inner, "host_rows: row stride ", t.stride[0],
                " is below the row size ", inner, " (", t.describe(), ")");
  const size_t es = size_t(dtype_size(t.dtype)), row_bytes = size_t(inner) * es;
  const size_t span = n_src == 0 ? 0 : (size_t(n_src - 1) * size_t(t.stride[0]) + size_t(inner)) * es;
  std::vector<char> copy;
  const char* src = host_bytes(t, span, copy);

  std::vector<int32_t> index;
  if (rows) {
    index.resize(size_t(n_src));
    if (t.device == Device::cpu)
      std::memcpy(index.data(), rows, index.size() * sizeof(int32_t));
    else
      copy_device_to_host(index.data(), rows, index.size() * sizeof(int32_t));
  }
  const int64_t n = n_src;
  const std::vector<int64_t> shape(t.shape.begin(), t.shape.begin() + t.rank);
  Buffer out(t.dtype, shape);
  char* dst = static_cast<char*>(out.data());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = rows ? index[size_t(i)] : i;
    ARIADNE_CHECK(r >= 0 && r < n_src, "host_rows: rows[", i, "] = ", r, " is outside the tensor's ", n_src, " rows");
    std::memcpy(dst + size_t(i) * row_bytes, src + size_t(r) * size_t(t.stride[0]) * es, row_bytes);
  }
  return out;
}

}  // namespace ariadne
