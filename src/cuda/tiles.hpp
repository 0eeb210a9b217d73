// Internal: the tile shape the CUDA backend picks for a call, for cost models and benchmarks that
// report the useful-work fraction of the tiles next to the time. Plain C++ (no CUDA headers).
#pragma once

#include "ariadne/attention.hpp"

namespace ariadne {

int cuda_query_tile_rows(const AttentionParams& p);  // 64 or 128
int cuda_key_tile_rows();                            // 64

}  // namespace ariadne
