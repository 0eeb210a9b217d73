// ariadne llm — runs a Llama-architecture GGUF model (SmolLM2-135M): a greedy continuation of a
// prompt, or retrieval tasks prefilled under each method of a grid and scored against dense.
//
//   ariadne llm --gguf FILE --prompt "The capital of France is" --new 8
//   ariadne llm --gguf FILE --task passkey --tokens 4096 --method rr --json
//   ariadne llm --gguf FILE --task passkey --tokens 4096 --method dense,rr --decode dense,rr,quest
//               --decode-tau 0.8,0.9 --decode-compare --json      (sparse decode after each prefill)
//   ariadne llm --gguf FILE --task passkey,niah --tokens 1024,2048 --method dense,rr,xattn
//               --tau 0.9,0.95 --stride 8,16 --seeds 4 --depth 0.1,0.5,0.9 --json
//
// Probes, per-layer comparisons, τ sweeps, q/k dumps and the estimators on dumped heads are
// `ariadne llm-probe` (cmd_llm_probe.cpp). Every run of a task instance under dense is the anchor of
// its accuracy ratio.
#include <iostream>

#include "llm_common.hpp"

namespace ariadne::cli {
namespace {

int run_llm(const Args& a) {
  if (a.given("prompt")) {
    for (const char* o : {"task", "tokens", "depth", "seeds", "seed", "method", "tau", "stride", "offset", "rr-schedule",
                          "protect"})
      if (a.given(o)) a.fail(o, "applies to task runs, not to --prompt");
  }
  TaskLoop loop;
  if (!a.given("prompt")) loop.methods = run_methods(a);  // checked before the model is loaded
  LoadedModel m = load_model(a);
  if (a.given("prompt")) {
    const std::vector<int32_t> ids = m.tok.encode(a.str("prompt"));
    const int64_t context = m.model->config().context;
    if (context > 0 && int64_t(ids.size()) + a.i64("new") > context)
      a.fail("prompt", std::to_string(ids.size()) + " tokens + --new exceed the model's context of " +
                           std::to_string(context));
    PrefillOptions po;
    po.method.dense = true;
    po.method.attention_backend = m.backend;
    MethodSpec spec{"dense", 1, 0};
    spec.decode = a.strs("decode").front();
    spec.decode_tau = a.reals("decode-tau").front();
    m.model->set_decode(decode_options(a, spec));
    const std::vector<int32_t> gen = m.model->generate(ids, a.i32("new"), po, nullptr, m.tok.eos());
    if (a.json())
      print_json({{"model", m.json}, {"prompt_ids", ids}, {"generated_ids", gen}, {"generated", m.tok.decode(gen)}});
    else
      std::cout << m.tok.decode(gen) << "\n";
    return 0;
  }
  return run_task_loop(a, m, loop);
}

OptionTable llm_options() {
  OptionTable t = llm_task_options();
  t.push_back(text("prompt", "", "a prompt to continue greedily (instead of tasks)"));
  return t;
}

const Command reg{"llm", "run a Llama GGUF model (SmolLM2) with block-sparse prefill on retrieval tasks",
                  llm_options(), run_llm};

}  // namespace
}  // namespace ariadne::cli
