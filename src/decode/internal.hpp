// Shared by the decode backends and the page selection (include/ariadne/decode.hpp).
#pragma once

#include <cstdint>

#include "ariadne/decode.hpp"

namespace ariadne::decode_detail {

// The tokens of a sequence of `length` that a decode query (at position length − 1) sees under
// `window`: [first, length); and the logical pages holding them: [page_lo, page_hi].
struct Visible {
  int64_t first = 0, length = 0;
  int64_t page_lo = 0, page_hi = -1;  // page_hi < page_lo: none
  int64_t pages() const { return page_hi - page_lo + 1; }
};
Visible visible_of(int64_t length, int64_t window, int page_size);

// One stored K or V element of the cache as float.
inline float load(const unsigned char* base, DType dtype, int64_t index) {
  switch (dtype) {
    case DType::f32: return reinterpret_cast<const float*>(base)[index];
    case DType::bf16: return bf16_to_float(reinterpret_cast<const uint16_t*>(base)[index]);
    default: return f16_to_float(reinterpret_cast<const uint16_t*>(base)[index]);
  }
}

void decode_reference(const DecodeParams& p);
void decode_cpu(const DecodeParams& p);
// The device cache's kernels (src/decode/cuda); builds without CUDA throw.
void decode_cuda(const DecodeParams& p);

}  // namespace ariadne::decode_detail
