// ariadne/receptive_field.hpp — how far information from one token spreads through a schedule.
//
// Token-level simulation (SPEC A.5): a start patch is "covered"; after each layer a patch is
// covered when it was covered before (the residual connection keeps it) or when any key its query
// may see in that layer is covered. Each layer runs in its own token order (schedule.hpp), so a
// window of ±w reaches sequence neighbours of that order; across order changes the covered set is
// carried by spatial position, not sequence position. Only the pattern matters here, not weights.
//
// The talk's example: a 10×14 grid at token level (merge 1, so block_row is raster and block_col is
// column-major raster), window 4: seven row-order layers cover about 41% of the image, while
// RRRR-CCC covers all of it by layer 7.
#pragma once

#include <cstdint>
#include <vector>

#include "ariadne/order.hpp"
#include "ariadne/schedule.hpp"

namespace ariadne {

struct ReceptiveField {
  Grid grid;
  int start_row = 0, start_col = 0;
  std::vector<double> coverage;  // [layers] covered fraction of the grid after each layer
  std::vector<int> reached;      // [h·w] raster: layer (1-based) after which the patch is first
                                 // covered; 0 for the start patch, -1 when never covered
};

// Spreads from patch (start_row, start_col) of `grid` through every layer of `schedule`. merge and
// qwen_window define the orders as in make_order (merge 1 = token level, as in the talk).
ReceptiveField receptive_field(const Schedule& schedule, Grid grid, int start_row, int start_col,
                               int merge = 1, int qwen_window = 4);

}  // namespace ariadne
