// Placeholder until the tiled CPU backend (issue 3) lands: reports itself as unsupported.
#include <thread>

#include "backends.hpp"

namespace ariadne {

static int g_threads = 0;

bool attention_cpu_supports(const AttentionParams&, std::string* why) {
  if (why) *why = "the fast CPU backend is not built yet (issue 3); use --backend reference";
  return false;
}
void attention_cpu(const AttentionParams&) { detail::fail("the fast CPU backend is not built yet (issue 3)"); }
int cpu_threads() { return g_threads > 0 ? g_threads : int(std::thread::hardware_concurrency()); }
void set_cpu_threads(int n) { g_threads = n; }

}  // namespace ariadne
