// Random-weight Llama GGUF files (src/workloads/random_llama.hpp): the loader reads the shape back,
// every weight is bf16-representable, the matrices have the asked scale (1/√in by default), the
// same seed gives the same bytes and another seed other weights, the CPU model runs on the file,
// and bad shapes and unknown names are refused naming the field.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "ariadne/error.hpp"
#include "ariadne/gguf.hpp"
#include "ariadne/llm.hpp"
#include "ariadne/tensor.hpp"
#include "workloads/random_llama.hpp"

namespace ariadne {
namespace {

LlamaShape small_shape() {
  LlamaShape s{2, 64, 4, 2, 16, 96, 50};
  s.context = 512;
  return s;
}

// The standard deviation of a tensor's values (their mean is 0 or 1 by construction).
double spread(const std::vector<float>& v) {
  double m = 0, q = 0;
  for (const float x : v) m += x;
  m /= double(v.size());
  for (const float x : v) q += (x - m) * (x - m);
  return std::sqrt(q / double(v.size()));
}

void expect_error(const LlamaShape& s, const std::string& what) {
  try {
    random_llama_gguf(s, 1);
    ADD_FAILURE() << "accepted a shape with bad " << what;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(RandomLlama, LoadsBackWithItsShapeAndScales) {
  const LlamaShape s = small_shape();
  const std::vector<uint8_t> bytes = random_llama_gguf(s, 5);
  const GgufFile f = GgufFile::parse(bytes.data(), bytes.size(), "random.gguf");
  const LlamaModel m = LlamaModel::from_gguf(f);
  const LlamaConfig& c = m.config();
  EXPECT_EQ(c.layers, s.layers);
  EXPECT_EQ(c.dim, s.dim);
  EXPECT_EQ(c.heads, s.heads);
  EXPECT_EQ(c.kv_heads, s.kv_heads);
  EXPECT_EQ(c.head_dim, s.head_dim);
  EXPECT_EQ(c.ffn, s.ffn);
  EXPECT_EQ(c.vocab, s.vocab);
  EXPECT_EQ(c.context, s.context);
  EXPECT_TRUE(c.tied);
  for (const char* name : {"token_embd.weight", "blk.1.attn_norm.weight", "blk.0.attn_q.weight",
                           "blk.1.ffn_down.weight"}) {
    for (const float v : f.to_float(f.tensor(name)))
      ASSERT_EQ(v, bf16_to_float(float_to_bf16(v))) << name << " holds a value bf16 does not";
  }
  // 1/√in per matrix (within the sampling error of a few thousand values), N(0, 1) embeddings,
  // norms 1 + N(0, 0.1²).
  EXPECT_NEAR(spread(f.to_float(f.tensor("blk.0.attn_q.weight"))), 1 / std::sqrt(64.0), 0.1 / std::sqrt(64.0));
  EXPECT_NEAR(spread(f.to_float(f.tensor("blk.0.ffn_down.weight"))), 1 / std::sqrt(96.0), 0.1 / std::sqrt(96.0));
  EXPECT_NEAR(spread(f.to_float(f.tensor("token_embd.weight"))), 1.0, 0.1);
  EXPECT_NEAR(spread(f.to_float(f.tensor("blk.0.attn_norm.weight"))), 0.1, 0.03);
  const std::vector<uint8_t> scaled = random_llama_gguf(s, 5, 0.25f);
  const GgufFile g = GgufFile::parse(scaled.data(), scaled.size(), "scaled.gguf");
  EXPECT_NEAR(spread(g.to_float(g.tensor("blk.1.attn_k.weight"))), 0.25, 0.03);
}

TEST(RandomLlama, SeedsDecideTheWeightsAndTheModelRuns) {
  const LlamaShape s = small_shape();
  EXPECT_EQ(random_llama_gguf(s, 3), random_llama_gguf(s, 3));
  EXPECT_NE(random_llama_gguf(s, 3), random_llama_gguf(s, 4));
  const std::vector<uint8_t> bytes = random_llama_gguf(s, 3);
  LlamaModel m = LlamaModel::from_gguf(GgufFile::parse(bytes.data(), bytes.size(), "random.gguf"));
  PrefillOptions po;
  po.method.dense = true;
  const std::vector<float> logits = m.prefill({1, 7, 9, 49, 0, 3}, po);
  ASSERT_EQ(logits.size(), size_t(s.vocab));
  for (const float v : logits) ASSERT_TRUE(std::isfinite(v));
  for (const float v : m.decode(11)) ASSERT_TRUE(std::isfinite(v));
}

TEST(RandomLlama, RefusesBadShapesAndUnknownNames) {
  LlamaShape s = small_shape();
  s.layers = 0;
  expect_error(s, "layers is 0");
  s = small_shape();
  s.kv_heads = 3;  // 4 heads over 3 KV heads
  expect_error(s, "whole GQA group");
  s = small_shape();
  s.dim = 65;
  expect_error(s, "dim = heads · head_dim");
  s = small_shape();
  s.context = 0;
  expect_error(s, "context 0");
  const LlamaShape smol = llama_shape("smollm2-135m");
  EXPECT_EQ(smol.layers, 30);
  EXPECT_EQ(smol.dim, smol.heads * smol.head_dim);
  try {
    llama_shape("gpt-5");
    ADD_FAILURE() << "accepted an unknown shape name";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'gpt-5' is not known, expected smollm2-135m"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ariadne
