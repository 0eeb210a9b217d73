// ariadne llm — runs a Llama-architecture GGUF model (SmolLM2-135M) with block-sparse prefill and
// scores retrieval tasks; or prints the top logits / a greedy continuation of a prompt.
//
//   ariadne llm --gguf FILE --task passkey --tokens 4096 --method rr --json
//   ariadne llm --gguf FILE --task passkey,niah --tokens 1024,2048 --method dense,rr,xattn
//               --tau 0.9,0.95 --stride 8,16 --seeds 4 --depths 0.1,0.5,0.9 --compare --json
//   ariadne llm --gguf FILE --prompt "The capital of France is" --new 8
//
// Options: --block B (128), --offset paper|released, --new N (tokens generated, 8), --compare
// (per layer: oracle metrics and output error vs dense; ~3x the attention work), --layers (print the
// per-layer rows too), --dump DIR (q/k .npy of the first task's dense run), --backend cpu|reference,
// --threads N. Without --gguf the model is looked up as llm_model_path() says (llm.hpp).
// Every run of a task instance under dense is the anchor of its accuracy ratio.
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <map>

#include "ariadne/gguf.hpp"
#include "ariadne/llm.hpp"
#include "ariadne/llm_tasks.hpp"
#include "ariadne/tokenizer.hpp"
#include "cli.hpp"

namespace {

using namespace ariadne;
using nlohmann::json;

struct MethodSpec {
  std::string name;  // "dense" or an estimator
  double tau = 1;
  int stride = 0;
  std::string label() const {
    if (name == "dense") return "dense";
    std::ostringstream os;
    os << name << " tau=" << tau << " S=" << stride;
    return os.str();
  }
};

struct Agg {
  int runs = 0, correct = 0, dense_correct_both = 0;
  double density = 0, mass_recall = 0, f1 = 0, err = 0, ms = 0;
  std::vector<double> layer_recall, layer_f1, layer_err, layer_density;
};

json layer_json(const LayerTrace& t) {
  return json{{"density", t.density}, {"mass_recall", t.mass_recall}, {"precision", t.precision},
              {"recall", t.recall}, {"f1", t.f1}, {"out_rel_err", t.out_rel_err},
              {"mass_recall_per_head", t.mass_recall_per_head}, {"f1_per_head", t.f1_per_head},
              {"ms_estimate", t.ms_estimate}, {"ms_attention", t.ms_attention}};
}

int run_llm(const cli::Args& args) {
  std::string path = args.str("gguf", "");
  if (path.empty()) path = llm_model_path();
  ARIADNE_CHECK(!path.empty(), "llm: no --gguf given and no model found (", llm_model_hint(), ")");
  if (args.has("threads")) set_cpu_threads(int(args.integer("threads", 2)));
  const GgufFile file = GgufFile::open(path);
  const BpeTokenizer tok = BpeTokenizer::from_gguf(file);
  LlamaModel model = LlamaModel::from_gguf(file);
  const LlamaConfig& c = model.config();
  const int n_new = int(args.integer("new", 8));
  const int32_t block = int32_t(args.integer("block", 128));
  const RROffset offset = parse_rr_offset(args.str("offset", "paper"));
  const Backend backend = args.has("backend") ? parse_backend(args.str("backend", "auto")) : Backend::automatic;
  const json model_json = {{"file", path}, {"layers", c.layers}, {"dim", c.dim}, {"heads", c.heads},
                           {"kv_heads", c.kv_heads}, {"head_dim", c.head_dim}, {"vocab", c.vocab},
                           {"context", c.context}, {"rope_base", c.rope_base}, {"tied", c.tied}};

  if (args.has("prompt")) {
    const std::vector<int32_t> ids = tok.encode(args.str("prompt", ""));
    PrefillOptions po;
    po.method.dense = true;
    po.method.attention_backend = backend;
    const std::vector<int32_t> gen = model.generate(ids, n_new, po, nullptr, tok.eos());
    args.reject_unused();
    if (args.json()) {
      cli::print_json({{"model", model_json}, {"prompt_ids", ids}, {"generated_ids", gen},
                       {"generated", tok.decode(gen)}});
    } else {
      std::cout << tok.decode(gen) << "\n";
    }
    return 0;
  }

  std::vector<MethodSpec> methods;
  const auto taus = args.list("tau", "0.95");
  const auto strides = args.list("stride", "8");
  for (const std::string& m : args.list("method", "rr")) {
    if (m == "dense") {
      methods.push_back({"dense", 1, 0});
      continue;
    }
    parse_estimator(m);  // validates the name
    for (const std::string& t : taus)
      for (const std::string& s : strides) methods.push_back({m, std::stod(t), std::stoi(s)});
  }
  // The anchor runs first so each instance has its dense answer.
  if (methods.front().name != "dense") methods.insert(methods.begin(), MethodSpec{"dense", 1, 0});
  const auto tasks = args.list("task", "passkey");
  const auto lengths = args.list("tokens", "4096");
  const auto depths = args.list("depths", "0.1,0.5,0.9");
  const int seeds = int(args.integer("seeds", 1));
  const int seed0 = int(args.integer("seed", 1));
  const bool compare = args.flag("compare");
  const bool layers = args.flag("layers");
  const std::string dump = args.str("dump", "");
  args.reject_unused();

  json runs = json::array();
  std::map<std::string, Agg> agg;  // key: task/tokens/method label
  bool dumped = false;
  for (const std::string& kind : tasks)
    for (const std::string& len : lengths)
      for (int s = 0; s < seeds; ++s)
        for (const std::string& dep : depths) {
          const RetrievalTask task = make_retrieval_task(kind, tok, std::stoll(len), std::stod(dep), uint64_t(seed0 + s));
          const std::vector<int32_t> ids = tok.encode(task.prompt, false);
          bool dense_ok = false;
          for (const MethodSpec& m : methods) {
            PrefillOptions po;
            po.method.dense = m.name == "dense";
            po.method.attention_backend = backend;
            po.compare = compare;
            if (!po.method.dense) {
              po.method.estimate.method = parse_estimator(m.name);
              po.method.estimate.tau = m.tau;
              po.method.estimate.stride = m.stride;
              po.method.estimate.block = block;
              po.method.estimate.offset = offset;
            }
            if (po.method.dense && !dump.empty() && !dumped) {
              po.dump_dir = dump;
              dumped = true;
            }
            PrefillTrace tr;
            const std::vector<int32_t> gen = model.generate(ids, n_new, po, &tr, tok.eos());
            const std::string text = tok.decode(gen);
            const bool ok = retrieval_correct(text, task.answer);
            if (po.method.dense) dense_ok = ok;
            json run = {{"task", kind}, {"tokens", task.tokens}, {"depth", task.depth}, {"seed", task.seed},
                        {"method", m.name}, {"tau", m.tau}, {"stride", m.stride}, {"answer", task.answer},
                        {"generated", text}, {"correct", ok}, {"density", tr.density},
                        {"ms_prefill", tr.ms_total}, {"ms_attention", tr.ms_attention},
                        {"ms_estimate", tr.ms_estimate}};
            Agg& a = agg[kind + "/" + len + "/" + m.label()];
            a.runs++;
            a.correct += ok;
            a.dense_correct_both += ok && dense_ok;
            a.density += tr.density;
            a.ms += tr.ms_total;
            if (compare) {
              json lj = json::array();
              double r = 0, f = 0, e = 0;
              const size_t L = tr.layers.size();
              a.layer_recall.resize(L), a.layer_f1.resize(L), a.layer_err.resize(L), a.layer_density.resize(L);
              for (size_t l = 0; l < L; ++l) {
                const LayerTrace& t = tr.layers[l];
                r += t.mass_recall, f += t.f1, e += t.out_rel_err;
                a.layer_recall[l] += t.mass_recall, a.layer_f1[l] += t.f1, a.layer_err[l] += t.out_rel_err;
                a.layer_density[l] += t.density;
                lj.push_back(layer_json(t));
              }
              run["mass_recall"] = r / double(L);
              run["f1"] = f / double(L);
              run["out_rel_err"] = e / double(L);
              a.mass_recall += r / double(L), a.f1 += f / double(L), a.err += e / double(L);
              if (layers) run["layers"] = lj;
            }
            if (!args.json())
              std::cerr << kind << " " << task.tokens << " tok depth " << task.depth << " seed " << task.seed << " "
                        << m.label() << ": '" << text << "' " << (ok ? "ok" : "WRONG") << " density "
                        << std::setprecision(3) << tr.density << " " << std::setprecision(5) << tr.ms_total / 1000
                        << " s\n";
            runs.push_back(std::move(run));
          }
        }

  json summary = json::array();
  for (const auto& [key, a] : agg) {
    const std::string dense_key = key.substr(0, key.rfind('/')) + "/dense";
    const Agg& d = agg.at(dense_key);
    json s = {{"case", key}, {"runs", a.runs}, {"accuracy", double(a.correct) / a.runs},
              {"dense_accuracy", double(d.correct) / d.runs},
              {"accuracy_vs_dense", d.correct ? double(a.correct) / d.correct : 0.0},
              {"density", a.density / a.runs}, {"s_prefill", a.ms / a.runs / 1000}};
    if (compare) {
      s["mass_recall"] = a.mass_recall / a.runs;
      s["f1"] = a.f1 / a.runs;
      s["out_rel_err"] = a.err / a.runs;
      json pl = json::array();
      for (size_t l = 0; l < a.layer_recall.size(); ++l)
        pl.push_back({{"layer", l}, {"density", a.layer_density[l] / a.runs},
                      {"mass_recall", a.layer_recall[l] / a.runs}, {"f1", a.layer_f1[l] / a.runs},
                      {"out_rel_err", a.layer_err[l] / a.runs}});
      s["per_layer"] = pl;
    }
    summary.push_back(s);
  }
  if (args.json()) {
    cli::print_json({{"model", model_json}, {"block", block}, {"offset", rr_offset_name(offset)},
                     {"new_tokens", n_new}, {"summary", summary}, {"runs", runs}});
  } else {
    std::cout << "| case | runs | accuracy | vs dense | density | mass recall | block F1 | out err | s/prefill |\n"
              << "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
    for (const json& s : summary)
      std::cout << "| " << s["case"].get<std::string>() << " | " << s["runs"] << " | " << s["accuracy"] << " | "
                << s["accuracy_vs_dense"] << " | " << s["density"] << " | " << s.value("mass_recall", 0.0) << " | "
                << s.value("f1", 0.0) << " | " << s.value("out_rel_err", 0.0) << " | " << s["s_prefill"] << " |\n";
  }
  return 0;
}

const cli::Command reg{"llm", "run a Llama GGUF model (SmolLM2) with block-sparse prefill on retrieval tasks", run_llm};

}  // namespace
