// Label maps from mask files, nearest-neighbour resize, polygon rasterization.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "ariadne/error.hpp"
#include "ariadne/file.hpp"
#include "ariadne/image.hpp"
#include "ariadne/mask.hpp"
#include "ariadne/npy.hpp"

namespace ariadne {

namespace {

LabelMap read_label_map_file(const std::string& path) {
  uint8_t head[8] = {};
  {
    const int fd = open_input_file(path);  // refuses FIFOs, directories, devices
    ssize_t got;
    do got = ::read(fd, head, sizeof head);
    while (got < 0 && errno == EINTR);
    const int e = errno;
    ::close(fd);
    ARIADNE_CHECK(got >= 0, path, ": cannot read the mask (", std::strerror(e), ")");
  }
  static const uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  LabelMap m;
  if (std::memcmp(head, kPng, 8) == 0) {
    // Full depth: a 16-bit label map keeps labels above 255 (its high byte alone turned 15 into 0).
    const PngValues img = read_png_values(path);
    m.height = img.height;
    m.width = img.width;
    m.ids.assign(img.values.begin(), img.values.end());
    return m;
  }
  if (head[0] == 0x93 && std::memcmp(head + 1, "NUMPY", 5) == 0) {
    const NpyArray a = read_npy(path);
    ARIADNE_CHECK(a.shape.size() == 2, path, ": shape has ", a.shape.size(),
                  " dimensions, expected a 2-D label map [height, width]");
    ARIADNE_CHECK(a.shape[0] > 0 && a.shape[1] > 0 && a.shape[0] <= kMaxImagePixels && a.shape[1] <= kMaxImagePixels &&
                      a.shape[0] * a.shape[1] <= kMaxImagePixels,
                  path,
                  ": shape (", a.shape[0], ", ", a.shape[1], ") is empty or larger than ", kMaxImagePixels,
                  " pixels");
    m.height = int(a.shape[0]);
    m.width = int(a.shape[1]);
    m.ids = a.to_int32();
    return m;
  }
  detail::fail(path, ": not a mask file: expected a PNG or a .npy array");
}

}  // namespace

LabelMap read_label_map(const std::string& path) {
  return with_path_errors(path, "read the mask", [&] { return read_label_map_file(path); });
}

LabelMap resize_nearest(const LabelMap& m, int height, int width) {
  ARIADNE_CHECK(m.height > 0 && m.width > 0 && m.ids.size() == size_t(m.height) * size_t(m.width),
                "resize_nearest: label map is empty or its ids do not match ", m.height, "x", m.width);
  ARIADNE_CHECK(height > 0 && width > 0, "resize_nearest: target size ", height, "x", width, " must be positive");
  LabelMap r;
  r.height = height;
  r.width = width;
  r.ids.resize(size_t(height) * size_t(width));
  // Integer form of floor((i + ½)·in/out) = floor((2i + 1)·in / (2·out)): exact, no rounding drift.
  std::vector<int> sx(static_cast<size_t>(width));
  for (int x = 0; x < width; ++x) sx[size_t(x)] = int((int64_t(2 * x + 1) * m.width) / (2 * int64_t(width)));
  for (int y = 0; y < height; ++y) {
    const int yy = int((int64_t(2 * y + 1) * m.height) / (2 * int64_t(height)));
    for (int x = 0; x < width; ++x) r.ids[size_t(y) * size_t(width) + size_t(x)] = m.at(yy, sx[size_t(x)]);
  }
  return r;
}

std::vector<uint8_t> rasterize_polygon(const std::vector<double>& xy, int height, int width) {
  ARIADNE_CHECK(height > 0 && width > 0, "rasterize_polygon: image size ", height, "x", width, " must be positive");
  ARIADNE_CHECK(xy.size() % 2 == 0, "rasterize_polygon: ", xy.size(), " coordinates, expected (x, y) pairs");
  for (size_t i = 0; i < xy.size(); ++i)
    ARIADNE_CHECK(std::isfinite(xy[i]) && std::abs(xy[i]) < 1e9, "rasterize_polygon: coordinate ", i, " is ", xy[i],
                  ", expected a finite pixel coordinate");
  std::vector<uint8_t> mask(size_t(height) * size_t(width), 0);
  const size_t n = xy.size() / 2;
  if (n < 3) return mask;
  std::vector<double> cross;
  for (int y = 0; y < height; ++y) {
    const double cy = y + 0.5;
    cross.clear();
    for (size_t i = 0; i < n; ++i) {
      const size_t j = (i + 1) % n;
      const double x0 = xy[2 * i], y0 = xy[2 * i + 1], x1 = xy[2 * j], y1 = xy[2 * j + 1];
      // Half-open in y: an edge counts when the scanline lies in [min y, max y), so a vertex on the
      // scanline is counted once and horizontal edges never.
      if ((y0 <= cy) != (y1 <= cy)) cross.push_back(x0 + (cy - y0) * (x1 - x0) / (y1 - y0));
    }
    std::sort(cross.begin(), cross.end());
    for (size_t k = 0; k + 1 < cross.size(); k += 2) {
      // Centres x + ½ in [left, right): x from ceil(left − ½) to ceil(right − ½) − 1.
      const int lo = std::max(0, int(std::ceil(cross[k] - 0.5)));
      const int hi = std::min(width, int(std::ceil(cross[k + 1] - 0.5)));
      for (int x = lo; x < hi; ++x) mask[size_t(y) * size_t(width) + size_t(x)] = 1;
    }
  }
  return mask;
}

}  // namespace ariadne
