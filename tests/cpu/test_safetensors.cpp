// safetensors reader/writer: round trips in every supported dtype, and every malformed header the
// reader must refuse with a message naming the file and the tensor or field.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include <gtest/gtest.h>

#include "ariadne/safetensors.hpp"
#include "common.hpp"

namespace ariadne {
namespace {

std::string temp_path(const std::string& name) {
  static const testing::TempDir dir("ariadne-st");  // removed when the test binary exits
  return dir / name;
}

// A file made of an explicit header length, header text and data bytes.
std::string write_raw(const std::string& name, uint64_t length, const std::string& header, size_t data_bytes) {
  const std::string path = temp_path(name);
  std::ofstream f(path, std::ios::binary);
  for (int i = 0; i < 8; ++i) f.put(char(uint8_t(length >> (8 * i))));
  f << header;
  f << std::string(data_bytes, '\x01');
  return path;
}
std::string write_header(const std::string& name, const std::string& header, size_t data_bytes) {
  return write_raw(name, header.size(), header, data_bytes);
}

// Expects construction (and, when `tensor` is given, read_f32 of it) to throw with every fragment.
void expect_error(const std::string& path, std::vector<std::string> fragments, const std::string& tensor = "") {
  try {
    SafetensorsFile f(path);
    if (!tensor.empty()) f.read_f32(tensor);
    ADD_FAILURE() << path << ": no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    fragments.push_back(path);
    for (const auto& fr : fragments) EXPECT_NE(msg.find(fr), std::string::npos) << "'" << fr << "' missing in: " << msg;
  }
}

TEST(Safetensors, RoundTripEveryDtypeAndRank) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-3, 3);
  std::vector<float> a(2 * 3 * 2 * 2 * 5);  // rank 5, like a Conv3d weight
  for (float& x : a) x = u(rng);
  std::vector<uint16_t> b(7), h(4 * 3);
  std::vector<float> b_ref, h_ref;
  for (auto& x : b) {
    x = float_to_bf16(u(rng));
    b_ref.push_back(bf16_to_float(x));
  }
  for (auto& x : h) {
    x = float_to_f16(u(rng));
    h_ref.push_back(f16_to_float(x));
  }
  const float scalar = 2.5f;
  const std::string path = temp_path("ok.safetensors");
  write_safetensors(path,
                    {{"w.conv", DType::f32, {2, 3, 2, 2, 5}, a.data()},
                     {"b", DType::bf16, {7}, b.data()},
                     {"h", DType::f16, {4, 3}, h.data()},
                     {"s", DType::f32, {}, &scalar},
                     {"empty", DType::f32, {0, 4}, nullptr}},
                    {{"format", "pt"}, {"note", "x"}});
  SafetensorsFile f(path);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"b", "empty", "h", "s", "w.conv"}));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.entry("w.conv").shape, (std::vector<int64_t>{2, 3, 2, 2, 5}));
  EXPECT_EQ(f.entry("b").dtype, DType::bf16);
  EXPECT_EQ(f.read_f32("w.conv"), a);
  EXPECT_EQ(f.read_f32("b"), b_ref);
  EXPECT_EQ(f.read_f32("h"), h_ref);
  EXPECT_EQ(f.read_f32("s"), std::vector<float>{2.5f});
  EXPECT_TRUE(f.read_f32("empty").empty());
  EXPECT_EQ(f.entry("s").numel(), 1);
  // The data offsets written must start 8-aligned (header padded with spaces).
  EXPECT_EQ(reinterpret_cast<uintptr_t>(f.bytes("b")) % 8, 0u);
  SafetensorsFile moved = std::move(f);
  EXPECT_EQ(moved.read_f32("h"), h_ref);
  expect_error(path, {"no tensor named 'nope'"}, "nope");
}

TEST(Safetensors, WriterRefusesBadInput) {
  float x = 1;
  EXPECT_THROW(write_safetensors(temp_path("w1"), {{"a", DType::f32, {1}, &x}, {"a", DType::f32, {1}, &x}}), Error);
  EXPECT_THROW(write_safetensors(temp_path("w2"), {{"__metadata__", DType::f32, {1}, &x}}), Error);
  EXPECT_THROW(write_safetensors(temp_path("w3"), {{"a", DType::f32, {-1}, &x}}), Error);
  EXPECT_THROW(write_safetensors("/nonexistent-dir/x.safetensors", {{"a", DType::f32, {1}, &x}}), Error);
}

TEST(Safetensors, RefusesShortAndHugeHeaders) {
  const std::string tiny = temp_path("tiny");
  std::ofstream(tiny) << "abc";
  expect_error(tiny, {"too short"});
  expect_error(write_raw("zero", 0, "", 0), {"header length is 0"});
  expect_error(write_raw("huge", uint64_t(1) << 40, "{}", 0), {"100 MB"});
  expect_error(write_raw("trunc", 500, "{\"a\": 1}", 10), {"exceeds the file size"});
  expect_error("/nonexistent/file.safetensors", {"cannot open"});
}

TEST(Safetensors, RefusesMalformedJson) {
  expect_error(write_header("badjson", "{\"a\": ", 0), {"not valid JSON"});
  expect_error(write_header("array", "[1, 2]", 0), {"expected an object"});
  expect_error(write_header("dup", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4),
               {"duplicate key 'a'"});
  expect_error(write_header("meta", R"({"__metadata__":{"k":1}})", 0), {"__metadata__['k']", "expected a string"});
  expect_error(write_header("meta2", R"({"__metadata__":[1]})", 0), {"__metadata__"});
  expect_error(write_header("entry", R"({"t":5})", 0), {"tensor 't'", "expected an object"});
}

TEST(Safetensors, RefusesBadFields) {
  expect_error(write_header("nodtype", R"({"t":{"shape":[1],"data_offsets":[0,4]}})", 4), {"tensor 't'", "'dtype'"});
  expect_error(write_header("noshape", R"({"t":{"dtype":"F32","data_offsets":[0,4]}})", 4), {"tensor 't'", "'shape'"});
  expect_error(write_header("nooff", R"({"t":{"dtype":"F32","shape":[1]}})", 4), {"tensor 't'", "'data_offsets'"});
  expect_error(write_header("off3", R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", 4), {"'data_offsets'"});
  expect_error(write_header("extra", R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})", 4),
               {"tensor 't'", "unknown field 'x'"});
  expect_error(write_header("dtype", R"({"t":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})", 4),
               {"tensor 't'", "unknown dtype 'F33'"});
  expect_error(write_header("neg", R"({"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4), {"tensor 't'", "shape[0]"});
  expect_error(write_header("flt", R"({"t":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4), {"tensor 't'", "shape[0]"});
  expect_error(write_header("negoff", R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 4), {"tensor 't'", "data_offsets"});
  expect_error(write_header("ovf", R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", 4),
               {"tensor 't'", "overflows"});
}

TEST(Safetensors, RefusesBadOffsets) {
  expect_error(write_header("size", R"({"t":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", 20),
               {"tensor 't'", "cover 20 bytes", "needs 24"});
  expect_error(write_header("rev", R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", 8), {"tensor 't'", "end before"});
  expect_error(write_header("range", R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 12),
               {"tensor 't'", "past the data buffer"});
  expect_error(write_header("overlap", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
               {"tensor 'b'", "overlaps tensor 'a'"});
  expect_error(write_header("hole", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})", 12),
               {"tensor 'b'", "hole"});
  expect_error(write_header("trail", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 9), {"trailing bytes"});
}

TEST(Safetensors, OtherDtypesAreValidatedButNotRead) {
  const std::string p = write_header("i64", R"({"ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},"w":{"dtype":"F32","shape":[1],"data_offsets":[16,20]}})", 20);
  SafetensorsFile f(p);
  EXPECT_FALSE(f.entry("ids").supported);
  EXPECT_EQ(f.read_f32("w").size(), 1u);
  expect_error(p, {"tensor 'ids'", "I64", "only F32, BF16 and F16"}, "ids");
}

// Seeded corruptions of a valid file (flipped header bytes, truncations, forged lengths): every one
// either opens and reads consistently or throws ariadne::Error — never crashes (run under ASan too).
TEST(Safetensors, CorruptedFilesNeverCrash) {
  std::vector<float> a(24, 1.5f);
  std::vector<uint16_t> b(10, 0x3f80);
  const std::string good = temp_path("fuzz_src.safetensors");
  write_safetensors(good, {{"a", DType::f32, {2, 3, 4}, a.data()}, {"b", DType::bf16, {10}, b.data()}}, {{"k", "v"}});
  std::ifstream in(good, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::mt19937 rng(99);
  int opened = 0, refused = 0;
  for (int iter = 0; iter < 300; ++iter) {
    std::string m = bytes;
    const int kind = iter % 3;
    if (kind == 0) {  // flip 1-3 bytes of the length or the JSON header
      const size_t header_end = 8 + size_t(uint8_t(bytes[0]) | uint8_t(bytes[1]) << 8);
      for (int k = 0; k < 1 + int(rng() % 3); ++k) m[rng() % header_end] = char(rng());
    } else if (kind == 1) {  // truncate anywhere
      m.resize(rng() % bytes.size());
    } else {  // forge the length field
      const uint64_t len = rng() % 2 ? uint64_t(rng()) : uint64_t(rng()) << 32 | rng();
      for (int i = 0; i < 8; ++i) m[size_t(i)] = char(uint8_t(len >> (8 * i)));
    }
    const std::string path = temp_path("fuzz.safetensors");
    std::ofstream(path, std::ios::binary | std::ios::trunc) << m;
    try {
      SafetensorsFile f(path);
      for (const auto& n : f.names()) {
        if (f.entry(n).supported) {
          EXPECT_EQ(f.read_f32(n).size(), size_t(f.entry(n).numel()));
        }
      }
      ++opened;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      ++refused;
    }
  }
  EXPECT_GT(refused, 100);  // the corruptions are real
}

}  // namespace
}  // namespace ariadne
