// libFuzzer target: COCO annotation JSON (images, categories, polygons, RLE lists and compressed
// RLE strings) and the label map of every image the parser accepts.
#include <string>

#include "ariadne/error.hpp"
#include "ariadne/mask.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const ariadne::CocoDataset ds = ariadne::parse_coco(text, "fuzz.json");
    for (const ariadne::CocoImage& im : ds.images) {
      // Painting is linear in pixels x annotations; keep each run short (the size limit itself is
      // the parser's job, checked above).
      if (int64_t(im.width) * im.height > (int64_t(1) << 16)) continue;
      const ariadne::LabelMap m = ariadne::coco_label_map(ds, im);
      if (m.ids.size() != size_t(im.width) * size_t(im.height)) __builtin_trap();
    }
    for (const ariadne::CocoAnnotation& a : ds.annotations)
      if (a.has_rle && ariadne::rle_from_string(ariadne::rle_to_string(a.rle.counts), "round trip") != a.rle.counts)
        __builtin_trap();  // the compressed form must round-trip
  } catch (const ariadne::Error&) {
  }
  // The compressed RLE decoder alone, on the raw bytes.
  try {
    const std::vector<uint32_t> c = ariadne::rle_from_string(text, "fuzz counts");
    if (ariadne::rle_from_string(ariadne::rle_to_string(c), "round trip") != c) __builtin_trap();
  } catch (const ariadne::Error&) {
  }
  return 0;
}
