// COCO annotations: compressed and plain RLE, polygon rasterization, validation of malformed
// files, and the labelme-examples annotations against the VOC masks made from the same polygons.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "ariadne/error.hpp"
#include "ariadne/mask.hpp"

namespace {

using namespace ariadne;
namespace fs = std::filesystem;

const fs::path kSamples = "/usr/share/doc/labelme-examples/examples/instance_segmentation";

TEST(Rle, CompressedStringKnownValues) {
  // Hand-derived from the format: small counts are one character 48 + c; 100 = 4 + 3·32 needs two
  // groups ('T' = 48 + 4 + 32 for "more", then '3'); the 4th count is stored as 1 − 2 = −1, one
  // group 31 with the sign bit 16 set ('O').
  EXPECT_EQ(rle_from_string("325", "t"), (std::vector<uint32_t>{3, 2, 5}));
  EXPECT_EQ(rle_from_string("T3", "t"), (std::vector<uint32_t>{100}));
  EXPECT_EQ(rle_from_string("325O", "t"), (std::vector<uint32_t>{3, 2, 5, 1}));
  EXPECT_EQ(rle_to_string({3, 2, 5, 1}), "325O");
  EXPECT_EQ(rle_to_string({100}), "T3");
  EXPECT_EQ(rle_from_string("", "t"), std::vector<uint32_t>{});
}

TEST(Rle, RoundTripOnRandomMasks) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 40; ++trial) {
    const int h = 1 + int(rng() % 40), w = 1 + int(rng() % 40);
    std::vector<uint8_t> mask(size_t(h * w));
    // Blobby masks (long runs) and noisy ones (short runs, many negative differences).
    const bool noisy = trial % 2;
    uint8_t cur = 0;
    for (auto& m : mask) {
      if (noisy ? rng() % 2 : rng() % 50 == 0) cur ^= 1;
      m = cur;
    }
    const CocoRle r = rle_encode(mask, h, w);
    CocoRle back{h, w, rle_from_string(rle_to_string(r.counts), "t")};
    EXPECT_EQ(back.counts, r.counts);
    EXPECT_EQ(rle_decode(back, "t"), mask);
  }
}

TEST(Rle, DecodeIsColumnMajor) {
  // 2×3 mask, runs 1 zero, 2 ones, 3 zeros over column-major pixels: (0,0)=0, (1,0)=1, (0,1)=1.
  const std::vector<uint8_t> m = rle_decode(CocoRle{2, 3, {1, 2, 3}}, "t");
  EXPECT_EQ(m, (std::vector<uint8_t>{0, 1, 0, 1, 0, 0}));
}

TEST(Rle, MalformedInputsThrow) {
  EXPECT_THROW(rle_from_string("3~", "t"), Error);   // character outside '0'..'o'
  EXPECT_THROW(rle_from_string("3T", "t"), Error);   // ends inside a count ("more" bit set)
  EXPECT_THROW(rle_from_string("O", "t"), Error);    // first count −1
  EXPECT_THROW(rle_from_string("12O", "t"), Error);  // third count −1 (differences start at the fourth)
  EXPECT_THROW(rle_from_string("123M", "t"), Error);  // fourth count: 'M' is −3, plus the second (2) gives −1
  EXPECT_THROW(rle_decode(CocoRle{2, 3, {1, 2}}, "t"), Error);  // sums to 3, not 6
}

TEST(Polygon, RasterRuleOnHandMadeShapes) {
  // Rectangle [1,4) × [1,3): centres x+½ ∈ [1,4) → x = 1..3, y = 1..2.
  std::vector<uint8_t> m = rasterize_polygon({1, 1, 4, 1, 4, 3, 1, 3}, 5, 6);
  for (int y = 0; y < 5; ++y)
    for (int x = 0; x < 6; ++x) EXPECT_EQ(m[size_t(y * 6 + x)], (x >= 1 && x <= 3 && y >= 1 && y <= 2) ? 1 : 0);
  // Centres exactly on edges: left/top edge inside, right/bottom outside.
  m = rasterize_polygon({0.5, 0.5, 2.5, 0.5, 2.5, 2.5, 0.5, 2.5}, 4, 4);
  EXPECT_EQ(m, (std::vector<uint8_t>{1, 1, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
  // Two squares sharing an edge: disjoint, and together they tile the union.
  const auto a = rasterize_polygon({0, 0, 2.5, 0, 2.5, 3, 0, 3}, 3, 5);
  const auto b = rasterize_polygon({2.5, 0, 5, 0, 5, 3, 2.5, 3}, 3, 5);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i] + b[i], 1) << i;
  // Orientation does not matter; a polygon partly outside the image is clipped.
  EXPECT_EQ(rasterize_polygon({1, 3, 4, 3, 4, 1, 1, 1}, 5, 6), rasterize_polygon({1, 1, 4, 1, 4, 3, 1, 3}, 5, 6));
  EXPECT_THROW(rasterize_polygon({0, 0, NAN, 1, 1, 1}, 4, 4), Error);
  EXPECT_THROW(rasterize_polygon({0, 0, 1, 1, 1}, 4, 4), Error);
  m = rasterize_polygon({-1, -1, 3, -1, 3, 2, -1, 2}, 4, 4);
  EXPECT_EQ(m, (std::vector<uint8_t>{1, 1, 1, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
}

TEST(Polygon, PixelCountTracksShoelaceArea) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int trial = 0; trial < 20; ++trial) {
    // A random star-shaped polygon around the centre of a 120×160 image.
    std::vector<double> xy;
    const int n = 5 + trial;
    for (int i = 0; i < n; ++i) {
      const double t = 2 * M_PI * (i + 0.8 * u(rng)) / n, r = 20 + 35 * u(rng);
      xy.push_back(80 + r * std::cos(t));
      xy.push_back(60 + r * std::sin(t));
    }
    double area = 0, perimeter = 0;
    for (int i = 0; i < n; ++i) {
      const int j = (i + 1) % n;
      area += xy[2 * i] * xy[2 * j + 1] - xy[2 * j] * xy[2 * i + 1];
      perimeter += std::hypot(xy[2 * j] - xy[2 * i], xy[2 * j + 1] - xy[2 * i + 1]);
    }
    area = std::abs(area) / 2;
    double count = 0;
    for (uint8_t v : rasterize_polygon(xy, 120, 160)) count += v;
    // Centre sampling errs by at most about half a pixel along the boundary.
    EXPECT_NEAR(count, area, 0.5 * perimeter + 4) << "trial " << trial;
  }
}

// A small valid file; tests below break one field at a time.
std::string valid_json() {
  return R"({"images": [{"id": 7, "file_name": "a/img1.jpg", "width": 5, "height": 4}],
             "categories": [{"id": 0, "name": "_background_"}, {"id": 3, "name": "cat"}, {"id": 9, "name": "dog"}],
             "annotations": [
               {"id": 1, "image_id": 7, "category_id": 3, "segmentation": [[0, 0, 2, 0, 2, 2, 0, 2]], "iscrowd": 0},
               {"id": 2, "image_id": 7, "category_id": 9, "segmentation": {"size": [4, 5], "counts": [16, 4]}},
               {"id": 3, "image_id": 7, "category_id": 9, "iscrowd": 1,
                "segmentation": {"size": [4, 5], "counts": "04`0"}}]})";
}

TEST(Coco, ParsesAndPaintsInFileOrder) {
  const CocoDataset ds = parse_coco(valid_json(), "ann.json");
  ASSERT_EQ(ds.images.size(), 1u);
  ASSERT_EQ(ds.annotations.size(), 3u);
  EXPECT_EQ(ds.find_by_stem("img1"), &ds.images[0]);
  EXPECT_EQ(ds.find_by_stem("img2"), nullptr);
  const LabelMap m = coco_label_map(ds, ds.images[0]);
  // cat: the 2×2 top-left square; dog (plain RLE): the last column (column-major pixels 16..19);
  // crowd (string RLE "04`0": runs 0, 4, 16 — '`' = 48 + 16 + 32 starts a two-group 16): the
  // first column.
  const std::vector<int32_t> expect = {-1, 3, 0, 0, 9,  //
                                       -1, 3, 0, 0, 9,  //
                                       -1, 0, 0, 0, 9,  //
                                       -1, 0, 0, 0, 9};
  EXPECT_EQ(m.ids, expect);
}

void expect_coco_error(const std::string& from, const std::string& to, const std::string& field) {
  std::string text = valid_json();
  const size_t at = text.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  text.replace(at, from.size(), to);
  try {
    parse_coco(text, "ann.json");
    ADD_FAILURE() << "no error after replacing '" << from << "' by '" << to << "'";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("ann.json"), std::string::npos) << m;
    EXPECT_NE(m.find(field), std::string::npos) << "expected '" << field << "' in: " << m;
  }
}

TEST(Coco, MalformedFilesNameTheField) {
  expect_coco_error("{\"images\"", "[{\"images\"", "JSON");
  expect_coco_error("\"images\"", "\"imgs\"", "images");
  expect_coco_error("\"width\": 5", "\"width\": 0", "images[0]");
  expect_coco_error("\"width\": 5", "\"width\": 5.5", "images[0].width");
  expect_coco_error("\"id\": 7,", "\"id\": \"7\",", "images[0].id");
  expect_coco_error("\"file_name\": \"a/img1.jpg\"", "\"file_name\": 3", "images[0].file_name");
  expect_coco_error("{\"id\": 3, \"name\": \"cat\"}", "{\"id\": 0, \"name\": \"cat\"}", "categories[1].id");
  expect_coco_error("\"image_id\": 7, \"category_id\": 3", "\"image_id\": 8, \"category_id\": 3",
                    "annotations[0].image_id");
  expect_coco_error("\"category_id\": 3", "\"category_id\": 4", "annotations[0].category_id");
  expect_coco_error("[[0, 0, 2, 0, 2, 2, 0, 2]]", "[[0, 0, 2, 0, 2, 2, 0]]", "annotations[0].segmentation[0]");
  expect_coco_error("[[0, 0, 2, 0, 2, 2, 0, 2]]", "[[0, 0, 2, 0]]", "annotations[0].segmentation[0]");
  expect_coco_error("[[0, 0, 2, 0, 2, 2, 0, 2]]", "[[0, 0, 2, 0, 2, 2, 0, 7]]", "annotations[0].segmentation[0][7]");
  expect_coco_error("[[0, 0, 2, 0, 2, 2, 0, 2]]", "[[0, 0, 2, \"x\", 2, 2, 0, 2]]", "segmentation[0][3]");
  expect_coco_error("[[0, 0, 2, 0, 2, 2, 0, 2]]", "[0, 0, 2, 0, 2, 2, 0, 2]", "annotations[0].segmentation[0]");
  expect_coco_error("\"iscrowd\": 0", "\"iscrowd\": 2", "annotations[0].iscrowd");
  expect_coco_error("\"iscrowd\": 0", "\"iscrowd\": 0, \"area\": \"big\"", "annotations[0].area");
  expect_coco_error("\"size\": [4, 5], \"counts\": [16, 4]", "\"size\": [5, 4], \"counts\": [16, 4]",
                    "annotations[1].segmentation.size");
  expect_coco_error("\"counts\": [16, 4]", "\"counts\": [16, 3]", "annotations[1].segmentation.counts");
  expect_coco_error("\"counts\": [16, 4]", "\"counts\": [16, -4]", "annotations[1].segmentation.counts[1]");
  expect_coco_error("\"counts\": [16, 4]", "\"counts\": 20", "annotations[1].segmentation.counts");
  expect_coco_error("\"counts\": \"04`0\"", "\"counts\": \"04`1\"", "annotations[2].segmentation.counts");
  expect_coco_error("\"counts\": \"04`0\"", "\"counts\": \"04 0\"", "annotations[2].segmentation.counts");
  expect_coco_error("\"segmentation\": [[0", "\"segmentation\": 5, \"x\": [[0", "annotations[0].segmentation");
  EXPECT_THROW(read_coco("/nonexistent/ann.json"), Error);
}

// Random character mutations of a valid file and of RLE strings: parsed or ariadne::Error, never a
// crash; whatever parses also paints a label map of the image's size.
TEST(Coco, MutatedFilesParseOrThrow) {
  const std::string good = valid_json();
  const std::string alphabet = "0123456789-.,:[]{}\" eE";
  std::mt19937 rng(4);
  int errors = 0;
  for (int trial = 0; trial < 1500; ++trial) {
    std::string t = good;
    for (int e = 0; e < 1 + int(rng() % 3); ++e) t[rng() % t.size()] = alphabet[rng() % alphabet.size()];
    try {
      const CocoDataset ds = parse_coco(t, "m.json");
      for (const CocoImage& im : ds.images) EXPECT_EQ(coco_label_map(ds, im).ids.size(), size_t(im.width * im.height));
    } catch (const Error&) {
      ++errors;
    }
  }
  EXPECT_GT(errors, 300);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string s;
    for (int i = 0; i < 1 + int(rng() % 12); ++i) s.push_back(char(40 + rng() % 90));
    try {
      const std::vector<uint32_t> c = rle_from_string(s, "t");
      EXPECT_EQ(rle_from_string(rle_to_string(c), "t"), c);
    } catch (const Error&) {
    }
  }
}

// labelme drew the VOC class PNGs and wrote annotations.json from the same polygons: the label
// maps must agree on nearly every pixel (the two rasterization rules differ only along edges), and
// each annotation's pixel count must be close to the area labelme stored.
TEST(Coco, SampleAnnotationsMatchTheVocMasks) {
  const fs::path json = kSamples / "data_dataset_coco" / "annotations.json";
  ASSERT_TRUE(fs::exists(json)) << json << " is missing: install labelme-examples (scripts/setup)";
  const CocoDataset ds = read_coco(json.string());
  ASSERT_EQ(ds.images.size(), 3u);
  EXPECT_EQ(ds.annotations.size(), 12u);
  for (const CocoImage& im : ds.images) {
    const std::string stem = fs::path(im.file_name).stem().string();
    const LabelMap coco = coco_label_map(ds, im);
    const LabelMap voc = read_label_map((kSamples / "data_dataset_voc" / "SegmentationClassPNG" / (stem + ".png")).string());
    ASSERT_EQ(voc.height, im.height);
    ASSERT_EQ(voc.width, im.width);
    // Pixels labelme marked "__ignore__" (VOC void, 255) are not exported to COCO at all.
    int64_t same = 0, compared = 0, fg_voc = 0;
    for (size_t p = 0; p < coco.ids.size(); ++p) {
      if (voc.ids[p] == 255) continue;
      ++compared;
      same += coco.ids[p] == voc.ids[p];
      fg_voc += voc.ids[p] != 0;
    }
    EXPECT_GT(fg_voc, 1000) << stem;
    EXPECT_GT(double(same) / double(compared), 0.98) << stem;
  }
  for (const CocoAnnotation& a : ds.annotations) {
    const CocoImage& im = *std::find_if(ds.images.begin(), ds.images.end(), [&](const CocoImage& i) { return i.id == a.image_id; });
    std::vector<uint8_t> u(size_t(im.height * im.width), 0);
    for (const auto& ring : a.polygons) {
      const auto r = rasterize_polygon(ring, im.height, im.width);
      for (size_t p = 0; p < u.size(); ++p) u[p] |= r[p];
    }
    double count = 0, perimeter = 0;
    for (uint8_t v : u) count += v;
    for (const auto& ring : a.polygons)
      for (size_t i = 0; i < ring.size(); i += 2) {
        const size_t j = (i + 2) % ring.size();
        perimeter += std::hypot(ring[j] - ring[i], ring[j + 1] - ring[i + 1]);
      }
    // labelme's masks also take every pixel its polygon outline touches, about half a pixel more
    // along the boundary than centre sampling.
    ASSERT_GT(a.area, 0) << "annotation " << a.id;
    EXPECT_LE(count, a.area + 4) << "annotation " << a.id;
    EXPECT_GE(count, a.area - 0.5 * perimeter - 4) << "annotation " << a.id;
  }
}

}  // namespace
