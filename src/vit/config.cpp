// Encoder configuration presets and the mapping of schedules onto an encoder's depth.
#include <algorithm>
#include <sstream>

#include "ariadne/error.hpp"
#include "ariadne/vit.hpp"

namespace ariadne {

void VitConfig::validate() const {
  ARIADNE_CHECK(depth >= 1, "vit config: depth ", depth, " must be >= 1");
  ARIADNE_CHECK(hidden >= 1 && heads >= 1 && hidden % heads == 0, "vit config: hidden ", hidden,
                " must be a positive multiple of heads ", heads);
  ARIADNE_CHECK(head_dim() % 4 == 0, "vit config: head_dim ", head_dim(),
                " must be a multiple of 4 (2D RoPE splits it into h and w halves of pairs)");
  ARIADNE_CHECK(intermediate >= 1 && out_hidden >= 1, "vit config: intermediate ", intermediate,
                " and out_hidden ", out_hidden, " must be >= 1");
  ARIADNE_CHECK(in_channels == 3, "vit config: in_channels ", in_channels, " (only RGB input, 3, is supported)");
  ARIADNE_CHECK(patch >= 1 && temporal >= 1 && merge >= 1, "vit config: patch ", patch, ", temporal ", temporal,
                ", merge ", merge, " must be >= 1");
  ARIADNE_CHECK(window_px >= factor() && window_px % factor() == 0, "vit config: window_size ", window_px,
                " px must be a positive multiple of patch·merge = ", factor());
  for (int l : full_layers)
    ARIADNE_CHECK(l >= 0 && l < depth, "vit config: full layer index ", l, " is outside 0..", depth - 1);
  ARIADNE_CHECK(rope_theta > 0 && eps > 0, "vit config: rope_theta and eps must be > 0");
}

std::string VitConfig::describe() const {
  std::ostringstream os;
  os << "depth " << depth << ", hidden " << hidden << ", heads " << heads << " x " << head_dim()
     << ", intermediate " << intermediate << ", out " << out_hidden << ", patch " << patch << ", temporal "
     << temporal << ", merge " << merge << ", window " << window_px << " px, full layers [";
  for (size_t i = 0; i < full_layers.size(); ++i) os << (i ? ", " : "") << full_layers[i];
  os << "]";
  return os.str();
}

VitConfig VitConfig::qwen25_vl() { return VitConfig{}; }

VitConfig VitConfig::small() {
  // Small enough that its bf16 weights and pixel rows fit in a few hundred KB of test data, with
  // two heads of dim 16 and a 56-px window (2×2 merge units) so that a 56×84 image has two windows.
  VitConfig c;
  c.depth = 4;
  c.hidden = 32;
  c.heads = 2;
  c.intermediate = 64;
  c.out_hidden = 32;
  c.window_px = 56;
  c.full_layers = {1, 3};
  return c;
}

VitConfig VitConfig::named(std::string_view name) {
  if (name == "qwen2.5-vl" || name == "qwen2.5-vl-3b") return qwen25_vl();
  if (name == "qwen2.5-vl-7b") {
    VitConfig c = qwen25_vl();
    c.out_hidden = 3584;
    return c;
  }
  if (name == "small") return small();
  detail::fail("vit config: unknown name '", name, "' (expected qwen2.5-vl, qwen2.5-vl-7b or small)");
}

Schedule vit_schedule(std::string_view text, const VitConfig& config, int64_t window) {
  Schedule s = resolve_schedule(text, window);
  if (int(s.layers.size()) == config.depth) return s;
  const std::string name(text);
  const bool uniform_full = name == "full" || name == "full+sink";
  const bool qwen_layout = name == "chunk" || name == "chunk+sink" || name == "swa2d" || name == "swa2d+sink" ||
                           name == "swa1d" || name == "swa1d+sink";
  ARIADNE_CHECK(uniform_full || qwen_layout, "schedule '", name, "' has ", s.layers.size(),
                " layers but the encoder has ", config.depth,
                "; give a schedule of that length (e.g. in the short syntax)");
  if (uniform_full) {
    Schedule out = parse_schedule(std::to_string(config.depth) + (name == "full" ? "xF" : "xF+"), window);
    out.name = name;
    return out;
  }
  // The local letter of the preset, placed on every layer that the model does not keep full.
  const auto local = std::find_if(s.layers.begin(), s.layers.end(),
                                  [](const LayerSpec& l) { return l.kind != LayerKind::full; });
  std::string spec;
  for (int i = 0; i < config.depth; ++i) {
    const bool full = std::find(config.full_layers.begin(), config.full_layers.end(), i) != config.full_layers.end();
    spec += full ? "F " : std::string(1, local->letter) + (local->sink ? "+ " : " ");
  }
  Schedule out = parse_schedule(spec, window);
  out.name = name;
  return out;
}

}  // namespace ariadne
