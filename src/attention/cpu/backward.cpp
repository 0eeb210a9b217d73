// The CPU backend's backward: not built yet; the reference backend serves host tensors meanwhile.
#include "attention/backends.hpp"

namespace ariadne {

bool attention_backward_cpu_supports(const AttentionParams&, const AttentionGrads&, std::string* why) {
  if (why) *why = "the cpu backend has no backward yet (use the reference backend)";
  return false;
}

void attention_backward_cpu(const AttentionParams&, const AttentionGrads&) {
  detail::fail("attention_backward: the cpu backend has no backward yet (use the reference backend)");
}

}  // namespace ariadne
