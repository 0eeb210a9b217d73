// Issue 29, size arithmetic: element counts, byte sizes and FLOP counts that overflow int64 must
// throw ariadne::Error naming the quantity, never wrap (a wrapped element count allocated 64 bytes
// and wrote past them; `flops --sides 28000` printed negative FLOPs; a GGUF F32 tensor of 2^62
// elements had a byte size of 0 and passed the bounds check). GGUF metadata must take memory in
// proportion to the file (a 20 MB file of array elements took 2 GB).
#include <gtest/gtest.h>

#include <malloc.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "ariadne/error.hpp"
#include "ariadne/file.hpp"
#include "ariadne/flops.hpp"
#include "ariadne/gguf.hpp"
#include "ariadne/npy.hpp"
#include "ariadne/safetensors.hpp"
#include "ariadne/schedule.hpp"
#include "ariadne/tensor.hpp"
#include "common.hpp"
#include "common.hpp"

namespace {

using namespace ariadne;

using ariadne::testing::error_of;

constexpr int64_t k2p62 = int64_t(1) << 62;

TEST(HostileSizes, CheckedHelpers) {
  EXPECT_EQ(checked_mul(int64_t(3), int64_t(4), "x"), 12);
  EXPECT_MSG(error_of([] { (void)checked_mul(k2p62, int64_t(4), "q: element count"); }),
             "q: element count: 4611686018427387904 · 4 overflows 64-bit integers");
  EXPECT_MSG(error_of([] { (void)checked_add(INT64_MAX, int64_t(1), "pairs"); }), "pairs: ");
  EXPECT_EQ(checked_numel(std::vector<int64_t>{2, 3, 4}, "t"), 24);
  EXPECT_EQ(checked_numel(std::vector<int64_t>{}, "t"), 1);
  EXPECT_EQ(checked_numel(std::vector<int64_t>{5, 0, 7}, "t"), 0);
  EXPECT_MSG(error_of([] { (void)checked_numel(std::vector<int64_t>{2, -1}, "t"); }), "t: dimension 1 is -1");
  // A zero dimension does not excuse the others: their product is a stride.
  EXPECT_MSG(error_of([] { (void)checked_numel(std::vector<int64_t>{0, k2p62, k2p62}, "t"); }),
             "t: element count overflows");
}

// attn --tokens 4 --heads 4611686018427387904 --dim 4: the count wrapped to 0 and a 64-byte buffer
// was written as if it held 2^64 elements.
TEST(HostileSizes, BufferAndViewsRefuseOverflowingShapes) {
  EXPECT_MSG(error_of([] { Buffer b(DType::f32, {4, k2p62, 4}); }), "Buffer of f32: element count overflows");
  EXPECT_MSG(error_of([] { Buffer b(DType::bf16, {k2p62 / 2, 2}); }), "Buffer of bf16: byte size");
  EXPECT_MSG(error_of([] { Buffer b(DType::f32, {2, -3}); }), "dimension 1 is -3");
  float x = 0;
  EXPECT_MSG(error_of([&] { (void)make_view(&x, DType::f32, {4, k2p62, 4}); }), "make_view: shape [4, ");
  // A view built by hand: numel() throws instead of wrapping.
  TensorView t;
  t.data = &x;
  t.rank = 3;
  t.shape = {281474976710656, 281474976710656, 4, 0};
  EXPECT_MSG(error_of([&] { (void)t.numel(); }), "element count overflows");
  EXPECT_EQ(make_view(&x, DType::f32, {3, 0, 5}).numel(), 0);
  EXPECT_EQ(Buffer(DType::f16, {7, 3}).numel(), 21);
}

// The FLOP model: a product that does not fit int64 is refused naming the quantity (a huge
// head_dim stands in for a huge image, which would take minutes to count).
TEST(HostileSizes, FlopModelRefusesOverflow) {
  EncoderShape shape;
  shape.head_dim = 1 << 30;
  const Schedule full = resolve_schedule("full");
  const std::string msg = error_of([&] { (void)schedule_cost(full, {image_grid(448)}, shape); });
  EXPECT_MSG(msg, "FLOPs");
  EXPECT_MSG(msg, "overflows 64-bit integers");
  // The same schedule at the real head_dim still counts (paper: 0.69T at 448²).
  const ScheduleCost c = schedule_cost(full, {image_grid(448)});
  EXPECT_GT(c.flops_paper, 0);
  EXPECT_EQ(c.flops_paper, 4 * c.flops);
}

// An F32 tensor of exactly 2^62 elements is 2^64 bytes: the size wrapped to 0 and passed the
// bounds check, so to_float() would have read 2^62 floats from an empty data section.
TEST(HostileSizes, GgufTensorByteSizeOverflowIsRejected) {
  for (const auto& dims : {std::vector<int64_t>{int64_t(1) << 31, int64_t(1) << 31},
                           std::vector<int64_t>{int64_t(1) << 40, int64_t(1) << 22}}) {
    GgufWriterTensor t;
    t.name = "huge";
    t.dims = dims;
    t.type = GgmlType::f32;
    const std::vector<uint8_t> bytes = gguf_serialize({}, {t});
    const std::string msg = error_of([&] { (void)GgufFile::parse(bytes.data(), bytes.size(), "huge.gguf"); });
    EXPECT_MSG(msg, "huge.gguf: tensor 'huge': byte size");
  }
  // F16 of 2^62 elements (2^63 bytes) still cannot pass the bounds check of a small file.
  GgufWriterTensor t;
  t.name = "half";
  t.dims = {int64_t(1) << 31, int64_t(1) << 31};
  t.type = GgmlType::f16;
  const std::vector<uint8_t> bytes = gguf_serialize({}, {t});
  EXPECT_THROW((void)GgufFile::parse(bytes.data(), bytes.size(), "half.gguf"), Error);
}

// A .npy array with a zero dimension and two huge ones: numel 0 passed, every stride overflowed.
TEST(HostileSizes, NpyShapeWithZeroAndHugeDimensionsIsRejected) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 999999999999999999, 999999999999999999), }";
  header.append(64 - (10 + header.size() + 1) % 64, ' ');
  header += '\n';
  std::vector<uint8_t> file = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, uint8_t(header.size() & 0xff),
                               uint8_t(header.size() >> 8)};
  file.insert(file.end(), header.begin(), header.end());
  EXPECT_MSG(error_of([&] { (void)parse_npy(file.data(), file.size(), "zero.npy"); }),
             "zero.npy: shape: element count overflows");
}

// The same for safetensors: the byte size was checked, the strides of a zero-size tensor were not.
TEST(HostileSizes, SafetensorsShapeWithZeroAndHugeDimensionsIsRejected) {
  std::string header = R"({"t": {"dtype": "F32", "shape": [0, 4611686018427387904, 4611686018427387904], "data_offsets": [0, 0]}})";
  std::vector<uint8_t> file(8);
  for (int i = 0; i < 8; ++i) file[size_t(i)] = uint8_t(uint64_t(header.size()) >> (8 * i));
  file.insert(file.end(), header.begin(), header.end());
  const ariadne::testing::TempDir dir("ariadne-sizes");
  const std::string path = dir / "zero.safetensors";
  write_file_atomic(path, file.data(), file.size());
  EXPECT_MSG(error_of([&] { SafetensorsFile f(path); }), "zero.safetensors: tensor 't': shape [0,");
  EXPECT_MSG(error_of([&] { SafetensorsFile f(path); }), "element count overflows");
}

uint64_t heap_in_use() {
  const struct mallinfo2 m = mallinfo2();
  return uint64_t(m.uordblks) + uint64_t(m.hblkhd);
}

// Metadata arrays were one 96-byte GgufValue per element: ~100x the file. Now numbers are kept as
// their stored bytes and strings as one blob, and nested arrays / keys are capped.
TEST(HostileSizes, GgufMetadataArraysAreCompact) {
  constexpr size_t n = 4u << 20;  // 4 Mi u8 elements: 4 MiB on disk, 400 MB as GgufValues
  GgufValue bytes_array;
  bytes_array.type = GgufValueType::array;
  bytes_array.item_type = GgufValueType::u8;
  bytes_array.raw.assign(n, 7);
  std::vector<std::string> words(200000, "tok");
  const std::vector<uint8_t> file =
      gguf_serialize({{"many", bytes_array}, {"words", gguf_str_array(words)}}, {});
  const uint64_t before = heap_in_use();
  {
    const GgufFile f = GgufFile::parse(file.data(), file.size(), "many.gguf");
    const uint64_t used = heap_in_use() - before;
    EXPECT_LT(used, 2 * file.size()) << used << " bytes of heap for a " << file.size() << "-byte file";
    const GgufValue& v = f.value("many");
    ASSERT_EQ(v.size(), n);
    EXPECT_EQ(v.int_at(n - 1), 7);
    EXPECT_EQ(f.value("words").size(), words.size());
    EXPECT_EQ(f.value("words").str_at(199999), "tok");
    EXPECT_EQ(f.get_strings("words").size(), words.size());
    EXPECT_THROW((void)v.str_at(0), Error);
    EXPECT_THROW((void)v.int_at(n), Error);
  }
  // 100,000 empty nested arrays (12 bytes each on disk) or keys: refused with a clear error.
  GgufValue nested;
  nested.type = GgufValueType::array;
  nested.item_type = GgufValueType::array;
  GgufValue empty;
  empty.type = GgufValueType::array;
  empty.item_type = GgufValueType::u8;
  nested.items.assign(100000, empty);
  const std::vector<uint8_t> deep = gguf_serialize({{"nested", nested}}, {});
  EXPECT_MSG(error_of([&] { (void)GgufFile::parse(deep.data(), deep.size(), "nested.gguf"); }),
             "nested.gguf: metadata 'nested'[65535]: the metadata holds more than 65536 values");
  std::vector<std::pair<std::string, GgufValue>> keys;
  for (int i = 0; i < 70000; ++i) {
    std::string key(1, 'k');  // (not "k" + ...: a GCC 12 -Wrestrict false positive)
    key += std::to_string(i);
    keys.push_back({key, gguf_u32(1)});
  }
  const std::vector<uint8_t> many_keys = gguf_serialize(keys, {});
  EXPECT_MSG(error_of([&] { (void)GgufFile::parse(many_keys.data(), many_keys.size(), "keys.gguf"); }),
             "the metadata holds more than 65536 values");
  // Float arrays read through float_at only (int64_t(NaN) would be undefined).
  GgufValue floats;
  floats.type = GgufValueType::array;
  floats.item_type = GgufValueType::f32;
  const float fv[2] = {1.5f, std::numeric_limits<float>::quiet_NaN()};
  floats.raw.assign(reinterpret_cast<const uint8_t*>(fv), reinterpret_cast<const uint8_t*>(fv) + 8);
  const std::vector<uint8_t> ff = gguf_serialize({{"f", floats}}, {});
  const GgufFile g = GgufFile::parse(ff.data(), ff.size(), "f.gguf");
  EXPECT_EQ(g.value("f").float_at(0), 1.5);
  EXPECT_TRUE(std::isnan(g.value("f").float_at(1)));
  EXPECT_THROW((void)g.value("f").int_at(1), Error);
  // Arrays still round-trip through the writer.
  const std::vector<uint8_t> ints = gguf_serialize({{"i", gguf_i32_array({1, -2, 3})}}, {});
  EXPECT_EQ(GgufFile::parse(ints.data(), ints.size(), "i.gguf").get_ints("i"), (std::vector<int64_t>{1, -2, 3}));
}

}  // namespace
