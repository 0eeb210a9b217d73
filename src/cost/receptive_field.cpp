// Receptive-field spread through a schedule (receptive_field.hpp).
#include "ariadne/receptive_field.hpp"

#include <array>
#include <memory>

#include "ariadne/error.hpp"
#include "ariadne/pattern.hpp"

namespace ariadne {

ReceptiveField receptive_field(const Schedule& schedule, Grid grid, int start_row, int start_col,
                               int merge, int qwen_window) {
  ARIADNE_CHECK(grid.h > 0 && grid.w > 0, "receptive field: grid ", grid.h, "x", grid.w,
                " must have positive sides");
  ARIADNE_CHECK(start_row >= 0 && start_row < grid.h && start_col >= 0 && start_col < grid.w,
                "receptive field: start (", start_row, ", ", start_col, ") is outside the ", grid.h, "x",
                grid.w, " grid");
  ReceptiveField rf;
  rf.grid = grid;
  rf.start_row = start_row;
  rf.start_col = start_col;
  const int64_t n = grid.tokens();
  rf.reached.assign(size_t(n), -1);
  rf.reached[size_t(int64_t(start_row) * grid.w + start_col)] = 0;

  std::array<std::unique_ptr<TokenOrder>, 4> orders;
  std::vector<int64_t> prefix(size_t(n) + 1);
  int64_t covered = 1;
  for (size_t li = 0; li < schedule.layers.size(); ++li) {
    const LayerSpec& layer = schedule.layers[li];
    auto& o = orders[size_t(layer.order)];
    if (!o) o = std::make_unique<TokenOrder>(make_order(layer.order, {grid}, merge, qwen_window));
    // Covered keys counted by prefix sums in this layer's sequence order; the state before the
    // layer is every patch reached at an earlier layer.
    prefix[0] = 0;
    for (int64_t p = 0; p < n; ++p)
      prefix[size_t(p) + 1] = prefix[size_t(p)] + (rf.reached[size_t(o->perm[size_t(p)])] >= 0);
    const Pattern pat = layer_pattern(layer, *o);
    for (int32_t s = 0; s < pat.num_seqs; ++s) {
      const SeqExtent e = pat.seq(s, n, n);
      for (int64_t iq = 0; iq < e.lq; ++iq) {
        int& r = rf.reached[size_t(o->perm[size_t(e.q0 + iq)])];
        if (r >= 0) continue;
        const KeyRange k = pat.key_range(e, iq, iq + 1);
        if (!k.empty() && prefix[size_t(e.k0 + k.hi)] > prefix[size_t(e.k0 + k.lo)]) {
          r = int(li) + 1;
          ++covered;
        }
      }
    }
    rf.coverage.push_back(double(covered) / double(n));
  }
  return rf;
}

}  // namespace ariadne
