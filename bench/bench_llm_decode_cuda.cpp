// Whole decode steps of a Llama on the GPU (issue 32): each step one CUDA graph replay
// (DecodeOptions::graph) against the same step kernel by kernel, dense and with the rr page
// selection, in the same run. The model has random weights at a named shape
// (src/workloads/random_llama.hpp: the sizes of SmolLM2-135M and others), so no checkpoint is needed;
// the step's work depends on the shape and the context, not on the values.
//
// Per (shape, context): a prompt of random token ids prefilled densely to `context` tokens, then
// `steps` decode steps fed random token ids, timed one by one on the host around
// LlamaModel::decode (the embedding upload, every layer, the logits copied back). Graph runs count
// their captures (one per page the context reaches, and the first step). Prints one JSON list on
// stdout, progress on stderr:
//   ms_{graph,eager}_{dense,rr}  median step (mean_* the mean, captures included)
//   graph_speedup_{dense,rr}     eager / graph medians; rr_density: kept / visible pages
//
//   bench_llm_decode_cuda [--shapes smollm2-135m] [--contexts 1024,8192,32768] [--steps 64] [--tau 0.9]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ariadne/device.hpp"
#include "ariadne/error.hpp"
#include "ariadne/gguf.hpp"
#include "ariadne/llm.hpp"
#include "workloads/random_llama.hpp"

namespace {

using namespace ariadne;

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (const double x : v) s += x;
  return v.empty() ? 0 : s / double(v.size());
}

struct Run {
  std::vector<double> ms;
  int64_t captures = 0, kept = 0, visible = 0;
};

// Prefill `prompt`, then one decode step per token of `feed`, each timed on the host.
Run decode_run(LlamaModel& m, const DecodeOptions& o, const std::vector<int32_t>& prompt,
               const std::vector<int32_t>& feed) {
  m.set_decode(o);
  PrefillOptions po;
  po.method.dense = true;
  m.prefill(prompt, po);
  const int64_t captured = m.graph_captures();
  Run r;
  for (const int32_t t : feed) {
    const auto t0 = std::chrono::steady_clock::now();
    m.decode(t);
    r.ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  r.captures = m.graph_captures() - captured;
  if (o.sparse) {  // one more step with its trace: the pages the selection keeps
    DecodeStepTrace st;
    m.decode(feed.front(), &st);
    r.kept = st.pages_kept;
    r.visible = st.pages_visible;
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> shapes = {"smollm2-135m"};
  std::vector<int64_t> contexts = {1024, 8192, 32768};
  int steps = 64;
  double tau = 0.9;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string o = argv[i], v = argv[i + 1];
    if (o == "--shapes") shapes = split(v);
    else if (o == "--contexts") {
      contexts.clear();
      for (const std::string& c : split(v)) contexts.push_back(std::stoll(c));
    } else if (o == "--steps") steps = std::stoi(v);
    else if (o == "--tau") tau = std::stod(v);
    else {
      std::fprintf(stderr, "bench_llm_decode_cuda: unknown option %s\n", o.c_str());
      return 2;
    }
  }
  if (!cuda_available()) {
    std::printf("[]\n");
    std::fprintf(stderr, "bench_llm_decode_cuda: no CUDA device\n");
    return 0;
  }
  nlohmann::json rows = nlohmann::json::array();
  try {
    for (const std::string& name : shapes) {
      const LlamaShape shape = llama_shape(name);
      const std::vector<uint8_t> bytes = random_llama_gguf(shape, 1);
      LlamaModel m = LlamaModel::from_gguf(GgufFile::parse(bytes.data(), bytes.size(), name + ".gguf"));
      m.set_backend(Backend::cuda);
      std::mt19937_64 rng(7);
      const auto tokens = [&](int64_t n) {
        std::vector<int32_t> t(static_cast<size_t>(n));
        for (int32_t& x : t) x = int32_t(rng() % uint64_t(shape.vocab));
        return t;
      };
      for (const int64_t N : contexts) {
        std::fprintf(stderr, "%s context %lld\n", name.c_str(), static_cast<long long>(N));
        const std::vector<int32_t> prompt = tokens(N), feed = tokens(steps);
        nlohmann::json row = {{"shape", name}, {"context", N}, {"steps", steps}, {"tau", tau}};
        for (const bool sparse : {false, true}) {
          const std::string kind = sparse ? "rr" : "dense";
          DecodeOptions o;
          o.sparse = sparse;
          o.select.scorer = PageScorer::rr;
          o.select.tau = tau;
          decode_run(m, o, prompt, feed);  // warm-up: cuBLASLt plans, first captures, pools
          const Run graph = decode_run(m, o, prompt, feed);
          o.graph = false;
          const Run eager = decode_run(m, o, prompt, feed);
          row["ms_graph_" + kind] = median(graph.ms);
          row["ms_eager_" + kind] = median(eager.ms);
          row["mean_graph_" + kind] = mean(graph.ms);
          row["mean_eager_" + kind] = mean(eager.ms);
          row["graph_speedup_" + kind] = median(eager.ms) / median(graph.ms);
          row["captures_" + kind] = graph.captures;
          if (sparse) row["rr_density"] = graph.visible ? double(graph.kept) / double(graph.visible) : 1.0;
        }
        std::fprintf(stderr, "  %s\n", row.dump().c_str());
        rows.push_back(row);
      }
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_llm_decode_cuda: %s\n", e.what());
    return 1;
  }
  std::printf("%s\n", rows.dump(1).c_str());
  return 0;
}
