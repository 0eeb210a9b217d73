// libFuzzer target: the safetensors reader (header length, JSON header, dtypes, shapes, offsets)
// and read_f32 of every tensor it accepts.
#include <cstring>

#include "ariadne/error.hpp"
#include "ariadne/safetensors.hpp"
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const ariadne::fuzz::MemFile file(data, size);
  try {
    const ariadne::SafetensorsFile st(file.path());
    for (const std::string& name : st.names()) {
      const ariadne::SafetensorsEntry& e = st.entry(name);
      // Raw access must stay inside the mapping: touch the first and last byte of each tensor.
      if (e.end > e.begin) {
        volatile uint8_t sink = st.bytes(name)[0];
        sink = st.bytes(name)[e.end - e.begin - 1];
        (void)sink;
      }
      try {
        const std::vector<float> v = st.read_f32(name);
        if (int64_t(v.size()) != e.numel()) __builtin_trap();  // read_f32 must return numel values
      } catch (const ariadne::Error&) {  // unsupported dtype: reported, fine
      }
    }
  } catch (const ariadne::Error&) {
  }
  return 0;
}
