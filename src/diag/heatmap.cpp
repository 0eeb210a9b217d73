// Pictures of received attention and patch labels (written as PNG by image.hpp's write_png).
#include <algorithm>
#include <cmath>

#include "ariadne/error.hpp"
#include "ariadne/image.hpp"
#include "ariadne/shs.hpp"

namespace ariadne {

namespace {

// A dark-to-bright colour map (black → purple → orange → pale yellow), piecewise linear through
// five stops, so that low and high received attention read apart on any photo.
void colour(double t, uint8_t rgb[3]) {
  static const double stops[5][3] = {{0, 0, 4}, {87, 16, 110}, {188, 55, 84}, {249, 142, 9}, {252, 255, 164}};
  if (std::isnan(t)) t = 0;  // NaN received attention: int(NaN) below would be undefined
  t = std::clamp(t, 0.0, 1.0) * 4.0;
  const int i = std::min(3, int(t));
  const double f = t - i;
  for (int c = 0; c < 3; ++c) rgb[c] = uint8_t(std::lround(stops[i][c] * (1 - f) + stops[i + 1][c] * f));
}

void check_rgb(const Image& img, const char* what) {
  ARIADNE_CHECK(img.channels == 3 && img.width > 0 && img.height > 0 &&
                    img.pixels.size() == size_t(img.width) * size_t(img.height) * 3,
                what, ": background must be a non-empty RGB image");
}

// A picture of height × width pixels must stay within the decoders' limit (kMaxImagePixels, 2^28):
// `shs --cell 2000` asked for a 196 GB heatmap and ended in bad_alloc.
void check_picture(const char* what, int64_t height, int64_t width, const char* hint) {
  ARIADNE_CHECK(height > 0 && width > 0 && height <= kMaxImagePixels && width <= kMaxImagePixels &&
                    height * width <= kMaxImagePixels,
                what, ": a ", width, "x", height, " picture exceeds the limit of ", kMaxImagePixels, " pixels", hint);
}

}  // namespace

Image resize_rgb(const Image& img, int height, int width) {
  check_rgb(img, "resize_rgb");
  ARIADNE_CHECK(height > 0 && width > 0, "resize_rgb: target ", height, "x", width, " must be positive");
  check_picture("resize_rgb", height, width, "");
  Image out;
  out.width = width;
  out.height = height;
  out.channels = 3;
  out.pixels.resize(size_t(width) * size_t(height) * 3);
  const double sy = double(img.height) / height, sx = double(img.width) / width;
  for (int y = 0; y < height; ++y) {
    const double fy = std::clamp((y + 0.5) * sy - 0.5, 0.0, double(img.height - 1));
    const int y0 = int(fy), y1 = std::min(y0 + 1, img.height - 1);
    const double wy = fy - y0;
    for (int x = 0; x < width; ++x) {
      const double fx = std::clamp((x + 0.5) * sx - 0.5, 0.0, double(img.width - 1));
      const int x0 = int(fx), x1 = std::min(x0 + 1, img.width - 1);
      const double wx = fx - x0;
      for (int c = 0; c < 3; ++c) {
        const double v = (img.at(y0, x0, c) * (1 - wx) + img.at(y0, x1, c) * wx) * (1 - wy) +
                         (img.at(y1, x0, c) * (1 - wx) + img.at(y1, x1, c) * wx) * wy;
        out.pixels[(size_t(y) * size_t(width) + size_t(x)) * 3 + size_t(c)] = uint8_t(std::lround(v));
      }
    }
  }
  return out;
}

Image heatmap_grid(const Image& background, const float* received, int heads, Grid grid, int cell, int cols) {
  check_rgb(background, "heatmap_grid");
  ARIADNE_CHECK(heads > 0 && cell > 0 && cols > 0 && grid.h > 0 && grid.w > 0, "heatmap_grid: heads ", heads,
                ", cell ", cell, ", cols ", cols, ", grid ", grid.h, "x", grid.w, " must be positive");
  cols = std::min(cols, heads);
  const int rows = (heads + cols - 1) / cols, gap = 2;
  // Sizes in int64 first: grid · cell · cols overflows int for a large cell.
  check_picture("heatmap_grid", int64_t(rows) * (int64_t(grid.h) * cell + gap) + gap,
                int64_t(cols) * (int64_t(grid.w) * cell + gap) + gap, " (use a smaller cell)");
  const int tile_h = grid.h * cell, tile_w = grid.w * cell;
  const Image bg = resize_rgb(background, tile_h, tile_w);
  Image out;
  out.width = cols * tile_w + (cols + 1) * gap;
  out.height = rows * tile_h + (rows + 1) * gap;
  out.channels = 3;
  out.pixels.assign(size_t(out.width) * size_t(out.height) * 3, 255);
  const int64_t n = grid.tokens();
  for (int h = 0; h < heads; ++h) {
    const float* r = received + h * n;
    const auto [mn, mx] = std::minmax_element(r, r + n);
    const double lo = *mn, span = *mx - *mn;
    const int ox = gap + (h % cols) * (tile_w + gap), oy = gap + (h / cols) * (tile_h + gap);
    for (int y = 0; y < tile_h; ++y)
      for (int x = 0; x < tile_w; ++x) {
        const double t = span > 0 ? (r[(y / cell) * grid.w + x / cell] - lo) / span : 0.5;
        uint8_t c[3];
        colour(t, c);
        uint8_t* px = &out.pixels[(size_t(oy + y) * size_t(out.width) + size_t(ox + x)) * 3];
        // 35% photo under 65% colour: the object stays recognisable, the map dominates.
        for (int k = 0; k < 3; ++k) px[k] = uint8_t(std::lround(0.35 * bg.at(y, x, k) + 0.65 * c[k]));
      }
  }
  return out;
}

Image label_picture(const Image& background, const std::vector<int8_t>& labels, Grid grid, int cell) {
  check_rgb(background, "label_picture");
  ARIADNE_CHECK(int64_t(labels.size()) == grid.tokens() && cell > 0, "label_picture: ", labels.size(),
                " labels for a ", grid.h, "x", grid.w, " grid");
  check_picture("label_picture", int64_t(grid.h) * cell, int64_t(grid.w) * cell, " (use a smaller cell)");
  Image out = resize_rgb(background, grid.h * cell, grid.w * cell);
  for (int y = 0; y < out.height; ++y)
    for (int x = 0; x < out.width; ++x) {
      const int8_t l = labels[size_t((y / cell) * grid.w + x / cell)];
      uint8_t* px = &out.pixels[(size_t(y) * size_t(out.width) + size_t(x)) * 3];
      const uint8_t gray = uint8_t((px[0] * 3 + px[1] * 6 + px[2]) / 10);
      static const uint8_t fg[3] = {255, 140, 0}, bgc[3] = {30, 110, 255};
      for (int k = 0; k < 3; ++k) {
        if (l == kPatchForeground) px[k] = uint8_t((px[k] + fg[k]) / 2);
        else if (l == kPatchBackground) px[k] = uint8_t((px[k] + bgc[k]) / 2);
        else px[k] = gray;
      }
      // Patch borders in a darker shade, so that the 14-pixel grid is visible.
      if (x % cell == 0 || y % cell == 0)
        for (int k = 0; k < 3; ++k) px[k] = uint8_t(px[k] * 3 / 4);
    }
  return out;
}

}  // namespace ariadne
