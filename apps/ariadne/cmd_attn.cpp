// ariadne attn — one attention call on seeded random inputs: time, throughput and error against
// the exact reference.
//
//   ariadne attn --tokens 4096 --heads 16 --kv-heads 16 --dim 80 --pattern window:64,64
//                [--batch 1] [--sink none|denominator|key0] [--sink-value 0.5] [--dtype f32|bf16|f16]
//                [--backend cpu|reference|cuda] [--reps 5] [--seed 1] [--check auto|yes|no] [--json]
#include <iostream>

#include "attn_case.hpp"
#include "cli.hpp"

namespace ariadne::cli {
namespace {

int run_attn(const Args& a) {
  AttnCase c;
  c.tokens = a.integer("tokens", 1024);
  c.batch = a.integer("batch", 1);
  c.heads = a.integer("heads", 16);
  c.kv_heads = a.integer("kv-heads", c.heads);
  c.dim = a.integer("dim", 64);
  c.pattern = a.str("pattern", "full");
  c.sink_mode = parse_sink_mode(a.str("sink", "none"));
  c.sink_value = a.real("sink-value", 0.5);
  c.backend = parse_backend(a.str("backend", "cpu"));
  c.dtype = parse_dtype(a.str("dtype", c.backend == Backend::cuda ? "bf16" : "f32"));
  c.reps = a.integer("reps", 5);
  c.seed = uint64_t(a.integer("seed", 1));
  c.check = a.str("check", "auto");
  a.reject_unused();
  const nlohmann::json j = run_attn_case(c);
  if (a.json()) {
    print_json(j);
    return 0;
  }
  std::cout << "attention " << c.pattern << "  N " << c.tokens << " x batch " << c.batch << ", heads " << c.heads
            << "/" << c.kv_heads << ", d " << c.dim << ", " << dtype_name(c.dtype) << ", sink "
            << sink_mode_name(c.sink_mode) << ", backend " << backend_name(c.backend) << "\n"
            << "  " << j["ms"].get<double>() << " ms (median of " << c.reps << "), " << j["gflops"].get<double>()
            << " GFLOP/s mask-aware\n";
  if (j["checked"].get<bool>())
    std::cout << "  max |out-ref| / max|ref| = " << j["max_rel_err"].get<double>()
              << ", relative L2 = " << j["rel_l2"].get<double>() << "\n";
  else
    std::cout << "  (not checked against the reference: --check yes to force)\n";
  return 0;
}

const Command reg{"attn", "one attention call on random inputs: time and error vs the reference", run_attn};

}  // namespace
}  // namespace ariadne::cli
