// Patch labels from masks and the Mann–Whitney AUROC.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "ariadne/error.hpp"
#include "ariadne/shs.hpp"

namespace ariadne {

int ForegroundRule::classify(int32_t id) const {
  auto in = [id](const std::vector<int32_t>& v) { return std::find(v.begin(), v.end(), id) != v.end(); };
  if (in(ignore)) return -1;
  if (!foreground.empty()) return in(foreground) ? 1 : 0;
  return in(background) ? 0 : 1;
}

PatchFractions patch_fractions(const LabelMap& mask, Grid grid, int patch, const ForegroundRule& rule) {
  ARIADNE_CHECK(grid.h > 0 && grid.w > 0 && patch > 0, "patch_fractions: grid ", grid.h, "x", grid.w, " and patch ",
                patch, " must be positive");
  const LabelMap r = resize_nearest(mask, grid.h * patch, grid.w * patch);
  PatchFractions f;
  f.grid = grid;
  f.patch = patch;
  f.fg.assign(size_t(grid.tokens()), 0.f);
  f.bg.assign(size_t(grid.tokens()), 0.f);
  std::vector<int64_t> nf(size_t(grid.tokens()), 0), nb(size_t(grid.tokens()), 0);
  for (int y = 0; y < r.height; ++y)
    for (int x = 0; x < r.width; ++x) {
      const int c = rule.classify(r.at(y, x));
      const size_t p = size_t(y / patch) * size_t(grid.w) + size_t(x / patch);
      if (c == 1) ++nf[p];
      if (c == 0) ++nb[p];
    }
  const double area = double(patch) * patch;
  for (size_t p = 0; p < nf.size(); ++p) {
    f.fg[p] = float(nf[p] / area);
    f.bg[p] = float(nb[p] / area);
  }
  return f;
}

std::vector<int8_t> label_patches(const PatchFractions& f, double purity) {
  ARIADNE_CHECK(purity >= 0.5 && purity <= 1.0, "purity ", purity, " must lie in [0.5, 1]");
  std::vector<int8_t> labels(f.fg.size(), kPatchExcluded);
  for (size_t p = 0; p < f.fg.size(); ++p) {
    // Fractions are k/patch² exactly representable up to float rounding; compare with a hair of
    // slack so that purity 1 accepts a patch whose count equals the area.
    const double fg = f.fg[p], bg = f.bg[p], eps = 1e-6;
    if (fg > 0.5 && fg >= purity - eps) labels[p] = kPatchForeground;
    else if (bg > 0.5 && bg >= purity - eps) labels[p] = kPatchBackground;
  }
  return labels;
}

std::vector<float> to_spatial(const float* seq, const TokenOrder& order) {
  ARIADNE_CHECK(order.images() == 1, "to_spatial: the order holds ", order.images(), " images, expected one");
  std::vector<float> out(static_cast<size_t>(order.tokens()));
  for (int64_t i = 0; i < order.tokens(); ++i) out[size_t(order.perm[size_t(i)])] = seq[i];
  return out;
}

double auroc(const std::vector<double>& pos, const std::vector<double>& neg) {
  ARIADNE_CHECK(!pos.empty() && !neg.empty(), "auroc: needs at least one value on each side (", pos.size(), " FG, ",
                neg.size(), " BG)");
  struct V {
    double v;
    bool pos;
  };
  std::vector<V> all;
  all.reserve(pos.size() + neg.size());
  for (double v : pos) all.push_back({v, true});
  for (double v : neg) all.push_back({v, false});
  for (const V& x : all) ARIADNE_CHECK(!std::isnan(x.v), "auroc: a value is NaN");
  std::sort(all.begin(), all.end(), [](const V& a, const V& b) { return a.v < b.v; });
  // Sum of the positives' mid-ranks (1-based); a tie group of ranks i+1..j shares (i+1+j)/2.
  double rank_sum = 0;
  for (size_t i = 0; i < all.size();) {
    size_t j = i;
    while (j < all.size() && all[j].v == all[i].v) ++j;
    const double mid = 0.5 * double(i + 1 + j);
    for (size_t t = i; t < j; ++t)
      if (all[t].pos) rank_sum += mid;
    i = j;
  }
  const double np = double(pos.size()), nn = double(neg.size());
  const double u = rank_sum - np * (np + 1) / 2;  // pairs won by pos, ties counted ½
  return u / (np * nn);
}

}  // namespace ariadne
