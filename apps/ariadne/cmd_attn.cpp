// ariadne attn — one attention call on seeded random inputs: time, throughput and error against
// the exact reference.
//
//   ariadne attn --tokens 4096 --heads 16 --kv-heads 16 --dim 80 --pattern window:64,64
//                [--batch 1] [--sink none|denominator|key0] [--sink-value 0.5] [--dtype f32|bf16|f16]
//                [--backend cpu|reference|cuda] [--repeat 5] [--seed 1] [--check auto|yes|no] [--json]
//                [--backward [--deterministic]]
#include <iostream>
#include <limits>

#include "attn_case.hpp"
#include "cli.hpp"

namespace ariadne::cli {
namespace {

int run_attn(const Args& a) {
  AttnCase c;
  c.tokens = a.i64("tokens");
  c.batch = a.i64("batch");
  c.heads = a.i64("heads");
  c.kv_heads = a.given("kv-heads") ? a.i64("kv-heads") : c.heads;
  c.dim = a.i64("dim");
  c.pattern = a.str("pattern");
  c.sink_mode = parse_sink_mode(a.str("sink"));
  c.sink_value = a.real("sink-value");
  c.backend = parse_backend(a.str("backend"));
  c.dtype = parse_dtype(a.given("dtype") ? a.str("dtype") : c.backend == Backend::cuda ? "bf16" : "f32");
  c.reps = a.i64("repeat");
  c.seed = uint64_t(a.i64("seed"));
  c.check = a.str("check");
  c.backward = a.flag("backward");
  c.deterministic = a.flag("deterministic");
  if (c.deterministic && !c.backward) a.fail("deterministic", "applies to the backward: add --backward");
  if (c.tokens * c.batch >= (int64_t(1) << 31))
    a.fail("tokens", "tokens x batch = " + std::to_string(c.tokens * c.batch) + " exceeds 2^31 packed rows");
  if (c.heads % c.kv_heads != 0) a.fail("kv-heads", "must divide --heads");
  require_cuda_if_asked(a, "backend");
  check_attn_memory(c);  // refuses a case that would not fit in memory, before allocating
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
  if (c.backward) {
    const nlohmann::json& b = j["backward"];
    std::cout << "backward (" << b["plan"].get<std::string>() << ")\n  " << b["ms"].get<double>() << " ms (median of "
              << c.reps << "), " << b["gflops"].get<double>() << " GFLOP/s at 2.5x the forward's FLOPs\n";
    for (const char* name : {"dq", "dk", "dv", "dsink"})
      if (b.contains(name))
        std::cout << "  " << name << ": max |g-ref| / max|ref| = " << b[name]["max_rel_err"].get<double>()
                  << ", relative L2 = " << b[name]["rel_l2"].get<double>() << "\n";
  }
  return 0;
}

const Command reg{"attn", "one attention call on random inputs: time and error vs the reference",
                  {integer("tokens", 1024, 1, (int64_t(1) << 31) - 1, "tokens per sequence"),
                   integer("batch", 1, 1, 1 << 20, "sequences (packed, varlen)"),
                   integer("heads", 16, 1, 1024, "query heads"),
                   integer("kv-heads", 16, 1, 1024, "key/value heads (default: --heads; must divide it)")
                       .without_default(),
                   integer("dim", 64, 1, 1024, "head dimension"),
                   text("pattern", "full", "mask: full, causal, window:L,R, chunk:C, blocks:B,DENSITY ...")
                       .checked([](const std::string& s) { parse_pattern_spec(s); }),
                   choice("sink", "none", {"none", "denominator", "key0"}, "attention sink form"),
                   real("sink-value", 0.5, Range::any(), "sink logit of every head"),
                   choice("dtype", "", {"f32", "bf16", "f16"}, "input dtype (default f32 on the CPU, bf16 on cuda)"),
                   choice("backend", "cpu", {"cpu", "reference", "cuda"}, "attention backend"),
                   integer("repeat", 5, 1, 100000, "timed calls (the median is reported)"),
                   integer("seed", 1, 0, int64_t(1) << 62, "input seed"),
                   choice("check", "auto", {"auto", "yes", "no"},
                          "compare with the exact reference (auto: when it costs at most ~1 GFLOP)"),
                   boolean("backward", false, "also time the backward and check its gradients against the reference"),
                   boolean("deterministic", false, "the backward's bitwise-reproducible mode (CUDA)")},
                  run_attn};

}  // namespace
}  // namespace ariadne::cli
