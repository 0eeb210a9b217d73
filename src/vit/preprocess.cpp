// Qwen2.5-VL image preprocessing: smart resize, PIL-exact bicubic, CLIP normalization, patch rows.
#include <algorithm>
#include <cmath>

#include "ariadne/error.hpp"
#include "ariadne/vit.hpp"

namespace ariadne {

namespace {

// Python's round(): half to even, on the double quotient (HF: round(height / factor)).
int64_t round_half_even(double x) {
  const double r = std::nearbyint(x);  // the default rounding mode is to nearest, ties to even
  return int64_t(r);
}

// PIL's bicubic kernel (Keys, a = −0.5) and its support.
double bicubic(double x) {
  constexpr double a = -0.5;
  x = std::fabs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
  return 0.0;
}
constexpr double kSupport = 2.0;
// PIL's fixed-point precision for 8-bit images: 32 − 8 − 2 bits after the binary point.
constexpr int kPrecision = 22;

// Per output pixel: the first input index, the tap count, and ksize quantized weights.
struct Coeffs {
  int ksize = 0;
  std::vector<int> first, count;
  std::vector<int32_t> k;  // [out, ksize]
};

Coeffs precompute(int in_size, int out_size) {
  const double scale = double(in_size) / out_size;
  const double filterscale = scale < 1.0 ? 1.0 : scale;  // widen the kernel when shrinking (antialias)
  const double support = kSupport * filterscale;
  Coeffs c;
  c.ksize = int(std::ceil(support)) * 2 + 1;
  c.first.resize(size_t(out_size));
  c.count.resize(size_t(out_size));
  c.k.assign(size_t(out_size) * size_t(c.ksize), 0);
  std::vector<double> w(size_t(c.ksize));
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int xmin = int(center - support + 0.5);  // truncation toward zero, as PIL's (int) cast
    if (xmin < 0) xmin = 0;
    int xmax = int(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0;
    for (int x = 0; x < xmax; ++x) {
      w[size_t(x)] = bicubic((x + xmin - center + 0.5) * ss);
      ww += w[size_t(x)];
    }
    for (int x = 0; x < xmax; ++x) {
      const double v = ww != 0.0 ? w[size_t(x)] / ww : w[size_t(x)];
      const double f = v * double(1 << kPrecision);
      c.k[size_t(xx) * size_t(c.ksize) + size_t(x)] = int32_t(v < 0 ? -0.5 + f : 0.5 + f);
    }
    c.first[size_t(xx)] = xmin;
    c.count[size_t(xx)] = xmax;
  }
  return c;
}

uint8_t clip8(int32_t acc) {
  const int32_t v = acc >> kPrecision;  // arithmetic shift: floor, as PIL
  return uint8_t(v < 0 ? 0 : v > 255 ? 255 : v);
}

}  // namespace

std::pair<int, int> smart_resize(int height, int width, int factor, int64_t min_pixels, int64_t max_pixels) {
  ARIADNE_CHECK(height > 0 && width > 0, "smart_resize: image size ", width, "x", height, " must be positive");
  ARIADNE_CHECK(factor > 0 && min_pixels > 0 && max_pixels >= min_pixels, "smart_resize: factor ", factor,
                ", min_pixels ", min_pixels, ", max_pixels ", max_pixels, " are inconsistent");
  const double ratio = double(std::max(height, width)) / double(std::min(height, width));
  ARIADNE_CHECK(ratio <= 200, "smart_resize: aspect ratio ", ratio, " of a ", width, "x", height,
                " image exceeds 200 (Qwen2.5-VL's limit)");
  int64_t h = round_half_even(double(height) / factor) * factor;
  int64_t w = round_half_even(double(width) / factor) * factor;
  if (h * w > max_pixels) {
    const double beta = std::sqrt(double(height) * double(width) / double(max_pixels));
    h = std::max<int64_t>(factor, int64_t(std::floor(height / beta / factor)) * factor);
    w = std::max<int64_t>(factor, int64_t(std::floor(width / beta / factor)) * factor);
  } else if (h * w < min_pixels) {
    const double beta = std::sqrt(double(min_pixels) / (double(height) * double(width)));
    h = int64_t(std::ceil(height * beta / factor)) * factor;
    w = int64_t(std::ceil(width * beta / factor)) * factor;
  }
  return {int(h), int(w)};
}

Image resize_bicubic(const Image& src, int out_width, int out_height) {
  ARIADNE_CHECK(src.width > 0 && src.height > 0 && src.channels > 0 &&
                    src.pixels.size() == size_t(src.width) * size_t(src.height) * size_t(src.channels),
                "resize_bicubic: source image ", src.width, "x", src.height, "x", src.channels, " is malformed");
  ARIADNE_CHECK(out_width > 0 && out_height > 0 && int64_t(out_width) * out_height <= kMaxImagePixels,
                "resize_bicubic: target size ", out_width, "x", out_height, " is out of range");
  const int C = src.channels;
  Image cur = src;
  if (out_width != src.width) {  // horizontal pass, rounded to 8 bits (PIL keeps an 8-bit temporary)
    const Coeffs c = precompute(src.width, out_width);
    Image tmp;
    tmp.width = out_width;
    tmp.height = cur.height;
    tmp.channels = C;
    tmp.pixels.resize(size_t(out_width) * size_t(cur.height) * size_t(C));
    for (int y = 0; y < cur.height; ++y)
      for (int xx = 0; xx < out_width; ++xx) {
        const int32_t* k = &c.k[size_t(xx) * size_t(c.ksize)];
        for (int ch = 0; ch < C; ++ch) {
          int32_t acc = 1 << (kPrecision - 1);  // rounding bias
          for (int x = 0; x < c.count[size_t(xx)]; ++x) acc += int32_t(cur.at(y, c.first[size_t(xx)] + x, ch)) * k[x];
          tmp.pixels[(size_t(y) * size_t(out_width) + size_t(xx)) * size_t(C) + size_t(ch)] = clip8(acc);
        }
      }
    cur = std::move(tmp);
  }
  if (out_height != src.height) {  // vertical pass
    const Coeffs c = precompute(src.height, out_height);
    Image tmp;
    tmp.width = cur.width;
    tmp.height = out_height;
    tmp.channels = C;
    tmp.pixels.resize(size_t(cur.width) * size_t(out_height) * size_t(C));
    for (int yy = 0; yy < out_height; ++yy) {
      const int32_t* k = &c.k[size_t(yy) * size_t(c.ksize)];
      for (int x = 0; x < cur.width; ++x)
        for (int ch = 0; ch < C; ++ch) {
          int32_t acc = 1 << (kPrecision - 1);
          for (int y = 0; y < c.count[size_t(yy)]; ++y) acc += int32_t(cur.at(c.first[size_t(yy)] + y, x, ch)) * k[y];
          tmp.pixels[(size_t(yy) * size_t(cur.width) + size_t(x)) * size_t(C) + size_t(ch)] = clip8(acc);
        }
    }
    cur = std::move(tmp);
  }
  return cur;
}

namespace {

// Normalized planes [3, h, w] of one resized image, computed as HF does: u8 · (1/255) in double
// rounded to float, then (x − mean) / std in float.
std::vector<float> normalized_planes(const Image& r, const PreprocessOptions& options) {
  const int h = r.height, w = r.width;
  std::vector<float> plane(size_t(3) * size_t(h) * size_t(w));
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x) {
        const float v = float(double(r.at(y, x, c)) * (1.0 / 255.0));
        plane[(size_t(c) * size_t(h) + size_t(y)) * size_t(w) + size_t(x)] =
            (v - options.mean[size_t(c)]) / options.std[size_t(c)];
      }
  return plane;
}

// Appends the patch rows of one temporal patch: rows in block_row order (merge units in raster
// order, the M×M patches of a unit in raster order), columns (channel, t, py, px) where frame t
// of the temporal patch is frames[t] (planes [3, h, w] of the grid's size).
void append_rows(const std::vector<const std::vector<float>*>& frames, const Grid& g, const VitConfig& config,
                 std::vector<float>& out) {
  const int P = config.patch, M = config.merge, T = int(frames.size());
  const size_t h = size_t(g.h) * size_t(P), w = size_t(g.w) * size_t(P);
  for (int uy = 0; uy < g.h / M; ++uy)
    for (int ux = 0; ux < g.w / M; ++ux)
      for (int my = 0; my < M; ++my)
        for (int mx = 0; mx < M; ++mx) {
          const size_t py0 = size_t((uy * M + my) * P), px0 = size_t((ux * M + mx) * P);
          for (size_t c = 0; c < 3; ++c)
            for (int t = 0; t < T; ++t) {
              const std::vector<float>& plane = *frames[size_t(t)];
              for (size_t py = 0; py < size_t(P); ++py)
                for (size_t px = 0; px < size_t(P); ++px) out.push_back(plane[(c * h + py0 + py) * w + px0 + px]);
            }
        }
}

}  // namespace

PixelBatch preprocess(const std::vector<Image>& images, const VitConfig& config, const PreprocessOptions& options) {
  config.validate();
  ARIADNE_CHECK(!images.empty(), "preprocess: no image given");
  PixelBatch batch;
  batch.patch_dim = config.patch_dim();
  for (size_t n = 0; n < images.size(); ++n) {
    const Image& im = images[n];
    ARIADNE_CHECK(im.channels == 3, "preprocess: image ", n, " has ", im.channels, " channels, expected RGB (3)");
    const auto [h, w] = smart_resize(im.height, im.width, config.factor(), options.min_pixels, options.max_pixels);
    const std::vector<float> plane =
        normalized_planes((h == im.height && w == im.width) ? im : resize_bicubic(im, w, h), options);
    const Grid g{h / config.patch, w / config.patch};
    batch.grids.push_back(g);
    batch.grid_t.push_back(1);
    // A still image is `temporal` identical frames.
    append_rows(std::vector<const std::vector<float>*>(size_t(config.temporal), &plane), g, config, batch.values);
  }
  return batch;
}

PixelBatch preprocess_video(const std::vector<Image>& frames, const VitConfig& config,
                            const PreprocessOptions& options) {
  config.validate();
  ARIADNE_CHECK(!frames.empty(), "preprocess_video: no frame given");
  const Image& first = frames[0];
  const auto [h, w] = smart_resize(first.height, first.width, config.factor(), options.min_pixels,
                                   options.max_pixels);
  std::vector<std::vector<float>> planes;
  planes.reserve(frames.size());
  for (size_t n = 0; n < frames.size(); ++n) {
    const Image& im = frames[n];
    ARIADNE_CHECK(im.channels == 3, "preprocess_video: frame ", n, " has ", im.channels,
                  " channels, expected RGB (3)");
    // One clip has one size: its temporal patches share the grid, as HF's processor requires.
    ARIADNE_CHECK(im.width == first.width && im.height == first.height, "preprocess_video: frame ", n, " is ",
                  im.width, "x", im.height, ", expected the size of frame 0 (", first.width, "x", first.height, ")");
    planes.push_back(normalized_planes((h == im.height && w == im.width) ? im : resize_bicubic(im, w, h), options));
  }
  const int T = config.temporal;
  const size_t padded = (frames.size() + size_t(T) - 1) / size_t(T) * size_t(T);
  PixelBatch batch;
  batch.patch_dim = config.patch_dim();
  const Grid g{h / config.patch, w / config.patch};
  batch.grid_t.push_back(int(padded / size_t(T)));
  for (size_t t0 = 0; t0 < padded; t0 += size_t(T)) {
    // Frames past the end repeat the last one (HF pads the clip to a multiple of the temporal patch).
    std::vector<const std::vector<float>*> group;
    for (size_t t = t0; t < t0 + size_t(T); ++t) group.push_back(&planes[std::min(t, planes.size() - 1)]);
    batch.grids.push_back(g);
    append_rows(group, g, config, batch.values);
  }
  return batch;
}

}  // namespace ariadne
