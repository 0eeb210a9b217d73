// The fast CPU backend's own properties, beyond the case table (tests/cpu/test_cases.cpp, which
// checks every output against the reference on every kernel table): bit-identical results for any
// thread count, on both the call-wide and the stream path, and the checks of its settings.
#include <algorithm>
#include <cmath>
#include <cstring>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attention/backends.hpp"
#include "attention/cpu/attention_kernels.hpp"
#include "attention/cpu/runner.hpp"
#include "cases.hpp"
#include "cpu/force_isa.hpp"

namespace ariadne {
namespace {

using namespace testing;

// Runs pc on the CPU backend with 1, 2 and 3 threads; every output of every run must be equal.
void expect_thread_independent(const PreparedCase& pc) {
  SCOPED_TRACE(pc.name);
  const int saved = cpu_threads();
  std::vector<CaseOutputs> runs;
  for (int t : {1, 2, 3}) {
    set_cpu_threads(t);
    runs.push_back(poisoned_outputs(pc));
    attention(host_params(pc, runs.back()), Backend::cpu);
  }
  set_cpu_threads(saved);
  for (size_t r = 1; r < runs.size(); ++r)
    for (auto m : {&CaseOutputs::out, &CaseOutputs::lse, &CaseOutputs::entropy, &CaseOutputs::distance,
                   &CaseOutputs::received}) {
      const Buffer& a = runs[0].*m;
      const Buffer& b = runs[r].*m;
      if (a.data() == nullptr) continue;
      ASSERT_EQ(0, std::memcmp(a.data(), b.data(), size_t(a.numel()) * dtype_size(a.dtype()))) << "run " << r << " differs";
    }
}

// Items are independent and nothing accumulates across threads (no float atomics).
TEST(AttentionCpu, DeterministicAcrossThreadCounts) {
  AttnCase c;
  c.tokens_q = {300, 77};
  c.heads_q = 4;
  c.heads_kv = 2;
  c.pattern = "window:40,40+blocks:0.7@64";
  c.sink_mode = SinkMode::denominator;
  c.sink = 1.f;
  c.dtype = DType::f32;
  c.diagnostics = true;
  expect_thread_independent(prepare(c));
  // Without received attention a narrow pattern takes the stream path: items of 16 query tiles.
  AttnCase w;
  w.tokens_q = {1500, 300};
  w.heads_q = 4;
  w.heads_kv = 2;
  w.dim = 80;
  w.pattern = "window:64,64";
  w.dtype = DType::bf16;
  w.f32_out = true;
  expect_thread_independent(prepare(w));
}

// A bf16 case with f32 out (the rounding of out stays out of the comparison).
AttnCase bf16_case(std::vector<int64_t> q, std::vector<int64_t> k, int hq, int hkv, int dim, const char* pat) {
  AttnCase c = make_case(std::move(q), std::move(k), hq, hkv, dim, pat, DType::bf16);
  c.f32_out = true;
  return c;
}

// Each case on every kernel table this CPU can run, against the reference, twice (bit-identical).
void expect_reference_on_every_table(const std::vector<AttnCase>& cs) {
  for (const AttnCase& c : cs) {
    const PreparedCase pc = prepare(c, salt());
    for (const char* isa : kIsas) {
      if (!cpu::tile_kernels_available(isa)) continue;
      SCOPED_TRACE(pc.name + " on cpu/" + isa);
      CaseBackend b;
      b.name = std::string("cpu/") + isa;
      b.repeat = true;
      b.run = [isa](const PreparedCase& p, CaseOutputs& o, std::string* why) {
        const AttentionParams params = host_params(p, o);
        if (!backend_supports(Backend::cpu, params, why)) return false;
        const ForceIsa force(isa);
        attention(params, Backend::cpu);
        return true;
      };
      std::string why;
      EXPECT_TRUE(run_case(pc, b, &why)) << why;
    }
  }
}

// bf16 narrow patterns without the diagnostics: on a table with a batched P·V (AMX) the stream path
// walks 16-row groups over all their key tiles and batches P·V per group (forward_groups), whole
// groups in one softmax step per run of tiles (band_bf16) unless a block mask or the key-0 bias is
// there, a path
// the case table's CPU sweeps (all with diagnostics) do not take. Rows off the 16-row grid, query
// tiles cut by 48- and 40-row blocks, several stream items, a band wider than one P·V batch
// (kPvBatch tiles), windows of one key, both sink forms, GQA, strided views; on every table.
TEST(AttentionCpu, StreamRowGroupsMatchReference) {
  const auto make = bf16_case;
  std::vector<AttnCase> cs = {
      make({1100, 70}, {}, 4, 2, 80, "window:100,30"),
      make({1090}, {1200}, 2, 1, 48, "chunk:200"),
      make({1030}, {}, 2, 1, 32, "window:64,64+blocks:0.6@48"),
      make({300, 77}, {}, 2, 2, 80, "window:33,47+blocks:0.7@40"),
      make({900}, {}, 2, 1, 64, "window:400,300"),
      make({45, 1, 130}, {}, 4, 4, 64, "window:0,0"),
      make({77, 200}, {90, 200}, 2, 1, 96, "window:5,0"),
      make({150}, {}, 2, 1, 80, "chunk:48+window:10,inf"),
  };
  for (SinkMode mode : {SinkMode::denominator, SinkMode::key0_bias}) {
    AttnCase c = make({300, 33}, {}, 8, 2, 80, "window:17,5");
    c.sink_mode = mode;
    c.sink = std::numeric_limits<float>::quiet_NaN();  // random per head
    cs.push_back(c);
  }
  AttnCase padded = make({257, 64}, {}, 8, 2, 80, "window:64,64");
  padded.token_pad = 24;
  padded.f32_out = false;
  cs.push_back(padded);
  // Blocks of KV heads per item (stream_kv_block): 3 KV heads at d 80 make blocks of 2 and 1, 5
  // at d 40 blocks of 4 and 1; bf16 out rows of 80 and 128 entries (streaming stores of the whole
  // lines, ordinary ones of a line shared with the next head).
  cs.push_back(make({700, 90}, {}, 6, 3, 80, "window:64,64"));
  // lq > lk: the first rows see no key, also inside 16-row groups whose other rows see some.
  cs.push_back(make({300}, {200}, 2, 1, 80, "window:40,10"));
  AttnCase five = make({600}, {}, 10, 5, 40, "chunk:96");
  five.f32_out = false;
  cs.push_back(five);
  AttnCase wide = make({333}, {}, 3, 3, 128, "window:31,64");
  wide.f32_out = false;
  cs.push_back(wide);
  expect_reference_on_every_table(cs);
  // Thread counts on the group path: items of 16 query tiles, split among threads differently.
  expect_thread_independent(prepare(cs[0]));
  expect_thread_independent(prepare(cs[cs.size() - 2]));
}

// Stream mode computes a block of KV heads per item when one head's K or V row ends inside a cache
// line and the heads sit side by side: the fewest heads (at most 4) whose rows end on a line.
TEST(AttentionCpu, StreamKvBlocksEndOnCacheLines) {
  const auto block = [](DType dt, int heads, int d, bool side_by_side = true) {
    TensorView t;
    t.dtype = dt;
    t.shape = {64, heads, d, 0};
    t.stride = {heads * d, side_by_side ? d : 64 * d, 1, 0};
    return cpu::stream_kv_block(t, t, heads);
  };
  EXPECT_EQ(block(DType::bf16, 16, 80), 2);   // 160-byte rows
  EXPECT_EQ(block(DType::bf16, 16, 128), 1);  // whole lines already
  EXPECT_EQ(block(DType::bf16, 16, 40), 4);   // 80 bytes: 320 at 4
  EXPECT_EQ(block(DType::bf16, 16, 72), 4);   // 144 bytes: 576 at 4
  EXPECT_EQ(block(DType::bf16, 16, 36), 1);   // 72 bytes: no block of at most 4 ends on a line
  EXPECT_EQ(block(DType::f32, 16, 80), 1);
  EXPECT_EQ(block(DType::bf16, 1, 80), 1);    // one KV head
  EXPECT_EQ(block(DType::bf16, 3, 40), 1);    // 4 would be needed, 3 exist
  EXPECT_EQ(block(DType::bf16, 16, 80, false), 1);  // heads apart in memory
}

// store_bf16 (the bf16 output rows): every start alignment and length against the scalar rounding,
// the entries around the row untouched; the streaming stores of whole lines included.
TEST(AttentionCpu, Bf16RowStoresRoundEveryEntry) {
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.f, 3.f);
  std::vector<float> src(160);
  for (auto& x : src) x = normal(rng);
  for (const char* isa : kIsas) {
    if (!cpu::tile_kernels_available(isa)) continue;
    const ForceIsa force(isa);
    const cpu::TileKernels& k = cpu::active_tile_kernels();
    if (k.store_bf16 == nullptr) continue;
    SCOPED_TRACE(isa);
    alignas(64) uint16_t buf[256];
    for (int off = 0; off < 40; ++off)
      for (int n : {1, 7, 16, 31, 32, 33, 63, 64, 80, 96, 128, 150}) {
        std::fill(std::begin(buf), std::end(buf), uint16_t(0xABCD));
        k.store_bf16(src.data(), 0.75f, n, buf + off);
#if defined(__SSE2__)
        _mm_sfence();
#endif
        for (int i = 0; i < 256; ++i) {
          const uint16_t want = i >= off && i < off + n ? float_to_bf16(src[size_t(i - off)] * 0.75f) : 0xABCD;
          ASSERT_EQ(buf[i], want) << "offset " << off << ", n " << n << ", entry " << i;
        }
      }
  }
}

// Wide patterns whose packed K and V of one head exceed 1 MiB take 128-row query tiles (Runner's
// qtile_): lq off the 128-row grid, lq < lk with GQA 4:1, a packed batch with one sequence below the
// size, a causal diagonal clipped inside a tile, blocks of 64 and 160 rows cutting the tiles, both
// sink forms, logits near ±1e4, f16 inputs (widened to fp32), and bf16 (the batched and the fused
// dense paths over 8 row groups); on every table.
TEST(AttentionCpu, WideQueryTilesMatchReference) {
  auto make = [](std::vector<int64_t> q, std::vector<int64_t> k, int hq, int hkv, int dim, const char* pat) {
    return make_case(std::move(q), std::move(k), hq, hkv, dim, pat, DType::f32);
  };
  std::vector<AttnCase> cs = {
      make({300}, {1100}, 2, 1, 128, "full"),
      make({1100}, {}, 2, 2, 128, "causal"),
      make({200, 150}, {1700, 1200}, 4, 1, 80, "full"),
      make({1100}, {}, 2, 1, 128, "causal+blocks:0.5@64"),
      make({400}, {1100}, 2, 1, 128, "full+blocks:0.6@160"),
  };
  for (SinkMode mode : {SinkMode::denominator, SinkMode::key0_bias}) {
    AttnCase c = make({300}, {1100}, 4, 2, 128, "full");
    c.sink_mode = mode;
    c.sink = std::numeric_limits<float>::quiet_NaN();  // random per head
    cs.push_back(c);
  }
  AttnCase large = make({256}, {1100}, 2, 1, 128, "full");
  large.input_scale = 35;  // logits ~1e4
  cs.push_back(large);
  AttnCase half = make({300}, {1100}, 2, 1, 128, "full");
  half.dtype = DType::f16;
  cs.push_back(half);
  // bf16 tiles hold half the bytes: 1 MiB is 2048 keys at d 128.
  cs.push_back(bf16_case({300}, {2100}, 2, 1, 128, "full"));
  cs.push_back(bf16_case({200, 170}, {2100, 2200}, 4, 1, 128, "full"));
  cs.push_back(bf16_case({2100}, {}, 2, 1, 128, "causal"));
  AttnCase bias = bf16_case({300}, {2100}, 2, 2, 128, "full");
  bias.sink_mode = SinkMode::key0_bias;
  bias.sink = std::numeric_limits<float>::quiet_NaN();
  cs.push_back(bias);
  expect_reference_on_every_table(cs);
  expect_thread_independent(prepare(cs[1]));
}

// Runs pc on the named table (the caller checks it is available).
void run_on_table(const PreparedCase& pc, const char* isa, std::vector<CaseOutputs>& runs) {
  runs.push_back(poisoned_outputs(pc));
  const ForceIsa force(isa);
  attention(host_params(pc, runs.back()), Backend::cpu);
}

// bf16 without the diagnostics on the call-wide path: whole key tiles seen by every row of a query
// tile are done in batches of up to kPvBatch (on AMX one fused softmax step per 16-row group over
// the batch, TileKernels::dense_bf16). Batches cut by partial tiles, a block mask, a causal
// diagonal and the key-0 bias tile; short row groups; lq < lk with GQA 4:1; head dims 48-128;
// logits near ±1e4; strided views; on every table.
TEST(AttentionCpu, DenseBatchesMatchReference) {
  const auto make = bf16_case;
  std::vector<AttnCase> cs = {
      make({300, 77}, {}, 4, 2, 80, "full"),         make({512}, {}, 2, 1, 128, "causal"),
      make({256}, {700}, 4, 1, 64, "full"),          make({640}, {}, 2, 2, 80, "causal+blocks:0.5@64"),
      make({64, 256}, {600, 256}, 2, 1, 80, "full"),  make({200}, {}, 2, 1, 96, "full"),
      make({130}, {}, 2, 2, 48, "full"),
  };
  for (SinkMode mode : {SinkMode::denominator, SinkMode::key0_bias}) {
    AttnCase c = make({400}, {}, 4, 2, 80, "full");
    c.sink_mode = mode;
    c.sink = std::numeric_limits<float>::quiet_NaN();  // random per head
    cs.push_back(c);
  }
  AttnCase large = make({384}, {}, 2, 1, 80, "full");
  large.input_scale = 35;  // logits ~1e4: each step's maximum moves by thousands
  cs.push_back(large);
  AttnCase shifted = make({320}, {}, 2, 2, 64, "full");
  shifted.logit_shift = 3000;
  cs.push_back(shifted);
  AttnCase padded = make({257, 64}, {}, 8, 2, 80, "full");
  padded.token_pad = 24;
  cs.push_back(padded);
  expect_reference_on_every_table(cs);
  expect_thread_independent(prepare(cs[0]));
}

// The same batches with a non-finite value: a NaN query row, a +inf query row (logits ±inf), a NaN
// key in the first batch (every row of its KV group poisoned before the second batch starts), one
// in the second batch, and every key +inf in one channel (rows whose logits are all −inf see no key).
// The poisoned rows come out NaN (out and LSE), the rows without a key empty (out 0, LSE −inf);
// every other row keeps the reference's value, also the rows that share a 16-row group with a
// poisoned one (docs/numerics.md). The same in a ±64 window, where stream mode runs whole 16-row
// groups through one softmax step per run of key tiles (TileKernels::band_bf16 on AMX): there a
// poisoned key reaches only the rows whose window holds it.
TEST(AttentionCpu, DenseBatchesPoisonOnlyTheirRows) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  struct Poison {
    const char* what;
    char tensor;
    int64_t row;
    float value;
  };
  // Row 37 poisons an even 16-row group, row 250 an odd one: at head dim 128 groups run their P·V
  // in pairs (pv_pair), and a poisoned group sends its waiting partner through the single path.
  for (const char* pattern : {"full", "window:64,64"})
  for (const int dim : {80, 128}) {
    const bool window = pattern[0] == 'w';
    for (const Poison& z : {Poison{"q NaN", 'q', 37, nan}, Poison{"q +inf", 'q', 250, inf},
                           Poison{"k NaN, first batch", 'k', 70, nan}, Poison{"k NaN, second batch", 'k', 300, nan},
                           Poison{"every k +inf", 'K', 0, inf}}) {
      AttnCase c = make_case({512}, {}, 4, 2, dim, pattern, DType::bf16);
      c.f32_out = true;
      PreparedCase pc = prepare(c, salt());
      const int h = 1, g = 0;  // query head 1 reads KV head 0
      if (z.tensor == 'q') pc.in.params.q.set({z.row, h, 0}, z.value);
      else if (z.tensor == 'k') pc.in.params.k.set({z.row, g, 5}, z.value);
      else
        for (int64_t j = 0; j < 512; ++j) pc.in.params.k.set({j, g, 5}, z.value);
      for (const char* isa : kIsas) {
        if (!cpu::tile_kernels_available(isa)) continue;
        SCOPED_TRACE(std::string(z.what) + " at d " + std::to_string(dim) + ", " + pattern + " on cpu/" + isa);
        std::vector<CaseOutputs> runs;
        run_on_table(pc, isa, runs);
        const float* out = runs[0].out.as<float>();
        const float* lse = runs[0].lse.as<float>();
        const float* ref_out = pc.ref.out.as<float>();
        const float* ref_lse = pc.ref.lse.as<float>();
        // The tolerance rule of docs/numerics.md (tests/common.hpp) on the clean rows: relative L2 within
        // tol, every element within 10·tol·max|ref|, the LSE within tol·max(1, |ref|).
        float ref_max = 1e-3f;
        for (int64_t i = 0; i < pc.ref.out.numel(); ++i) ref_max = std::max(ref_max, std::abs(ref_out[i]));
        int bad_rows = 0, wrong = 0, empty_rows = 0;
        double err2 = 0, ref2 = 0;
        for (int hh = 0; hh < c.heads_q; ++hh)
          for (int64_t r = 0; r < 512; ++r) {
            const bool sees = z.tensor != 'k' || !window || std::abs(r - z.row) <= 64;
            const bool poisoned = z.tensor == 'q' ? hh == h && r == z.row : hh / 2 == g && sees;
            const float l = lse[hh * 512 + r];
            const float* o = out + (r * c.heads_q + hh) * c.dim;
            // Every key +inf in channel 5: a query negative there has only −inf logits, so it sees no
            // key (out 0, LSE −inf); any other query of the group meets +inf or inf·0 (NaN).
            if (poisoned && z.tensor == 'K' && pc.in.params.q.get({r, hh, 5}) < 0) {
              bool empty = l == -inf;
              for (int j = 0; j < c.dim; ++j) empty = empty && o[j] == 0.f;
              empty_rows += 1;
              bad_rows += empty ? 0 : 1;
              continue;
            }
            if (poisoned) {
              bool all_nan = std::isnan(l);
              for (int j = 0; j < c.dim; ++j) all_nan = all_nan && std::isnan(o[j]);
              bad_rows += all_nan ? 0 : 1;
              continue;
            }
            const float* ro = ref_out + (r * c.heads_q + hh) * c.dim;
            const float rl = ref_lse[hh * 512 + r];
            bool near = std::abs(l - rl) <= pc.tol * std::max(1.f, std::abs(rl));
            for (int j = 0; j < c.dim; ++j) {
              near = near && std::abs(o[j] - ro[j]) <= 10 * pc.tol * ref_max;
              err2 += double(o[j] - ro[j]) * (o[j] - ro[j]);
              ref2 += double(ro[j]) * ro[j];
            }
            wrong += near ? 0 : 1;
          }
        EXPECT_EQ(bad_rows, 0) << "poisoned rows that are not NaN everywhere, or empty rows not empty";
        if (z.tensor == 'K') {
          EXPECT_GT(empty_rows, 100);
        }
        EXPECT_EQ(wrong, 0) << "clean rows off the reference";
        EXPECT_LE(std::sqrt(err2 / ref2), pc.tol) << "relative L2 of the clean rows";
      }
    }
  }
}

TEST(AttentionCpu, ThreadAndKernelSettingsRejectBadValues) {
  EXPECT_THROW(set_cpu_threads(0), Error);
  EXPECT_THROW(cpu::force_tile_kernels("sse9"), Error);
  EXPECT_GE(cpu_threads(), 1);
  EXPECT_TRUE(cpu::tile_kernels_available("generic"));
}

// The two AVX-512 tables share every fp32 kernel; "avx512" has no bf16 product (bf16 inputs take the
// fp32 ones, so it needs no AVX512-BF16), "avx512bf16" has them, and each table the CPU can run
// implies the ones it builds on.
TEST(AttentionCpu, Avx512TablesDifferOnlyInTheBf16Products) {
  const cpu::TileKernels* a = cpu::tile_kernels_avx512();
  const cpu::TileKernels* b = cpu::tile_kernels_avx512bf16();
  if (a == nullptr || b == nullptr) GTEST_SKIP() << "not an x86-64 build";
  EXPECT_STREQ(a->name, "avx512");
  EXPECT_STREQ(b->name, "avx512bf16");
  EXPECT_EQ(a->qk_bf16, nullptr);
  EXPECT_EQ(a->pv_bf16, nullptr);
  EXPECT_EQ(a->store_bf16, nullptr);
  EXPECT_NE(b->qk_bf16, nullptr);
  EXPECT_NE(b->pv_bf16, nullptr);
  EXPECT_EQ(a->qk_f32, b->qk_f32);
  EXPECT_EQ(a->softmax, b->softmax);
  EXPECT_EQ(a->pv_f32, b->pv_f32);
  EXPECT_EQ(a->probs, b->probs);
  const auto implies = [](const char* t, const char* base) {
    return !cpu::tile_kernels_available(t) || cpu::tile_kernels_available(base);
  };
  EXPECT_TRUE(implies("amx", "avx512bf16"));
  EXPECT_TRUE(implies("avx512bf16", "avx512"));
  EXPECT_TRUE(implies("avx512", "avx2"));
}

// force_tile_kernels("") returns to the table the process was configured with (ARIADNE_CPU_ISA's,
// read once, else the best), so a test that forces a table does not lift the user's cap.
TEST(AttentionCpu, ForcedKernelsReturnToTheConfiguredTable) {
  const cpu::TileKernels* configured = &cpu::active_tile_kernels();
  cpu::force_tile_kernels("generic");
  EXPECT_STREQ(cpu::active_tile_kernels().name, cpu::tile_kernels_generic()->name);
  cpu::force_tile_kernels("");
  EXPECT_EQ(&cpu::active_tile_kernels(), configured);
}

// A table with per-thread state (AMX: the tile configuration loaded once per session) must give the
// products of a session exactly as it gives them alone, also when a session's product of another
// head dim reloads the configuration in between (d 80 and d 128 here; 7-row groups take the short
// path). Runs where the CPU has such a table (the device machine's Xeon), else skips.
TEST(AttentionCpu, Bf16SessionProductsEqualStandaloneOnes) {
  const cpu::TileKernels* k = cpu::tile_kernels_available("amx") ? cpu::tile_kernels_amx() : nullptr;
  if (k == nullptr || k->begin_bf16 == nullptr) GTEST_SKIP() << "no kernel table with per-thread state here";
  std::mt19937_64 rng(31);
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  auto bf16_words = [&](size_t n) {  // bf16 of magnitude 2^-8 .. 2^1, either sign
    std::vector<uint16_t> w(n);
    for (auto& x : w) x = uint16_t(0x3b80u + rng() % 0x480u) | uint16_t(rng() % 2 ? 0x8000u : 0u);
    return w;
  };
  struct Product {
    int dp, rows;
    std::vector<uint16_t> q, kt, v;
    std::vector<float> p, alpha;
  };
  std::vector<Product> products;
  for (int dp : {40, 64, 40})
    for (int rows : {32, 7}) {
      Product x{dp, rows, bf16_words(size_t(rows) * 2 * dp), bf16_words(size_t(dp) * cpu::kKeyTile * 2),
                bf16_words(size_t(16) * 2 * dp * 2), std::vector<float>(size_t(rows) * cpu::kKeyTile),
                std::vector<float>(size_t(rows))};
      for (auto& f : x.p) f = unit(rng);
      for (auto& f : x.alpha) f = unit(rng);
      products.push_back(std::move(x));
    }
  auto run = [&](const Product& x, std::vector<float>& s, std::vector<float>& o) {
    s.assign(size_t(x.rows) * cpu::kKeyTile, 0.f);
    o.assign(size_t(x.rows) * 2 * x.dp, 0.5f);
    k->qk_bf16(x.q.data(), 2 * x.dp, reinterpret_cast<const uint16_t*>(x.kt.data()), x.dp, x.rows, s.data());
    k->pv_bf16(x.p.data(), x.v.data(), 2 * x.dp, x.rows, x.alpha.data(), o.data());
  };
  std::vector<std::vector<float>> alone_s(products.size()), alone_o(products.size());
  for (size_t i = 0; i < products.size(); ++i) run(products[i], alone_s[i], alone_o[i]);
  std::vector<float> s, o;
  {
    const cpu::Bf16Session session(*k, true, 40);
    for (size_t i = 0; i < products.size(); ++i) {
      run(products[i], s, o);
      EXPECT_EQ(s, alone_s[i]) << "product " << i;
      EXPECT_EQ(o, alone_o[i]) << "product " << i;
    }
  }
  run(products[0], s, o);  // after the session, alone again
  EXPECT_EQ(s, alone_s[0]);
}

}  // namespace
}  // namespace ariadne
