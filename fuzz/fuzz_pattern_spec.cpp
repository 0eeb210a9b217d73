// libFuzzer target: the CLI's --pattern parser (full | causal | window:L,R | chunk:C | blocks:D[@B]).
#include <string>

#include "ariadne/error.hpp"
#include "ariadne/pattern.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const ariadne::PatternSpec s = ariadne::parse_pattern_spec(text);
    // What the parser accepts must describe a valid pattern on a small case.
    ariadne::validate_pattern(s.dense, 64, 64, 1);
    if (s.block_density > 0) {
      const ariadne::BlockMask m =
          ariadne::BlockMask::random(s.dense, s.block, 1, 64, 64, s.block_density, 1, true);
      ariadne::validate_pattern(s.dense.with_blocks(m.view()), 64, 64, 1);
    }
    (void)ariadne::describe(s.dense);
  } catch (const ariadne::Error&) {
  }
  return 0;
}
