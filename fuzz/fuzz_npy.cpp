// libFuzzer target: the .npy parser (magic, version, header dict, dtype, shape/size) and both
// element conversions of every array it accepts.
#include "ariadne/error.hpp"
#include "ariadne/npy.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const ariadne::NpyArray a = ariadne::parse_npy(data, size, "fuzz.npy");
    if (a.data.size() != size_t(a.numel()) * size_t(a.itemsize)) __builtin_trap();
    if (a.to_float().size() != size_t(a.numel())) __builtin_trap();
    try {
      (void)a.to_int32();
    } catch (const ariadne::Error&) {  // float dtype or out-of-range value: reported, fine
    }
  } catch (const ariadne::Error&) {
  }
  return 0;
}
