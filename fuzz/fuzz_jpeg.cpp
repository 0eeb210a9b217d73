// libFuzzer target: JPEG decoding through ariadne's image wrapper (decode_image, RGB output).
// Inputs without the JPEG start-of-image marker get it prepended, so that every input reaches libjpeg.
#include <vector>

#include "ariadne/error.hpp"
#include "ariadne/image.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> buf;
  if (!(size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF)) buf = {0xFF, 0xD8, 0xFF};
  buf.insert(buf.end(), data, data + size);
  try {
    const ariadne::Image img = ariadne::decode_image(buf.data(), buf.size(), "fuzz.jpg");
    if (img.channels != 3 || img.pixels.size() != size_t(img.width) * size_t(img.height) * 3) __builtin_trap();
  } catch (const ariadne::Error&) {
  }
  return 0;
}
