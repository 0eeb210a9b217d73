// Demo part: one attention call per pattern on the ViT shape, time and error against the reference.
#include <iomanip>

#include "attn_case.hpp"
#include "demo.hpp"

namespace ariadne::cli {
namespace {

void run_attention(DemoContext& ctx) {
  const int64_t n = ctx.quick ? 256 : 1024;
  auto& md = ctx.md;
  md << "Random inputs, N " << n << ", 16 heads, d 80 (the ViT shape), CPU backend, checked against the double "
        "reference with the rule of docs/numerics.md.\n\n"
     << "| pattern | sink | dtype | ms | GFLOP/s (mask-aware) | max rel err | rel L2 |\n"
     << "| --- | --- | --- | --- | --- | --- | --- |\n";
  nlohmann::json rows = nlohmann::json::array();
  struct Item {
    const char* pattern;
    SinkMode sink;
    DType dtype;
  };
  for (const Item& it : {Item{"full", SinkMode::none, DType::f32}, Item{"full", SinkMode::none, DType::bf16},
                         Item{"causal", SinkMode::none, DType::f32}, Item{"window:64,64", SinkMode::none, DType::f32},
                         Item{"window:64,64", SinkMode::denominator, DType::bf16},
                         Item{"window:64,64", SinkMode::key0_bias, DType::f32}, Item{"chunk:64", SinkMode::none, DType::f32},
                         Item{"blocks:0.5@64", SinkMode::none, DType::f32}}) {
    AttnCase c;
    c.tokens = n;
    c.pattern = it.pattern;
    c.sink_mode = it.sink;
    c.dtype = it.dtype;
    c.backend = Backend::cpu;
    c.reps = 3;
    c.check = "yes";
    const nlohmann::json j = run_attn_case(c);
    md << "| " << it.pattern << " | " << sink_mode_name(it.sink) << " | " << dtype_name(it.dtype) << " | "
       << std::fixed << std::setprecision(3) << j["ms"].get<double>() << " | " << std::setprecision(1)
       << j["gflops"].get<double>() << " | " << std::scientific << std::setprecision(2)
       << j["max_rel_err"].get<double>() << " | " << j["rel_l2"].get<double>() << " |\n";
    rows.push_back(j);
  }
  ctx.json["runs"] = rows;
}

const DemoPart part{20, "attention", "Attention per pattern", run_attention};

}  // namespace
}  // namespace ariadne::cli
