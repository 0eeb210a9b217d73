// ariadne/random_llama.hpp — Llama GGUF files with random weights at a chosen shape, for tests and
// benchmarks that exercise the model's code paths and speed without a trained checkpoint.
//
// Every tensor is f32 holding bf16-representable values (so a GPU path that rounds the weights to
// bf16 changes nothing). Matrices are N(0, s²) with s = matrix_scale, or 1/√in when matrix_scale
// is 0 (outputs of the size of their inputs); norm weights 1 + N(0, 0.1²); the token embedding
// N(0, 1). Named shapes follow the released configurations' sizes (the weights are random):
//   smollm2-135m  30 layers, dim 576,  9 / 3 heads of 64, ffn 1536, vocab 49152
//   smollm2-360m  32 layers, dim 960, 15 / 5 heads of 64, ffn 2560, vocab 49152
//   llama-1b      16 layers, dim 2048, 32 / 8 heads of 64, ffn 8192, vocab 128256 (Llama-3.2-1B)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ariadne {

struct LlamaShape {
  int layers = 0, dim = 0, heads = 0, kv_heads = 0, head_dim = 0, ffn = 0, vocab = 0;
  int64_t context = 131072;  // llama.context_length
};

// One of the names above; throws ariadne::Error naming the known shapes otherwise.
LlamaShape llama_shape(const std::string& name);

// The GGUF bytes of a Llama of this shape with weights drawn from `seed` (tied output: no
// output.weight). The shape must be one the loader reads back (dim = heads · head_dim, a whole
// GQA group, an even head dim); throws ariadne::Error naming the field otherwise.
std::vector<uint8_t> random_llama_gguf(const LlamaShape& shape, uint64_t seed, float matrix_scale = 0.f);

}  // namespace ariadne
