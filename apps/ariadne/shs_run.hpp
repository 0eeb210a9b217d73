// One SHS-Index run over a set of images (shared by `ariadne shs` and the demo): masks from a
// folder or a COCO file, attention from the encoder or from q/k dumps, outputs in a folder.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ariadne/mask.hpp"
#include "ariadne/shs.hpp"
#include "ariadne/vit.hpp"

namespace ariadne::cli {

struct ShsJob {
  std::vector<std::string> images;  // image files (PNG / JPEG); masks and dumps are found by stem
  bool video = false;  // the images are the frames of one clip, in time order (encoder source only)
  std::string masks_dir;            // <stem>.png or <stem>.npy label maps, or:
  std::string coco_file;            // COCO annotations (images matched by file-name stem)
  ForegroundRule rule;
  double purity = 1.0;

  // Source (a): the encoder. weights must stay alive during the run.
  const VitWeights* weights = nullptr;
  Schedule schedule;  // encoder: vit_schedule(); dumps: per-layer patterns (empty: all full)
  PreprocessOptions preprocess;
  EncodeOptions encode;

  // Source (b): q/k dumps: qk_dir/<stem>/{q,k}_<layer>.npy ([heads, tokens, dim], f32 or f16) and
  // optional sink_<layer>.npy ([heads]); qk_dir itself when there is one image and no sub-folder.
  std::string qk_dir;
  Grid grid;
  OrderKind order = OrderKind::block_row;
  int merge = 2, window_units = 4;
  SinkMode sink_mode = SinkMode::denominator;  // for layers with a sink file

  Backend diag_backend = Backend::automatic;  // backend of the diagnostic attention passes
  std::string out_dir;  // empty: no files
  int cell = 8;         // heatmap pixels per patch
  int max_heatmap_layers = 1 << 30;  // heatmaps for at most this many layers (evenly spread)
};

struct ShsRunResult {
  ShsSummary summary;
  nlohmann::json json;            // summary + source, schedule, per-image records, files written
  std::vector<std::string> files;  // written files (relative to out_dir)
};

// One image's inputs, found and checked before the run.
struct ShsImageInput {
  std::string path, stem;
  std::string mask_file;     // --masks: <stem>.png or <stem>.npy
  int64_t coco_entry = -1;   // --coco: its index in ShsInputs::coco.images (CocoDataset::find_image)
  std::string qk_dir;        // --qk: the folder of its dumps
};
struct ShsInputs {
  CocoDataset coco;  // the parsed --coco file (empty with --masks)
  std::vector<ShsImageInput> images;
};

// Every input of every image of `job` (its images, masks_dir or coco_file, and qk_dir; not the
// weights), checked before the encoder runs or any file is written, so that a bad second image
// cannot leave the first one's outputs behind: stems are unique (masks, dumps and outputs are
// found by stem), each image decodes, its mask exists and has the image's size, its dump folder
// has q_0.npy and k_0.npy. Throws ariadne::Error naming the file.
ShsInputs check_shs_inputs(const ShsJob& job);

// Runs the job on checked inputs. The outputs are written as each image finishes; a failure after
// some were written names them in its message (rethrow_naming_outputs, cli.hpp).
ShsRunResult run_shs(const ShsJob& job, const ShsInputs& inputs, std::ostream* log);
// check_shs_inputs, then the run.
ShsRunResult run_shs(const ShsJob& job, std::ostream* log);

}  // namespace ariadne::cli
