// Demo part: block-sparse prefill of a synthetic long prompt, RRAttention vs XAttention vs dense:
// density, attention-mass recall, block F1 against the oracle, output error against dense, time.
#include <cmath>
#include <iomanip>

#include "ariadne/prefill.hpp"
#include "workloads/synthetic.hpp"
#include "demo.hpp"

namespace ariadne::cli {
namespace {

double rel_l2(const Buffer& a, const Buffer& b) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.as<float>()[i], y = b.as<float>()[i];
    num += (x - y) * (x - y);
    den += y * y;
  }
  return std::sqrt(num / den);
}

void run_prefill_part(DemoContext& ctx) {
  SyntheticConfig sc;
  sc.heads_q = 8;
  sc.heads_kv = 2;
  sc.dim = 128;
  // 32K needs the fast CPU attention; the double reference is only practical on short prompts.
  Buffer probe(DType::f32, {1, 1, 128});
  AttentionParams pp;
  pp.q = pp.k = pp.v = pp.out = probe.view();
  pp.pattern = Pattern::causal();
  const bool fast = backend_supports(Backend::cpu, pp);
  const Backend backend = fast ? Backend::cpu : Backend::reference;
  sc.tokens = ctx.quick ? 1024 : (fast ? 32768 : 4096);
  const Synthetic data = make_synthetic(sc);
  const int64_t n = sc.tokens;

  auto& md = ctx.md;
  md << "Synthetic prompt of " << n << " tokens (`" << sc.mix << "`, θ = 10000), 8 query / 2 KV heads, d 128, "
     << "B 128, S 8, τ 0.95, attention backend " << backend_name(backend)
     << (fast ? "" : " (the fast CPU backend is not built: short prompt)")
     << ". Ground truth: the exact oracle at the same τ (density " ;
  EstimateConfig oc;
  oc.method = Estimator::oracle;
  const EstimateResult oracle = estimate(data.q.view(), data.k.view(), Pattern::causal(), oc);
  md << std::fixed << std::setprecision(3) << oracle.stats.density << ").\n\n"
     << "| method | density | mass recall | block F1 | rel err vs dense | ms estimate | ms attention | ms total |\n"
     << "| --- | --- | --- | --- | --- | --- | --- | --- |\n";

  nlohmann::json rows = nlohmann::json::array();
  Buffer dense_out;
  for (const char* method : {"dense", "rr", "xattn"}) {
    PrefillConfig pc;
    pc.dense = std::string(method) == "dense";
    if (!pc.dense) pc.estimate.method = parse_estimator(method);
    pc.attention_backend = backend;
    Buffer out(DType::f32, {n, sc.heads_q, sc.dim});
    AttentionParams ap;
    ap.q = data.q.view();
    ap.k = data.k.view();
    ap.v = data.v.view();
    ap.out = out.view();
    ap.pattern = Pattern::causal();
    const PrefillResult r = prefill(ap, pc);
    const BlockMask all = BlockMask::all_visible(ap.pattern, 128, sc.heads_q, n, n);
    const MaskMetrics m = compare_to_oracle(pc.dense ? all : r.estimate.mask, oracle);
    const double err = pc.dense ? 0.0 : rel_l2(out, dense_out);
    if (pc.dense) dense_out = std::move(out);
    const PrefillStats& st = r.stats;
    md << "| " << method << " | " << std::setprecision(3) << st.density << " | " << std::setprecision(4)
       << m.mass_recall << " | " << std::setprecision(3) << m.f1 << " | " << std::scientific << std::setprecision(2)
       << err << std::fixed << " | " << std::setprecision(1) << st.ms_estimate << " | " << st.ms_attention
       << " | " << st.ms_total << " |\n";
    rows.push_back({{"method", method}, {"density", st.density}, {"mass_recall", m.mass_recall},
                    {"block_f1", m.f1}, {"rel_err", err}, {"ms_estimate", st.ms_estimate},
                    {"ms_attention", st.ms_attention}, {"ms_total", st.ms_total}});
  }
  ctx.json["tokens"] = n;
  ctx.json["backend"] = backend_name(backend);
  ctx.json["oracle_density"] = oracle.stats.density;
  ctx.json["runs"] = rows;
}

const DemoPart part{50, "prefill", "Block-sparse prefill (RRAttention, XAttention, dense)", run_prefill_part};

}  // namespace
}  // namespace ariadne::cli
