// Image decoding: PNG of every colour type and JPEG, decoded from files the test writes; corrupt,
// truncated and foreign files are refused with messages naming the file.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include <gtest/gtest.h>
#include <jpeglib.h>
#include <png.h>

#include "ariadne/error.hpp"
#include "ariadne/image.hpp"
#include "common.hpp"

namespace ariadne {
namespace {

std::string temp_path(const std::string& name) {
  static const testing::TempDir dir("ariadne-img");  // removed when the test binary exits
  return dir / name;
}

std::vector<uint8_t> slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}
void dump(const std::string& p, const std::vector<uint8_t>& b) {
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

Image pattern_image(int w, int h, int channels) {
  Image im;
  im.width = w;
  im.height = h;
  im.channels = channels;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < channels; ++c) im.pixels.push_back(uint8_t((x * 37 + y * 11 + c * 80) & 255));
  return im;
}

// A palette PNG written with libpng's simplified API (colour-mapped format): index = (x + y) % 3.
std::string write_palette_png(const std::string& name, int w, int h) {
  const std::string p = temp_path(name);
  png_image pi{};
  pi.version = PNG_IMAGE_VERSION;
  pi.width = png_uint_32(w);
  pi.height = png_uint_32(h);
  pi.format = PNG_FORMAT_RGB_COLORMAP;
  pi.colormap_entries = 3;
  const uint8_t cmap[9] = {255, 0, 0, 0, 255, 0, 0, 0, 255};
  std::vector<uint8_t> idx;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) idx.push_back(uint8_t((x + y) % 3));
  EXPECT_TRUE(png_image_write_to_file(&pi, p.c_str(), 0, idx.data(), 0, cmap)) << pi.message;
  png_image_free(&pi);
  return p;
}

std::string write_jpeg(const std::string& name, const Image& im, int quality) {
  const std::string p = temp_path(name);
  FILE* f = std::fopen(p.c_str(), "wb");
  jpeg_compress_struct c{};
  jpeg_error_mgr err{};
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  jpeg_stdio_dest(&c, f);
  c.image_width = JDIMENSION(im.width);
  c.image_height = JDIMENSION(im.height);
  c.input_components = 3;
  c.in_color_space = JCS_RGB;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, quality, TRUE);
  jpeg_start_compress(&c, TRUE);
  for (int y = 0; y < im.height; ++y) {
    JSAMPROW row = const_cast<uint8_t*>(im.pixels.data()) + size_t(y) * size_t(im.width) * 3;
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  std::fclose(f);
  return p;
}

void expect_error(const std::function<void()>& fn, const std::vector<std::string>& fragments) {
  try {
    fn();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& fr : fragments) EXPECT_NE(msg.find(fr), std::string::npos) << "'" << fr << "' missing in: " << msg;
  }
}

TEST(Image, PngRoundTripRgbGrayRgba) {
  const Image rgb = pattern_image(13, 7, 3);
  write_png(temp_path("rgb.png"), rgb);
  const Image back = read_image(temp_path("rgb.png"));
  EXPECT_EQ(back.width, 13);
  EXPECT_EQ(back.height, 7);
  EXPECT_EQ(back.channels, 3);
  EXPECT_EQ(back.pixels, rgb.pixels);

  const Image gray = pattern_image(5, 9, 1);
  write_png(temp_path("gray.png"), gray);
  const Image g3 = read_image(temp_path("gray.png"));  // gray -> RGB replicates the value
  ASSERT_EQ(g3.channels, 3);
  for (int y = 0; y < 9; ++y)
    for (int x = 0; x < 5; ++x)
      for (int c = 0; c < 3; ++c) ASSERT_EQ(g3.at(y, x, c), gray.at(y, x, 0));
  EXPECT_EQ(read_png_indexed(temp_path("gray.png")).pixels, gray.pixels);

  const Image rgba = pattern_image(6, 4, 4);
  write_png(temp_path("rgba.png"), rgba);
  const Image a3 = read_image(temp_path("rgba.png"));  // alpha dropped
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 6; ++x)
      for (int c = 0; c < 3; ++c) ASSERT_EQ(a3.at(y, x, c), rgba.at(y, x, c));
  expect_error([&] { read_png_indexed(temp_path("rgba.png")); }, {"rgba.png", "single channel"});
}

TEST(Image, PaletteGivesIndicesOrColours) {
  const std::string p = write_palette_png("pal.png", 10, 6);
  const Image idx = read_png_indexed(p);
  ASSERT_EQ(idx.channels, 1);
  const Image rgb = read_image(p);
  const uint8_t cmap[3][3] = {{255, 0, 0}, {0, 255, 0}, {0, 0, 255}};
  for (int y = 0; y < 6; ++y)
    for (int x = 0; x < 10; ++x) {
      ASSERT_EQ(idx.at(y, x, 0), (x + y) % 3);
      for (int c = 0; c < 3; ++c) ASSERT_EQ(rgb.at(y, x, c), cmap[(x + y) % 3][c]);
    }
}

TEST(Image, JpegDecodes) {
  Image im;  // smooth content so that quality 100 stays within a few levels
  im.width = 24;
  im.height = 16;
  im.channels = 3;
  for (int y = 0; y < 16; ++y)
    for (int x = 0; x < 24; ++x) {
      im.pixels.push_back(uint8_t(x * 8));
      im.pixels.push_back(uint8_t(y * 12));
      im.pixels.push_back(128);
    }
  const Image d = read_image(write_jpeg("a.jpg", im, 100));
  ASSERT_EQ(d.width, 24);
  ASSERT_EQ(d.height, 16);
  int worst = 0;
  for (size_t i = 0; i < d.pixels.size(); ++i) worst = std::max(worst, std::abs(int(d.pixels[i]) - int(im.pixels[i])));
  EXPECT_LE(worst, 8);
}

TEST(Image, CorruptFilesFailClearly) {
  const Image rgb = pattern_image(32, 32, 3);
  write_png(temp_path("ok.png"), rgb);
  std::vector<uint8_t> png = slurp(temp_path("ok.png"));
  dump(temp_path("trunc.png"), std::vector<uint8_t>(png.begin(), png.begin() + long(png.size() / 2)));
  expect_error([&] { read_image(temp_path("trunc.png")); }, {"trunc.png", "corrupt PNG"});
  std::vector<uint8_t> flipped = png;
  flipped[png.size() / 2] ^= 0xFF;  // a byte inside IDAT: CRC or zlib error
  dump(temp_path("flip.png"), flipped);
  expect_error([&] { read_image(temp_path("flip.png")); }, {"flip.png", "corrupt PNG"});
  std::vector<uint8_t> header_only(png.begin(), png.begin() + 20);
  dump(temp_path("hdr.png"), header_only);
  expect_error([&] { read_image(temp_path("hdr.png")); }, {"hdr.png", "corrupt PNG"});

  std::vector<uint8_t> jpg = slurp(write_jpeg("b.jpg", rgb, 90));
  dump(temp_path("trunc.jpg"), std::vector<uint8_t>(jpg.begin(), jpg.begin() + long(jpg.size() * 2 / 3)));
  expect_error([&] { read_image(temp_path("trunc.jpg")); }, {"trunc.jpg", "corrupt JPEG"});
  dump(temp_path("hdr.jpg"), std::vector<uint8_t>(jpg.begin(), jpg.begin() + 40));
  expect_error([&] { read_image(temp_path("hdr.jpg")); }, {"hdr.jpg", "corrupt JPEG"});

  dump(temp_path("text.png"), {'h', 'e', 'l', 'l', 'o'});
  expect_error([&] { read_image(temp_path("text.png")); }, {"text.png", "not a PNG or JPEG"});
  expect_error([&] { read_image(temp_path("missing.png")); }, {"missing.png", "cannot open"});
  expect_error([&] { read_png_indexed(temp_path("b.jpg")); }, {"b.jpg", "not a PNG"});
}

// Seeded byte flips and truncations of valid PNG and JPEG files: each decodes or throws
// ariadne::Error naming the file; none crashes (the suite also runs under ASan).
TEST(Image, CorruptedFilesNeverCrash) {
  write_png(temp_path("fz.png"), pattern_image(20, 12, 3));
  const std::vector<std::vector<uint8_t>> sources = {slurp(temp_path("fz.png")),
                                                     slurp(write_jpeg("fz.jpg", pattern_image(20, 12, 3), 80))};
  std::mt19937 rng(5);
  int refused = 0;
  for (int iter = 0; iter < 400; ++iter) {
    std::vector<uint8_t> m = sources[size_t(iter % 2)];
    if (iter % 4 < 2) {
      for (int k = 0; k < 1 + int(rng() % 4); ++k) m[8 + rng() % (m.size() - 8)] ^= uint8_t(1 + rng() % 255);
    } else {
      m.resize(4 + rng() % (m.size() - 4));
    }
    const std::string name = "fuzz" + std::to_string(iter);
    try {
      const Image im = decode_image(m.data(), m.size(), name);
      EXPECT_EQ(im.pixels.size(), size_t(im.width) * size_t(im.height) * 3);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
      ++refused;
    }
  }
  EXPECT_GT(refused, 100);
}

TEST(Image, WriterRefusesBadImages) {
  Image bad = pattern_image(4, 4, 2);
  expect_error([&] { write_png(temp_path("x.png"), bad); }, {"x.png", "2 channels"});
  Image short_buf = pattern_image(4, 4, 3);
  short_buf.pixels.pop_back();
  expect_error([&] { write_png(temp_path("y.png"), short_buf); }, {"y.png", "expected width"});
  expect_error([&] { write_png("/nonexistent-dir/z.png", pattern_image(2, 2, 3)); }, {"z.png"});
}

}  // namespace
}  // namespace ariadne
