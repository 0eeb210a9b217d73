// mask_picture (ariadne/mask_picture.hpp): cells coloured by the mask's verdict against the oracle,
// brightness by the exact block mass.
#include "ariadne/mask_picture.hpp"

#include <algorithm>
#include <cmath>

#include "ariadne/error.hpp"

namespace ariadne {

namespace {

// Whether key block c is listed in CSR row r (rows are sorted).
bool listed(const BlockMask& m, int64_t r, int32_t c) {
  const auto* lo = m.col_idx.data() + m.row_ptr[size_t(r)];
  const auto* hi = m.col_idx.data() + m.row_ptr[size_t(r) + 1];
  return std::binary_search(lo, hi, c);
}

}  // namespace

Image mask_picture(const BlockMask& mask, const EstimateResult& oracle, int32_t seq, int head, int cell) {
  const BlockMask& om = oracle.mask;
  ARIADNE_CHECK(cell >= 1 && cell <= 64, "mask_picture: cell is ", cell, " pixels, expected in [1, 64]");
  ARIADNE_CHECK(mask.block == om.block && mask.heads == om.heads && mask.seq_block_base == om.seq_block_base,
                "mask_picture: the mask's rows (block ", mask.block, ", ", mask.heads,
                " heads) differ from the oracle's (block ", om.block, ", ", om.heads, " heads, or other sequences)");
  ARIADNE_CHECK(int64_t(oracle.score_ptr.size()) == om.rows() + 1 && mask.rows() == om.rows(),
                "mask_picture: the oracle result has no host scores for its ", om.rows(), " rows");
  const int64_t seqs = int64_t(om.seq_block_base.size()) - 1;
  ARIADNE_CHECK(seq >= 0 && seq < seqs, "mask_picture: sequence ", seq, ", expected in [0, ", seqs, ")");
  ARIADNE_CHECK(head >= 0 && head < om.heads, "mask_picture: head ", head, ", expected in [0, ", om.heads, ")");
  const int64_t nqb = om.seq_block_base[size_t(seq) + 1] - om.seq_block_base[size_t(seq)];
  const int64_t row0 = int64_t(om.seq_block_base[size_t(seq)]) * om.heads + head * nqb;
  int64_t nkb = 0;  // the widest row: the last query block sees every key block
  for (int64_t m = 0; m < nqb; ++m) nkb = std::max(nkb, oracle.visible(row0 + m));
  ARIADNE_CHECK(nqb > 0 && nkb > 0, "mask_picture: sequence ", seq, " has no query block");
  ARIADNE_CHECK(nqb * cell <= 16384 && nkb * cell <= 16384 && nqb * nkb * cell * cell <= kMaxImagePixels,
                "mask_picture: ", nqb, " x ", nkb, " blocks at ", cell, " pixels a cell exceed the picture limit");
  Image img;
  img.width = int(nkb * cell);
  img.height = int(nqb * cell);
  img.channels = 3;
  img.pixels.assign(size_t(img.width) * size_t(img.height) * 3, 255);
  for (int64_t m = 0; m < nqb; ++m) {
    const int64_t r = row0 + m;
    const int64_t nvis = oracle.visible(r);
    for (int64_t c = 0; c < nvis; ++c) {
      const double mass = oracle.scores[size_t(oracle.score_ptr[size_t(r)] + c)];
      // 1 at the whole row's mass, 0 at 10⁻⁴ of it or below (NaN: 0).
      const double t = mass > 0 ? std::clamp(1.0 + std::log10(mass) / 4.0, 0.0, 1.0) : 0.0;
      const bool kept = listed(mask, r, int32_t(c)), truth = listed(om, r, int32_t(c));
      // Full colours at t = 1, fading towards a light tint at t = 0.
      const double lo = 0.85 - 0.7 * t;  // the share of white mixed in
      const double base[3] = {kept && truth ? 0.0 : truth ? 0.85 : kept ? 0.1 : 0.35,
                              kept && truth ? 0.6 : truth ? 0.05 : kept ? 0.25 : 0.35,
                              kept && truth ? 0.1 : truth ? 0.05 : kept ? 0.85 : 0.35};
      uint8_t rgb[3];
      for (int ch = 0; ch < 3; ++ch) rgb[ch] = uint8_t(std::lround(255.0 * (lo + (1 - lo) * base[ch])));
      for (int y = 0; y < cell; ++y)
        for (int x = 0; x < cell; ++x) {
          uint8_t* px = img.pixels.data() + ((size_t(m * cell + y) * size_t(img.width)) + size_t(c * cell + x)) * 3;
          // A one-pixel grid line on cells of 4 pixels or more keeps neighbouring blocks apart.
          const bool edge = cell >= 4 && (x == cell - 1 || y == cell - 1);
          for (int ch = 0; ch < 3; ++ch) px[ch] = edge ? uint8_t(255) : rgb[ch];
        }
    }
  }
  return img;
}

}  // namespace ariadne
