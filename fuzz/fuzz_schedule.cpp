// libFuzzer target: layer schedule strings (presets and the short syntax "4x(4xR+ 3xC+ F)").
#include <string>

#include "ariadne/error.hpp"
#include "ariadne/schedule.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const ariadne::Schedule s = ariadne::resolve_schedule(text, 64);
    if (s.layers.empty()) __builtin_trap();  // an accepted schedule has layers
    (void)s.letters();
    (void)s.order_changes();
  } catch (const ariadne::Error&) {
  }
  return 0;
}
