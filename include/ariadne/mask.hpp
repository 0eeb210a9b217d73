// ariadne/mask.hpp — segmentation masks: label maps from PNG / .npy files and from COCO annotation
// JSON (polygons and run-length encodings), for the SHS-Index's foreground / background labels.
//
// A label map is one int32 id per pixel, [height, width] row-major. What the ids mean is up to the
// source: PASCAL VOC class PNGs hold class indices (0 background, 255 "void" along object borders),
// instance PNGs hold instance indices, COCO label maps (coco_label_map) hold category ids.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ariadne {

struct LabelMap {
  int height = 0, width = 0;
  std::vector<int32_t> ids;  // [height, width] row-major
  int32_t at(int y, int x) const { return ids[size_t(y) * size_t(width) + size_t(x)]; }
};

// Id written by coco_label_map for crowd regions (iscrowd = 1): neither object nor background.
constexpr int32_t kCrowdLabel = -1;

// A mask file: PNG (palette index or gray value per pixel at full depth, 16-bit gray included, via
// image.hpp's read_png_values) or
// .npy (2-D integer or bool array [height, width]). Told apart by content, not by name.
LabelMap read_label_map(const std::string& path);

// Nearest-neighbour resize (labels must not be blended): output pixel (y, x) takes input pixel
// (floor((y + ½)·H/h), floor((x + ½)·W/w)), the pixel whose area contains the output pixel's
// centre (PIL's NEAREST uses the same rule).
LabelMap resize_nearest(const LabelMap& m, int height, int width);

// ---- COCO ----
// Run-length encoding of a binary mask as COCO stores it: alternating run lengths of 0s and 1s,
// starting with 0s, over the pixels in COLUMN-major order (x outer, y inner); the runs sum to h·w.
struct CocoRle {
  int height = 0, width = 0;
  std::vector<uint32_t> counts;
};

struct CocoImage {
  int64_t id = 0;
  std::string file_name;
  int width = 0, height = 0;
};
struct CocoCategory {
  int64_t id = 0;
  std::string name;
};
struct CocoAnnotation {
  int64_t id = 0, image_id = 0, category_id = 0;
  bool iscrowd = false;
  double area = -1;  // the file's "area" field (pixels, as the writer counted them); −1 when absent
  std::vector<std::vector<double>> polygons;  // each [x0, y0, x1, y1, ...], pixel coordinates
  bool has_rle = false;                       // else the polygons describe the region
  CocoRle rle;
};
struct CocoDataset {
  std::string path;
  std::vector<CocoImage> images;
  std::vector<CocoCategory> categories;
  std::vector<CocoAnnotation> annotations;  // file order (later ones paint over earlier ones)

  // The image whose file_name has this base name without extension ("2011_000003" matches
  // "JPEGImages/2011_000003.jpg"); nullptr when none does. Two entries with that stem
  // ("a/x.jpg", "b/x.png") throw naming both: the image cannot be bound to one of them.
  const CocoImage* find_by_stem(const std::string& stem) const;
  // The entry of an image file: file_name equal to `image_path`, else the one entry with the same
  // base name ("x.jpg"), else find_by_stem of its stem. Throws naming both entries when two match
  // at the first step that finds any; nullptr when none does.
  const CocoImage* find_image(const std::string& image_path) const;
};

// Reads and validates a COCO annotation file: "images" (unique integer ids, file names, positive
// sizes), "categories" (unique ids) and "annotations" (existing image and category ids; polygons
// with an even number ≥ 6 of finite coordinates within one pixel of the image; RLEs whose size
// matches the image and whose counts sum to h·w). Errors name the file and the JSON path of the
// bad field ("ann.json: annotations[4].segmentation.counts: runs sum to 1200, expected 1250").
CocoDataset read_coco(const std::string& path);
CocoDataset parse_coco(const std::string& json_text, const std::string& name);

// COCO's compressed RLE string (the "counts" string of the COCO API): each count is written in
// 5-bit groups, least significant first, as characters 48 + group (+ 32 when more groups follow,
// bit 4 of the last group being the sign); counts after the second are stored as differences from
// the count two places before. Throws naming `what` for characters outside '0'…'o', a string that
// ends inside a count, or a negative run.
std::vector<uint32_t> rle_from_string(const std::string& s, const std::string& what);
std::string rle_to_string(const std::vector<uint32_t>& counts);

// Binary mask [height, width] row-major (1 = inside) from an RLE, and back.
std::vector<uint8_t> rle_decode(const CocoRle& rle, const std::string& what);
CocoRle rle_encode(const std::vector<uint8_t>& mask, int height, int width);

// Polygon rasterization rule: pixel (x, y) covers the square [x, x+1) × [y, y+1) and is inside
// when its centre (x + ½, y + ½) is inside the polygon by the even-odd rule (a centre exactly on a
// left edge counts as inside, on a right edge as outside, so polygons sharing an edge never both
// take a pixel). Several rings of one annotation are separate parts (their union), as in COCO.
// xy: [x0, y0, x1, y1, ...]; returns [height, width] row-major 0/1.
std::vector<uint8_t> rasterize_polygon(const std::vector<double>& xy, int height, int width);

// Label map of one image: every annotation of the image painted in file order with its
// category_id (crowd annotations with kCrowdLabel); unannotated pixels are 0. A category with id 0
// (labelme's "_background_") therefore reads as background.
LabelMap coco_label_map(const CocoDataset& coco, const CocoImage& image);

}  // namespace ariadne
