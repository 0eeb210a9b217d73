// ariadne/image.hpp — PNG and JPEG decoding, PNG writing.
//
// Pixels are 8-bit, interleaved, row-major: pixels[(y · width + x) · channels + c]. Decoders turn
// every PNG colour type (gray, gray+alpha, palette, RGB, RGBA; 1-16 bit) and every JPEG the library
// reads (gray, YCbCr) into RGB; alpha and tRNS transparency are dropped (PIL's convert("RGB") does
// the same), 16-bit samples keep their high byte (PIL does the same for 16-bit colour; for 16-bit
// gray it clips to 255 instead). CMYK JPEGs are rejected. Corrupt or truncated files throw ariadne::Error
// naming the file and what the decoder reported; libpng and libjpeg errors are contained in C-style
// frames (setjmp/longjmp never crosses a C++ object with a destructor).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ariadne {

struct Image {
  int width = 0, height = 0, channels = 0;
  std::vector<uint8_t> pixels;  // [height, width, channels] row-major
  uint8_t at(int y, int x, int c) const { return pixels[(size_t(y) * size_t(width) + size_t(x)) * size_t(channels) + size_t(c)]; }
};

// Largest image the decoders accept (width · height), so that a forged header cannot ask for
// terabytes: 2^28 pixels (16384 × 16384).
constexpr int64_t kMaxImagePixels = int64_t(1) << 28;

// Decodes a PNG or JPEG file (told apart by signature, not by name) to RGB (channels = 3).
Image read_image(const std::string& path);
// The same from bytes in memory; `name` is used in error messages.
Image decode_image(const uint8_t* data, size_t size, const std::string& name);

// A PNG read for masks: one channel of raw values, no colour conversion. Palette images give the
// palette index of each pixel; gray images their gray value (16-bit gray is reduced to its high
// byte, read_png_values keeps it whole; bit depths below 8 are expanded to one index per byte, values unscaled). RGB(A) or
// gray+alpha images are rejected: a mask must be single-channel or indexed.
Image read_png_indexed(const std::string& path);

// A mask PNG at full depth: palette indices (1-8 bit) or gray values (1-16 bit, unscaled: a 16-bit
// label 1000 reads as 1000), [height, width] row-major. Colour or alpha PNGs are rejected as in
// read_png_indexed. read_label_map (mask.hpp) reads PNG masks through this.
struct PngValues {
  int width = 0, height = 0;
  int bit_depth = 8;             // 8 (palette, gray of 1-8 bits) or 16
  std::vector<uint16_t> values;  // [height, width]
};
PngValues read_png_values(const std::string& path);
PngValues decode_png_values(const uint8_t* data, size_t size, const std::string& name);

// Writes an 8-bit PNG atomically (file.hpp: a temporary file renamed over `path`); channels 1 (gray), 3 (RGB) or 4 (RGBA). Throws naming the file.
void write_png(const std::string& path, const Image& image);

}  // namespace ariadne
