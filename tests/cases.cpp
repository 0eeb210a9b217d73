// The attention case table and its runner (see cases.hpp).
#include "cases.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <ostream>
#include <random>
#include <set>
#include <sstream>

namespace ariadne::testing {

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Built with += only: GCC 12 at -O3 raises a false -Wrestrict on "literal" + std::string.
std::string join(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  return s;
}

// 2.5 → "2.5", 10 → "10", 1e4 → "10000".
std::string number(double x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

std::string signed_number(float x) {
  if (std::isinf(x)) return x > 0 ? "+inf" : "-inf";
  std::string s = x >= 0 ? "+" : "";
  s += number(x);
  return s;
}

}  // namespace

std::string name_of(const AttnCase& c) {
  std::string n = "n";
  n += join(c.tokens_q);
  if (!c.tokens_k.empty() && c.tokens_k != c.tokens_q) {
    n += "_k";
    n += join(c.tokens_k);
  }
  n += "_h";
  n += std::to_string(c.heads_q);
  n += 'x';
  n += std::to_string(c.heads_kv);
  n += "_d";
  n += std::to_string(c.dim);
  n += '_';
  n += c.pattern;
  if (c.sink_mode != SinkMode::none) {
    n += "_sink:";
    n += sink_mode_name(c.sink_mode);
    n += std::isnan(c.sink) ? std::string(":rand") : signed_number(c.sink);
  }
  n += '_';
  n += dtype_name(c.dtype);
  if (c.f32_out && c.dtype != DType::f32) n += "_outf32";
  if (c.order == TokenOrder::column_major) {
    n += "_order:col";
    n += std::to_string(c.grid_cols);
  }
  if (c.order == TokenOrder::shuffled) n += "_order:shuffled";
  if (c.token_pad > 0) {
    n += "_pad";
    n += std::to_string(c.token_pad);
  }
  if (c.input_scale != 1) {
    n += "_x";
    n += number(c.input_scale);
  }
  if (c.logit_shift != 0) {
    n += "_shift";
    n += signed_number(c.logit_shift);
  }
  if (c.diagnostics) n += "_diag";
  if (!c.lse) n += "_nolse";
  n += "_s";
  n += std::to_string(c.seed);
  return n;
}

std::string test_name_of(const AttnCase& c) {
  std::string out;
  for (const char ch : name_of(c)) {
    if (std::isalnum(static_cast<unsigned char>(ch)) || ch == '_') out += ch;
    else if (ch == '+') out += 'p';
    else if (ch == '-') out += 'm';
    else if (ch == '.') out += 'o';
    else if (ch == '@') out += 'b';
    else out += '_';  // ':' and ','
  }
  return out;
}

std::string test_name(const ::testing::TestParamInfo<AttnCase>& info) { return test_name_of(info.param); }

void PrintTo(const AttnCase& c, std::ostream* os) { *os << name_of(c); }

PatternSpec parse_case_pattern(const std::string& spec) {
  PatternSpec ps;
  ps.dense = Pattern::full();
  auto side = [&](const std::string& s) -> int64_t {
    if (s == "inf") return kUnbounded;
    return std::stoll(s);
  };
  std::stringstream parts(spec);
  std::string part;
  while (std::getline(parts, part, '+')) {
    const auto colon = part.find(':');
    const std::string kind = part.substr(0, colon), arg = colon == std::string::npos ? "" : part.substr(colon + 1);
    if (kind == "full") continue;
    if (kind == "causal") {
      ps.dense.window_right = 0;
    } else if (kind == "window") {
      const auto comma = arg.find(',');
      ARIADNE_CHECK(comma != std::string::npos, "case pattern '", spec, "': window needs L,R");
      ps.dense.window_left = side(arg.substr(0, comma));
      ps.dense.window_right = side(arg.substr(comma + 1));
    } else if (kind == "chunk") {
      ps.dense.chunk = std::stoll(arg);
    } else if (kind == "blocks") {
      const auto at = arg.find('@');
      ARIADNE_CHECK(at != std::string::npos, "case pattern '", spec, "': blocks needs D@B");
      ps.block_density = std::stod(arg.substr(0, at));
      ps.block = int32_t(std::stoi(arg.substr(at + 1)));
    } else {
      ARIADNE_CHECK(false, "case pattern '", spec, "': unknown part '", part, "'");
    }
  }
  return ps;
}

// ---------------------------------------------------------------------------------------------
// The table
// ---------------------------------------------------------------------------------------------
AttnCase make_case(std::vector<int64_t> q, std::vector<int64_t> k, int hq, int hkv, int dim, std::string pattern,
                   DType dt, uint64_t seed) {
  AttnCase c;
  c.tokens_q = std::move(q);
  c.tokens_k = std::move(k);
  c.heads_q = hq;
  c.heads_kv = hkv;
  c.dim = dim;
  c.pattern = std::move(pattern);
  c.dtype = dt;
  c.seed = seed;
  return c;
}

namespace {

const DType kAllDtypes[] = {DType::f32, DType::bf16, DType::f16};
const DType kHalfDtypes[] = {DType::bf16, DType::f16};


std::string window(int64_t l, int64_t r) {
  auto side = [](int64_t x) { return x == kUnbounded ? std::string("inf") : std::to_string(x); };
  std::string s = "window:";
  s += side(l);
  s += ',';
  s += side(r);
  return s;
}

// "a" + "b" + "c" without operator+ (see join).
std::string cat(std::initializer_list<std::string> parts) {
  std::string s;
  for (const std::string& p : parts) s += p;
  return s;
}

// The CPU backend's sweeps: every dtype, f32 out, with the diagnostics; GQA 2:1 and d 64 unless
// a case says otherwise.
void cpu_sweeps(std::vector<AttnCase>& t) {
  auto add = [&](std::vector<int64_t> q, std::vector<int64_t> k, std::string pat, DType dt, int hq = 4, int hkv = 2,
                 int dim = 64, uint64_t seed = 1) -> AttnCase& {
    AttnCase c = make_case(std::move(q), std::move(k), hq, hkv, dim, std::move(pat), dt, seed);
    c.f32_out = true;
    c.diagnostics = true;
    t.push_back(c);
    return t.back();
  };
  for (DType dt : kAllDtypes) {
    // Lengths not divisible by the tiles.
    for (int64_t n : {1, 31, 33, 65, 100}) add({n}, {}, "full", dt);
    // Head dims.
    for (int d : {16, 33, 80, 128}) add({70}, {}, "full", dt, 2, 1, d);
    // Packed batches with empty and one-token sequences: sequence 2 has keys but no queries,
    // sequence 4 queries but no keys (fully masked rows).
    for (const char* pat : {"causal", "full"}) add({37, 1, 0, 130, 3}, {37, 1, 17, 150, 0}, pat, dt).must_mask = true;
    // GQA 4:1 over strided views.
    add({90, 45}, {}, window(20, 9), dt, 8, 2, 80).token_pad = 7;
    // Causal with fewer queries than keys (chunked prefill).
    add({50, 7}, {200, 40}, "causal", dt);
    // Fully masked rows: causal with lq > lk puts the first 60 queries before key 0.
    add({100}, {40}, "causal", dt).must_mask = true;
    for (SinkMode mode : {SinkMode::denominator, SinkMode::key0_bias}) {
      AttnCase& c = add({100}, {40}, "causal", dt);
      c.sink_mode = mode;
      c.sink = 2.5f;
      c.must_mask = true;
    }
    // Windows and chunks.
    add({300}, {}, window(64, 64), dt);
    add({77}, {}, window(5, 0), dt);
    add({60}, {99}, window(0, 17), dt);
    add({45}, {}, window(0, 0), dt);
    add({200, 64, 10}, {}, "chunk:64", dt);
    add({40}, {61}, "chunk:7", dt);
    add({150}, {}, cat({"chunk:48+", window(10, kUnbounded)}), dt);
    // Block-sparse masks (half the visible blocks, no diagonal kept: some rows fully masked).
    struct B {
      int block;
      const char* dense;
      std::vector<int64_t> q, k;
    };
    for (const B& b : {B{64, "causal", {300}, {}}, B{48, "full", {150, 97}, {}}, B{16, "window:40,40", {130}, {}},
                       B{32, "causal", {70, 33}, {150, 33}}, B{100, "full", {250}, {}}})
      add(b.q, b.k, cat({b.dense, "+blocks:0.5@", std::to_string(b.block)}), dt, 4, 1);
    // Sinks of both forms: ±10 and random per head.
    for (SinkMode mode : {SinkMode::denominator, SinkMode::key0_bias})
      for (float v : {-10.f, 10.f, kNaN}) {
        AttnCase& c = add({70, 1, 40}, {}, window(16, 16), dt);
        c.sink_mode = mode;
        c.sink = v;
      }
    // Logits near ±1e4: inputs of ±35 at d 64 give |logits| up to 35²·64/8 ≈ 1e4.
    add({80, 20}, {}, "full", dt).input_scale = 35;
    AttnCase& big = add({80, 20}, {}, "causal", dt);
    big.input_scale = 35;
    big.sink_mode = SinkMode::denominator;
    big.sink = 10;
    // Narrow patterns over more than one stream work item (16 query tiles): the key-tile ring
    // wraps many times, items start mid-sequence, GQA heads share an item's ring.
    add({1100, 70}, {}, window(100, 30), dt, 4, 2, 80);
    add({1090}, {1200}, "chunk:200", dt, 2, 1, 48);
    add({1030}, {}, cat({window(64, 64), "+blocks:0.6@48"}), dt, 2, 1, 32);
  }
  // Denominator sinks of ±inf: −inf is the plain softmax, +inf takes every row's mass.
  for (float v : {-kInf, kInf}) {
    AttnCase& c = add({40, 9}, {}, "causal", DType::f32);
    c.sink_mode = SinkMode::denominator;
    c.sink = v;
    c.diagnostics = v < 0;
  }
  // Outputs in the input's 16-bit dtype.
  for (DType dt : kHalfDtypes) {
    AttnCase& c = add({90}, {}, window(30, 30), dt);
    c.f32_out = false;
    c.diagnostics = false;
  }
  // Random shapes: lengths, packed batches, patterns, dtypes, GQA ratios, head dims, masks, sinks.
  std::mt19937_64 rng(2024);
  auto pick = [&](int n) { return int(rng() % uint64_t(n)); };
  for (int i = 0; i < 24; ++i) {
    const int nseq = 1 + pick(3);
    std::vector<int64_t> sq, sk;
    for (int s = 0; s < nseq; ++s) {
      sq.push_back(s == 0 ? 1 + pick(140) : pick(140));
      sk.push_back(pick(3) == 0 ? sq.back() + pick(60) : sq.back());
    }
    std::string pat;
    switch (pick(5)) {
      case 0: pat = "full"; break;
      case 1: pat = "causal"; break;
      case 2: {
        const int l = pick(70);
        pat = window(l, pick(70));
        break;
      }
      case 3: pat = cat({"chunk:", std::to_string(1 + pick(70))}); break;
      default: {
        const bool unbounded = pick(3) == 0;
        pat = window(unbounded ? kUnbounded : pick(90), 0);
        break;
      }
    }
    const DType dt = kAllDtypes[pick(3)];
    const int hkv = 1 + pick(2), hq = hkv * (1 + pick(4));
    const int dims[] = {8, 33, 64, 80};
    const int dim = dims[pick(4)];
    AttnCase c = make_case(sq, sk == sq ? std::vector<int64_t>{} : sk, hq, hkv, dim, pat, dt, 100 + uint64_t(i));
    c.f32_out = true;
    c.diagnostics = true;
    if (pick(3) == 0) {
      const double density = 0.6;
      c.pattern += cat({"+blocks:", number(density), "@", std::to_string(16 * (1 + pick(5)))});
    }
    if (pick(2) == 0) {
      c.sink_mode = pick(2) ? SinkMode::denominator : SinkMode::key0_bias;
      c.sink = kNaN;
    }
    c.token_pad = pick(2) * 5;
    t.push_back(c);
  }
}

// The numerical edges (docs/numerics.md, edge rows): fully masked rows, sinks of ±10 and ±inf,
// one-token sequences and decode shapes, head dims at both ends.
void edge_cases(std::vector<AttnCase>& t) {
  // Host shapes: GQA 2:1, d 16, f32.
  auto host = [](std::vector<int64_t> q, std::vector<int64_t> k, std::string pat, int dim = 16,
                 DType dt = DType::f32) {
    return make_case(std::move(q), std::move(k), 4, 2, dim, std::move(pat), dt, 11);
  };
  // Device shapes: GQA 2:1, d 64, bf16, f32 out.
  auto dev = [](std::vector<int64_t> q, std::vector<int64_t> k, std::string pat, int dim = 64,
                DType dt = DType::bf16) {
    AttnCase c = make_case(std::move(q), std::move(k), 4, 2, dim, std::move(pat), dt, 23);
    c.f32_out = true;
    return c;
  };
  for (const bool sink : {false, true}) {
    // Queries bottom-right aligned on fewer causal keys, queries without keys, keys without
    // queries; block-sparse rows left empty by the sampling.
    for (AttnCase c : {host({6, 5, 0, 3}, {4, 0, 3, 3}, "causal"), host({40, 9}, {}, "causal+blocks:0.25@4"),
                       dev({70, 65, 0, 3}, {40, 0, 3, 3}, "causal"), dev({200, 9}, {}, "causal+blocks:0.2@64")}) {
      c.must_mask = true;
      if (sink) {
        c.sink_mode = SinkMode::denominator;
        c.sink = 2.5f;
      }
      t.push_back(c);
    }
  }
  struct S {
    SinkMode mode;
    float value;
  };
  for (const S& s : {S{SinkMode::denominator, 10.f}, S{SinkMode::denominator, -10.f}, S{SinkMode::denominator, kInf},
                     S{SinkMode::denominator, -kInf}, S{SinkMode::key0_bias, 10.f}, S{SinkMode::key0_bias, -10.f},
                     S{SinkMode::key0_bias, -kInf}})
    for (AttnCase c : {host({33, 20}, {}, "causal"), dev({100, 33}, {}, "causal")}) {
      c.sink_mode = s.mode;
      c.sink = s.value;
      t.push_back(c);
    }
  // Logits near ±1e4 on top of small ones: every logit of a row moves by the same amount.
  for (const float shift : {1e4f, -1e4f}) {
    AttnCase c = dev({130}, {}, "causal");
    c.logit_shift = shift;
    t.push_back(c);
  }
  // Packed one-token sequences, one query against many keys (decode), a single token.
  for (const AttnCase& c : {host({1, 1, 0, 1}, {1, 1, 1, 0}, "causal"), host({1, 1}, {300, 7}, "causal"),
                            host({1}, {300}, window(16, 0)), dev({1, 1, 0, 1}, {1, 1, 1, 0}, "causal"),
                            dev({1, 1}, {300, 7}, "causal"), dev({1}, {300}, window(16, 0)),
                            dev({1}, {1}, "full", 64, DType::f16)})
    t.push_back(c);
  // Head dims at both ends (the reference and the CPU backend take any; CUDA declines some).
  for (const int d : {1, 3, 256, 512})
    for (const DType dt : {DType::f32, DType::bf16}) t.push_back(host({37, 5}, {}, "causal", d, dt));
  for (const int d : {32, 64, 80, 96, 128, 256}) t.push_back(dev({77, 130}, {}, "causal", d));
}

// The CUDA backend's sweeps: 16-bit inputs, out in the input dtype, the head dims its kernels serve.
void cuda_sweeps(std::vector<AttnCase>& t) {
  auto add = [&](std::vector<int64_t> q, std::vector<int64_t> k, int dim, DType dt, std::string pat, int hq = 4,
                 int hkv = 4) -> AttnCase& {
    t.push_back(make_case(std::move(q), std::move(k), hq, hkv, dim, std::move(pat), dt, 1));
    return t.back();
  };
  // Pattern × head dim × dtype × length; GQA 4:1 on half of the cases, MHA on the rest.
  for (const char* pat : {"full", "causal", "window:64,64", "window:17,5", "chunk:64", "chunk:48",
                          "causal+blocks:0.5@64", "full+blocks:0.4@128"})
    for (int dim : {64, 80, 96, 128})
      for (DType dt : kHalfDtypes)
        for (int64_t n : {1, 77, 300}) {
          const bool gqa = (dim / 16 + n) % 2 == 0;
          add({n}, {}, dim, dt, pat, gqa ? 8 : 4, gqa ? 2 : 4);
        }
  // Sinks of both forms, ±10 and random per head.
  for (SinkMode mode : {SinkMode::denominator, SinkMode::key0_bias})
    for (float sink : {10.f, -10.f, kNaN})
      for (const char* pat : {"full", "window:32,32", "causal"})
        for (int dim : {80, 128}) {
          AttnCase& c = add({190}, {}, dim, DType::bf16, pat, 8, 2);
          c.sink_mode = mode;
          c.sink = sink;
        }
  // Packed batches with one-token and empty sequences, with block masks and sinks.
  for (const char* pat : {"full", "causal", "window:20,3", "chunk:40"})
    for (DType dt : kHalfDtypes) add({1, 0, 130, 64, 5, 200, 1}, {}, 80, dt, pat, 8, 2);
  add({1, 0, 130, 64, 200}, {}, 64, DType::bf16, "causal+blocks:0.6@64");
  // Chunks that divide the 64-row tiles in a packed batch (the backward's direct dQ), with sinks.
  for (SinkMode mode : {SinkMode::none, SinkMode::denominator, SinkMode::key0_bias})
    for (int dim : {80, 128}) {
      AttnCase& c = add({1, 0, 130, 64, 5, 200, 1}, {}, dim, dim == 80 ? DType::bf16 : DType::f16, "chunk:32", 8, 2);
      c.sink_mode = mode;
      c.sink = mode == SinkMode::none ? 0.f : kNaN;
    }
  for (SinkMode mode : {SinkMode::denominator, SinkMode::key0_bias}) {
    AttnCase& c = add({1, 0, 70, 129}, {}, 96, DType::f16, "window:16,16");
    c.sink_mode = mode;
    c.sink = kNaN;
  }
  // Chunked prefill (lq < lk) and queries without keys.
  for (SinkMode mode : {SinkMode::none, SinkMode::denominator}) {
    AttnCase& c = add({50, 7, 33}, {300, 0, 33}, 128, DType::bf16, "causal");
    c.sink_mode = mode;
    c.sink = mode == SinkMode::none ? 0.f : 1.5f;
    c.must_mask = true;
  }
  add({70}, {451}, 64, DType::f16, "window:40,0");
  // Strided views; an f32 output.
  for (int64_t pad : {8, 24})
    for (int dim : {80, 96}) add({257}, {}, dim, DType::bf16, "window:64,64", 8, 2).token_pad = pad;
  add({150}, {}, 64, DType::f16, "causal").f32_out = true;
  // Many key tiles through the pipelines; larger logits stress the online maximum.
  add({1500}, {}, 80, DType::bf16, "full", 2, 2);
  add({400}, {}, 128, DType::f16, "causal").input_scale = 2;
  // A 24 × 20 token grid walked column-major (Ariadne's alternate layers) or shuffled.
  for (TokenOrder order : {TokenOrder::column_major, TokenOrder::shuffled})
    for (const char* pat : {"window:8,8", "chunk:24", "chunk:16", "causal"})
      for (int dim : {64, 80}) {
        AttnCase& c = add({24 * 20}, {}, dim, DType::bf16, pat, 8, 2);
        c.order = order;
        c.grid_cols = order == TokenOrder::column_major ? 20 : 0;
      }
  // Diagnostics (entropy, distance in the forward, received attention in the transposed pass) on
  // packed batches with empty and one-token sequences, every sink form, block masks; with and
  // without an LSE output.
  struct Diag {
    const char* pattern;
    SinkMode sink;
    int dim;
    bool lse;
  };
  for (const Diag& dg : {Diag{"full", SinkMode::none, 64, true}, Diag{"window:16,16", SinkMode::denominator, 80, true},
                         Diag{"window:20,3", SinkMode::key0_bias, 80, false}, Diag{"chunk:48", SinkMode::none, 96, false},
                         Diag{"causal+blocks:0.6@64", SinkMode::denominator, 128, true}})
    for (DType dt : kHalfDtypes) {
      AttnCase& c = add({1, 0, 130, 75, 200}, {}, dg.dim, dt, dg.pattern, 8, 2);
      c.sink_mode = dg.sink;
      c.sink = dg.sink == SinkMode::none ? 0.f : kNaN;
      c.diagnostics = true;
      c.lse = dg.lse;
    }
}

std::vector<AttnCase> build_table() {
  std::vector<AttnCase> all;
  cpu_sweeps(all);
  edge_cases(all);
  cuda_sweeps(all);
  // Names identify cases: a repeated name is the same case (the first one stays, must_mask of
  // either); two test names may not collide after the character mapping.
  std::vector<AttnCase> table;
  std::set<std::string> names, test_names;
  for (const AttnCase& c : all) {
    ARIADNE_CHECK(c.order == TokenOrder::none || !c.diagnostics, name_of(c), ": token orders run without diagnostics");
    const std::string n = name_of(c);
    if (!names.insert(n).second) {
      for (AttnCase& k : table)
        if (name_of(k) == n) k.must_mask = k.must_mask || c.must_mask;
      continue;
    }
    ARIADNE_CHECK(test_names.insert(test_name_of(c)).second, "case table: test name of '", n, "' collides");
    table.push_back(c);
  }
  return table;
}

}  // namespace

std::vector<AttnCase> cases(const std::string& filter) {
  static const std::vector<AttnCase> table = build_table();
  std::vector<std::string> terms;
  std::stringstream ss(filter);
  for (std::string w; ss >> w;) terms.push_back(w);
  std::vector<AttnCase> out;
  for (const AttnCase& c : table) {
    const std::string n = name_of(c);
    if (std::all_of(terms.begin(), terms.end(), [&](const std::string& w) { return n.find(w) != std::string::npos; }))
      out.push_back(c);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// The runner
// ---------------------------------------------------------------------------------------------
namespace {

bool has(const Buffer& b) { return b.data() != nullptr; }

// Stored rows of a [tokens, heads, dim] view gathered into a contiguous buffer in `order`.
Buffer gather(const TensorView& t, const std::vector<int32_t>& order) {
  Buffer b(t.dtype, {t.shape[0], t.shape[1], t.shape[2]});
  const TensorView v = b.view();
  for (int64_t i = 0; i < t.shape[0]; ++i)
    for (int64_t h = 0; h < t.shape[1]; ++h)
      for (int64_t x = 0; x < t.shape[2]; ++x) v.set({i, h, x}, t.get({order[size_t(i)], h, x}));
  return b;
}

CaseOutputs alloc_outputs(const AttnCase& c, int64_t total_q, int64_t total_k, DType out_dtype, bool all) {
  CaseOutputs o;
  o.out = Buffer(out_dtype, {total_q, c.heads_q, c.dim});
  if (c.lse || all) o.lse = Buffer(DType::f32, {c.heads_q, total_q});
  if (c.diagnostics) {
    o.entropy = Buffer(DType::f32, {c.heads_q, total_q});
    o.distance = Buffer(DType::f32, {c.heads_q, total_q});
    o.received = Buffer(DType::f32, {c.heads_q, total_k});
  }
  for (Buffer* b : {&o.out, &o.lse, &o.entropy, &o.distance, &o.received})
    if (has(*b)) b->fill(kNaN);
  return o;
}

AttentionParams with_outputs(AttentionParams p, const PreparedCase& pc, const CaseOutputs& o) {
  p.out = o.out.view();
  if (has(o.lse)) p.lse = o.lse.view();
  if (pc.c.diagnostics) {
    p.entropy = o.entropy.view();
    p.distance = o.distance.view();
    p.received = o.received.view();
    p.coords_q = pc.coords_q.view();
    p.coords_k = pc.coords_k.view();
  }
  return p;
}

// The reference on the case's stored inputs; with a token order, on explicitly gathered inputs
// with its rows scattered back (independent of the backends' own order handling).
CaseOutputs run_reference_outputs(const PreparedCase& pc) {
  const AttnCase& c = pc.c;
  const int64_t tq = pc.in.total_q, tk = pc.in.total_k;
  CaseOutputs ref = alloc_outputs(c, tq, tk, DType::f32, /*all=*/true);
  if (c.order == TokenOrder::none) {
    attention(with_outputs(pc.in.params, pc, ref), Backend::reference);
    return ref;
  }
  const Buffer q = gather(pc.in.params.q, pc.order), k = gather(pc.in.params.k, pc.order),
               v = gather(pc.in.params.v, pc.order);
  AttentionParams p = pc.in.params;
  p.q = q.view();
  p.k = k.view();
  p.v = v.view();
  CaseOutputs logical = alloc_outputs(c, tq, tk, DType::f32, true);
  attention(with_outputs(p, pc, logical), Backend::reference);
  for (int64_t i = 0; i < tq; ++i) {
    const int64_t row = pc.order[size_t(i)];
    for (int h = 0; h < c.heads_q; ++h) {
      ref.lse.view().set({h, row}, logical.lse.view().get({h, i}));
      for (int x = 0; x < c.dim; ++x) ref.out.view().set({row, h, x}, logical.out.view().get({i, h, x}));
    }
  }
  return ref;
}

bool row_zero(const TensorView& out, int64_t row, int64_t h) {
  for (int64_t x = 0; x < out.shape[2]; ++x)
    if (out.get({row, h, x}) != 0.f) return false;
  return true;
}

// Rows with no allowed key by the pattern's rule: out exactly 0 and LSE −inf, or the sink with a
// denominator sink: exactly for the reference (tol 0), within the LSE rule of docs/numerics.md
// (|lse − sink| <= tol · max(1, |sink|)) for a backend, whose kernels compute the LSE in base 2 and
// may land an ulp away from the sink. Returns how many (sequence, head, query) rows are masked.
int64_t check_masked_rows(const PreparedCase& pc, const CaseOutputs& o, const char* who, double tol) {
  const Pattern& pat = pc.in.params.pattern;
  const AttnCase& c = pc.c;
  int64_t masked = 0;
  for (int32_t s = 0; s < pat.num_seqs; ++s) {
    const SeqExtent e = pat.seq(s, pc.in.total_q, pc.in.total_k);
    for (int h = 0; h < c.heads_q; ++h)
      for (int64_t iq = 0; iq < e.lq; ++iq) {
        const KeyRange kr = pat.key_range(e, iq, iq + 1);
        bool any = false;
        for (int64_t ik = std::max<int64_t>(kr.lo, 0); ik < std::min(kr.hi, e.lk) && !any; ++ik)
          any = pat.allowed(s, e, h, iq, ik);
        if (any) continue;
        ++masked;
        const int64_t logical = e.q0 + iq;
        const int64_t row = pc.order.empty() ? logical : pc.order[size_t(logical)];
        EXPECT_TRUE(row_zero(o.out.view(), row, h)) << who << ": masked row " << row << " head " << h << " not zero";
        if (!has(o.lse)) continue;
        const float lse = o.lse.view().get({h, row});
        if (c.sink_mode == SinkMode::denominator) {
          const float sink = pc.in.params.sink.get({h});
          const bool close = std::isfinite(sink) ? std::abs(double(lse) - sink) <= tol * std::max(1.0, std::abs(double(sink)))
                                                 : lse == sink;
          EXPECT_TRUE(close || (std::isnan(sink) && std::isnan(lse)))
              << who << ": masked row " << row << " head " << h << " lse " << lse << ", expected the sink " << sink;
        } else {
          EXPECT_TRUE(std::isinf(lse) && lse < 0) << who << ": masked row " << row << " head " << h << " lse " << lse;
        }
      }
  }
  return masked;
}

bool same_bytes(const Buffer& a, const Buffer& b) {
  if (has(a) != has(b)) return false;
  if (!has(a)) return true;
  return a.numel() == b.numel() &&
         std::memcmp(a.data(), b.data(), size_t(a.numel()) * dtype_size(a.dtype())) == 0;
}

}  // namespace

PreparedCase prepare(const AttnCase& c, uint64_t salt) {
  PreparedCase pc;
  pc.c = c;
  pc.name = name_of(c);
  pc.seed = salt == 0 ? c.seed : c.seed ^ (salt * 0xD1B54A32D192ED03ull);

  Case k;  // the input generator of common.hpp
  k.name = pc.name;
  k.seq_q = c.tokens_q;
  k.seq_k = c.tokens_k;
  k.heads_q = c.heads_q;
  k.heads_kv = c.heads_kv;
  k.dim = c.dim;
  const PatternSpec ps = parse_case_pattern(c.pattern);
  k.pattern = ps.dense;
  k.block_density = ps.block_density;
  k.block = ps.block;
  k.sink_mode = c.sink_mode;
  k.sink_value = c.sink;
  k.dtype = c.dtype;
  k.input_scale = c.input_scale;
  k.seed = pc.seed;
  k.token_pad = c.token_pad;
  pc.in = make_inputs(k);
  AttentionParams& p = pc.in.params;

  double bound = max_abs_logit(pc.in);
  if (c.logit_shift != 0) {
    // Channel 0 carries the shift: q = 100, k = shift / 25 with scale 1/4 adds the shift to every
    // logit of a row (100 and ±400 are exact in bf16 and f16).
    p.scale = 0.25f;
    bound = max_abs_logit(pc.in) + std::abs(c.logit_shift);
    for (int64_t t = 0; t < pc.in.total_q; ++t)
      for (int h = 0; h < c.heads_q; ++h) p.q.set({t, h, 0}, 100.f);
    for (int64_t t = 0; t < pc.in.total_k; ++t)
      for (int h = 0; h < c.heads_kv; ++h) p.k.set({t, h, 0}, c.logit_shift / 25.f);
  }
  if (c.sink_mode != SinkMode::none) bound += std::isnan(c.sink) ? 3.0 : std::isinf(c.sink) ? 0.0 : std::abs(c.sink);
  pc.tol = tolerance(c.dtype, bound);

  if (c.order != TokenOrder::none) {
    const int64_t total = pc.in.total_q;
    ARIADNE_CHECK(total == pc.in.total_k, pc.name, ": a token order needs as many keys as queries");
    pc.order.resize(size_t(total));
    if (c.order == TokenOrder::column_major) {
      const int64_t cols = c.grid_cols, rows = total / cols;
      ARIADNE_CHECK(cols > 0 && rows * cols == total, pc.name, ": the grid does not tile the tokens");
      for (int64_t i = 0; i < total; ++i) pc.order[size_t(i)] = int32_t((i % rows) * cols + i / rows);
    } else {
      std::iota(pc.order.begin(), pc.order.end(), 0);
      std::shuffle(pc.order.begin(), pc.order.end(), std::mt19937_64(pc.seed + 9));
    }
  }
  if (c.diagnostics) {
    // Random cells of a 40 × 40 grid.
    pc.coords_q = Buffer(DType::f32, {pc.in.total_q, 2});
    pc.coords_k = Buffer(DType::f32, {pc.in.total_k, 2});
    std::mt19937_64 rng(pc.seed + 77);
    std::uniform_int_distribution<int> cell(0, 39);
    for (Buffer* b : {&pc.coords_q, &pc.coords_k})
      for (int64_t i = 0; i < b->numel(); ++i) b->as<float>()[i] = float(cell(rng));
  }
  pc.ref = run_reference_outputs(pc);
  return pc;
}

CaseOutputs poisoned_outputs(const PreparedCase& pc) {
  const DType out = pc.c.f32_out ? DType::f32 : pc.c.dtype;
  return alloc_outputs(pc.c, pc.in.total_q, pc.in.total_k, out, /*all=*/false);
}

AttentionParams host_params(const PreparedCase& pc, const CaseOutputs& o) {
  AttentionParams p = with_outputs(pc.in.params, pc, o);
  if (!pc.order.empty()) p.order = pc.order.data();
  return p;
}

void check_outputs(const PreparedCase& pc, const CaseOutputs& got, bool fp32_diagnostics) {
  const AttnCase& c = pc.c;
  // An output rounded to 16 bits carries that rounding too.
  const double out_tol = std::max(pc.tol, tolerance(got.out.dtype(), 0));
  EXPECT_TRUE(close_enough("out", compare(got.out.view(), pc.ref.out.view()), out_tol));
  // Rows the reference leaves exactly zero (masked rows, a +inf sink) are exactly zero.
  for (int64_t row = 0; row < pc.in.total_q; ++row)
    for (int h = 0; h < c.heads_q; ++h)
      if (row_zero(pc.ref.out.view(), row, h)) {
        EXPECT_TRUE(row_zero(got.out.view(), row, h)) << "out row " << row << " head " << h << " should be zero";
      }
  if (has(got.lse)) {
    for (int h = 0; h < c.heads_q; ++h)
      for (int64_t i = 0; i < pc.in.total_q; ++i) {
        const float g = got.lse.view().get({h, i}), r = pc.ref.lse.view().get({h, i});
        if (std::isnan(r)) {
          EXPECT_TRUE(std::isnan(g)) << "lse[" << h << "," << i << "] = " << g << ", expected NaN";
        } else if (std::isinf(r)) {
          EXPECT_EQ(g, r) << "lse[" << h << "," << i << "]";
        } else {
          EXPECT_TRUE(std::isfinite(g) && std::abs(g - r) <= pc.tol * std::max(1.f, std::abs(r)))
              << "lse[" << h << "," << i << "] = " << g << ", reference " << r << " (tol " << pc.tol << ")";
        }
      }
  }
  const int64_t masked = check_masked_rows(pc, got, "backend", pc.tol);
  if (c.must_mask) {
    EXPECT_GT(masked, 0) << "the case must contain fully masked rows";
  }
  if (!c.diagnostics) return;
  // Diagnostics use fp32 probabilities on backends that keep them (never rounded to 16 bits).
  const double diag_tol = fp32_diagnostics ? 10 * tolerance(DType::f32, max_abs_logit(pc.in)) : pc.tol;
  EXPECT_TRUE(close_enough("entropy", compare(got.entropy.view(), pc.ref.entropy.view()), diag_tol));
  EXPECT_TRUE(close_enough("distance", compare(got.distance.view(), pc.ref.distance.view()), diag_tol));
  EXPECT_TRUE(close_enough("received", compare(got.received.view(), pc.ref.received.view()), diag_tol));
}

bool run_case(const PreparedCase& pc, const CaseBackend& backend, std::string* why, CaseOutputs* got) {
  SCOPED_TRACE(cat({pc.name, " on ", backend.name, " (input seed ", std::to_string(pc.seed), ")"}));
  // The reference itself obeys the masked-row rule.
  const int64_t masked = check_masked_rows(pc, pc.ref, "reference", 0);
  if (pc.c.must_mask) {
    EXPECT_GT(masked, 0) << "the case must contain fully masked rows";
  }
  CaseOutputs first = poisoned_outputs(pc);
  if (!backend.run(pc, first, why)) return false;
  check_outputs(pc, first, backend.fp32_diagnostics);
  if (backend.repeat) {
    CaseOutputs second = poisoned_outputs(pc);
    EXPECT_TRUE(backend.run(pc, second, why));
    for (auto m : {&CaseOutputs::out, &CaseOutputs::lse, &CaseOutputs::entropy, &CaseOutputs::distance,
                   &CaseOutputs::received})
      EXPECT_TRUE(same_bytes(first.*m, second.*m)) << "two identical runs differ";
  }
  if (got) *got = std::move(first);
  return true;
}

}  // namespace ariadne::testing
