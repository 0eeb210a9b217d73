// Encoder weights: loading from safetensors checkpoints, seeded random weights, saving.
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

#include "ariadne/error.hpp"
#include "ariadne/safetensors.hpp"
#include "ariadne/vit.hpp"

namespace ariadne {

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string o = "[";
  for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
  return o + "]";
}

// The tensors of a (possibly sharded) checkpoint, looked up by full name across files.
class Checkpoint {
 public:
  explicit Checkpoint(const std::vector<std::string>& files) {
    ARIADNE_CHECK(!files.empty(), "vit weights: no safetensors file given");
    for (const auto& f : files) files_.push_back(std::make_unique<SafetensorsFile>(f));
  }
  const SafetensorsFile* find(const std::string& name) const {
    for (const auto& f : files_)
      if (f->has(name)) return f.get();
    return nullptr;
  }
  bool has(const std::string& name) const { return find(name) != nullptr; }
  const std::vector<int64_t>& shape(const std::string& name) const { return get(name).entry(name).shape; }
  // The tensor as f32, its shape checked against `expected`.
  std::vector<float> read(const std::string& name, const std::vector<int64_t>& expected) const {
    const SafetensorsFile& f = get(name);
    const auto& s = f.entry(name).shape;
    ARIADNE_CHECK(s == expected, f.path(), ": tensor '", name, "' has shape ", shape_str(s), ", expected ",
                  shape_str(expected));
    return f.read_f32(name);
  }
  const SafetensorsFile& get(const std::string& name) const {
    const SafetensorsFile* f = find(name);
    ARIADNE_CHECK(f, names(), ": no tensor named '", name, "'");
    return *f;
  }
  std::string names() const {
    std::string o;
    for (const auto& f : files_) o += (o.empty() ? "" : ", ") + f->path();
    return o;
  }
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
};

// Architecture fields that a checkpoint's tensors cannot tell, from "vision_config" metadata.
void apply_metadata(const Checkpoint& ck, VitConfig& c) {
  for (const auto& f : ck.files()) {
    auto it = f->metadata().find("vision_config");
    if (it == f->metadata().end()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(it->second);
    } catch (const nlohmann::json::exception& e) {
      detail::fail(f->path(), ": metadata 'vision_config' is not valid JSON (", e.what(), ")");
    }
    ARIADNE_CHECK(j.is_object(), f->path(), ": metadata 'vision_config' is not a JSON object");
    auto get_int = [&](const char* key, int& field) {
      if (!j.contains(key)) return;
      ARIADNE_CHECK(j[key].is_number_integer(), f->path(), ": vision_config.", key, " is not an integer");
      field = j[key].get<int>();
    };
    get_int("num_heads", c.heads);
    get_int("window_size", c.window_px);
    if (j.contains("fullatt_block_indexes")) {
      ARIADNE_CHECK(j["fullatt_block_indexes"].is_array(), f->path(), ": vision_config.fullatt_block_indexes is not an array");
      c.full_layers.clear();
      for (const auto& v : j["fullatt_block_indexes"]) {
        ARIADNE_CHECK(v.is_number_integer(), f->path(), ": vision_config.fullatt_block_indexes holds a non-integer");
        c.full_layers.push_back(v.get<int>());
      }
    }
    if (j.contains("rope_theta")) {
      ARIADNE_CHECK(j["rope_theta"].is_number(), f->path(), ": vision_config.rope_theta is not a number");
      c.rope_theta = j["rope_theta"].get<double>();
    }
    return;  // the first file with metadata decides
  }
}

struct Uniform {
  std::mt19937_64 rng;
  // Uniform in [−bound, bound) from 53 random bits (the same on every standard library).
  std::vector<float> make(size_t n, double bound, double center = 0) {
    std::vector<float> v(n);
    for (auto& x : v) x = float(center + bound * (2.0 * double(rng() >> 11) * 0x1.0p-53 - 1.0));
    return v;
  }
};

// The tower's prefix and architecture from the tensors' shapes and the metadata (no tensor data is
// read: the files are memory-mapped and only their headers are looked at).
std::pair<std::string, VitConfig> checkpoint_config(const Checkpoint& ck, const VitConfig& defaults) {
  std::string P;
  for (const char* p : {"visual.", "model.visual."})
    if (ck.has(std::string(p) + "patch_embed.proj.weight")) P = p;
  ARIADNE_CHECK(!P.empty(), ck.names(),
                ": no vision tower found (neither 'visual.patch_embed.proj.weight' nor "
                "'model.visual.patch_embed.proj.weight')");
  VitConfig c = defaults;

  // Sizes from the shapes.
  const auto pe = ck.shape(P + "patch_embed.proj.weight");
  ARIADNE_CHECK(pe.size() == 5 && pe[3] == pe[4] && pe[0] > 0, ck.get(P + "patch_embed.proj.weight").path(),
                ": tensor '", P, "patch_embed.proj.weight' has shape ", shape_str(pe),
                ", expected a Conv3d weight [hidden, channels, temporal, patch, patch]");
  c.hidden = int(pe[0]);
  c.in_channels = int(pe[1]);
  c.temporal = int(pe[2]);
  c.patch = int(pe[3]);
  c.depth = 0;
  while (ck.has(P + "blocks." + std::to_string(c.depth) + ".norm1.weight")) ++c.depth;
  ARIADNE_CHECK(c.depth > 0, ck.names(), ": no tensor '", P, "blocks.0.norm1.weight'");
  const auto gate = ck.shape(P + "blocks.0.mlp.gate_proj.weight");
  ARIADNE_CHECK(gate.size() == 2, ck.names(), ": tensor '", P, "blocks.0.mlp.gate_proj.weight' has shape ",
                shape_str(gate), ", expected [intermediate, hidden]");
  c.intermediate = int(gate[0]);
  const auto m0 = ck.shape(P + "merger.mlp.0.weight");
  ARIADNE_CHECK(m0.size() == 2 && m0[0] == m0[1] && m0[0] % c.hidden == 0, ck.names(), ": tensor '", P,
                "merger.mlp.0.weight' has shape ", shape_str(m0), ", expected [hidden·merge², hidden·merge²]");
  c.merge = int(std::lround(std::sqrt(double(m0[0] / c.hidden))));
  ARIADNE_CHECK(int64_t(c.merge) * c.merge * c.hidden == m0[0], ck.names(), ": merger width ", m0[0],
                " is not hidden ", c.hidden, " times a square");
  const auto m2 = ck.shape(P + "merger.mlp.2.weight");
  ARIADNE_CHECK(m2.size() == 2, ck.names(), ": tensor '", P, "merger.mlp.2.weight' has shape ", shape_str(m2),
                ", expected [out_hidden, hidden·merge²]");
  c.out_hidden = int(m2[0]);
  apply_metadata(ck, c);
  c.validate();
  return {P, c};
}

}  // namespace

VitConfig read_vit_config(const std::vector<std::string>& files, const VitConfig& defaults) {
  return checkpoint_config(Checkpoint(files), defaults).second;
}

VitWeights load_vit_weights(const std::vector<std::string>& files, const VitConfig& defaults, float sink_init) {
  const Checkpoint ck(files);
  VitWeights w;
  w.source = ck.names();
  w.sink_init = sink_init;
  std::tie(w.prefix, w.config) = checkpoint_config(ck, defaults);
  const std::string& P = w.prefix;
  const VitConfig& c = w.config;
  const auto pe = ck.shape(P + "patch_embed.proj.weight");
  const int64_t H = c.hidden, I = c.intermediate, U = c.unit_dim();
  w.patch_embed = ck.read(P + "patch_embed.proj.weight", pe);
  for (int i = 0; i < c.depth; ++i) {
    const std::string b = P + "blocks." + std::to_string(i) + ".";
    VitLayerWeights L;
    L.norm1 = ck.read(b + "norm1.weight", {H});
    L.norm2 = ck.read(b + "norm2.weight", {H});
    L.qkv_w = ck.read(b + "attn.qkv.weight", {3 * H, H});
    L.qkv_b = ck.read(b + "attn.qkv.bias", {3 * H});
    L.proj_w = ck.read(b + "attn.proj.weight", {H, H});
    L.proj_b = ck.read(b + "attn.proj.bias", {H});
    L.gate_w = ck.read(b + "mlp.gate_proj.weight", {I, H});
    L.gate_b = ck.read(b + "mlp.gate_proj.bias", {I});
    L.up_w = ck.read(b + "mlp.up_proj.weight", {I, H});
    L.up_b = ck.read(b + "mlp.up_proj.bias", {I});
    L.down_w = ck.read(b + "mlp.down_proj.weight", {H, I});
    L.down_b = ck.read(b + "mlp.down_proj.bias", {H});
    if (ck.has(b + "attn.sinks")) {
      L.sinks = ck.read(b + "attn.sinks", {c.heads});
      L.sinks_from_file = true;
    } else {
      L.sinks.assign(size_t(c.heads), sink_init);
    }
    w.layers.push_back(std::move(L));
  }
  w.merger_norm = ck.read(P + "merger.ln_q.weight", {H});
  w.merger_w1 = ck.read(P + "merger.mlp.0.weight", {U, U});
  w.merger_b1 = ck.read(P + "merger.mlp.0.bias", {U});
  w.merger_w2 = ck.read(P + "merger.mlp.2.weight", {c.out_hidden, U});
  w.merger_b2 = ck.read(P + "merger.mlp.2.bias", {c.out_hidden});
  return w;
}

VitWeights random_vit_weights(const VitConfig& config, uint64_t seed, float sink_init) {
  config.validate();
  VitWeights w;
  w.config = config;
  w.random = true;
  w.seed = seed;
  w.source = "random(" + std::to_string(seed) + ")";
  w.prefix = "visual.";
  w.sink_init = sink_init;
  Uniform u{std::mt19937_64(seed)};
  const size_t H = size_t(config.hidden), I = size_t(config.intermediate), U = size_t(config.unit_dim()),
               O = size_t(config.out_hidden), D = size_t(config.patch_dim());
  auto lin = [&](size_t out, size_t in, std::vector<float>& W, std::vector<float>& b) {
    const double bound = 1.0 / std::sqrt(double(in));
    W = u.make(out * in, bound);
    b = u.make(out, bound);
  };
  w.patch_embed = u.make(H * D, 1.0 / std::sqrt(double(D)));
  for (int i = 0; i < config.depth; ++i) {
    VitLayerWeights L;
    L.norm1 = u.make(H, 0.1, 1.0);
    L.norm2 = u.make(H, 0.1, 1.0);
    lin(3 * H, H, L.qkv_w, L.qkv_b);
    lin(H, H, L.proj_w, L.proj_b);
    lin(I, H, L.gate_w, L.gate_b);
    lin(I, H, L.up_w, L.up_b);
    lin(H, I, L.down_w, L.down_b);
    L.sinks.assign(size_t(config.heads), sink_init);
    w.layers.push_back(std::move(L));
  }
  w.merger_norm = u.make(H, 0.1, 1.0);
  lin(U, U, w.merger_w1, w.merger_b1);
  lin(O, U, w.merger_w2, w.merger_b2);
  return w;
}

void save_vit_weights(const std::string& path, const VitWeights& w, DType dtype, const std::string& prefix,
                      bool with_sinks) {
  const VitConfig& c = w.config;
  // Converted copies stay alive until the file is written.
  std::vector<std::vector<uint16_t>> half;
  std::vector<SafetensorsTensor> ts;
  auto add = [&](const std::string& name, const std::vector<float>& v, std::vector<int64_t> shape) {
    SafetensorsTensor t{prefix + name, dtype, std::move(shape), v.data()};
    if (dtype != DType::f32) {
      half.emplace_back(v.size());
      for (size_t i = 0; i < v.size(); ++i)
        half.back()[i] = dtype == DType::bf16 ? float_to_bf16(v[i]) : float_to_f16(v[i]);
      t.data = half.back().data();
    }
    ts.push_back(std::move(t));
  };
  half.reserve(size_t(c.depth) * 13 + 6);  // pointers into `half` must not move
  const int64_t H = c.hidden, I = c.intermediate, U = c.unit_dim();
  add("patch_embed.proj.weight", w.patch_embed, {H, c.in_channels, c.temporal, c.patch, c.patch});
  for (int i = 0; i < c.depth; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    const VitLayerWeights& L = w.layers[size_t(i)];
    add(b + "norm1.weight", L.norm1, {H});
    add(b + "norm2.weight", L.norm2, {H});
    add(b + "attn.qkv.weight", L.qkv_w, {3 * H, H});
    add(b + "attn.qkv.bias", L.qkv_b, {3 * H});
    add(b + "attn.proj.weight", L.proj_w, {H, H});
    add(b + "attn.proj.bias", L.proj_b, {H});
    add(b + "mlp.gate_proj.weight", L.gate_w, {I, H});
    add(b + "mlp.gate_proj.bias", L.gate_b, {I});
    add(b + "mlp.up_proj.weight", L.up_w, {I, H});
    add(b + "mlp.up_proj.bias", L.up_b, {I});
    add(b + "mlp.down_proj.weight", L.down_w, {H, I});
    add(b + "mlp.down_proj.bias", L.down_b, {H});
    if (with_sinks) add(b + "attn.sinks", L.sinks, {c.heads});
  }
  add("merger.ln_q.weight", w.merger_norm, {H});
  add("merger.mlp.0.weight", w.merger_w1, {U, U});
  add("merger.mlp.0.bias", w.merger_b1, {U});
  add("merger.mlp.2.weight", w.merger_w2, {c.out_hidden, U});
  add("merger.mlp.2.bias", w.merger_b2, {c.out_hidden});
  nlohmann::json vc = {{"depth", c.depth},          {"hidden_size", c.hidden},
                       {"num_heads", c.heads},      {"intermediate_size", c.intermediate},
                       {"out_hidden_size", c.out_hidden}, {"patch_size", c.patch},
                       {"temporal_patch_size", c.temporal}, {"spatial_merge_size", c.merge},
                       {"window_size", c.window_px}, {"fullatt_block_indexes", c.full_layers},
                       {"rope_theta", c.rope_theta}};
  write_safetensors(path, ts, {{"format", "pt"}, {"vision_config", vc.dump()}});
}

}  // namespace ariadne
