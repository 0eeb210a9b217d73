// Demo part: a sample image through the vision encoder with the full, chunk and ariadne schedules:
// time per stage, attention cost from the FLOP model, and how far each output is from full's.
#include <cmath>
#include <iomanip>

#include "ariadne/error.hpp"
#include "ariadne/estimate.hpp"
#include "ariadne/flops.hpp"
#include "ariadne/vit.hpp"
#include "demo.hpp"

namespace ariadne::cli {
namespace {

// A deterministic picture: smooth gradients with a bright disc, no file needed.
Image sample_image(int side) {
  Image im;
  im.width = im.height = side;
  im.channels = 3;
  for (int y = 0; y < side; ++y)
    for (int x = 0; x < side; ++x) {
      const double dx = x - side * 0.6, dy = y - side * 0.4;
      const bool disc = dx * dx + dy * dy < side * side * 0.04;
      im.pixels.push_back(uint8_t(disc ? 240 : 128 + 100 * std::sin(x / 9.0) * std::cos(y / 13.0)));
      im.pixels.push_back(uint8_t(disc ? 200 : 255 * x / side));
      im.pixels.push_back(uint8_t(disc ? 40 : 255 * y / side));
    }
  return im;
}

void run_encoder(DemoContext& ctx) {
  // Quick mode: the 4-layer test config; otherwise the Qwen2.5-VL tower at 224 px (CPU time).
  const VitConfig config = ctx.quick ? VitConfig::small() : VitConfig::qwen25_vl();
  const int side = ctx.quick ? 112 : 224;
  const VitWeights w = random_vit_weights(config, 1, 0.f);
  const PixelBatch px = preprocess({sample_image(side)}, config);
  auto& md = ctx.md;
  md << "Random weights (seed 1; sinks initialized to 0), " << config.describe() << ". Image " << side << "x" << side
     << " px = " << px.tokens() << " tokens. CPU fp32, GEMMs through OpenBLAS. FLOPs: attention only, plain "
     << "forward count from the FLOP model. `vs full`: relative L2 distance of the encoder output to the full "
     << "schedule's.\n\n"
     << "| schedule | layers | order changes | attention on | attention GFLOP | patch_embed ms | qkv+proj ms | "
        "attention ms | mlp ms | permute ms | merger ms | total ms | vs full |\n"
     << "|";
  for (int i = 0; i < 13; ++i) md << " --- |";
  md << "\n";
  nlohmann::json rows = nlohmann::json::array();
  std::vector<float> full_out;
  EncoderShape shape;
  shape.heads = config.heads;
  shape.head_dim = config.head_dim();
  shape.patch = config.patch;
  shape.merge = config.merge;
  shape.qwen_window = config.window_units();
  const std::vector<std::string> names = ctx.quick ? std::vector<std::string>{"full", "chunk", "R+C+R+F"}
                                                   : std::vector<std::string>{"full", "chunk", "ariadne"};
  for (const std::string& name : names) {
    const Schedule s = vit_schedule(name, config);
    const EncodeResult r = encode(w, px.values, px.grids, s);
    if (full_out.empty()) full_out = r.out;
    const ScheduleCost cost = schedule_cost(s, px.grids, shape);
    const auto& t = r.times;
    ARIADNE_CHECK(r.out.size() == full_out.size(), "demo: the schedules' outputs differ in size");
    const double diff = relative_l2_error(r.out.data(), full_out.data(), r.out.size());
    md << std::fixed << "| " << name << " | `" << s.letters() << "` | " << r.order_changes << " | "
       << r.attention_backend << " | " << std::setprecision(3) << double(cost.flops) / 1e9 << " | "
       << std::setprecision(1) << t.patch_embed << " | " << t.qkv + t.proj << " | " << t.attention << " | " << t.mlp
       << " | " << t.permute << " | " << t.merger << " | " << t.total << " | " << std::setprecision(3) << diff
       << " |\n";
    rows.push_back({{"schedule", name}, {"layers", s.letters()}, {"order_changes", r.order_changes},
                    {"attention_backend", r.attention_backend}, {"attention_flops", cost.flops},
                    {"times_ms", {{"patch_embed", t.patch_embed}, {"qkv", t.qkv}, {"proj", t.proj},
                                  {"attention", t.attention}, {"mlp", t.mlp}, {"permute", t.permute},
                                  {"merger", t.merger}, {"rope", t.rope}, {"norm", t.norm}, {"total", t.total}}},
                    {"rel_l2_vs_full", diff}});
  }
  md << "\nThe weights are random: the outputs show that the schedules run and how much they change the "
        "result, not model quality.\n";
  ctx.json["config"] = config.describe();
  ctx.json["random_weights"] = true;
  ctx.json["tokens"] = px.tokens();
  ctx.json["schedules"] = rows;
}

const DemoPart part{30, "encoder", "Vision encoder with attention schedules", run_encoder};

}  // namespace
}  // namespace ariadne::cli
