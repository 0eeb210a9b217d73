// libFuzzer target: mask files through read_label_map (indexed/gray PNG or 2-D integer .npy, told
// apart by content) and a nearest-neighbour resize of what it returns.
#include "ariadne/error.hpp"
#include "ariadne/mask.hpp"
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const ariadne::fuzz::MemFile file(data, size);
  try {
    const ariadne::LabelMap m = ariadne::read_label_map(file.path());
    if (m.height <= 0 || m.width <= 0 || m.ids.size() != size_t(m.height) * size_t(m.width)) __builtin_trap();
    // Up- and down-sampling both index the source map: a wrong rule reads out of bounds.
    const ariadne::LabelMap r = ariadne::resize_nearest(m, 7, 13);
    const ariadne::LabelMap back = ariadne::resize_nearest(r, m.height > 64 ? 64 : m.height, m.width > 64 ? 64 : m.width);
    (void)back;
  } catch (const ariadne::Error&) {
  }
  return 0;
}
