// .npy reader: round trips, hand-written headers of every version, malformed files, and the
// labelme-examples package's real arrays against the PNG masks they were saved from.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "ariadne/error.hpp"
#include "ariadne/mask.hpp"
#include "ariadne/npy.hpp"
#include "ariadne/tensor.hpp"
#include "common.hpp"

namespace {

using ariadne::NpyArray;
namespace fs = std::filesystem;

// Bytes of a .npy file with the given version, header text (newline added) and data.
std::vector<uint8_t> npy_bytes(int major, const std::string& header, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> b = {0x93, 'N', 'U', 'M', 'P', 'Y', uint8_t(major), 0};
  const std::string h = header + "\n";
  const size_t n = h.size();
  b.push_back(uint8_t(n & 0xff));
  b.push_back(uint8_t(n >> 8));
  if (major > 1) {
    b.push_back(0);
    b.push_back(0);
  }
  b.insert(b.end(), h.begin(), h.end());
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

NpyArray parse(const std::vector<uint8_t>& b) { return ariadne::parse_npy(b.data(), b.size(), "t.npy"); }

// Expects an ariadne::Error whose message names the file and contains `field`.
void expect_error(const std::vector<uint8_t>& b, const std::string& field) {
  try {
    parse(b);
    ADD_FAILURE() << "no error; expected one mentioning '" << field << "'";
  } catch (const ariadne::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("t.npy"), std::string::npos) << m;
    EXPECT_NE(m.find(field), std::string::npos) << "expected '" << field << "' in: " << m;
  }
}

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

TEST(Npy, WriteThenReadRoundTrips) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-5.f, 5.f);
  const ariadne::testing::TempDir dir("ariadne-npy");
  for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{{7}, {3, 5}, {2, 3, 4}, {0, 4}, {}}) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = u(rng);
    const std::string path = dir / "rt.npy";
    ariadne::write_npy(path, v.data(), shape);
    EXPECT_EQ(fs::file_size(path) % 64, (size_t(n) * 4) % 64) << "data must start on a 64-byte boundary";
    const NpyArray a = ariadne::read_npy(path);
    EXPECT_EQ(a.shape, shape);
    EXPECT_EQ(a.descr, "<f4");
    EXPECT_EQ(a.to_float(), v);
  }
}

TEST(Npy, HeaderVariantsAndDtypes) {
  // Version 2.0, double quotes, no trailing comma, f16 data.
  const uint16_t halves[3] = {ariadne::float_to_f16(1.5f), ariadne::float_to_f16(-2.f), ariadne::float_to_f16(0.25f)};
  std::vector<uint8_t> d(6);
  std::memcpy(d.data(), halves, 6);
  NpyArray a = parse(npy_bytes(2, "{\"descr\": \"<f2\", \"fortran_order\": False, \"shape\": (3,)}", d));
  EXPECT_EQ(a.to_float(), (std::vector<float>{1.5f, -2.f, 0.25f}));
  // Signed ints sign-extend; unsigned bytes; bools.
  const int16_t s[2] = {-3, 300};
  d.assign(4, 0);
  std::memcpy(d.data(), s, 4);
  a = parse(npy_bytes(1, "{'shape': (1, 2), 'fortran_order': False, 'descr': '<i2', }", d));
  EXPECT_EQ(a.to_int32(), (std::vector<int32_t>{-3, 300}));
  a = parse(npy_bytes(3, "{'descr': '|u1', 'fortran_order': False, 'shape': (2,), }", {255, 7}));
  EXPECT_EQ(a.to_int32(), (std::vector<int32_t>{255, 7}));
  a = parse(npy_bytes(1, "{'descr': '|b1', 'fortran_order': False, 'shape': (2,), }", {1, 0}));
  EXPECT_EQ(a.to_float(), (std::vector<float>{1.f, 0.f}));
}

TEST(Npy, MalformedFilesNameTheField) {
  const std::vector<uint8_t> four = f32_bytes({1, 2, 3, 4});
  const std::string ok = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }";
  ASSERT_NO_THROW(parse(npy_bytes(1, ok, four)));

  std::vector<uint8_t> b = npy_bytes(1, ok, four);
  b[1] = 'X';
  expect_error(b, "magic");
  b = npy_bytes(1, ok, four);
  b[6] = 4;
  expect_error(b, "version");
  expect_error(std::vector<uint8_t>(b.begin(), b.begin() + 9), "magic");  // too short for a preamble
  b = npy_bytes(1, ok, four);
  b[8] = 0xff;  // header length past the end of the file
  b[9] = 0x7f;
  expect_error(b, "header length");
  b = npy_bytes(1, ok, four);
  b[10 + ok.size()] = ' ';  // the newline that ends the header
  expect_error(b, "newline");
  expect_error(npy_bytes(1, "{'descr': '<f4', 'shape': (2, 2), }", four), "fortran_order");
  expect_error(npy_bytes(1, "{'descr': '<f4', 'fortran_order': False, }", four), "shape");
  expect_error(npy_bytes(1, "{'fortran_order': False, 'shape': (2, 2), }", four), "descr");
  expect_error(npy_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), 'x': 1}", four), "unknown key");
  expect_error(npy_bytes(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", four), "fortran_order");
  expect_error(npy_bytes(1, "{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2, 2), }", four), "fortran_order");
  expect_error(npy_bytes(1, "{'descr': '>f4', 'fortran_order': False, 'shape': (2, 2), }", four), "big-endian");
  expect_error(npy_bytes(1, "{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }", four), "descr");
  expect_error(npy_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, -2), }", four), "shape");
  expect_error(npy_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", four), "data size");
  expect_error(npy_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", four), "data size");
  expect_error(npy_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), ", four), "header");
  expect_error(npy_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 99999999999), }", four),
               "shape");
  // to_int32 refuses floats and values out of range.
  EXPECT_THROW(parse(npy_bytes(1, ok, four)).to_int32(), ariadne::Error);
  std::vector<uint8_t> big(8, 0xff);
  big[7] = 0x7f;
  EXPECT_THROW(parse(npy_bytes(1, "{'descr': '<i8', 'fortran_order': False, 'shape': (1,), }", big)).to_int32(),
               ariadne::Error);
  EXPECT_THROW(ariadne::read_npy("/nonexistent/x.npy"), ariadne::Error);
}

// Random byte mutations of a valid file: every outcome is a parsed array whose data matches its
// shape, or an ariadne::Error — never a crash (run under the sanitizer build to catch overreads).
TEST(Npy, MutatedFilesParseOrThrow) {
  const std::vector<uint8_t> good =
      npy_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", f32_bytes({1, 2, 3, 4, 5, 6}));
  std::mt19937 rng(9);
  int errors = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<uint8_t> b = good;
    const int edits = 1 + int(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % b.size();
      switch (rng() % 3) {
        case 0: b[at] = uint8_t(rng()); break;
        case 1: b.erase(b.begin() + long(at)); break;
        default: b.resize(at); break;
      }
      if (b.empty()) break;
    }
    try {
      const NpyArray a = parse(b);
      EXPECT_EQ(int64_t(a.data.size()), a.numel() * a.itemsize);
    } catch (const ariadne::Error&) {
      ++errors;
    }
  }
  EXPECT_GT(errors, 1000);  // most mutations break something and are caught
}

// labelme-examples ships each VOC class mask twice: as an int32 .npy and as a palette PNG.
TEST(Npy, SampleDataNpyAndPngMasksAgree) {
  const fs::path voc = "/usr/share/doc/labelme-examples/examples/instance_segmentation/data_dataset_voc";
  ASSERT_TRUE(fs::exists(voc)) << voc << " is missing: install labelme-examples (scripts/setup)";
  for (const char* stem : {"2011_000003", "2011_000006", "2011_000025"}) {
    for (const char* kind : {"SegmentationClass", "SegmentationObject"}) {
      const auto from_npy = ariadne::read_label_map((voc / kind / (std::string(stem) + ".npy")).string());
      const auto from_png = ariadne::read_label_map((voc / (std::string(kind) + "PNG") / (std::string(stem) + ".png")).string());
      ASSERT_EQ(from_npy.height, from_png.height);
      ASSERT_EQ(from_npy.width, from_png.width);
      // labelme saves -1 (unlabelled) in the .npy and palette index 255 in the PNG.
      std::vector<int32_t> npy_ids = from_npy.ids;
      for (int32_t& v : npy_ids)
        if (v == -1) v = 255;
      EXPECT_EQ(npy_ids, from_png.ids) << stem << " " << kind;
    }
  }
}

}  // namespace
