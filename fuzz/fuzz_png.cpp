// libFuzzer target: PNG decoding through ariadne's image wrapper (decode_image, RGB output).
// Inputs without the PNG signature get it prepended, so that every input reaches libpng.
#include <algorithm>
#include <vector>

#include "ariadne/error.hpp"
#include "ariadne/image.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const uint8_t kSig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  std::vector<uint8_t> buf(kSig, kSig + 8);
  const bool has_sig = size >= 8 && std::equal(kSig, kSig + 8, data);
  buf.insert(buf.end(), data + (has_sig ? 8 : 0), data + size);
  try {
    const ariadne::Image img = ariadne::decode_image(buf.data(), buf.size(), "fuzz.png");
    if (img.channels != 3 || img.pixels.size() != size_t(img.width) * size_t(img.height) * 3) __builtin_trap();
  } catch (const ariadne::Error&) {
  }
  return 0;
}
