// Random-weight Llama GGUF files (src/workloads/random_llama.hpp).
#include "workloads/random_llama.hpp"

#include <cmath>
#include <random>

#include "ariadne/error.hpp"
#include "ariadne/gguf.hpp"
#include "ariadne/tensor.hpp"

namespace ariadne {

LlamaShape llama_shape(const std::string& name) {
  if (name == "smollm2-135m") return {30, 576, 9, 3, 64, 1536, 49152};
  if (name == "smollm2-360m") return {32, 960, 15, 5, 64, 2560, 49152};
  if (name == "llama-1b") return {16, 2048, 32, 8, 64, 8192, 128256};
  ARIADNE_CHECK(false, "llama shape '", name, "' is not known, expected smollm2-135m, smollm2-360m or llama-1b");
  return {};
}

std::vector<uint8_t> random_llama_gguf(const LlamaShape& s, uint64_t seed, float matrix_scale) {
  for (const auto& [v, name] : {std::pair{s.layers, "layers"}, std::pair{s.dim, "dim"}, std::pair{s.heads, "heads"},
                                std::pair{s.kv_heads, "kv_heads"}, std::pair{s.head_dim, "head_dim"},
                                std::pair{s.ffn, "ffn"}, std::pair{s.vocab, "vocab"}})
    ARIADNE_CHECK(v > 0, "random llama: ", name, " is ", v, ", expected > 0");
  ARIADNE_CHECK(s.heads % s.kv_heads == 0 && s.head_dim % 2 == 0 && s.dim == s.heads * s.head_dim, "random llama: ",
                s.heads, " heads over ", s.kv_heads, " KV heads of dim ", s.head_dim, " in a model dim of ", s.dim,
                ", expected a whole GQA group, an even head dim and dim = heads · head_dim");
  ARIADNE_CHECK(s.context > 0 && s.context < (int64_t(1) << 32), "random llama: context ", s.context,
                ", expected 1 … 2^32 − 1");
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<GgufWriterTensor> ts;
  // dims in GGUF order: {in, out} for a matrix y = x·Wᵀ of `out` rows of `in` values.
  const auto add = [&](const std::string& name, std::vector<int64_t> dims, float scale, float shift) {
    std::vector<float> v(size_t(dims[0] * (dims.size() > 1 ? dims[1] : 1)));
    for (float& x : v) x = bf16_to_float(float_to_bf16(shift + scale * nd(rng)));
    ts.push_back({name, dims, GgmlType::f32, ggml_quantize(GgmlType::f32, v.data(), int64_t(v.size()))});
  };
  const auto matrix = [&](const std::string& name, int64_t in, int64_t out) {
    add(name, {in, out}, matrix_scale > 0 ? matrix_scale : 1.f / std::sqrt(float(in)), 0.f);
  };
  add("token_embd.weight", {s.dim, s.vocab}, 1.f, 0.f);
  add("output_norm.weight", {s.dim}, 0.1f, 1.f);
  const int64_t Q = int64_t(s.heads) * s.head_dim, KV = int64_t(s.kv_heads) * s.head_dim;
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add(p + "attn_norm.weight", {s.dim}, 0.1f, 1.f);
    matrix(p + "attn_q.weight", s.dim, Q);
    matrix(p + "attn_k.weight", s.dim, KV);
    matrix(p + "attn_v.weight", s.dim, KV);
    matrix(p + "attn_output.weight", Q, s.dim);
    add(p + "ffn_norm.weight", {s.dim}, 0.1f, 1.f);
    matrix(p + "ffn_gate.weight", s.dim, s.ffn);
    matrix(p + "ffn_up.weight", s.dim, s.ffn);
    matrix(p + "ffn_down.weight", s.ffn, s.dim);
  }
  return gguf_serialize({{"general.architecture", gguf_str("llama")},
                         {"llama.block_count", gguf_u32(uint32_t(s.layers))},
                         {"llama.context_length", gguf_u32(uint32_t(s.context))},
                         {"llama.embedding_length", gguf_u32(uint32_t(s.dim))},
                         {"llama.feed_forward_length", gguf_u32(uint32_t(s.ffn))},
                         {"llama.attention.head_count", gguf_u32(uint32_t(s.heads))},
                         {"llama.attention.head_count_kv", gguf_u32(uint32_t(s.kv_heads))},
                         {"llama.rope.freq_base", gguf_f32(10000.f)},
                         {"llama.rope.dimension_count", gguf_u32(uint32_t(s.head_dim))},
                         {"llama.attention.layer_norm_rms_epsilon", gguf_f32(1e-5f)}},
                        ts, 32);
}

}  // namespace ariadne
