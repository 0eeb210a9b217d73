// Demo part: the cost model (attention FLOPs of the encoder schedules, as in the paper's appendix)
// and the receptive-field example of the talk.
#include <iomanip>

#include "ariadne/flops.hpp"
#include "ariadne/receptive_field.hpp"
#include "demo.hpp"

namespace ariadne::cli {
namespace {

void run_cost(DemoContext& ctx) {
  auto& md = ctx.md;
  md << "Whole-encoder attention FLOPs (32 layers, 16 heads, d 80), counted exactly from each layer's pattern. "
        "`paper` is the paper's convention (4x a plain forward; docs in flops.hpp). `useful` is the share of the "
        "work a kernel with 128x128 tiles does that is not masked out.\n\n"
     << "| schedule | side | tokens | forward TFLOP | paper TFLOP | vs full | useful (128x128 tiles) |\n"
     << "| --- | --- | --- | --- | --- | --- | --- |\n";
  nlohmann::json rows = nlohmann::json::array();
  for (int side : {448, 896, 1792}) {
    double full_flops = 0;
    for (const char* name : {"full", "chunk", "swa1d+sink", "ariadne"}) {
      const ScheduleCost c = schedule_cost(preset_schedule(name), {image_grid(side)});
      if (std::string(name) == "full") full_flops = double(c.flops);
      md << "| " << name << " | " << side << " | " << c.tokens << " | " << std::fixed << std::setprecision(3)
         << double(c.flops) / 1e12 << " | " << double(c.flops_paper) / 1e12 << " | " << std::setprecision(2)
         << full_flops / double(c.flops) << "x | " << std::setprecision(3) << c.useful_fraction << " |\n";
      rows.push_back({{"schedule", name}, {"side", side}, {"tokens", c.tokens}, {"flops", c.flops},
                      {"flops_paper", c.flops_paper}, {"useful_fraction", c.useful_fraction}});
    }
  }
  ctx.json["flops"] = rows;

  md << "\nReceptive field at token level (10x14 grid, window 4, start at the centre): coverage after each layer.\n\n";
  nlohmann::json rf = nlohmann::json::object();
  for (const char* spec : {"RRRRRRR", "RRRRCCC"}) {
    const ReceptiveField r = receptive_field(parse_schedule(spec, 4), Grid{10, 14}, 5, 7, /*merge=*/1);
    md << "- `" << spec << "`:";
    for (double c : r.coverage) md << " " << std::setprecision(0) << std::fixed << 100 * c << "%";
    md << "\n";
    rf[spec] = r.coverage;
    md << "\n```\n";  // the layer at which each patch is first reached
    for (int y = 0; y < 10; ++y) {
      for (int x = 0; x < 14; ++x) {
        const int l = r.reached[size_t(y * 14 + x)];
        md << (l < 0 ? '.' : char('0' + l));
      }
      md << "\n";
    }
    md << "```\n\n";
  }
  ctx.json["receptive_field"] = rf;
}

const DemoPart part{10, "cost", "Cost model and receptive field", run_cost};

}  // namespace
}  // namespace ariadne::cli
