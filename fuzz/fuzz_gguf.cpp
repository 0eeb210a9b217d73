// libFuzzer target: the GGUF reader (header, metadata of every value type, tensor infos, alignment,
// sizes and offsets) and the dequantization of every tensor it accepts.
#include "ariadne/error.hpp"
#include "ariadne/gguf.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const ariadne::GgufFile f = ariadne::GgufFile::parse(data, size, "fuzz.gguf");
    for (const ariadne::GgufTensor& t : f.tensors()) {
      // parse() validated every tensor's byte range against the input, so decoding stays inside it.
      if (t.data < data || t.data + t.bytes > data + size) __builtin_trap();
      if (f.to_float(t).size() != size_t(t.numel())) __builtin_trap();
    }
    for (const auto& [key, value] : f.metadata()) {
      try {  // typed getters on arbitrary keys: a wrong type is an ariadne::Error, never a crash
        (void)f.get_string(key);
      } catch (const ariadne::Error&) {
      }
      try {
        (void)f.get_ints(key);
      } catch (const ariadne::Error&) {
      }
      // Compact arrays: every element through the accessor of its type, sizes consistent.
      if (value.type == ariadne::GgufValueType::array) {
        for (size_t k = 0; k < value.size(); ++k) {
          if (value.item_type == ariadne::GgufValueType::string) (void)value.str_at(k);
          else if (value.item_type != ariadne::GgufValueType::array) (void)value.float_at(k);
        }
        if (value.item_type == ariadne::GgufValueType::string && !value.ends.empty() &&
            value.ends.back() != value.blob.size())
          __builtin_trap();
      }
    }
  } catch (const ariadne::Error&) {
  }
  return 0;
}
