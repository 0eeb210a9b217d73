// Layer schedules: presets, the short syntax and the pattern of each layer (schedule.hpp).
#include "ariadne/schedule.hpp"

#include <cctype>

#include "ariadne/error.hpp"

namespace ariadne {

namespace {

// Upper bounds that keep a typo ("4x(1000000xR)") from allocating millions of layers.
constexpr int64_t kMaxRepeat = 1024;
constexpr size_t kMaxLayers = 4096;
// Nesting limit of '(' groups: the parser recurses once per level, and a long run of '(' from a
// command line must not overflow the stack.
constexpr int kMaxDepth = 64;

struct Preset {
  const char* name;
  const char* spec;
};
constexpr Preset kPresets[] = {
    {"full", "32xF"},
    {"full+sink", "32xF+"},
    {"chunk", "4x(7xW F)"},
    {"chunk+sink", "4x(7xW+ F)"},
    {"swa2d", "4x(7xQ F)"},
    {"swa2d+sink", "4x(7xQ+ F)"},
    {"swa1d", "4x(7xR F)"},
    {"swa1d+sink", "4x(7xR+ F)"},
    {"ariadne", "4x(4xR+ 3xC+ F)"},
    {"mimo", "3x(F 4xR+ 4xC+) F"},
};

// Recursive-descent parser of the short syntax. Positions in messages are 1-based.
class Parser {
 public:
  Parser(std::string_view text, int64_t window) : s_(text), window_(window) {}

  std::vector<LayerSpec> parse() {
    std::vector<LayerSpec> out = sequence(0);
    ARIADNE_CHECK(pos_ == s_.size(), where(), "unmatched ')'");
    ARIADNE_CHECK(!out.empty(), "schedule '", s_, "': no layer given (letters R, C, Q, W, F)");
    // Full layers take the previous layer's order; the first layers default to block_row.
    OrderKind current = OrderKind::block_row;
    for (LayerSpec& l : out) {
      if (l.kind == LayerKind::full) l.order = current;
      current = l.order;
    }
    return out;
  }

 private:
  std::string where() const {
    std::string w = "schedule '" + std::string(s_) + "': position " + std::to_string(pos_ + 1);
    if (pos_ < s_.size()) w += std::string(" ('") + s_[pos_] + "')";
    else w += " (end)";
    return w + ": ";
  }

  static bool separator(char c) { return c == ' ' || c == '-' || c == '_'; }

  void skip() {
    while (pos_ < s_.size() && separator(s_[pos_])) ++pos_;
  }

  std::vector<LayerSpec> sequence(int depth) {
    std::vector<LayerSpec> out;
    for (;;) {
      skip();
      if (pos_ == s_.size() || s_[pos_] == ')') return out;
      std::vector<LayerSpec> item = repeated(depth);
      out.insert(out.end(), item.begin(), item.end());
      ARIADNE_CHECK(out.size() <= kMaxLayers, where(), "more than ", kMaxLayers, " layers");
    }
  }

  // [N 'x'] unit
  std::vector<LayerSpec> repeated(int depth) {
    int64_t count = 1;
    if (std::isdigit(static_cast<unsigned char>(s_[pos_]))) {
      const size_t start = pos_;
      count = 0;
      while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) {
        count = count * 10 + (s_[pos_] - '0');
        ++pos_;
        ARIADNE_CHECK(count <= kMaxRepeat, "schedule '", s_, "': position ", start + 1,
                      ": repeat count exceeds ", kMaxRepeat);
      }
      ARIADNE_CHECK(count >= 1, "schedule '", s_, "': position ", start + 1, ": repeat count must be >= 1");
      ARIADNE_CHECK(pos_ < s_.size() && s_[pos_] == 'x', where(), "expected 'x' after the repeat count ",
                    count, " (e.g. 4xR or 4x(RRRRCCCF))");
      ++pos_;
      ARIADNE_CHECK(pos_ < s_.size() && !separator(s_[pos_]), where(),
                    "expected a letter or '(' after '", count, "x'");
    }
    const std::vector<LayerSpec> one = unit(depth);
    ARIADNE_CHECK(one.size() * size_t(count) <= kMaxLayers, where(), "more than ", kMaxLayers, " layers");
    std::vector<LayerSpec> out;
    for (int64_t i = 0; i < count; ++i) out.insert(out.end(), one.begin(), one.end());
    return out;
  }

  std::vector<LayerSpec> unit(int depth) {
    const char c = s_[pos_];
    if (c == '(') {
      const size_t open = pos_;
      ARIADNE_CHECK(depth < kMaxDepth, where(), "groups nested more than ", kMaxDepth, " deep");
      ++pos_;
      std::vector<LayerSpec> inner = sequence(depth + 1);
      ARIADNE_CHECK(pos_ < s_.size() && s_[pos_] == ')', "schedule '", s_, "': position ", open + 1,
                    ": '(' is never closed");
      ARIADNE_CHECK(!inner.empty(), "schedule '", s_, "': position ", open + 1, ": empty group '()'");
      ++pos_;
      return inner;
    }
    LayerSpec l;
    l.letter = c;
    switch (c) {
      case 'R': l.kind = LayerKind::window; l.order = OrderKind::block_row; break;
      case 'C': l.kind = LayerKind::window; l.order = OrderKind::block_col; break;
      case 'Q': l.kind = LayerKind::window; l.order = OrderKind::qwen_window; break;
      case 'W': l.kind = LayerKind::chunk; l.order = OrderKind::qwen_window; break;
      case 'F': l.kind = LayerKind::full; break;
      default:
        detail::fail(where(), "unknown layer letter (expected R, C, Q, W or F, a repeat 'Nx' or '(')");
    }
    ++pos_;
    if (l.kind == LayerKind::window) {
      ARIADNE_CHECK(window_ >= 0, "schedule '", s_, "': window ", window_, " must be >= 0 for SWA layers");
      l.window = window_;
    }
    if (pos_ < s_.size() && s_[pos_] == '+') {
      l.sink = true;
      ++pos_;
    }
    return {l};
  }

  std::string_view s_;
  int64_t window_;
  size_t pos_ = 0;
};

}  // namespace

const char* layer_kind_name(LayerKind k) {
  switch (k) {
    case LayerKind::full: return "full";
    case LayerKind::window: return "window";
    case LayerKind::chunk: return "chunk";
  }
  return "?";
}

int Schedule::order_changes() const {
  int n = 0;
  for (size_t i = 1; i < layers.size(); ++i) n += layers[i].order != layers[i - 1].order;
  return n;
}

std::string Schedule::letters() const {
  std::string s;
  for (const LayerSpec& l : layers) {
    s += l.letter;
    if (l.sink) s += '+';
  }
  return s;
}

std::vector<std::string> schedule_presets() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

Schedule preset_schedule(std::string_view name, int64_t window) {
  for (const Preset& p : kPresets)
    if (name == p.name) {
      Schedule s = parse_schedule(p.spec, window);
      s.name = p.name;
      return s;
    }
  std::string valid;
  for (const Preset& p : kPresets) valid += (valid.empty() ? "" : ", ") + std::string(p.name);
  detail::fail("unknown schedule preset '", name, "' (presets: ", valid, ")");
}

Schedule parse_schedule(std::string_view spec, int64_t window) {
  Schedule s;
  s.name = std::string(spec);
  s.layers = Parser(spec, window).parse();
  return s;
}

Schedule resolve_schedule(std::string_view text, int64_t window) {
  for (const Preset& p : kPresets)
    if (text == p.name) return preset_schedule(text, window);
  return parse_schedule(text, window);
}

Pattern layer_pattern(const LayerSpec& layer, const TokenOrder& order) {
  ARIADNE_CHECK(order.cu_seqlens.size() >= 2, "layer pattern: the token order has no image");
  if (layer.kind != LayerKind::full)
    ARIADNE_CHECK(order.kind == layer.order, "layer pattern: a ", layer_kind_name(layer.kind),
                  " layer (letter ", layer.letter, ") runs on order ", order_name(layer.order),
                  ", but the tokens are in order ", order_name(order.kind));
  const int32_t images = int32_t(order.cu_seqlens.size() - 1);
  switch (layer.kind) {
    case LayerKind::full:
      return Pattern::full().with_varlen(images, order.cu_seqlens.data());
    case LayerKind::window:
      ARIADNE_CHECK(layer.window >= 0, "layer pattern: window ", layer.window, " must be >= 0");
      return Pattern::window(layer.window, layer.window).with_varlen(images, order.cu_seqlens.data());
    case LayerKind::chunk:
      ARIADNE_CHECK(order.cu_windows.size() >= 2, "layer pattern: a chunk layer needs the windows of ",
                    "the qwen_window order (cu_windows is empty)");
      return Pattern::full().with_varlen(int32_t(order.cu_windows.size() - 1), order.cu_windows.data());
  }
  detail::fail("layer pattern: unknown layer kind");
}

}  // namespace ariadne
