// ariadne/synthetic.hpp — seeded long-context q/k/v with the attention structures real LLM heads
// show, planted with a known ground truth, for measuring estimators without a model.
//
// Every q/k row is RoPE'd (NeoX / Llama rotate-half convention, inv_freq_i = θ^(−2i/d)) at its
// token position. Each vector is R_n·c_n + a_n: a pre-RoPE content c_n rotated to position n,
// plus an absolute part a_n; a_n = R_n·(R_n^−1·a_n) is still the rotation of a pre-RoPE vector, so
// the output is exactly what a model with those pre-RoPE q/k would produce. Relative structures
// (bands) come from RoPE itself; absolute ones (sink, stripes, needles) from a_n.
//
// Logit strengths are in nats relative to L = ln(N), so the share of mass a structure takes is
// roughly the same at 8K and 128K. Background: q and k carry N(0, 0.75²) noise per dimension
// (background logits of std ≈ 0.56). Head types (one per query head):
//   sink    keys 0..3 carry a sink direction; every query aligns with it at L + 1 nats: about 90%
//           of each row's mass lands in key block 0, the rest is diffuse.
//   local   queries and keys share a pre-RoPE direction u whose energy sits in the fast-rotating
//           half of the frequencies; RoPE turns q·k into Σ_i |u_i|² cos((m − n)·ω_i): a band along
//           the diagonal (peak L + 3 nats at distance 0, fading within ~100 tokens).
//   slash   as local with the query pre-rotated by −δ (δ per head in [64, 1024)): a band at
//           n = m − δ, a slash line parallel to the diagonal.
//   stripe  16 key positions per KV head (uniform over the sequence) carry a stripe direction;
//           every query aligns with it at L − 0.5 nats: vertical lines in the attention map.
//   needle  4 needles per head: 32 consecutive keys at a random position in [N/16, N/2) carry a
//           needle direction, and 16 consecutive queries at a random position in [N/2, N) retrieve
//           them at L + 2 nats; every other query of the head is diffuse.
//   diffuse only the noise (and the weak sink every type has).
// Every type except sink also aligns with the sink keys at L − 1 nats (a weak sink, as in real
// heads). Key-side structures are planted in every KV head; query heads decide what to look at.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ariadne/tensor.hpp"

namespace ariadne {

enum class HeadType : uint8_t { sink, local, slash, stripe, needle, diffuse };
const char* head_type_name(HeadType t);

// "sink:2,local:2,stripe:2,needle:2" → the expanded list [sink, sink, local, ...]. Query head h
// gets entry h mod size (so a GQA group mixes types, as in real models). Counts must be >= 1;
// unknown names, empty entries and malformed counts throw naming the entry.
std::vector<HeadType> parse_head_mix(const std::string& mix);

struct SyntheticConfig {
  int64_t tokens = 4096;
  int heads_q = 8, heads_kv = 2, dim = 128;  // dim even
  double rope_theta = 10000;                  // 10000 (Llama-2 / Qwen2) or 500000 (Llama-3)
  std::string mix = "sink:2,local:2,stripe:2,needle:2";
  uint64_t seed = 1;
};

// Ground truth of one needle: queries [q_lo, q_hi) of query head `head` retrieve keys [k_lo, k_hi).
struct Needle {
  int head = 0;
  int64_t q_lo = 0, q_hi = 0, k_lo = 0, k_hi = 0;
};

struct Synthetic {
  Buffer q;  // f32 [tokens, heads_q, dim], post-RoPE
  Buffer k;  // f32 [tokens, heads_kv, dim], post-RoPE
  Buffer v;  // f32 [tokens, heads_kv, dim], N(0, 1)
  std::vector<HeadType> head_types;               // [heads_q]
  std::vector<int64_t> slash_offset;              // [heads_q]: δ for slash heads, 0 otherwise
  std::vector<std::vector<int64_t>> stripe_keys;  // [heads_kv][16]: sorted key positions
  std::vector<int64_t> sink_keys;                 // {0, 1, 2, 3} (those < tokens)
  std::vector<Needle> needles;
};

// Deterministic for a given config (own RNG: splitmix64 + Box–Muller). Throws ariadne::Error on
// tokens < 1, heads_q not a multiple of heads_kv, odd or non-positive dim, θ <= 1, or a bad mix.
Synthetic make_synthetic(const SyntheticConfig& c);

}  // namespace ariadne
