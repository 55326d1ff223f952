// The layer golden suite (`orthros golden --level layer`): one call of the Orthros attention layer
// per case (layer_suite.hpp has the file format, the loader and the expected results), at the
// qwen3-8b and llama3.1-8b head shapes and tiny edges.
#include "golden_common.hpp"

#include "orthros/check.hpp"
#include "orthros/configs.hpp"
#include "orthros/golden.hpp"
#include "orthros/layer.hpp"
#include "orthros/layer_suite.hpp"
#include "orthros/portkit.hpp"
#include "orthros/safetensors.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace orthros::portkit {
namespace {

using namespace golden_detail;

/// d_model of the cases at the real head shapes (H_q*D = 4096 stays real; d_model = 4096 would make
/// every case ~270 MB) and of the tiny edges.
constexpr Index kLayerDModel = 64, kLayerEdgeDModel = 32;

/// A scale vector away from 1 and from 0: alpha in ±[0.5, 0.85] ∪ ±[1.15, 1.5] (a port that drops
/// or misplaces alpha, or swaps the streams' vectors, cannot hide behind alpha ≈ 1).
Vec<double> layer_scale_vec(Index n, SplitMix& g) {
  Vec<double> v(n);
  for (Index i = 0; i < n; ++i) {
    const double m = ((g.next() & 1) ? 1.15 : 0.5) + 0.35 * g.uniform();
    v[i] = (g.next() & 1) ? -m : m;
  }
  return v;
}

/// An offset vector away from 0: beta in ±[0.2, 0.6].
Vec<double> layer_offset_vec(Index n, SplitMix& g) {
  Vec<double> v(n);
  for (Index i = 0; i < n; ++i) {
    const double m = 0.2 + 0.4 * g.uniform();
    v[i] = (g.next() & 1) ? -m : m;
  }
  return v;
}

/// The weights of one layer from the stream seeded by (seed, tag + "/weights"): projections with
/// entries ±[0.05, 1) * 3/sqrt(fan-in) (so q, k, v and y are O(1) and the scores' softmax is neither
/// uniform nor one-hot), alpha/alpha' from layer_scale_vec, beta/beta' from layer_offset_vec, QK-norm
/// gains in [0.5, 1.5].
AttentionWeights<double> layer_weights(std::uint64_t seed, const std::string& tag, const AttentionConfig& a, Index dm) {
  SplitMix g{seed ^ fnv1a(tag + "/weights")};
  const Index d = Index(a.num_q_heads) * a.head_dim, dkv = Index(a.num_kv_heads) * a.head_dim;
  AttentionWeights<double> w;
  w.w_q = random_mat(dm, d, g, 3.0 / std::sqrt(double(dm)));
  w.w_k = random_mat(dm, dkv, g, 3.0 / std::sqrt(double(dm)));
  w.w_v = random_mat(dm, dkv, g, 3.0 / std::sqrt(double(dm)));
  w.w_o = random_mat(d, dm, g, 3.0 / std::sqrt(double(d)));
  w.alpha = layer_scale_vec(d, g);
  w.beta = layer_offset_vec(d, g);
  w.alpha_out = layer_scale_vec(d, g);
  w.beta_out = layer_offset_vec(d, g);
  if (a.qk_norm) {
    w.q_norm.resize(a.head_dim);
    w.k_norm.resize(a.head_dim);
    for (Index i = 0; i < a.head_dim; ++i) w.q_norm[i] = 0.5 + g.uniform();
    for (Index i = 0; i < a.head_dim; ++i) w.k_norm[i] = 0.5 + g.uniform();
  }
  return w;
}

/// One sequence of N positions through one layer: base hidden states x, output-stream hidden
/// states x_out (independent of x, as after a first layer) and the float64 oracle's KV cache of all
/// N positions (the layer on x with T_out = 0). Its first P rows are the cache every case at P
/// starts from: bitwise the previous chunk's / prefill's expected cache-after (the keys and values
/// are token-wise), rounded to the suite dtype when the case is written.
struct LayerSeq {
  AttentionWeights<double> w;
  AttentionConfig cfg;
  Mat<double> x, x_out;
  KVCache<double> full;
};

LayerSeq layer_sequence(std::uint64_t seed, const std::string& tag, const AttentionWeights<double>& w,
                        const AttentionConfig& cfg, Index N) {
  LayerSeq s;
  s.w = w;
  s.cfg = cfg;
  SplitMix g{seed ^ fnv1a(tag + "/x")};
  const Index dm = w.w_q.rows();
  s.x = random_mat(N, dm, g, 1.0);
  s.x_out = random_mat(N, dm, g, 1.0);
  s.full.k.resize(0, Index(cfg.num_kv_heads) * cfg.head_dim);
  s.full.v.resize(0, Index(cfg.num_kv_heads) * cfg.head_dim);
  orthros_attention_layer<double>(w, cfg, s.x, Mat<double>(0, dm), s.full);
  return s;
}

/// One layer case before it is written.
struct LayerSpec {
  std::string name, regime, config, group, description;
  int group_index = -1, group_size = 0;
  portkit::LayerCase<double> c;
};

/// The layer call on tokens P+1..P+T of `s` with output tokens for the last T_out of them, starting
/// from the float64 cache of positions 1..P.
LayerSpec layer_slice(const LayerSeq& s, Index P, Index T, Index T_out) {
  LayerSpec l;
  l.c.w = s.w;
  l.c.cfg = s.cfg;
  l.c.x = s.x.middleRows(P, T);
  l.c.x_out = s.x_out.middleRows(P + T - T_out, T_out);
  l.c.cache.k = s.full.k.topRows(P);
  l.c.cache.v = s.full.v.topRows(P);
  l.c.T = T;
  l.c.P = P;
  l.c.T_out = T_out;
  l.c.d_model = s.x.cols();
  return l;
}

LayerSpec layer_named(LayerSpec l, std::string name, std::string regime, std::string config, std::string description,
                      std::string group = "", int idx = -1, int size = 0) {
  l.name = std::move(name);
  l.regime = std::move(regime);
  l.config = std::move(config);
  l.description = std::move(description);
  l.group = std::move(group);
  l.group_index = idx;
  l.group_size = size;
  return l;
}

/// Every layer case: the regimes of the operator suite at both real configurations' head shapes
/// (qwen3-8b with QK-norm, llama3.1-8b without; d_model 64; one sequence of N = 2w + 13 = 269
/// positions, crossing the window twice), then tiny edges (w = 1, GQA 7, SFT over a cache).
std::vector<LayerSpec> build_layer_suite(std::uint64_t seed, json& groups) {
  std::vector<LayerSpec> out;
  for (const auto& config_prefix : {std::pair<std::string, std::string>{"qwen3-8b", "qwen3_8b"},
                                     {"llama3.1-8b", "llama3_1_8b"}}) {
    // Named copies: a lambda below captures them (C++17 lambdas cannot capture structured bindings).
    const std::string& config = config_prefix.first;
    const std::string& prefix = config_prefix.second;
    const AttentionConfig cfg = attention_config(config);
    const AttentionWeights<double> w = layer_weights(seed, config, cfg, kLayerDModel);
    const std::int64_t win = cfg.window;
    const Index N = 2 * win + 13;
    const LayerSeq seq = layer_sequence(seed, config + "/sequence", w, cfg, N);
    auto add = [&](LayerSpec l, const std::string& n, const std::string& regime, const std::string& desc,
                   const std::string& group = "", int idx = -1, int size = 0) {
      out.push_back(layer_named(std::move(l), prefix + "_" + n, regime, config, desc, group.empty() ? "" : prefix + "_" + group,
                                idx, size));
    };
    add(layer_slice(seq, 0, N, N), "pt", "pt", "pre-training: T_out = T, P = 0 (all positions predict)");
    const Index sft_out = std::max<Index>(1, N / 4);
    add(layer_slice(seq, 0, N, sft_out), "sft", "sft",
        "SFT: output tokens for the last " + I(sft_out) + " positions (the response), P = 0");
    add(layer_slice(seq, 0, N, 1), "prefill", "prefill", "prefill: one output token at the last prompt token, P = 0");
    {
      const std::vector<Index> chunks{win + 1, win / 2 + 3, N - (win + 1) - (win / 2 + 3)};
      json g = {{"name", prefix + "_chunked_prefill"}, {"regime", "chunked_prefill"}, {"config", config},
                {"cases", json::array()},
                {"note", "one prompt in 3 chunks; chunk i's k_cache/v_cache are chunk i-1's expected k_cache_after/"
                         "v_cache_after (float64 oracle; rounded to the suite dtype). A port may feed its own cache "
                         "after instead: it then also tests its cache round trip, within the dtype's tolerance"}};
      Index P = 0;
      for (size_t i = 0; i < chunks.size(); ++i) {
        const bool last = i + 1 == chunks.size();
        const std::string n = "chunked_prefill_" + I(Index(i) + 1) + "of3";
        add(layer_slice(seq, P, chunks[i], last ? 1 : 0), n, "chunked_prefill",
            "chunk " + I(Index(i) + 1) + " of 3: tokens " + I(P + 1) + ".." + I(P + chunks[i]) +
                (last ? ", output token at the last token" : ", T_out = 0 (only fills the cache)"),
            "chunked_prefill", int(i), int(chunks.size()));
        g["cases"].push_back(prefix + "_" + n);
        P += chunks[i];
      }
      groups.push_back(g);
    }
    {
      const int steps = 4;
      json g = {{"name", prefix + "_decode"}, {"regime", "decode"}, {"config", config}, {"cases", json::array()},
                {"note", "prefill of the first N-4 tokens (not a case), then 4 decode pairs: T = 1, T_out = 1, "
                         "P = t - 1; step i's cache is step i-1's expected cache after. y equals row t of the pt "
                         "case's y, y_out row t of its y_out (bitwise in the float64 oracle)"}};
      for (int i = 0; i < steps; ++i) {
        const Index P = N - steps + i;
        const std::string n = "decode_step_" + I(i + 1);
        add(layer_slice(seq, P, 1, 1), n, "decode",
            "decode pair at position t = " + I(P + 1) + " over a cache of P = " + I(P), "decode", i, steps);
        g["cases"].push_back(prefix + "_" + n);
      }
      groups.push_back(g);
    }
    {
      const std::vector<Index> lens{3, win + 2, 2 * win + 7};
      json gp = {{"name", prefix + "_ragged_prefill"}, {"regime", "ragged_prefill"}, {"config", config},
                 {"cases", json::array()},
                 {"note", "a batch of 3 prompts of different lengths (same layer weights), one case per sequence"}};
      json gd = {{"name", prefix + "_ragged_decode"}, {"regime", "ragged_decode"}, {"config", config},
                 {"cases", json::array()},
                 {"note", "one decode step of the same 3 sequences; sequence b's cache is ragged_prefill_b's "
                          "expected cache after"}};
      for (size_t b = 0; b < lens.size(); ++b) {
        const LayerSeq s = layer_sequence(seed, config + "/ragged_" + I(Index(b)), w, cfg, lens[b] + 1);
        const std::string np = "ragged_prefill_b" + I(Index(b)), nd = "ragged_decode_b" + I(Index(b));
        add(layer_slice(s, 0, lens[b], 1), np, "ragged_prefill",
            "sequence " + I(Index(b)) + " of a ragged prefill batch: T = " + I(lens[b]), "ragged_prefill", int(b),
            int(lens.size()));
        add(layer_slice(s, lens[b], 1, 1), nd, "ragged_decode",
            "sequence " + I(Index(b)) + " of a ragged decode batch: P = " + I(lens[b]), "ragged_decode", int(b),
            int(lens.size()));
        gp["cases"].push_back(prefix + "_" + np);
        gd["cases"].push_back(prefix + "_" + nd);
      }
      groups.push_back(gp);
      groups.push_back(gd);
    }
  }
  // ---- tiny edges (d_model 32) ----
  struct Edge {
    std::string name, description;
    AttentionConfig cfg;
    Index P, T, T_out;
  };
  AttentionConfig w1 = attention_config("tiny"), gqa7 = w1, nonorm = w1;
  w1.window = 1;
  gqa7.num_q_heads = 28;
  gqa7.num_kv_heads = 4;
  nonorm.qk_norm = false;
  const std::vector<Edge> edges{
      {"edge_w1", "tiny shapes, w = 1: a base token sees only itself (o_t = v_t), the output tokens see everything",
       w1, 0, 12, 3},
      {"edge_gqa7", "GQA ratio 7 (28 query heads, 4 KV heads, D 16), P = 6 cached tokens", gqa7, 6, 14, 2},
      {"edge_cache_sft", "tiny shapes without QK-norm: SFT continuing a cache of P = 20 (T = 16, T_out = 6)", nonorm,
       20, 16, 6},
  };
  for (const Edge& e : edges) {
    const AttentionWeights<double> w = layer_weights(seed, e.name, e.cfg, kLayerEdgeDModel);
    const LayerSeq s = layer_sequence(seed, e.name + "/sequence", w, e.cfg, e.P + e.T);
    out.push_back(layer_named(layer_slice(s, e.P, e.T, e.T_out), e.name, "edge", "tiny", e.description));
  }
  return out;
}

}  // namespace

std::size_t write_layer_suite(const GoldenOptions& a) {
  const st::DType dt = portkit::parse_check_dtype(a.dtype);
  const fs::path root(a.out);
  std::error_code ec;
  for (const char* sub : {"cases", "expected"}) {
    fs::create_directories(root / sub, ec);
    require(!ec, "--out: cannot create directory ", (root / sub).string(), ": ", ec.message());
  }
  json groups = json::array();
  const std::vector<LayerSpec> specs = build_layer_suite(a.seed, groups);
  const double rel = check::rel_tolerance(a.dtype);
  json cases = json::array();
  for (const LayerSpec& l : specs) {
    st::File cf = portkit::make_layer_case(l.c, dt);
    cf.metadata["suite_version"] = std::to_string(kLayerSuiteVersion);
    cf.metadata["level"] = "layer";
    cf.metadata["case"] = l.name;
    cf.metadata["regime"] = l.regime;
    cf.metadata["config"] = l.config;
    cf.metadata["dtype"] = a.dtype;
    const portkit::Expected e = portkit::compute_layer_expected(cf, a.dtype);
    const auto [case_rel, exp_rel] = write_case_files(root, l.name, kLayerSuiteVersion, cf, e);
    const st::File& ef = e.file;

    json shapes, abs_tol, errs;
    std::string abs_note;
    for (const auto& [n, t] : cf.tensors) shapes[n] = shape_json(t);
    for (const std::string& t : e.names()) {
      shapes[t] = shape_json(ef.tensors.at(t));
      const check::AbsBaseline& b = e.oracle_err.at(t);
      abs_tol[t] = b.maxabs ? json(check::abs_tolerance(*b.maxabs)) : json(nullptr);
      errs[t] = b.maxabs ? json(*b.maxabs) : json(portkit::kNotApplicable);
      if (!b.maxabs) abs_note = "n/a (" + b.why_na + ")";
    }
    const AttentionConfig& c = l.c.cfg;
    json j = {{"name", l.name},
              {"file", case_rel},
              {"expected", exp_rel},
              {"regime", l.regime},
              {"config", l.config},
              {"description", l.description},
              {"T", l.c.T},
              {"P", l.c.P},
              {"T_out", l.c.T_out},
              {"H_q", c.num_q_heads},
              {"H_kv", c.num_kv_heads},
              {"D", c.head_dim},
              {"d_model", l.c.d_model},
              {"window", c.window},
              {"rope_theta", c.rope_theta},
              {"qk_norm", c.qk_norm},
              {"rms_eps", c.rms_eps},
              {"scale", 1.0 / std::sqrt(double(c.head_dim))},
              {"positions",
               {{"y", {l.c.P + 1, l.c.P + l.c.T}},
                {"y_out", {l.c.P + l.c.T - l.c.T_out + 1, l.c.P + l.c.T}},
                {"cache_after", {1, l.c.P + l.c.T}}}},
              {"shapes", shapes},
              {"dtype", a.dtype},
              {"tolerance", {{"rel", rel}, {"abs", abs_tol}, {"oracle_at_dtype_maxabs", errs}}}};
    if (!abs_note.empty()) j["tolerance"]["abs_criterion"] = abs_note;
    if (!l.group.empty()) j["group"] = {{"name", l.group}, {"index", l.group_index}, {"size", l.group_size}};
    cases.push_back(j);
  }
  json manifest = {
      {"format", "orthros-golden"},
      {"level", "layer"},
      {"suite_version", kLayerSuiteVersion},
      {"spec", "SPEC.md §2 (the layer), §5 (files), §6 (tolerance); docs/porting.md \"Layer suite\", "
               "docs/file-format.md"},
      {"seed", a.seed},
      {"dtype", a.dtype},
      {"configs", {"qwen3-8b", "llama3.1-8b", "tiny"}},
      {"layout",
       {{"case", "cases/NAME.safetensors in dtype: x [T,d_model], x_out [T_out,d_model], w_q [d_model,H_q*D], w_k, "
                 "w_v [d_model,H_kv*D], w_o [H_q*D,d_model], alpha, beta, alpha_out, beta_out [H_q*D], q_norm, "
                 "k_norm [D] (only when qk_norm is 1), k_cache, v_cache [P,H_kv,D] (the cache before the call: "
                 "post-RoPE keys, values); __metadata__ num_q_heads, num_kv_heads, head_dim, window, rope_theta, "
                 "qk_norm (1/0), rms_eps; softmax scale 1/sqrt(D)"},
        {"expected", "expected/NAME.safetensors in F64 (float64 layer oracle): y [T,d_model], y_out [T_out,d_model], "
                     "k_cache_after, v_cache_after [P+T,H_kv,D]; __metadata__ oracle_at_dtype_maxabs.<tensor>"},
        {"result", "a port writes ACTUAL_DIR/NAME.safetensors with y, y_out, k_cache_after, v_cache_after in any of "
                   "F64, F32, BF16, F16; then: orthros check --suite DIR --actual-dir ACTUAL_DIR"},
        {"positions", "row i of x and y is absolute position P+i+1 (RoPE index P+i); row i of x_out and y_out is "
                      "position P+T-T_out+i+1 (its base token's); cache row i is position i+1"},
        {"caches", "chunked prefill, decode and ragged decode cases start from the float64 oracle's expected cache "
                   "after the previous call, rounded to dtype; a port may chain its own k_cache_after instead"}}},
      {"tolerance_rule", {{"rel", "||out-ref||_F / ||ref||_F <= rel (f64 1e-12, f32 1e-5, f16 2e-3, bf16 1e-2)"},
                          {"abs", "max|out-ref| <= 2 * oracle_at_dtype_maxabs + 1e-6 (per tensor; E_X = the layer "
                                  "oracle at the dtype against float64)"},
                          {"finite", "no NaN/Inf in any output"}}},
      {"groups", groups},
      {"cases", cases}};
  write_manifest(root, manifest);
  return specs.size();
}

}  // namespace orthros::portkit
