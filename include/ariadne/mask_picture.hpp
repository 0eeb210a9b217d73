// ariadne/mask_picture.hpp — a picture of an estimator's block mask over the exact block masses, so
// that a reader sees where each estimator keeps, misses or adds blocks (docs/rrattention.md).
#pragma once

#include <cstdint>

#include "ariadne/estimate.hpp"
#include "ariadne/image.hpp"

namespace ariadne {

// One (sequence, query head) of `mask` against `oracle` (an Estimator::oracle result on the same
// q/k, block and layout: its scores are the exact block masses, its mask the blocks that hold τ of
// each row). A cell of `cell` × `cell` pixels per (query block, key block), query blocks down, key
// blocks across; the brightness of every visible cell follows the block's exact mass on a log
// scale (10⁻⁴ of its row or less: faint; the whole row: full), its colour the mask's verdict:
//   green  kept, and the oracle keeps it too;        red    the oracle keeps it, the mask misses it;
//   blue   kept, but the oracle does not;            grey   neither keeps it;
//   white  not causally visible.
// Throws ariadne::Error when the two results' row geometry differs, seq or head is out of range,
// cell is outside [1, 64], or the picture would exceed kMaxImagePixels.
Image mask_picture(const BlockMask& mask, const EstimateResult& oracle, int32_t seq, int head, int cell = 4);

}  // namespace ariadne
