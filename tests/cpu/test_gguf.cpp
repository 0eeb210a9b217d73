// GGUF reader: hand-built files with every value type and tensor type, dequantization against
// the block formulas written out here, and malformed files (each must fail with a message naming
// the file and the field).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "ariadne/error.hpp"
#include "ariadne/gguf.hpp"
#include "ariadne/tensor.hpp"
#include "common.hpp"

namespace ariadne {
namespace {

template <class T>
void put(std::vector<uint8_t>& b, T v) {
  const size_t at = b.size();
  b.resize(at + sizeof(T));
  std::memcpy(b.data() + at, &v, sizeof(T));
}
void put_str(std::vector<uint8_t>& b, const std::string& s) {
  put<uint64_t>(b, s.size());
  b.insert(b.end(), s.begin(), s.end());
}

void expect_error(const std::vector<uint8_t>& bytes, const std::vector<std::string>& fragments) {
  try {
    GgufFile::parse(bytes.data(), bytes.size(), "bad.gguf");
    ADD_FAILURE() << "no error; expected one mentioning " << fragments[0];
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("bad.gguf"), std::string::npos) << msg;
    for (const std::string& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
  }
}

std::vector<float> random_values(int64_t n, uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(rng);
  return v;
}

float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_float(h);
}

TEST(Gguf, EveryValueTypeRoundTrips) {
  std::vector<std::pair<std::string, GgufValue>> kv;
  auto scalar = [](GgufValueType t, int64_t i, double f) {
    GgufValue v;
    v.type = t;
    v.i = i;
    v.u = uint64_t(i);
    v.f = f;
    return v;
  };
  kv.push_back({"u8", scalar(GgufValueType::u8, 250, 0)});
  kv.push_back({"i8", scalar(GgufValueType::i8, -100, 0)});
  kv.push_back({"u16", scalar(GgufValueType::u16, 65000, 0)});
  kv.push_back({"i16", scalar(GgufValueType::i16, -32000, 0)});
  kv.push_back({"u32", gguf_u32(4000000000u)});
  kv.push_back({"i32", gguf_i32(-2000000000)});
  kv.push_back({"f32", gguf_f32(1.5f)});
  kv.push_back({"bool", gguf_bool(true)});
  kv.push_back({"str", gguf_str("héllo")});
  GgufValue u64 = scalar(GgufValueType::u64, 0, 0);
  u64.u = 18000000000000000000ull;
  kv.push_back({"u64", u64});
  kv.push_back({"i64", scalar(GgufValueType::i64, -9000000000000ll, 0)});
  kv.push_back({"f64", scalar(GgufValueType::f64, 0, -2.25)});
  kv.push_back({"strs", gguf_str_array({"a", "", "bc"})});
  kv.push_back({"ints", gguf_i32_array({1, -2, 3})});
  GgufValue nested;
  nested.type = GgufValueType::array;
  nested.item_type = GgufValueType::array;
  nested.items = {gguf_i32_array({7}), gguf_i32_array({})};
  kv.push_back({"nested", nested});
  const std::vector<uint8_t> bytes = gguf_serialize(kv, {});
  const GgufFile f = GgufFile::parse(bytes.data(), bytes.size(), "kv.gguf");
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.metadata().size(), kv.size());
  EXPECT_EQ(f.get_int("u8"), 250);
  EXPECT_EQ(f.get_int("i8"), -100);
  EXPECT_EQ(f.get_int("u16"), 65000);
  EXPECT_EQ(f.get_int("i16"), -32000);
  EXPECT_EQ(f.get_int("u32"), 4000000000ll);
  EXPECT_EQ(f.get_int("i32"), -2000000000);
  EXPECT_EQ(f.get_float("f32"), 1.5);
  EXPECT_TRUE(f.get_bool("bool", false));
  EXPECT_EQ(f.get_string("str"), "héllo");
  EXPECT_EQ(f.value("u64").u, 18000000000000000000ull);
  EXPECT_THROW(f.get_int("u64"), Error);  // above INT64_MAX
  EXPECT_EQ(f.get_int("i64"), -9000000000000ll);
  EXPECT_EQ(f.get_float("f64"), -2.25);
  EXPECT_EQ(f.get_strings("strs"), (std::vector<std::string>{"a", "", "bc"}));
  EXPECT_EQ(f.get_ints("ints"), (std::vector<int64_t>{1, -2, 3}));
  ASSERT_EQ(f.value("nested").items.size(), 2u);
  EXPECT_EQ(f.value("nested").items[0].int_at(0), 7);  // inner arrays are stored compactly
  // Typed getters refuse other types and absent keys, naming the key.
  EXPECT_THROW(f.get_string("u8"), Error);
  EXPECT_THROW(f.get_strings("ints"), Error);
  EXPECT_EQ(f.get_int("absent", 42), 42);
  try {
    f.get_int("absent");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'absent'"), std::string::npos);
  }
}

// Each quant type against its block formula, computed here from the raw bytes.
TEST(Gguf, DequantizeMatchesBlockFormulas) {
  const int64_t n = 96;
  const std::vector<float> x = random_values(n, 3, -2.f, 3.f);
  for (GgmlType t : {GgmlType::f32, GgmlType::f16, GgmlType::q8_0, GgmlType::q4_0, GgmlType::q4_1}) {
    SCOPED_TRACE(ggml_type_name(t));
    const std::vector<uint8_t> q = ggml_quantize(t, x.data(), n);
    ASSERT_EQ(int64_t(q.size()), n / ggml_block_values(t) * ggml_block_bytes(t));
    std::vector<float> got(static_cast<size_t>(n));
    ggml_dequantize(t, q.data(), n, got.data());
    for (int64_t i = 0; i < n; ++i) {
      const int64_t b = i / 32, j = i % 32;
      const uint8_t* p = q.data() + b * ggml_block_bytes(t);
      float want = 0;
      switch (t) {
        case GgmlType::f32: std::memcpy(&want, q.data() + 4 * i, 4); break;
        case GgmlType::f16: want = f16_at(q.data() + 2 * i); break;
        case GgmlType::q8_0: want = f16_at(p) * float(int8_t(p[2 + j])); break;
        case GgmlType::q4_0: {
          const int nib = j < 16 ? (p[2 + j] & 15) : (p[2 + j - 16] >> 4);
          want = f16_at(p) * float(nib - 8);
          break;
        }
        case GgmlType::q4_1: {
          const int nib = j < 16 ? (p[4 + j] & 15) : (p[4 + j - 16] >> 4);
          want = f16_at(p) * float(nib) + f16_at(p + 2);
          break;
        }
      }
      ASSERT_EQ(got[size_t(i)], want) << "value " << i;
      // And the encoder is a sane quantizer: within half a step of the input (4-bit: range/15).
      const double tol = t == GgmlType::f32 ? 0 : t == GgmlType::f16 ? 2e-3 : t == GgmlType::q8_0 ? 0.02 : 0.4;
      EXPECT_NEAR(got[size_t(i)], x[size_t(i)], tol) << "value " << i;
    }
  }
}

TEST(Gguf, TensorsAlignedAndReadFromAMappedFile) {
  const std::vector<float> a = random_values(64 * 3, 5, -1, 1), b = random_values(32, 6, -1, 1);
  std::vector<GgufWriterTensor> ts = {
      {"w.q4_1", {64, 3}, GgmlType::q4_1, ggml_quantize(GgmlType::q4_1, a.data(), 64 * 3)},
      {"v.f32", {32}, GgmlType::f32, ggml_quantize(GgmlType::f32, b.data(), 32)},
  };
  for (uint32_t align : {32u, 64u, 256u}) {
    SCOPED_TRACE(align);
    const std::vector<uint8_t> bytes = gguf_serialize({{"general.name", gguf_str("t")}}, ts, align);
    const testing::TempDir dir("ariadne-gguf");
    const std::string path = dir / "t.gguf";
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    const GgufFile f = GgufFile::open(path);
    EXPECT_EQ(f.alignment(), align);
    EXPECT_EQ(f.data_start() % align, 0u);
    const GgufTensor& w = f.tensor("w.q4_1");
    EXPECT_EQ(w.dims, (std::vector<int64_t>{64, 3}));
    EXPECT_EQ(w.rows(), 3);
    EXPECT_EQ(w.offset % align, 0u);
    std::vector<float> want(64 * 3);
    ggml_dequantize(GgmlType::q4_1, ts[0].bytes.data(), 64 * 3, want.data());
    EXPECT_EQ(f.to_float(w), want);
    std::vector<float> row(64);
    f.rows_to_float(w, 2, 1, row.data());
    EXPECT_EQ(row, std::vector<float>(want.begin() + 128, want.end()));
    EXPECT_THROW(f.rows_to_float(w, 2, 2, row.data()), Error);
    EXPECT_EQ(f.to_float(f.tensor("v.f32")), b);
    EXPECT_THROW(f.tensor("missing"), Error);
  }
}

// A minimal valid file: one f32 tensor of 8 values.
std::vector<uint8_t> one_tensor_file(uint64_t dim, uint32_t type, uint64_t offset, uint32_t n_dims = 1) {
  std::vector<uint8_t> b;
  put<uint32_t>(b, 0x46554747u);
  put<uint32_t>(b, 3);
  put<uint64_t>(b, 1);
  put<uint64_t>(b, 0);
  put_str(b, "t");
  put<uint32_t>(b, n_dims);
  for (uint32_t i = 0; i < n_dims; ++i) put<uint64_t>(b, i == 0 ? dim : 1);
  put<uint32_t>(b, type);
  put<uint64_t>(b, offset);
  b.resize((b.size() + 31) / 32 * 32, 0);
  b.resize(b.size() + 32, 0);
  return b;
}

TEST(Gguf, RefusesMalformedFiles) {
  // The baseline is valid, so each failure below is the one change.
  { const auto ok = one_tensor_file(8, 0, 0); EXPECT_NO_THROW(GgufFile::parse(ok.data(), ok.size(), "ok")); }
  expect_error({'G', 'G', 'U'}, {"magic", "truncated"});
  auto bad_magic = one_tensor_file(8, 0, 0);
  bad_magic[0] = 'X';
  expect_error(bad_magic, {"magic"});
  auto v1 = one_tensor_file(8, 0, 0);
  v1[4] = 1;
  expect_error(v1, {"version 1"});
  // Truncated anywhere inside the tensor info.
  const auto full = one_tensor_file(8, 0, 0);
  for (size_t cut : {size_t(10), size_t(30), size_t(40), size_t(50)})
    expect_error(std::vector<uint8_t>(full.begin(), full.begin() + long(cut)), {"truncated"});
  expect_error(one_tensor_file(8, 0, 32), {"tensor 't'", "runs past the end"});       // data past the end
  expect_error(one_tensor_file(8, 0, 4), {"tensor 't'", "alignment"});                // misaligned offset
  expect_error(one_tensor_file(8, 99, 0), {"tensor 't'", "ggml type 99"});            // unknown tensor type
  expect_error(one_tensor_file(8, 12, 0), {"tensor 't'", "not supported"});           // known, not decoded (Q4_K)
  expect_error(one_tensor_file(8, 0, 0, 5), {"tensor 't'", "n_dims"});
  expect_error(one_tensor_file(0, 0, 0), {"tensor 't'", "dim 0"});
  expect_error(one_tensor_file(uint64_t(1) << 63, 0, 0), {"tensor 't'", "dim 0"});    // element count overflow
  expect_error(one_tensor_file(40, 3, 0), {"tensor 't'", "block of 32"});             // Q4_1 row not whole blocks
  expect_error(one_tensor_file(uint64_t(1) << 40, 0, 0), {"tensor 't'", "runs past the end"});  // huge size
  expect_error(one_tensor_file(8, 0, ~uint64_t(0) - 31), {"tensor 't'", "runs past the end"});   // offset overflow

  // Huge counts are refused before anything is allocated.
  std::vector<uint8_t> huge;
  put<uint32_t>(huge, 0x46554747u);
  put<uint32_t>(huge, 3);
  put<uint64_t>(huge, ~uint64_t(0));
  put<uint64_t>(huge, 0);
  expect_error(huge, {"tensor_count"});
  std::vector<uint8_t> huge_kv;
  put<uint32_t>(huge_kv, 0x46554747u);
  put<uint32_t>(huge_kv, 2);
  put<uint64_t>(huge_kv, 0);
  put<uint64_t>(huge_kv, uint64_t(1) << 60);
  expect_error(huge_kv, {"metadata_kv_count"});

  auto kv_file = [](auto&& body) {
    std::vector<uint8_t> b;
    put<uint32_t>(b, 0x46554747u);
    put<uint32_t>(b, 3);
    put<uint64_t>(b, 0);
    put<uint64_t>(b, 1);
    put_str(b, "k");
    body(b);
    return b;
  };
  expect_error(kv_file([](auto& b) { put<uint32_t>(b, 13); }), {"'k'", "unknown value type 13"});
  expect_error(kv_file([](auto& b) {
                 put<uint32_t>(b, 9);
                 put<uint32_t>(b, 4);
                 put<uint64_t>(b, uint64_t(1) << 62);
               }),
               {"'k'", "array count"});
  expect_error(kv_file([](auto& b) {
                 put<uint32_t>(b, 9);
                 put<uint32_t>(b, 77);
                 put<uint64_t>(b, 1);
               }),
               {"'k'", "element type 77"});
  expect_error(kv_file([](auto& b) {
                 put<uint32_t>(b, 8);
                 put<uint64_t>(b, uint64_t(1) << 40);
               }),
               {"'k'", "string"});
  expect_error(kv_file([](auto& b) {
                 put<uint32_t>(b, 7);
                 put<uint8_t>(b, 2);
               }),
               {"'k'", "bool"});
  // Alignment must be a u32 power of two.
  auto align_file = [&](uint32_t type, uint32_t value) {
    std::vector<uint8_t> b;
    put<uint32_t>(b, 0x46554747u);
    put<uint32_t>(b, 3);
    put<uint64_t>(b, 0);
    put<uint64_t>(b, 1);
    put_str(b, "general.alignment");
    put<uint32_t>(b, type);
    put<uint32_t>(b, value);
    return b;
  };
  expect_error(align_file(4, 48), {"general.alignment", "power of two"});
  expect_error(align_file(4, 0), {"general.alignment", "power of two"});
  expect_error(align_file(5, 64), {"general.alignment", "expected u32"});
  // Duplicates.
  const std::vector<uint8_t> dup = gguf_serialize({{"a", gguf_u32(1)}, {"a", gguf_u32(2)}}, {});
  expect_error(dup, {"'a'", "twice"});
  const std::vector<float> z(32, 0.f);
  const std::vector<uint8_t> dup_t = gguf_serialize(
      {}, {{"x", {32}, GgmlType::f32, ggml_quantize(GgmlType::f32, z.data(), 32)},
           {"x", {32}, GgmlType::f32, ggml_quantize(GgmlType::f32, z.data(), 32)}});
  expect_error(dup_t, {"'x'", "twice"});
}

TEST(Gguf, OpenNamesMissingFile) {
  try {
    GgufFile::open("/nonexistent/model.gguf");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/model.gguf"), std::string::npos);
  }
}

}  // namespace
}  // namespace ariadne
