// COCO annotation files: JSON parsing with validation, RLE (list and compressed string forms),
// label maps. The formats are described in include/ariadne/mask.hpp.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "ariadne/error.hpp"
#include "ariadne/file.hpp"
#include "ariadne/image.hpp"
#include "ariadne/mask.hpp"

namespace ariadne {

namespace {

using nlohmann::json;

// Field accessors that fail with the file name and the JSON path of the field.
struct Ctx {
  const std::string& file;
  [[noreturn]] void fail(const std::string& where, const std::string& what) const {
    detail::fail(file, ": ", where, ": ", what);
  }
  const json& member(const json& obj, const std::string& where, const char* key) const {
    auto it = obj.find(key);
    if (it == obj.end()) fail(where, std::string("missing field '") + key + "'");
    return *it;
  }
  int64_t integer(const json& obj, const std::string& where, const char* key) const {
    const json& v = member(obj, where, key);
    if (!v.is_number_integer()) fail(where + "." + key, "expected an integer, found " + v.dump());
    return v.get<int64_t>();
  }
};

}  // namespace

std::vector<uint32_t> rle_from_string(const std::string& s, const std::string& what) {
  std::vector<int64_t> counts;
  size_t p = 0;
  while (p < s.size()) {
    int64_t x = 0;
    int k = 0;
    bool more = true;
    while (more) {
      ARIADNE_CHECK(p < s.size(), what, ": compressed RLE string ends inside count ", counts.size());
      const int c = int(static_cast<unsigned char>(s[p])) - 48;
      ARIADNE_CHECK(c >= 0 && c < 64, what, ": compressed RLE string has character '", s[p], "' at ", p,
                    ", expected '0'..'o'");
      ARIADNE_CHECK(k < 12, what, ": compressed RLE count ", counts.size(), " is longer than 12 characters");
      x |= int64_t(c & 0x1f) << (5 * k);
      more = (c & 0x20) != 0;
      ++p;
      ++k;
      if (!more && (c & 0x10)) x |= ~int64_t(0) << (5 * k);  // sign-extend the last group
    }
    if (counts.size() > 2) x += counts[counts.size() - 2];
    ARIADNE_CHECK(x >= 0 && x <= int64_t(UINT32_MAX), what, ": compressed RLE count ", counts.size(), " decodes to ",
                  x, ", expected a non-negative run length");
    counts.push_back(x);
  }
  return std::vector<uint32_t>(counts.begin(), counts.end());
}

std::string rle_to_string(const std::vector<uint32_t>& counts) {
  std::string s;
  for (size_t i = 0; i < counts.size(); ++i) {
    int64_t x = counts[i];
    if (i > 2) x -= int64_t(counts[i - 2]);
    bool more = true;
    while (more) {
      int c = int(x & 0x1f);
      x >>= 5;  // arithmetic shift: negative differences keep their sign
      more = (c & 0x10) ? x != -1 : x != 0;
      if (more) c |= 0x20;
      s.push_back(char(c + 48));
    }
  }
  return s;
}

std::vector<uint8_t> rle_decode(const CocoRle& rle, const std::string& what) {
  const int64_t n = int64_t(rle.height) * rle.width;
  ARIADNE_CHECK(rle.height > 0 && rle.width > 0, what, ": RLE size ", rle.height, "x", rle.width,
                " must be positive");
  int64_t sum = 0;
  for (uint32_t c : rle.counts) sum += c;
  ARIADNE_CHECK(sum == n, what, ": RLE runs sum to ", sum, ", expected height·width = ", n);
  std::vector<uint8_t> mask(size_t(n), 0);
  int64_t p = 0;
  for (size_t i = 0; i < rle.counts.size(); ++i) {
    if (i % 2 == 1)
      for (int64_t t = p; t < p + rle.counts[i]; ++t)  // column-major position t -> (t % h, t / h)
        mask[size_t(t % rle.height) * size_t(rle.width) + size_t(t / rle.height)] = 1;
    p += rle.counts[i];
  }
  return mask;
}

CocoRle rle_encode(const std::vector<uint8_t>& mask, int height, int width) {
  ARIADNE_CHECK(mask.size() == size_t(height) * size_t(width), "rle_encode: mask has ", mask.size(),
                " pixels, expected ", height, "x", width);
  CocoRle r{height, width, {}};
  uint8_t cur = 0;
  uint32_t run = 0;
  for (int x = 0; x < width; ++x)
    for (int y = 0; y < height; ++y) {
      const uint8_t v = mask[size_t(y) * size_t(width) + size_t(x)] ? 1 : 0;
      if (v != cur) {
        r.counts.push_back(run);
        run = 0;
        cur = v;
      }
      ++run;
    }
  r.counts.push_back(run);
  return r;
}

namespace {

// The one image of `ds` for which key(file_name) == want; nullptr when none; an error naming both
// entries when two match (binding to the first one silently scored the wrong image).
template <class Key>
const CocoImage* find_unique(const CocoDataset& ds, const std::string& want, const char* what, Key key) {
  const CocoImage* found = nullptr;
  size_t at = 0;
  for (size_t i = 0; i < ds.images.size(); ++i) {
    const CocoImage& im = ds.images[i];
    if (key(im.file_name) != want) continue;
    ARIADNE_CHECK(found == nullptr, ds.path, ": images[", at, "] (id ", found ? found->id : 0, ", '",
                  found ? found->file_name : "", "') and images[", i, "] (id ", im.id, ", '", im.file_name,
                  "') both have the ", what, " '", want, "': the image cannot be matched to one entry (rename one)");
    found = &im;
    at = i;
  }
  return found;
}

}  // namespace

const CocoImage* CocoDataset::find_by_stem(const std::string& stem) const {
  return find_unique(*this, stem, "file stem",
                     [](const std::string& f) { return std::filesystem::path(f).stem().string(); });
}

const CocoImage* CocoDataset::find_image(const std::string& image_path) const {
  if (const CocoImage* im = find_unique(*this, image_path, "file name", [](const std::string& f) { return f; }))
    return im;
  const std::string base = std::filesystem::path(image_path).filename().string();
  if (const CocoImage* im = find_unique(*this, base, "file name",
                                        [](const std::string& f) { return std::filesystem::path(f).filename().string(); }))
    return im;
  return find_by_stem(std::filesystem::path(image_path).stem().string());
}

CocoDataset parse_coco(const std::string& json_text, const std::string& name) {
  json doc;
  try {
    doc = json::parse(json_text);
  } catch (const json::exception& e) {
    detail::fail(name, ": not valid JSON: ", e.what());
  }
  const Ctx c{name};
  if (!doc.is_object()) c.fail("top level", "expected a JSON object with 'images' and 'annotations'");
  CocoDataset ds;
  ds.path = name;

  const json& images = c.member(doc, "top level", "images");
  if (!images.is_array()) c.fail("images", "expected an array");
  std::map<int64_t, size_t> image_index;
  for (size_t i = 0; i < images.size(); ++i) {
    const std::string where = "images[" + std::to_string(i) + "]";
    const json& im = images[i];
    if (!im.is_object()) c.fail(where, "expected an object");
    CocoImage out;
    out.id = c.integer(im, where, "id");
    const json& fn = c.member(im, where, "file_name");
    if (!fn.is_string()) c.fail(where + ".file_name", "expected a string");
    out.file_name = fn.get<std::string>();
    const int64_t w = c.integer(im, where, "width"), h = c.integer(im, where, "height");
    // Each side is bounded before the product, which would overflow int64 for forged sizes.
    if (w <= 0 || h <= 0 || w > kMaxImagePixels || h > kMaxImagePixels || w * h > kMaxImagePixels)
      c.fail(where, "size " + std::to_string(w) + "x" + std::to_string(h) + " must be positive and at most " +
                        std::to_string(kMaxImagePixels) + " pixels");
    out.width = int(w);
    out.height = int(h);
    if (!image_index.emplace(out.id, ds.images.size()).second)
      c.fail(where + ".id", "image id " + std::to_string(out.id) + " appears twice");
    ds.images.push_back(out);
  }

  std::set<int64_t> category_ids;
  if (doc.contains("categories")) {
    const json& cats = doc["categories"];
    if (!cats.is_array()) c.fail("categories", "expected an array");
    for (size_t i = 0; i < cats.size(); ++i) {
      const std::string where = "categories[" + std::to_string(i) + "]";
      if (!cats[i].is_object()) c.fail(where, "expected an object");
      CocoCategory cat;
      cat.id = c.integer(cats[i], where, "id");
      if (cats[i].contains("name") && cats[i]["name"].is_string()) cat.name = cats[i]["name"].get<std::string>();
      if (!category_ids.insert(cat.id).second)
        c.fail(where + ".id", "category id " + std::to_string(cat.id) + " appears twice");
      ds.categories.push_back(cat);
    }
  }

  const json& anns = c.member(doc, "top level", "annotations");
  if (!anns.is_array()) c.fail("annotations", "expected an array");
  for (size_t i = 0; i < anns.size(); ++i) {
    const std::string where = "annotations[" + std::to_string(i) + "]";
    const json& a = anns[i];
    if (!a.is_object()) c.fail(where, "expected an object");
    CocoAnnotation out;
    out.id = a.contains("id") ? c.integer(a, where, "id") : int64_t(i);
    out.image_id = c.integer(a, where, "image_id");
    auto im_it = image_index.find(out.image_id);
    if (im_it == image_index.end())
      c.fail(where + ".image_id", "image id " + std::to_string(out.image_id) + " is not in 'images'");
    const CocoImage& im = ds.images[im_it->second];
    out.category_id = c.integer(a, where, "category_id");
    if (!category_ids.empty() && !category_ids.count(out.category_id))
      c.fail(where + ".category_id", "category id " + std::to_string(out.category_id) + " is not in 'categories'");
    if (out.category_id < 0 || out.category_id > INT32_MAX)
      c.fail(where + ".category_id", "category id " + std::to_string(out.category_id) +
                                         " must lie in [0, 2^31) (label maps hold int32 ids; -1 marks crowd regions)");
    if (a.contains("iscrowd")) {
      const int64_t crowd = c.integer(a, where, "iscrowd");
      if (crowd != 0 && crowd != 1) c.fail(where + ".iscrowd", "expected 0 or 1, found " + std::to_string(crowd));
      out.iscrowd = crowd == 1;
    }
    if (a.contains("area")) {
      if (!a["area"].is_number() || a["area"].get<double>() < 0)
        c.fail(where + ".area", "expected a non-negative number, found " + a["area"].dump());
      out.area = a["area"].get<double>();
    }
    const json& seg = c.member(a, where, "segmentation");
    const std::string sw = where + ".segmentation";
    if (seg.is_array()) {
      for (size_t r = 0; r < seg.size(); ++r) {
        const std::string rw = sw + "[" + std::to_string(r) + "]";
        const json& ring = seg[r];
        if (!ring.is_array()) c.fail(rw, "expected an array of coordinates [x0, y0, x1, y1, ...]");
        if (ring.size() < 6 || ring.size() % 2)
          c.fail(rw, "has " + std::to_string(ring.size()) + " coordinates, expected an even number >= 6");
        std::vector<double> xy(ring.size());
        for (size_t k = 0; k < ring.size(); ++k) {
          if (!ring[k].is_number()) c.fail(rw + "[" + std::to_string(k) + "]", "expected a number");
          const double v = ring[k].get<double>();
          const double limit = k % 2 ? im.height : im.width;
          // Annotation tools put points on (or a hair beyond) the border; one pixel of slack.
          if (!std::isfinite(v) || v < -1.0 || v > limit + 1.0) {
            std::ostringstream os;
            os << (k % 2 ? "y" : "x") << " = " << v << " lies outside the image (" << im.width << "x" << im.height
               << ", one pixel of slack)";
            c.fail(rw + "[" + std::to_string(k) + "]", os.str());
          }
          xy[k] = v;
        }
        out.polygons.push_back(std::move(xy));
      }
    } else if (seg.is_object()) {
      const json& size = c.member(seg, sw, "size");
      if (!size.is_array() || size.size() != 2 || !size[0].is_number_integer() || !size[1].is_number_integer())
        c.fail(sw + ".size", "expected [height, width]");
      out.rle.height = size[0].get<int>();
      out.rle.width = size[1].get<int>();
      if (out.rle.height != im.height || out.rle.width != im.width)
        c.fail(sw + ".size", "is [" + std::to_string(out.rle.height) + ", " + std::to_string(out.rle.width) +
                                 "], but image " + std::to_string(im.id) + " is [" + std::to_string(im.height) +
                                 ", " + std::to_string(im.width) + "]");
      const json& counts = c.member(seg, sw, "counts");
      if (counts.is_string()) {
        out.rle.counts = rle_from_string(counts.get<std::string>(), name + ": " + sw + ".counts");
      } else if (counts.is_array()) {
        for (size_t k = 0; k < counts.size(); ++k) {
          if (!counts[k].is_number_integer() || counts[k].get<int64_t>() < 0 ||
              counts[k].get<int64_t>() > int64_t(UINT32_MAX))
            c.fail(sw + ".counts[" + std::to_string(k) + "]", "expected a non-negative integer run length");
          out.rle.counts.push_back(counts[k].get<uint32_t>());
        }
      } else {
        c.fail(sw + ".counts", "expected a list of run lengths or a compressed RLE string");
      }
      int64_t sum = 0;
      for (uint32_t v : out.rle.counts) sum += v;
      if (sum != int64_t(im.height) * im.width)
        c.fail(sw + ".counts", "runs sum to " + std::to_string(sum) + ", expected height·width = " +
                                   std::to_string(int64_t(im.height) * im.width));
      out.has_rle = true;
    } else {
      c.fail(sw, "expected a list of polygons or an RLE object {size, counts}");
    }
    ds.annotations.push_back(std::move(out));
  }
  return ds;
}

CocoDataset read_coco(const std::string& path) {
  return with_path_errors(path, "read the COCO annotation file", [&] {
    const std::vector<uint8_t> bytes = read_input_file(path);  // refuses FIFOs, directories, devices
    return parse_coco(std::string(bytes.begin(), bytes.end()), path);
  });
}

LabelMap coco_label_map(const CocoDataset& coco, const CocoImage& image) {
  LabelMap m;
  m.height = image.height;
  m.width = image.width;
  m.ids.assign(size_t(image.height) * size_t(image.width), 0);
  for (size_t i = 0; i < coco.annotations.size(); ++i) {
    const CocoAnnotation& a = coco.annotations[i];
    if (a.image_id != image.id) continue;
    const int32_t id = a.iscrowd ? kCrowdLabel : int32_t(a.category_id);
    auto paint = [&](const std::vector<uint8_t>& region) {
      for (size_t p = 0; p < region.size(); ++p)
        if (region[p]) m.ids[p] = id;
    };
    if (a.has_rle)
      paint(rle_decode(a.rle, coco.path + ": annotations[" + std::to_string(i) + "]"));
    else
      for (const auto& ring : a.polygons) paint(rasterize_polygon(ring, image.height, image.width));
  }
  return m;
}

}  // namespace ariadne
