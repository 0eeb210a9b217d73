// Shared by `ariadne llm` (the model run: a prompt, or retrieval tasks under prefill methods) and
// `ariadne llm-probe` (the same task runs plus probes, per-layer comparisons, τ sweeps, dumps, and
// the estimators on dumped heads): the method grid, the task loop and its summary.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ariadne/estimate.hpp"
#include "ariadne/gguf.hpp"
#include "ariadne/llm.hpp"
#include "ariadne/tokenizer.hpp"
#include "cli.hpp"

namespace ariadne::cli {

struct MethodSpec {
  std::string name;  // "dense" or an estimator
  double tau = 1;
  int stride = 0;
  RROffset offset = RROffset::paper;  // rr only
  std::string protect = "published";  // protect.hpp syntax
  RRSchedule schedule = RRSchedule::head;  // rr only
  std::string decode = "dense";  // decode steps: dense, or the page scorer of sparse decode
  double decode_tau = 1;
  std::string label() const;
};

// RR's sampling variants of --offset x --rr-schedule for estimator `method` (every pair for rr; the
// defaults alone for the others, which sample nothing).
std::vector<std::pair<RROffset, RRSchedule>> rr_variants(const Args& a, const std::string& method);

EstimateConfig estimate_config(const MethodSpec& m, int32_t block);
nlohmann::json breakdown_json(const MaskBreakdown& b);

// The options both commands declare: model, backend, tasks and the method grid.
OptionTable llm_task_options();

// The generation runs of the method grid (--method x --offset x --tau x --stride x --protect, each
// with every decode of --decode x --decode-tau), dense prefill with dense decode first (the anchor
// of every accuracy ratio).
std::vector<MethodSpec> run_methods(const Args& a);

// The decode options of a run: --page-size, --sink-pages, --recent-pages, --decode-rotate and
// --decode-compare with the spec's decode method and τ.
DecodeOptions decode_options(const Args& a, const MethodSpec& m);

// One task loop: every task x tokens x seed x depth instance through every method.
struct TaskLoop {
  std::vector<MethodSpec> methods;
  bool accuracy = true;             // false: the dense runs only (probes need no sparse run)
  bool compare = false;             // per layer of each sparse run: oracle metrics, error vs dense
  bool per_layer = false;           // per-layer and per-head rows in the JSON
  std::vector<MethodSpec> probe_specs;  // measured on each dense run's q/k
  bool probe_outputs = false;
  std::vector<double> probe_tau_sweep;
  std::string dump_dir;             // q/k/v .npy of the first dense run
};

struct LoadedModel {
  std::string path;
  std::unique_ptr<GgufFile> file;  // kept open while the model lives
  BpeTokenizer tok;
  std::unique_ptr<LlamaModel> model;
  Backend backend = Backend::automatic;
  nlohmann::json json;  // the "model" record of the output
};

// Loads the model of --gguf (or llm_model_path()), sets threads and the backend. Every other
// option must have been checked before this is called: loading is the first expensive step.
LoadedModel load_model(const Args& a);

// Checks the task instances against the model (lengths within its context, prompts that fit) before
// any run; then runs them and prints the JSON document or the table.
int run_task_loop(const Args& a, LoadedModel& m, const TaskLoop& loop);

}  // namespace ariadne::cli
