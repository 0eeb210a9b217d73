// Llama model: a tiny random Llama written as GGUF by the test against a plain-loop forward pass
// written here; dense == oracle at τ = 1; prefill + decode == a longer prefill; retrieval tasks;
// and, when SmolLM2-135M is present, logit parity with HF transformers' committed reference.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "ariadne/error.hpp"
#include "ariadne/gguf.hpp"
#include "ariadne/llm.hpp"
#include "ariadne/llm_tasks.hpp"
#include "ariadne/tokenizer.hpp"

namespace ariadne {
namespace {

constexpr int kLayers = 2, kDim = 64, kHeads = 4, kKv = 2, kHd = 16, kFfn = 96, kVocab = 96;

struct Tiny {
  std::vector<uint8_t> bytes;
  GgufFile file;
};

// Random weights; matrices Q4_1 / Q8_0 / F16 so each decoder is exercised, norms F32.
std::vector<uint8_t> tiny_llama_bytes(bool with_output) {
  std::mt19937_64 rng(21);
  std::normal_distribution<float> nd(0.f, 0.25f);
  auto vals = [&](int64_t n, float scale, float shift) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = shift + scale * nd(rng);
    return v;
  };
  std::vector<GgufWriterTensor> ts;
  auto add = [&](const std::string& name, std::vector<int64_t> dims, GgmlType t, const std::vector<float>& v) {
    ts.push_back({name, dims, t, ggml_quantize(t, v.data(), int64_t(v.size()))});
  };
  add("token_embd.weight", {kDim, kVocab}, GgmlType::q8_0, vals(kDim * kVocab, 4, 0));
  add("output_norm.weight", {kDim}, GgmlType::f32, vals(kDim, 0.2f, 1));
  if (with_output) add("output.weight", {kDim, kVocab}, GgmlType::f16, vals(kDim * kVocab, 1, 0));
  const int Q = kHeads * kHd, KV = kKv * kHd;
  for (int l = 0; l < kLayers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add(p + "attn_norm.weight", {kDim}, GgmlType::f32, vals(kDim, 0.2f, 1));
    add(p + "attn_q.weight", {kDim, Q}, GgmlType::q4_1, vals(kDim * Q, 2, 0));
    add(p + "attn_k.weight", {kDim, KV}, GgmlType::q4_0, vals(kDim * KV, 2, 0));
    add(p + "attn_v.weight", {kDim, KV}, GgmlType::q8_0, vals(kDim * KV, 1, 0));
    add(p + "attn_output.weight", {Q, kDim}, GgmlType::q4_1, vals(Q * kDim, 0.5f, 0));
    add(p + "ffn_norm.weight", {kDim}, GgmlType::f32, vals(kDim, 0.2f, 1));
    add(p + "ffn_gate.weight", {kDim, kFfn}, GgmlType::q4_1, vals(kDim * kFfn, 0.5f, 0));
    add(p + "ffn_up.weight", {kDim, kFfn}, GgmlType::f16, vals(kDim * kFfn, 0.5f, 0));
    add(p + "ffn_down.weight", {kFfn, kDim}, GgmlType::q4_1, vals(kFfn * kDim, 0.5f, 0));
  }
  return gguf_serialize({{"general.architecture", gguf_str("llama")},
                         {"llama.block_count", gguf_u32(kLayers)},
                         {"llama.context_length", gguf_u32(2048)},
                         {"llama.embedding_length", gguf_u32(kDim)},
                         {"llama.feed_forward_length", gguf_u32(kFfn)},
                         {"llama.attention.head_count", gguf_u32(kHeads)},
                         {"llama.attention.head_count_kv", gguf_u32(kKv)},
                         {"llama.rope.freq_base", gguf_f32(500.f)},
                         {"llama.rope.dimension_count", gguf_u32(kHd)},
                         {"llama.attention.layer_norm_rms_epsilon", gguf_f32(1e-5f)}},
                        ts, 64);
}

// Plain loops in double: embedding, RMSNorm, adjacent-pair RoPE, causal GQA softmax attention,
// SwiGLU, the output head. Returns the last position's logits.
std::vector<double> naive_forward(const GgufFile& f, const std::vector<int32_t>& tokens) {
  const int64_t n = int64_t(tokens.size());
  const std::vector<float> emb = f.to_float(f.tensor("token_embd.weight"));
  std::vector<double> h(size_t(n * kDim));
  for (int64_t t = 0; t < n; ++t)
    for (int i = 0; i < kDim; ++i) h[size_t(t * kDim + i)] = emb[size_t(tokens[size_t(t)] * kDim + i)];
  auto norm = [&](const std::vector<double>& x, const std::vector<float>& w, int64_t rows) {
    std::vector<double> y(x.size());
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (int i = 0; i < kDim; ++i) ss += x[size_t(r * kDim + i)] * x[size_t(r * kDim + i)];
      const double inv = 1 / std::sqrt(ss / kDim + 1e-5);
      for (int i = 0; i < kDim; ++i) y[size_t(r * kDim + i)] = w[size_t(i)] * x[size_t(r * kDim + i)] * inv;
    }
    return y;
  };
  auto matmul = [&](const std::vector<double>& x, int64_t rows, int in, const std::string& name, int out) {
    const std::vector<float> W = f.to_float(f.tensor(name));  // [out, in]
    std::vector<double> y(size_t(rows * out), 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int o = 0; o < out; ++o) {
        double s = 0;
        for (int i = 0; i < in; ++i) s += x[size_t(r * in + i)] * W[size_t(o * in + i)];
        y[size_t(r * out + o)] = s;
      }
    return y;
  };
  auto rope = [&](std::vector<double>& x, int heads) {
    for (int64_t t = 0; t < n; ++t)
      for (int hh = 0; hh < heads; ++hh)
        for (int i = 0; i < kHd / 2; ++i) {
          const double a = double(t) * std::pow(500.0, -2.0 * i / kHd);
          double* v = &x[size_t((t * heads + hh) * kHd + 2 * i)];
          const double x0 = v[0], x1 = v[1];
          v[0] = x0 * std::cos(a) - x1 * std::sin(a);
          v[1] = x0 * std::sin(a) + x1 * std::cos(a);
        }
  };
  for (int l = 0; l < kLayers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    std::vector<double> x = norm(h, f.to_float(f.tensor(p + "attn_norm.weight")), n);
    std::vector<double> q = matmul(x, n, kDim, p + "attn_q.weight", kHeads * kHd);
    std::vector<double> k = matmul(x, n, kDim, p + "attn_k.weight", kKv * kHd);
    std::vector<double> v = matmul(x, n, kDim, p + "attn_v.weight", kKv * kHd);
    rope(q, kHeads);
    rope(k, kKv);
    std::vector<double> att(size_t(n * kHeads * kHd), 0.0);
    for (int64_t i = 0; i < n; ++i)
      for (int hh = 0; hh < kHeads; ++hh) {
        const int kv = hh / (kHeads / kKv);
        std::vector<double> s(size_t(i + 1));
        double mx = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          double d = 0;
          for (int e = 0; e < kHd; ++e) d += q[size_t((i * kHeads + hh) * kHd + e)] * k[size_t((j * kKv + kv) * kHd + e)];
          s[size_t(j)] = d / std::sqrt(double(kHd));
          mx = std::max(mx, s[size_t(j)]);
        }
        double z = 0;
        for (double& e : s) z += (e = std::exp(e - mx));
        for (int64_t j = 0; j <= i; ++j)
          for (int e = 0; e < kHd; ++e)
            att[size_t((i * kHeads + hh) * kHd + e)] += s[size_t(j)] / z * v[size_t((j * kKv + kv) * kHd + e)];
      }
    const std::vector<double> o = matmul(att, n, kHeads * kHd, p + "attn_output.weight", kDim);
    for (size_t i = 0; i < h.size(); ++i) h[i] += o[i];
    x = norm(h, f.to_float(f.tensor(p + "ffn_norm.weight")), n);
    std::vector<double> g = matmul(x, n, kDim, p + "ffn_gate.weight", kFfn);
    const std::vector<double> u = matmul(x, n, kDim, p + "ffn_up.weight", kFfn);
    for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
    const std::vector<double> d = matmul(g, n, kFfn, p + "ffn_down.weight", kDim);
    for (size_t i = 0; i < h.size(); ++i) h[i] += d[i];
  }
  std::vector<double> last(h.end() - kDim, h.end());
  last = norm(last, f.to_float(f.tensor("output_norm.weight")), 1);
  const std::string head = f.has_tensor("output.weight") ? "output.weight" : "token_embd.weight";
  return matmul(last, 1, kDim, head, kVocab);
}

std::vector<int32_t> random_tokens(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = int32_t(rng() % kVocab);
  return t;
}

double max_diff(const std::vector<float>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

TEST(Llm, TinyLlamaMatchesPlainLoops) {
  for (bool with_output : {false, true}) {
    SCOPED_TRACE(with_output ? "output.weight" : "tied");
    const std::vector<uint8_t> bytes = tiny_llama_bytes(with_output);
    const GgufFile f = GgufFile::parse(bytes.data(), bytes.size(), "tiny.gguf");
    LlamaModel m = LlamaModel::from_gguf(f);
    EXPECT_EQ(m.config().tied, !with_output);
    EXPECT_EQ(m.config().head_dim, kHd);
    const std::vector<int32_t> tokens = random_tokens(70, 5);
    PrefillOptions po;
    po.method.dense = true;
    const std::vector<float> got = m.prefill(tokens, po);
    const std::vector<double> want = naive_forward(f, tokens);
    double scale = 0;
    for (double x : want) scale = std::max(scale, std::fabs(x));
    ASSERT_GT(scale, 0.1);
    EXPECT_LT(max_diff(got, want), 2e-4 * std::max(1.0, scale)) << "logit scale " << scale;
  }
}

TEST(Llm, DenseEqualsOracleAtTauOneAndDecodeMatchesPrefill) {
  const std::vector<uint8_t> bytes = tiny_llama_bytes(false);
  const GgufFile f = GgufFile::parse(bytes.data(), bytes.size(), "tiny.gguf");
  LlamaModel m = LlamaModel::from_gguf(f);
  const std::vector<int32_t> tokens = random_tokens(200, 9);
  PrefillOptions dense;
  dense.method.dense = true;
  const std::vector<float> ld = m.prefill(tokens, dense);
  PrefillOptions oracle;
  oracle.method.estimate.method = Estimator::oracle;
  oracle.method.estimate.tau = 1.0;
  oracle.method.estimate.block = 32;
  oracle.method.estimate.stride = 8;
  oracle.compare = true;
  PrefillTrace tr;
  const std::vector<float> lo = m.prefill(tokens, oracle, &tr);
  ASSERT_EQ(tr.layers.size(), size_t(kLayers));
  for (const LayerTrace& t : tr.layers) {
    EXPECT_DOUBLE_EQ(t.density, 1.0);
    EXPECT_NEAR(t.mass_recall, 1.0, 1e-6);
    EXPECT_DOUBLE_EQ(t.f1, 1.0);
    EXPECT_LT(t.out_rel_err, 1e-6);
  }
  for (size_t i = 0; i < ld.size(); ++i) ASSERT_NEAR(lo[i], ld[i], 1e-4) << i;

  // RR at τ = 0.9 keeps fewer blocks and still gives finite logits and metrics in range.
  PrefillOptions rr = oracle;
  rr.method.estimate.method = Estimator::rr;
  rr.method.estimate.tau = 0.9;
  const std::vector<float> lr = m.prefill(tokens, rr, &tr);
  for (float x : lr) ASSERT_TRUE(std::isfinite(x));
  for (const LayerTrace& t : tr.layers) {
    EXPECT_GT(t.density, 0.0);
    EXPECT_LE(t.density, 1.0);
    EXPECT_GE(t.mass_recall, 0.0);
    EXPECT_LE(t.mass_recall, 1.0 + 1e-9);
    EXPECT_EQ(t.f1_per_head.size(), size_t(kHeads));
  }

  // Probes on the dense run: layer 0 sees the same q/k/v in every run, so RR probed there equals
  // the RR run's own layer-0 comparison exactly; at later layers the runs differ.
  PrefillOptions probed = dense;
  probed.probes = {rr.method.estimate};
  probed.probe_outputs = true;
  PrefillTrace pt;
  const std::vector<float> lp = m.prefill(tokens, probed, &pt);
  EXPECT_EQ(lp, ld);  // probing does not change the run
  ASSERT_EQ(pt.layers[0].probes.size(), 1u);
  const LayerTrace& a = pt.layers[0].probes[0];
  const LayerTrace& b = tr.layers[0];
  EXPECT_EQ(a.density, b.density);
  EXPECT_EQ(a.mass_recall, b.mass_recall);
  EXPECT_EQ(a.f1, b.f1);
  EXPECT_EQ(a.f1_per_head, b.f1_per_head);
  EXPECT_EQ(a.out_rel_err, b.out_rel_err);

  // The KV cache: prefill(n − 1) + decode(last) == prefill(n) at the last position.
  std::vector<int32_t> head(tokens.begin(), tokens.end() - 1);
  m.prefill(head, dense);
  const std::vector<float> step = m.decode(tokens.back());
  EXPECT_EQ(m.cached(), int64_t(tokens.size()));
  // Different GEMM shapes sum in another order: f32 rounding of logits near 10 is ~1e-5 relative, twice that allowed.
  for (size_t i = 0; i < ld.size(); ++i) ASSERT_NEAR(step[i], ld[i], 2e-5 * std::max(10.f, std::fabs(ld[i]))) << i;
  // Greedy generation continues from the cache.
  const std::vector<int32_t> gen = m.generate(tokens, 3, dense);
  EXPECT_EQ(gen.size(), 3u);
  EXPECT_EQ(gen[0], argmax(ld));
}

TEST(Llm, RefusesBadModels) {
  std::vector<uint8_t> bytes = tiny_llama_bytes(false);
  const GgufFile ok = GgufFile::parse(bytes.data(), bytes.size(), "tiny.gguf");
  EXPECT_NO_THROW(LlamaModel::from_gguf(ok));
  const std::vector<uint8_t> empty = gguf_serialize({{"general.architecture", gguf_str("gpt2")}}, {});
  const GgufFile wrong = GgufFile::parse(empty.data(), empty.size(), "wrong.gguf");
  try {
    LlamaModel::from_gguf(wrong);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("general.architecture"), std::string::npos) << e.what();
  }
  LlamaModel m = LlamaModel::from_gguf(ok);
  EXPECT_THROW(m.decode(1), Error);  // nothing prefilled
  PrefillOptions po;
  po.method.dense = true;
  EXPECT_THROW(m.prefill({}, po), Error);
  EXPECT_THROW(m.prefill({kVocab}, po), Error);
}

TEST(Llm, RetrievalTasksAndScoring) {
  EXPECT_TRUE(retrieval_correct(" 71432. Remember", "71432"));
  EXPECT_FALSE(retrieval_correct(" 714321", "71432"));
  EXPECT_FALSE(retrieval_correct(" 7143", "71432"));
  EXPECT_FALSE(retrieval_correct(" none", "71432"));
  const std::string path = llm_model_path();
  if (path.empty()) GTEST_SKIP() << "SmolLM2 GGUF absent: " << llm_model_hint();
  const GgufFile f = GgufFile::open(path);
  const BpeTokenizer tok = BpeTokenizer::from_gguf(f);
  for (const char* kind : {"passkey", "niah"})
    for (double depth : {0.0, 0.5, 1.0}) {
      const RetrievalTask t = make_retrieval_task(kind, tok, 1024, depth, 3);
      EXPECT_LE(t.tokens, 1024);
      EXPECT_GT(t.tokens, 1000);  // within one filler group (~25 tokens) of the target
      EXPECT_NE(t.prompt.find(t.answer), std::string::npos);
      EXPECT_EQ(int64_t(tok.encode(t.prompt, false).size()), t.tokens);
    }
  EXPECT_NE(make_retrieval_task("passkey", tok, 1024, 0.5, 1).answer,
            make_retrieval_task("passkey", tok, 1024, 0.5, 2).answer);
  EXPECT_THROW(make_retrieval_task("sum", tok, 1024, 0.5, 1), Error);
  EXPECT_THROW(make_retrieval_task("passkey", tok, 20, 0.5, 1), Error);
  EXPECT_THROW(make_retrieval_task("passkey", tok, 1024, 1.5, 1), Error);
}

// Logits of HF transformers on the same GGUF (scripts/llm_reference.py).
TEST(Llm, SmolLM2LogitsMatchHF) {
  const std::string path = llm_model_path();
  if (path.empty()) GTEST_SKIP() << "SmolLM2 GGUF absent: " << llm_model_hint();
  const char* src = std::getenv("ARIADNE_SOURCE_DIR");
  const std::string ref_path = std::string(src ? src : ".") + "/tests/data/smollm2_reference.json";
  std::ifstream in(ref_path);
  ASSERT_TRUE(in) << ref_path;
  const nlohmann::json ref = nlohmann::json::parse(in);
  const GgufFile f = GgufFile::open(path);
  LlamaModel m = LlamaModel::from_gguf(f);
  EXPECT_EQ(m.config().layers, 30);
  EXPECT_EQ(m.config().heads, 9);
  EXPECT_EQ(m.config().kv_heads, 3);
  EXPECT_EQ(m.config().context, 8192);
  EXPECT_TRUE(m.config().tied);
  PrefillOptions po;
  po.method.dense = true;
  const std::vector<float> logits = m.prefill(ref["prompt_ids"].get<std::vector<int32_t>>(), po);
  const auto top = ref["top_ids"].get<std::vector<int32_t>>();
  const auto top_logits = ref["top_logits"].get<std::vector<double>>();
  EXPECT_EQ(argmax(logits), top[0]);
  for (size_t i = 0; i < top.size(); ++i) EXPECT_NEAR(logits[size_t(top[i])], top_logits[i], 2e-3) << "id " << top[i];
  const auto probe = ref["probe_ids"].get<std::vector<int32_t>>();
  const auto probe_logits = ref["probe_logits"].get<std::vector<double>>();
  for (size_t i = 0; i < probe.size(); ++i)
    EXPECT_NEAR(logits[size_t(probe[i])], probe_logits[i], 2e-3) << "id " << probe[i];
}

}  // namespace
}  // namespace ariadne
