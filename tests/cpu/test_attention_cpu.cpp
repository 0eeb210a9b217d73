// The fast CPU backend (issue 3) against the double reference, on every kernel table this CPU can run
// (generic, AVX2, AVX-512 with bf16 dot products): every output element, LSE, entropy, distance and
// received attention, poisoned with NaN before the run so an unwritten element fails.
#include <cmath>
#include <limits>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attention/backends.hpp"
#include "common.hpp"
#include "attention/cpu/attention_kernels.hpp"

namespace ariadne {
namespace {

using testing::Case;
using testing::Inputs;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
const char* const kIsas[] = {"generic", "avx2", "avx512"};

// Every output of one run: out, LSE and the three diagnostics.
struct Outputs {
  Buffer out, lse, entropy, distance, received;
};

Outputs alloc_outputs(const Inputs& in, DType out_dtype) {
  const AttentionParams& p = in.params;
  Outputs o;
  o.out = Buffer(out_dtype, {in.total_q, p.q.shape[1], p.q.shape[2]});
  o.lse = Buffer(DType::f32, {p.q.shape[1], in.total_q});
  o.entropy = Buffer(DType::f32, {p.q.shape[1], in.total_q});
  o.distance = Buffer(DType::f32, {p.q.shape[1], in.total_q});
  o.received = Buffer(DType::f32, {p.q.shape[1], in.total_k});
  for (Buffer* b : {&o.out, &o.lse, &o.entropy, &o.distance, &o.received}) b->fill(kNaN);
  return o;
}

// Grid positions for the distance diagnostic: random cells of a 40×40 grid.
struct Coords {
  Buffer q, k;
};
Coords make_coords(const Inputs& in, uint64_t seed) {
  Coords c{Buffer(DType::f32, {in.total_q, 2}), Buffer(DType::f32, {in.total_k, 2})};
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> cell(0, 39);
  for (Buffer* b : {&c.q, &c.k})
    for (int64_t i = 0; i < b->numel(); ++i) b->as<float>()[i] = float(cell(rng));
  return c;
}

AttentionParams with_outputs(const Inputs& in, const Outputs& o, const Coords* coords) {
  AttentionParams p = in.params;
  p.out = o.out.view();
  p.lse = o.lse.view();
  if (coords) {
    p.entropy = o.entropy.view();
    p.distance = o.distance.view();
    p.received = o.received.view();
    p.coords_q = coords->q.view();
    p.coords_k = coords->k.view();
  }
  return p;
}

// Runs `c` on the reference and on the CPU backend with kernel table `isa`; checks everything.
void check_case(const Case& c, const char* isa, bool diagnostics, DType out_dtype) {
  SCOPED_TRACE(c.name + " [" + isa + ", out " + dtype_name(out_dtype) + "]");
  const Inputs in = testing::make_inputs(c);
  const Coords coords = make_coords(in, c.seed + 77);
  const Coords* cp = diagnostics ? &coords : nullptr;

  Outputs ref = alloc_outputs(in, DType::f32);
  attention(with_outputs(in, ref, cp), Backend::reference);

  cpu::force_tile_kernels(isa);
  Outputs got = alloc_outputs(in, out_dtype);
  attention(with_outputs(in, got, cp), Backend::cpu);
  cpu::force_tile_kernels("");

  const double tol = testing::tolerance(c.dtype, testing::max_abs_logit(in));
  // An output rounded to 16 bits carries that rounding too.
  const double out_tol = std::max(tol, testing::tolerance(out_dtype, 0));
  EXPECT_TRUE(testing::close_enough("out", testing::compare(got.out.view(), ref.out.view()), out_tol));
  EXPECT_TRUE(testing::lse_close(got.lse.view(), ref.lse.view(), tol));
  if (!diagnostics) return;
  // Without received attention, narrow patterns pack K and V per work item into a ring instead of
  // once per call (attention_cpu.cpp, stream mode): same arithmetic, so out, LSE, entropy and
  // distance must be bit-identical to the run above.
  cpu::force_tile_kernels(isa);
  Outputs plain = alloc_outputs(in, out_dtype);
  AttentionParams pp = with_outputs(in, plain, cp);
  pp.received = TensorView{};
  attention(pp, Backend::cpu);
  cpu::force_tile_kernels("");
  for (auto member : {&Outputs::out, &Outputs::lse, &Outputs::entropy, &Outputs::distance}) {
    const Buffer& a = got.*member;
    const Buffer& b = plain.*member;
    ASSERT_EQ(0, std::memcmp(a.data(), b.data(), size_t(a.numel()) * dtype_size(a.dtype())))
        << (member == &Outputs::out ? "out" : member == &Outputs::lse ? "lse" : "entropy/distance")
        << " differs without received attention";
  }
  // Diagnostics use fp32 probabilities (never rounded to 16 bits), so the fp32 rule plus the
  // logit term applies whatever the input dtype.
  const double diag_tol = testing::tolerance(DType::f32, testing::max_abs_logit(in)) * 10;
  EXPECT_TRUE(testing::close_enough("entropy", testing::compare(got.entropy.view(), ref.entropy.view()), diag_tol));
  EXPECT_TRUE(testing::close_enough("distance", testing::compare(got.distance.view(), ref.distance.view()), diag_tol));
  EXPECT_TRUE(testing::close_enough("received", testing::compare(got.received.view(), ref.received.view()), diag_tol));
}

void check_all_isas(const Case& c, bool diagnostics = true, DType out_dtype = DType::f32) {
  for (const char* isa : kIsas) {
    if (!cpu::tile_kernels_available(isa)) continue;
    check_case(c, isa, diagnostics, out_dtype);
  }
}

Case make_case(std::string name, std::vector<int64_t> sq, std::vector<int64_t> sk, Pattern pat,
               DType dt = DType::f32, int hq = 4, int hkv = 2, int dim = 64, uint64_t seed = 1) {
  Case c;
  c.name = std::move(name);
  c.seq_q = std::move(sq);
  c.seq_k = std::move(sk);
  c.pattern = pat;
  c.dtype = dt;
  c.heads_q = hq;
  c.heads_kv = hkv;
  c.dim = dim;
  c.seed = seed;
  return c;
}

const DType kDtypes[] = {DType::f32, DType::bf16, DType::f16};

std::string with_dtype(const std::string& name, DType dt) { return name + "/" + dtype_name(dt); }

TEST(AttentionCpu, FullLengthsNotDivisibleByTiles) {
  for (DType dt : kDtypes)
    for (int64_t n : {1, 31, 33, 65, 100})
      check_all_isas(make_case(with_dtype("full n" + std::to_string(n), dt), {n}, {}, Pattern::full(), dt));
}

TEST(AttentionCpu, HeadDims) {
  for (DType dt : kDtypes)
    for (int d : {16, 33, 80, 128})
      check_all_isas(make_case(with_dtype("full d" + std::to_string(d), dt), {70}, {}, Pattern::full(), dt, 2, 1, d));
}

TEST(AttentionCpu, VarlenWithEmptyAndOneTokenSequences) {
  for (DType dt : kDtypes) {
    // Sequence 2 has keys but no queries; sequence 4 has queries but no keys (fully masked rows).
    Case c = make_case(with_dtype("varlen", dt), {37, 1, 0, 130, 3}, {37, 1, 17, 150, 0}, Pattern::causal(), dt);
    check_all_isas(c);
    c.pattern = Pattern::full();
    c.name = with_dtype("varlen full", dt);
    check_all_isas(c);
  }
}

TEST(AttentionCpu, GqaFourToOneAndStridedViews) {
  for (DType dt : kDtypes) {
    Case c = make_case(with_dtype("gqa 4:1 strided", dt), {90, 45}, {}, Pattern::window(20, 9), dt, 8, 2, 80);
    c.token_pad = 7;
    check_all_isas(c);
  }
}

TEST(AttentionCpu, CausalWithFewerQueriesThanKeys) {
  for (DType dt : kDtypes) check_all_isas(make_case(with_dtype("causal lq<lk", dt), {50, 7}, {200, 40}, Pattern::causal(), dt));
}

TEST(AttentionCpu, FullyMaskedRows) {
  // Causal with lq > lk: the first 60 queries sit before key 0 and see nothing.
  for (DType dt : kDtypes) {
    Case c = make_case(with_dtype("causal lq>lk", dt), {100}, {40}, Pattern::causal(), dt);
    check_all_isas(c);
    for (SinkMode mode : {SinkMode::denominator, SinkMode::key0_bias}) {
      c.sink_mode = mode;
      c.sink_value = 2.5f;
      c.name = with_dtype(std::string("causal lq>lk sink ") + sink_mode_name(mode), dt);
      check_all_isas(c);
    }
  }
}

TEST(AttentionCpu, Windows) {
  for (DType dt : kDtypes) {
    check_all_isas(make_case(with_dtype("window 64,64", dt), {300}, {}, Pattern::window(64, 64), dt));
    check_all_isas(make_case(with_dtype("window 5,0", dt), {77}, {}, Pattern::window(5, 0), dt));
    check_all_isas(make_case(with_dtype("window 0,17 lq<lk", dt), {60}, {99}, Pattern::window(0, 17), dt));
    check_all_isas(make_case(with_dtype("window 0,0", dt), {45}, {}, Pattern::window(0, 0), dt));
  }
}

TEST(AttentionCpu, Chunks) {
  for (DType dt : kDtypes) {
    check_all_isas(make_case(with_dtype("chunk 64", dt), {200, 64, 10}, {}, Pattern::chunked(64), dt));
    check_all_isas(make_case(with_dtype("chunk 7 lq<lk", dt), {40}, {61}, Pattern::chunked(7), dt));
    Pattern p = Pattern::chunked(48);
    p.window_left = 10;
    check_all_isas(make_case(with_dtype("chunk 48 + window 10,inf", dt), {150}, {}, p, dt));
  }
}

TEST(AttentionCpu, BlockSparse) {
  struct B {
    const char* name;
    int block;
    Pattern pat;
    std::vector<int64_t> sq, sk;
  };
  const B cases[] = {{"blocks 64 causal", 64, Pattern::causal(), {300}, {}},
                     {"blocks 48 full", 48, Pattern::full(), {150, 97}, {}},
                     {"blocks 16 window", 16, Pattern::window(40, 40), {130}, {}},
                     {"blocks 32 causal lq<lk", 32, Pattern::causal(), {70, 33}, {150, 33}},
                     {"blocks 100 full", 100, Pattern::full(), {250}, {}}};
  for (DType dt : kDtypes)
    for (const B& b : cases) {
      Case c = make_case(with_dtype(b.name, dt), b.sq, b.sk, b.pat, dt, 4, 1);
      c.block = b.block;
      c.block_density = 0.5;
      check_all_isas(c);
    }
}

TEST(AttentionCpu, SinksBothModes) {
  for (DType dt : kDtypes)
    for (SinkMode mode : {SinkMode::denominator, SinkMode::key0_bias})
      for (float v : {-10.f, 10.f, kNaN}) {
        Case c = make_case(with_dtype(std::string("sink ") + sink_mode_name(mode) + " " + std::to_string(v), dt),
                           {70, 1, 40}, {}, Pattern::window(16, 16), dt);
        c.sink_mode = mode;
        c.sink_value = v;
        check_all_isas(c);
      }
}

// Denominator sinks of ±inf: −inf is the plain softmax, +inf takes every row's mass (out 0, lse +inf).
TEST(AttentionCpu, InfiniteDenominatorSinks) {
  Case c = make_case("sink -inf", {40, 9}, {}, Pattern::causal(), DType::f32);
  c.sink_mode = SinkMode::denominator;
  c.sink_value = -std::numeric_limits<float>::infinity();
  check_all_isas(c);
  c.sink_value = std::numeric_limits<float>::infinity();
  const Inputs in = testing::make_inputs(c);
  for (const char* isa : kIsas) {
    if (!cpu::tile_kernels_available(isa)) continue;
    cpu::force_tile_kernels(isa);
    Outputs got = alloc_outputs(in, DType::f32);
    attention(with_outputs(in, got, nullptr), Backend::cpu);
    cpu::force_tile_kernels("");
    for (int64_t i = 0; i < got.out.numel(); ++i) ASSERT_EQ(got.out.as<float>()[i], 0.f) << isa << " out " << i;
    for (int64_t i = 0; i < got.lse.numel(); ++i)
      ASSERT_TRUE(std::isinf(got.lse.as<float>()[i]) && got.lse.as<float>()[i] > 0) << isa << " lse " << i;
  }
}

TEST(AttentionCpu, LargeLogits) {
  // input_scale 35 with d = 64: |logits| up to 35²·64/8 ≈ 1e4.
  for (DType dt : kDtypes) {
    Case c = make_case(with_dtype("logits 1e4", dt), {80, 20}, {}, Pattern::full(), dt);
    c.input_scale = 35.f;
    check_all_isas(c);
    c.sink_mode = SinkMode::denominator;
    c.sink_value = 10.f;
    c.pattern = Pattern::causal();
    c.name = with_dtype("logits 1e4 causal sink", dt);
    check_all_isas(c);
  }
}

TEST(AttentionCpu, SixteenBitOutputs) {
  for (DType dt : {DType::bf16, DType::f16})
    check_all_isas(make_case(with_dtype("out in input dtype", dt), {90}, {}, Pattern::window(30, 30), dt), false, dt);
}

TEST(AttentionCpu, RandomShapes) {
  std::mt19937_64 rng(2024);
  auto pick = [&](int n) { return int(rng() % uint64_t(n)); };
  for (int i = 0; i < 24; ++i) {
    const int nseq = 1 + pick(3);
    std::vector<int64_t> sq, sk;
    for (int s = 0; s < nseq; ++s) {
      sq.push_back(s == 0 ? 1 + pick(140) : pick(140));
      sk.push_back(pick(3) == 0 ? sq.back() + pick(60) : sq.back());
    }
    Pattern pat;
    switch (pick(5)) {
      case 0: pat = Pattern::full(); break;
      case 1: pat = Pattern::causal(); break;
      case 2: pat = Pattern::window(pick(70), pick(70)); break;
      case 3: pat = Pattern::chunked(1 + pick(70)); break;
      default: pat = Pattern::window(pick(3) == 0 ? kUnbounded : pick(90), 0); break;
    }
    const DType dt = kDtypes[pick(3)];
    const int hkv = 1 + pick(2), hq = hkv * (1 + pick(4));
    const int dims[] = {8, 33, 64, 80};
    Case c = make_case("random " + std::to_string(i) + " " + describe(pat) + "/" + dtype_name(dt), sq, sk, pat, dt,
                       hq, hkv, dims[pick(4)], 100 + uint64_t(i));
    if (pick(3) == 0) {
      c.block_density = 0.6;
      c.block = 16 * (1 + pick(5));
    }
    if (pick(2) == 0) {
      c.sink_mode = pick(2) ? SinkMode::denominator : SinkMode::key0_bias;
      c.sink_value = kNaN;
    }
    c.token_pad = pick(2) * 5;
    check_all_isas(c);
  }
}

// Narrow patterns over more than one stream work item (16 query tiles of 64 rows each): the key-tile
// ring wraps many times, items start mid-sequence, GQA heads share an item's ring. check_case runs
// each twice (with received attention: call-wide packing; without: the ring) and compares both.
TEST(AttentionCpu, StreamedNarrowPatterns) {
  for (DType dt : kDtypes) {
    check_all_isas(make_case(with_dtype("stream window 100,30 gqa", dt), {1100, 70}, {}, Pattern::window(100, 30), dt,
                             4, 2, 80));
    check_all_isas(make_case(with_dtype("stream chunk 200", dt), {1090}, {1200}, Pattern::chunked(200), dt, 2, 1, 48));
    Case c = make_case(with_dtype("stream blocks 48 window 64,64", dt), {1030}, {}, Pattern::window(64, 64), dt,
                       2, 1, 32);
    c.block = 48;
    c.block_density = 0.6;
    check_all_isas(c);
  }
}

// Bit-identical results for 1, 2 and 3 threads (items are independent; no float atomics).
TEST(AttentionCpu, DeterministicAcrossThreadCounts) {
  Case c = make_case("determinism", {300, 77}, {}, Pattern::window(40, 40), DType::f32);
  c.block_density = 0.7;
  c.sink_mode = SinkMode::denominator;
  c.sink_value = 1.f;
  const Inputs in = testing::make_inputs(c);
  const Coords coords = make_coords(in, 5);
  const int saved = cpu_threads();
  std::vector<Outputs> runs;
  for (int t : {1, 2, 3}) {
    set_cpu_threads(t);
    runs.push_back(alloc_outputs(in, DType::f32));
    attention(with_outputs(in, runs.back(), &coords), Backend::cpu);
  }
  set_cpu_threads(saved);
  for (size_t r = 1; r < runs.size(); ++r)
    for (auto member : {&Outputs::out, &Outputs::lse, &Outputs::entropy, &Outputs::received}) {
      const Buffer& a = runs[0].*member;
      const Buffer& b = runs[r].*member;
      ASSERT_EQ(0, std::memcmp(a.data(), b.data(), size_t(a.numel()) * 4)) << "run " << r << " differs";
    }
  // Without received attention a narrow pattern takes the stream path: items of 16 query tiles.
  Case w = make_case("determinism stream", {1500, 300}, {}, Pattern::window(64, 64), DType::bf16, 4, 2, 80);
  const Inputs win = testing::make_inputs(w);
  std::vector<Outputs> wruns;
  for (int t : {1, 2, 3}) {
    set_cpu_threads(t);
    wruns.push_back(alloc_outputs(win, DType::f32));
    attention(with_outputs(win, wruns.back(), nullptr), Backend::cpu);
  }
  set_cpu_threads(saved);
  for (size_t r = 1; r < wruns.size(); ++r)
    for (auto member : {&Outputs::out, &Outputs::lse}) {
      const Buffer& a = wruns[0].*member;
      const Buffer& b = wruns[r].*member;
      ASSERT_EQ(0, std::memcmp(a.data(), b.data(), size_t(a.numel()) * 4)) << "stream run " << r << " differs";
    }
}

TEST(AttentionCpu, ThreadAndKernelSettingsRejectBadValues) {
  EXPECT_THROW(set_cpu_threads(0), Error);
  EXPECT_THROW(cpu::force_tile_kernels("sse9"), Error);
  EXPECT_GE(cpu_threads(), 1);
  EXPECT_TRUE(cpu::tile_kernels_available("generic"));
}

}  // namespace
}  // namespace ariadne
