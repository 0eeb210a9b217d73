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
// (background logits of std ≈ 0.56). Planted key directions have norm 12, so query noise adds
// N(0, ≈1.1²) nats to a planted key's logit. Directions: the local-band vector u lives in the
// fast half of the rotate-half pairs (i mod d/2 < d/4); sink, stripe and needle directions live
// in the slow half and are mutually orthogonal per KV head, so they never leak into each other or
// into the RoPE bands at any position. Head types (one per query head); every type but diffuse
// has the local band of its query's position, as real heads at long context do (StreamingLLM's
// sink + recent window, MInference's A-shape and vertical-slash heads; docs/rrattention.md, "The
// synthetic mix", gives the mass each part takes):
//   sink    keys 0..3 carry a sink direction; every query aligns with it at L + 4 nats, plus a
//           local band at L + 2: the sink block holds most of each row's mass, the diagonal most
//           of the rest (an A-shape head).
//   local   queries and keys share the pre-RoPE direction u; RoPE turns q·k into
//           (L + 5)·Σ_i |u_i|² cos((m − n)·ω_i): a band along the diagonal that fades within
//           ~100 tokens (RoPE's long-range decay).
//   slash   as local with the query pre-rotated by −δ (δ per head, uniform in [64, 1024)): a band
//           at n = m − δ, a slash line parallel to the diagonal.
//   stripe  16 key positions per KV head (uniform over the sequence) carry a stripe direction;
//           every query aligns with it at L + 1 nats: vertical lines in the attention map (single
//           tokens: a stride-level estimate sees each diluted S-fold), plus a local band at L + 3
//           (a vertical-slash head: stripes and band share the mass about evenly).
//   needle  a local head (band at L + 5) that also retrieves: 4 needles per head (tokens >= 256):
//           32 consecutive keys at a random position in [N/16, N/2) carry a needle direction,
//           and 16 consecutive queries at a random position in [N/2, N) retrieve them at L + 3
//           nats; those queries drop the band (most of their mass is on the needle).
//   diffuse only the noise (and the weak sink every type has): no structure at all.
// Every type except sink also aligns with the sink keys at L − 2.5 nats (a weak sink, as in real
// heads). Key-side structures are planted in every KV head; query heads decide what to look at.
// v is i.i.d. N(0, 1) (zero mean: the output relative error of diffuse heads is large whenever any
// of their mass is dropped, since their dense output is a short average of random vectors).
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
