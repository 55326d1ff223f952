/// \file model_io.hpp
/// \brief A whole Orthros Transformer (config + weights) as one safetensors file, so a model
/// trained or converted elsewhere (e.g. a Hugging Face Llama/Qwen3 converted by
/// `orthros.torch.convert`, docs/conversion.md) runs every regime through the oracle.
///
/// Model file (docs/file-format.md, "Model weights"):
///   - `__metadata__` (strings): `orthros_model` = "1" (marks the format), `vocab_size`,
///     `d_model`, `d_ff`, `num_layers`, `num_q_heads`, `num_kv_heads`, `head_dim`, `window`
///     (decimal integers), `rope_theta`, `rms_eps` (decimal numbers; `rms_eps` is used by the
///     pre-norms, the final norm and the QK-norm alike, as in Llama/Qwen3), `qk_norm` ("true" or
///     "false"). Other keys are ignored (provenance, e.g. the source model's name).
///   - tensors, named as `for_each_parameter` names them (training.hpp), in the oracle's
///     layout `x W` (a projection is `[in, out]`: the TRANSPOSE of a `torch.nn.Linear` weight):
///     `embedding` [V, d_model], `layers.<l>.attn_norm` [d_model], `layers.<l>.attn.w_q`
///     [d_model, H_q*D], `.attn.w_k` / `.attn.w_v` [d_model, H_kv*D], `.attn.w_o` [H_q*D, d_model],
///     `.attn.alpha` / `.attn.beta` / `.attn.alpha_out` / `.attn.beta_out` [H_q*D],
///     `.attn.q_norm` / `.attn.k_norm` [D] (required when qk_norm, absent otherwise),
///     `layers.<l>.ffn_norm` [d_model], `.w_gate` / `.w_up` [d_model, d_ff], `.w_down`
///     [d_ff, d_model], `final_norm` [d_model], `lm_head` [d_model, V] (a tied model stores
///     the embedding's transpose here). Any of F64, F32, F16, BF16, widened exactly.
#pragma once

#include "orthros/case_io.hpp"
#include "orthros/model.hpp"
#include "orthros/safetensors.hpp"
#include "orthros/training.hpp"

#include <climits>
#include <string>
#include <vector>

namespace orthros {

/// A model read from a file: its configuration and weights in scalar type S.
template <typename S>
struct LoadedModel {
  ModelConfig config;       ///< hyper-parameters from the metadata
  ModelWeights<S> weights;  ///< every parameter
};

namespace detail {

inline std::int64_t model_meta_int(const st::File& f, const char* key, std::int64_t lo) {
  auto it = f.metadata.find(key);
  require(it != f.metadata.end(), "model file: missing metadata \"", key, "\"");
  std::int64_t v = 0;
  require(parse_int64_strict(it->second, v) && v >= lo && v <= INT_MAX, "model file: metadata \"", key,
          "\" must be an integer in [", lo, ", ", INT_MAX, "] (got \"", it->second, "\")");
  return v;
}

inline double model_meta_double(const st::File& f, const char* key) {
  auto it = f.metadata.find(key);
  require(it != f.metadata.end(), "model file: missing metadata \"", key, "\"");
  double v = 0;
  require(parse_double_strict(it->second, v) && std::isfinite(v) && v > 0, "model file: metadata \"", key,
          "\" must be a finite number > 0 (got \"", it->second, "\")");
  return v;
}

}  // namespace detail

/// Reads a model from a parsed safetensors file (format: the file comment).
/// \throws orthros::Error naming the key or tensor and the values on: a missing `orthros_model`
///   marker or metadata key, a malformed number, `qk_norm` other than "true"/"false", a missing
///   tensor, a tensor of the wrong shape (both shapes given), a non-finite weight, and everything
///   check_config / check_model_weights reject.
template <typename S>
LoadedModel<S> load_model(const st::File& f) {
  auto marker = f.metadata.find("orthros_model");
  require(marker != f.metadata.end() && marker->second == "1",
          "model file: metadata \"orthros_model\" must be \"1\" (is this an Orthros model file? see "
          "docs/file-format.md)");
  LoadedModel<S> m;
  ModelConfig& c = m.config;
  c.name = "file";
  c.vocab_size = static_cast<int>(detail::model_meta_int(f, "vocab_size", 1));
  c.d_model = static_cast<int>(detail::model_meta_int(f, "d_model", 1));
  c.d_ff = static_cast<int>(detail::model_meta_int(f, "d_ff", 1));
  c.num_layers = static_cast<int>(detail::model_meta_int(f, "num_layers", 1));
  c.attn.num_q_heads = static_cast<int>(detail::model_meta_int(f, "num_q_heads", 1));
  c.attn.num_kv_heads = static_cast<int>(detail::model_meta_int(f, "num_kv_heads", 1));
  c.attn.head_dim = static_cast<int>(detail::model_meta_int(f, "head_dim", 1));
  c.attn.window = detail::model_meta_int(f, "window", 1);
  c.attn.rope_theta = detail::model_meta_double(f, "rope_theta");
  c.rms_eps = c.attn.rms_eps = detail::model_meta_double(f, "rms_eps");
  auto qk = f.metadata.find("qk_norm");
  require(qk != f.metadata.end() && (qk->second == "true" || qk->second == "false"),
          "model file: metadata \"qk_norm\" must be \"true\" or \"false\"",
          qk == f.metadata.end() ? std::string(" (missing)") : " (got \"" + qk->second + "\")");
  c.attn.qk_norm = qk->second == "true";
  check_config(c);

  const Eigen::Index d = Eigen::Index(c.attn.num_q_heads) * c.attn.head_dim;
  const Eigen::Index dkv = Eigen::Index(c.attn.num_kv_heads) * c.attn.head_dim;
  auto tensor = [&](const std::string& name, std::vector<std::int64_t> shape) -> Mat<S> {
    auto it = f.tensors.find(name);
    require(it != f.tensors.end(), "model file: missing tensor \"", name, "\" ", st::shape_string(shape));
    require(it->second.shape == shape, "model file: tensor \"", name, "\" must have shape ", st::shape_string(shape),
            "; got ", st::shape_string(it->second.shape));
    detail::require_finite_tensor(it->second, "model file: tensor \"" + name + "\"", "weights must be finite");
    return st::to_matrix<S>(it->second, name);
  };
  auto vec = [&](const std::string& name, Eigen::Index n) -> Vec<S> { return tensor(name, {n}).col(0); };
  m.weights.embedding = tensor("embedding", {c.vocab_size, c.d_model});
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    LayerWeights<S> lw;
    lw.attn_norm = vec(p + "attn_norm", c.d_model);
    lw.attn.w_q = tensor(p + "attn.w_q", {c.d_model, d});
    lw.attn.w_k = tensor(p + "attn.w_k", {c.d_model, dkv});
    lw.attn.w_v = tensor(p + "attn.w_v", {c.d_model, dkv});
    lw.attn.w_o = tensor(p + "attn.w_o", {d, c.d_model});
    lw.attn.alpha = vec(p + "attn.alpha", d);
    lw.attn.beta = vec(p + "attn.beta", d);
    lw.attn.alpha_out = vec(p + "attn.alpha_out", d);
    lw.attn.beta_out = vec(p + "attn.beta_out", d);
    if (c.attn.qk_norm) {
      lw.attn.q_norm = vec(p + "attn.q_norm", c.attn.head_dim);
      lw.attn.k_norm = vec(p + "attn.k_norm", c.attn.head_dim);
    } else {
      for (const char* n : {"attn.q_norm", "attn.k_norm"})
        require(!f.tensors.count(p + n), "model file: tensor \"", p + n,
                "\" is present but metadata qk_norm is \"false\" (set qk_norm or drop the tensor)");
    }
    lw.ffn_norm = vec(p + "ffn_norm", c.d_model);
    lw.w_gate = tensor(p + "w_gate", {c.d_model, c.d_ff});
    lw.w_up = tensor(p + "w_up", {c.d_model, c.d_ff});
    lw.w_down = tensor(p + "w_down", {c.d_ff, c.d_model});
    m.weights.layers.push_back(std::move(lw));
  }
  m.weights.final_norm = vec("final_norm", c.d_model);
  m.weights.lm_head = tensor("lm_head", {c.d_model, c.vocab_size});
  check_model_weights(m.weights, c);
  return m;
}

/// Reads a model file from `path`. \throws orthros::Error as st::read_file and load_model,
/// prefixed with the path.
template <typename S>
LoadedModel<S> load_model(const std::string& path) {
  const st::File f = st::read_file(path);
  try {
    return load_model<S>(f);
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
}

/// Adds every parameter-shaped tensor of `w` (weights or gradients) to `f` as `prefix + name`
/// in the model file's names, shapes and layout; q_norm/k_norm only when `c.attn.qk_norm`.
template <typename S>
void parameter_tensors(const ModelWeights<S>& w, const ModelConfig& c, st::DType dtype, const std::string& prefix,
                       st::File& f) {
  const Eigen::Index d = Eigen::Index(c.attn.num_q_heads) * c.attn.head_dim;
  const Eigen::Index dkv = Eigen::Index(c.attn.num_kv_heads) * c.attn.head_dim;
  auto shape_of = [&](const std::string& name) -> std::vector<std::int64_t> {
    auto ends = [&](const char* s) {
      const std::string t(s);
      return name.size() >= t.size() && name.compare(name.size() - t.size(), t.size(), t) == 0;
    };
    if (name == "embedding") return {c.vocab_size, c.d_model};
    if (name == "lm_head") return {c.d_model, c.vocab_size};
    if (ends("attn.w_q")) return {c.d_model, d};
    if (ends("attn.w_k") || ends("attn.w_v")) return {c.d_model, dkv};
    if (ends("attn.w_o")) return {d, c.d_model};
    if (ends("alpha") || ends("beta") || ends("alpha_out") || ends("beta_out")) return {d};
    if (ends("q_norm") || ends("k_norm")) return {c.attn.head_dim};
    if (ends("w_gate") || ends("w_up")) return {c.d_model, c.d_ff};
    if (ends("w_down")) return {c.d_ff, c.d_model};
    return {c.d_model};  // attn_norm, ffn_norm, final_norm
  };
  for_each_parameter(w, [&](const std::string& name, const S* p, Eigen::Index n) {
    if (!c.attn.qk_norm && (name.find("q_norm") != std::string::npos || name.find("k_norm") != std::string::npos))
      return;
    Mat<S> m = Eigen::Map<const Mat<S>>(p, 1, n);
    f.tensors[prefix + name] = st::from_matrix(m, shape_of(name), dtype);
  });
}

/// The file form of a model (format: the file comment), tensors in `dtype`, so that
/// load_model(model_file(w, c, dtype)) gives `w` back exactly when `dtype` holds S exactly.
/// \throws orthros::Error from check_model_weights.
template <typename S>
st::File model_file(const ModelWeights<S>& w, const ModelConfig& c, st::DType dtype) {
  check_model_weights(w, c);
  st::File f;
  auto num = [](double x) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", x);
    return std::string(buf);
  };
  f.metadata = {{"orthros_model", "1"},
                {"vocab_size", std::to_string(c.vocab_size)},
                {"d_model", std::to_string(c.d_model)},
                {"d_ff", std::to_string(c.d_ff)},
                {"num_layers", std::to_string(c.num_layers)},
                {"num_q_heads", std::to_string(c.attn.num_q_heads)},
                {"num_kv_heads", std::to_string(c.attn.num_kv_heads)},
                {"head_dim", std::to_string(c.attn.head_dim)},
                {"window", std::to_string(c.attn.window)},
                {"rope_theta", num(c.attn.rope_theta)},
                {"rms_eps", num(c.rms_eps)},
                {"qk_norm", c.attn.qk_norm ? "true" : "false"}};
  require(c.rms_eps == c.attn.rms_eps, "model_file: rms_eps (", c.rms_eps, ") and attn.rms_eps (", c.attn.rms_eps,
          ") differ; the file format has one epsilon");
  parameter_tensors(w, c, dtype, "", f);
  return f;
}

}  // namespace orthros
