// Synthetic long-context q/k/v with planted head structures (see synthetic.hpp for the head types).
#include "workloads/synthetic.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "ariadne/attention.hpp"
#include "core/parse.hpp"

namespace ariadne {

const char* head_type_name(HeadType t) {
  switch (t) {
    case HeadType::sink: return "sink";
    case HeadType::local: return "local";
    case HeadType::slash: return "slash";
    case HeadType::stripe: return "stripe";
    case HeadType::needle: return "needle";
    case HeadType::diffuse: return "diffuse";
  }
  return "?";
}

std::vector<HeadType> parse_head_mix(const std::string& mix) {
  static const HeadType all[] = {HeadType::sink, HeadType::local, HeadType::slash,
                                 HeadType::stripe, HeadType::needle, HeadType::diffuse};
  std::vector<HeadType> out;
  std::stringstream ss(mix);
  std::string entry;
  while (std::getline(ss, entry, ',')) {
    const size_t colon = entry.find(':');
    const std::string name = entry.substr(0, colon);
    int count = 1;
    if (colon != std::string::npos) {
      const std::string n = entry.substr(colon + 1);
      const auto v = parse_int(n);
      count = v && *v >= 1 && *v <= 1 << 20 ? int(*v) : 0;
      ARIADNE_CHECK(count >= 1, "synthetic mix '", mix, "': entry '",
                    entry, "' has count '", n, "', expected an integer >= 1");
    }
    const HeadType* t = std::find_if(std::begin(all), std::end(all),
                                     [&](HeadType x) { return name == head_type_name(x); });
    ARIADNE_CHECK(t != std::end(all), "synthetic mix '", mix, "': unknown head type '", name,
                  "', expected sink, local, slash, stripe, needle or diffuse");
    out.insert(out.end(), size_t(count), *t);
  }
  ARIADNE_CHECK(!out.empty(), "synthetic mix is empty, expected e.g. 'sink:2,local:2,stripe:2,needle:2'");
  return out;
}

namespace {

// Counter-based randomness: each (stream, token, head) gets its own generator, so the output does
// not depend on the thread count.
struct Rng {
  uint64_t s;
  Rng(uint64_t seed, uint64_t a, uint64_t b, uint64_t c)
      : s(seed ^ (a * 0x9E3779B97F4A7C15ull) ^ (b * 0xC2B2AE3D27D4EB4Full) ^ (c * 0x165667B19E3779F9ull)) {
    next();
  }
  uint64_t next() {  // splitmix64
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return (double(next() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }  // (0, 1)
  double normal() { return std::sqrt(-2.0 * std::log(uniform())) * std::cos(6.283185307179586 * uniform()); }
  int64_t below(int64_t n) { return int64_t(next() % uint64_t(n)); }
};

enum Stream : uint64_t { kDirs = 1, kQ, kK, kV, kLayout };

// A random unit vector in the fast half of the rotate-half pairs (i mod d/2 < d/4) or, with
// slow = true, in the slow half, orthogonal to every vector in `others` (Gram–Schmidt). The two
// halves are invariant under RoPE, so absolute directions (slow half) never leak into the RoPE
// bands (fast half) at any position, and planted directions never alias each other.
std::vector<float> unit(Rng& r, int d, bool slow, const std::vector<std::vector<float>>& others = {}) {
  std::vector<float> u(size_t(d), 0.f);
  for (int i = 0; i < d; ++i)
    if (((i % (d / 2)) >= d / 4) == slow) u[size_t(i)] = float(r.normal());
  for (const auto& o : others) {
    double dot = 0;
    for (int i = 0; i < d; ++i) dot += double(u[size_t(i)]) * o[size_t(i)];
    for (int i = 0; i < d; ++i) u[size_t(i)] -= float(dot * o[size_t(i)]);
  }
  double n2 = 0;
  for (float x : u) n2 += double(x) * x;
  for (float& x : u) x = float(x / std::sqrt(n2));
  return u;
}

// Rotate-half RoPE of x (length d) at position `pos` (may be negative), in place.
void rope(float* x, int d, double pos, double theta) {
  const int h = d / 2;
  for (int i = 0; i < h; ++i) {
    const double a = pos * std::pow(theta, -2.0 * i / d);
    const double c = std::cos(a), s = std::sin(a);
    const double x0 = x[i], x1 = x[i + h];
    x[i] = float(x0 * c - x1 * s);
    x[i + h] = float(x1 * c + x0 * s);
  }
}

}  // namespace

Synthetic make_synthetic(const SyntheticConfig& c) {
  ARIADNE_CHECK(c.tokens >= 1, "synthetic: tokens is ", c.tokens, ", expected >= 1");
  ARIADNE_CHECK(c.heads_kv >= 1 && c.heads_q >= 1 && c.heads_q % c.heads_kv == 0, "synthetic: heads_q ",
                c.heads_q, " must be a positive multiple of heads_kv ", c.heads_kv);
  ARIADNE_CHECK(c.dim >= 4 && c.dim % 4 == 0, "synthetic: dim is ", c.dim, ", expected a multiple of 4");
  ARIADNE_CHECK(c.rope_theta > 1, "synthetic: rope_theta is ", c.rope_theta, ", expected > 1");
  const std::vector<HeadType> mix = parse_head_mix(c.mix);
  const int64_t N = c.tokens;
  const int d = c.dim, hq = c.heads_q, hkv = c.heads_kv, group = hq / hkv;
  const double L = std::log(double(N)), sqd = std::sqrt(double(d));
  // Planted key directions have norm kGamma; a query's matching component is sized so that the
  // logit (q·k/√d) equals the wanted strength λ: β = λ·√d / kGamma.
  constexpr double kGamma = 12.0, kNoise = 0.75;
  const auto beta = [&](double lambda) { return float(lambda * sqd / kGamma); };

  Synthetic out;
  out.head_types.resize(size_t(hq));
  for (int h = 0; h < hq; ++h) out.head_types[size_t(h)] = mix[size_t(h) % mix.size()];
  out.slash_offset.assign(size_t(hq), 0);
  for (int64_t t = 0; t < std::min<int64_t>(4, N); ++t) out.sink_keys.push_back(t);

  // ---- layout: directions, stripe columns, needles ----
  Rng lay(c.seed, kLayout, 0, 0);
  std::vector<std::vector<float>> w_sink, w_stripe, u_local;
  for (int g = 0; g < hkv; ++g) {
    Rng r(c.seed, kDirs, uint64_t(g), 0);
    w_sink.push_back(unit(r, d, true));
    w_stripe.push_back(unit(r, d, true, {w_sink.back()}));
    u_local.push_back(unit(r, d, false));
    std::vector<int64_t> cols;
    for (int i = 0; i < 16; ++i) cols.push_back(lay.below(N));
    std::sort(cols.begin(), cols.end());
    cols.erase(std::unique(cols.begin(), cols.end()), cols.end());
    out.stripe_keys.push_back(cols);
  }
  std::vector<std::vector<float>> w_needle;
  for (int h = 0; h < hq; ++h) {
    if (out.head_types[size_t(h)] == HeadType::slash) out.slash_offset[size_t(h)] = 64 + lay.below(960);
    // Needles need room: a key span in [N/16, N/2) and a query group in [N/2, N).
    if (out.head_types[size_t(h)] != HeadType::needle || N < 256) continue;
    for (int i = 0; i < 4; ++i) {
      Needle nd;
      nd.head = h;
      nd.k_lo = N / 16 + lay.below(std::max<int64_t>(1, N / 2 - N / 16 - 32));
      nd.k_hi = nd.k_lo + 32;
      nd.q_lo = N / 2 + lay.below(N - N / 2 - 16);
      nd.q_hi = nd.q_lo + 16;
      out.needles.push_back(nd);
      // Orthogonal to the KV head's sink and stripe and to its earlier needles while the slow
      // half has room (d/2 dimensions), random in it afterwards.
      const int g = h / group;
      std::vector<std::vector<float>> taken{w_sink[size_t(g)], w_stripe[size_t(g)]};
      for (size_t j = 0; j + 1 < out.needles.size(); ++j)
        if (out.needles[j].head / group == g) taken.push_back(w_needle[j]);
      if (int(taken.size()) >= d / 2) taken.clear();
      Rng r(c.seed, kDirs, 1000 + out.needles.size(), 0);
      w_needle.push_back(unit(r, d, true, taken));
    }
  }

  out.q = Buffer(DType::f32, {N, hq, d});
  out.k = Buffer(DType::f32, {N, hkv, d});
  out.v = Buffer(DType::f32, {N, hkv, d});
  float* Q = out.q.as<float>();
  float* K = out.k.as<float>();
  float* V = out.v.as<float>();
  // Local band: k carries alpha·u, a query a·u with a = λ·√d / alpha gives a band of λ nats at
  // distance 0. local, slash and needle heads take λ = L + 5 (alpha·u on both sides); stripe
  // heads a band at L + 3 and sink heads one at L + 2, so that their own structure keeps its share
  // of their mass (see synthetic.hpp and docs/rrattention.md, "The synthetic mix").
  const double lambda_local = L + 5;
  const float alpha = float(std::sqrt(lambda_local * sqd));
  const auto band = [&](HeadType t) {
    const double lambda = t == HeadType::sink ? L + 2 : t == HeadType::stripe ? L + 3 : lambda_local;
    return float(lambda * sqd / alpha);
  };

#pragma omp parallel for schedule(static) num_threads(cpu_threads())
  for (int64_t n = 0; n < N; ++n) {
    std::vector<float> x(static_cast<size_t>(d));
    for (int g = 0; g < hkv; ++g) {
      Rng r(c.seed, kK, uint64_t(n), uint64_t(g));
      for (int i = 0; i < d; ++i) x[size_t(i)] = float(kNoise * r.normal()) + alpha * u_local[size_t(g)][size_t(i)];
      rope(x.data(), d, double(n), c.rope_theta);
      const bool is_sink = n < 4;
      const bool is_stripe = std::binary_search(out.stripe_keys[size_t(g)].begin(), out.stripe_keys[size_t(g)].end(), n);
      for (int i = 0; i < d; ++i) {
        float a = 0;
        if (is_sink) a += float(kGamma) * w_sink[size_t(g)][size_t(i)];
        if (is_stripe) a += float(kGamma) * w_stripe[size_t(g)][size_t(i)];
        for (size_t j = 0; j < out.needles.size(); ++j) {
          const Needle& nd = out.needles[j];
          if (nd.head / group == g && n >= nd.k_lo && n < nd.k_hi) a += float(kGamma) * w_needle[j][size_t(i)];
        }
        K[(n * hkv + g) * d + i] = x[size_t(i)] + a;
      }
      Rng rv(c.seed, kV, uint64_t(n), uint64_t(g));
      for (int i = 0; i < d; ++i) V[(n * hkv + g) * d + i] = float(rv.normal());
    }
    for (int h = 0; h < hq; ++h) {
      const int g = h / group;
      const HeadType type = out.head_types[size_t(h)];
      Rng r(c.seed, kQ, uint64_t(n), uint64_t(h));
      for (int i = 0; i < d; ++i) x[size_t(i)] = float(kNoise * r.normal());
      // A needle head's retrieving queries look at their needle instead of the band.
      bool retrieving = false;
      for (const Needle& nd : out.needles) retrieving = retrieving || (nd.head == h && n >= nd.q_lo && n < nd.q_hi);
      if (type != HeadType::diffuse && !retrieving) {
        // slash: the content is u pre-rotated by −δ, so q_m·k_n peaks at n = m − δ.
        std::vector<float> u = u_local[size_t(g)];
        if (type == HeadType::slash) rope(u.data(), d, -double(out.slash_offset[size_t(h)]), c.rope_theta);
        const float a = band(type);
        for (int i = 0; i < d; ++i) x[size_t(i)] += a * u[size_t(i)];
      }
      rope(x.data(), d, double(n), c.rope_theta);
      const float b_sink = beta(type == HeadType::sink ? L + 4 : L - 2.5);
      for (int i = 0; i < d; ++i) {
        float a = b_sink * w_sink[size_t(g)][size_t(i)];
        if (type == HeadType::stripe) a += beta(L + 1) * w_stripe[size_t(g)][size_t(i)];
        Q[(n * hq + h) * d + i] = x[size_t(i)] + a;
      }
      for (size_t j = 0; j < out.needles.size(); ++j) {
        const Needle& nd = out.needles[j];
        if (nd.head == h && n >= nd.q_lo && n < nd.q_hi)
          for (int i = 0; i < d; ++i) Q[(n * hq + h) * d + i] += beta(L + 3) * w_needle[j][size_t(i)];
      }
    }
  }
  return out;
}

}  // namespace ariadne
