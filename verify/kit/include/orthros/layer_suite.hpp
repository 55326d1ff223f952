/// \file layer_suite.hpp
/// \brief Layer-level golden cases, shared by `orthros golden --level layer` and
/// `orthros check`: the case file of one call of the Orthros attention layer (SPEC §2, paper
/// Algorithm 1), its loader, and its expected results under SPEC §6.
///
/// Layer case (`cases/NAME.safetensors`; any of F64/F32/BF16/F16 per tensor, widened exactly):
///   x `[T, d_model]`, x_out `[T_out, d_model]`            hidden states of the base / output tokens
///   w_q `[d_model, H_q*D]`, w_k, w_v `[d_model, H_kv*D]`, w_o `[H_q*D, d_model]`
///   alpha, beta, alpha_out, beta_out `[H_q*D]`            scale-offset of the two query streams
///   q_norm, k_norm `[D]`                                  only when metadata qk_norm = "1"
///   k_cache, v_cache `[P, H_kv, D]`                       the cache before the call (post-RoPE keys)
/// metadata (strings): num_q_heads, num_kv_heads, head_dim, window, rope_theta, qk_norm ("1"/"0"),
/// rms_eps. The softmax scale is 1/sqrt(D). Base row i is position P+i+1, output row i position
/// P+T-T_out+i+1 (RoPE index = position - 1).
///
/// Expected (`expected/NAME.safetensors`, F64): y `[T, d_model]`, y_out `[T_out, d_model]`,
/// k_cache_after, v_cache_after `[P+T, H_kv, D]` from orthros_attention_layer<double>, plus per
/// tensor E_X = max |layer oracle at the dtype − float64| (orthros_attention_layer<S> on the inputs
/// converted to S: exact when the file stores S), as the operator's compute_expected().
#pragma once

#include "orthros/layer.hpp"
#include "orthros/portkit.hpp"

#include <array>
#include <climits>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace orthros::portkit {

/// A layer case in memory (inputs at scalar type S).
template <typename S>
struct LayerCase {
  AttentionWeights<S> w;  ///< W_Q, W_K, W_V, W_O, alpha, beta, alpha', beta', q_norm, k_norm
  AttentionConfig cfg;    ///< H_q, H_kv, D, window, rope_theta, qk_norm, rms_eps
  Mat<S> x;               ///< [T, d_model]
  Mat<S> x_out;           ///< [T_out, d_model]
  KVCache<S> cache;       ///< [P, H_kv*D] keys, values before the call
  std::int64_t T = 0, P = 0, T_out = 0, d_model = 0;
};

/// True when `f` is a layer case (holds `x`), not an operator case.
inline bool is_layer_case(const st::File& f) { return f.tensors.count("x") > 0; }

namespace detail {

inline std::int64_t layer_meta_int(const st::File& f, const char* key, const char* doc) {
  auto it = f.metadata.find(key);
  require(it != f.metadata.end(), "layer case: missing metadata \"", key, "\" (", doc, ")");
  std::int64_t v = 0;
  require(orthros::detail::parse_int64_strict(it->second, v) && v >= 1 && v <= INT_MAX, "layer case: metadata \"",
          key, "\" (", doc, ") must be an integer in [1, ", INT_MAX, "] (got \"", it->second, "\")");
  return v;
}

inline double layer_meta_double(const st::File& f, const char* key, const char* doc) {
  auto it = f.metadata.find(key);
  require(it != f.metadata.end(), "layer case: missing metadata \"", key, "\" (", doc, ")");
  double v = 0;
  require(orthros::detail::parse_double_strict(it->second, v) && std::isfinite(v), "layer case: metadata \"", key,
          "\" (", doc, ") must be a finite number (got \"", it->second, "\")");
  return v;
}

inline const st::Tensor& layer_tensor(const st::File& f, const char* name, const std::vector<std::int64_t>& want,
                                      const char* doc) {
  auto it = f.tensors.find(name);
  require(it != f.tensors.end(), "layer case: missing tensor \"", name, "\" ", doc);
  require(it->second.shape == want, "layer case: tensor \"", name, "\" must be ", doc, " = ", st::shape_string(want),
          "; got ", st::shape_string(it->second.shape));
  return it->second;
}

template <typename S>
Vec<S> to_vec(const st::Tensor& t, const char* name) {
  const Mat<S> m = st::to_matrix<S>(t, name);
  return Vec<S>(Eigen::Map<const Vec<S>>(m.data(), m.size()));
}

}  // namespace detail

/// Reads and validates a layer case (format: file comment), converting every tensor to S.
/// \throws orthros::Error naming the tensor or metadata and the values on: a missing tensor or
///   metadata key; a shape that does not follow from x, the metadata and k_cache (both shapes
///   printed); H_q % H_kv != 0; an odd head_dim (RoPE); window < 1; rope_theta <= 0; rms_eps < 0;
///   qk_norm not "1"/"0"; q_norm/k_norm present with qk_norm "0"; T_out > T; a NaN or Inf in any
///   tensor (named, with its first index: `layer case: tensor "w_q" holds NaN at [3, 17] (...)`).
template <typename S>
LayerCase<S> load_layer_case(const st::File& f) {
  LayerCase<S> c;
  AttentionConfig& a = c.cfg;
  a.num_q_heads = static_cast<int>(detail::layer_meta_int(f, "num_q_heads", "H_q"));
  a.num_kv_heads = static_cast<int>(detail::layer_meta_int(f, "num_kv_heads", "H_kv"));
  a.head_dim = static_cast<int>(detail::layer_meta_int(f, "head_dim", "D"));
  a.window = detail::layer_meta_int(f, "window", "keys of the sliding window, current token included");
  a.rope_theta = detail::layer_meta_double(f, "rope_theta", "RoPE base");
  a.rms_eps = detail::layer_meta_double(f, "rms_eps", "epsilon of the QK RMSNorm");
  auto qk = f.metadata.find("qk_norm");
  require(qk != f.metadata.end(), "layer case: missing metadata \"qk_norm\" (\"1\" or \"0\")");
  require(qk->second == "1" || qk->second == "0", "layer case: metadata \"qk_norm\" must be \"1\" or \"0\" (got \"",
          qk->second, "\")");
  a.qk_norm = qk->second == "1";
  check_dims(a.dims());
  require(a.head_dim % 2 == 0, "layer case: metadata \"head_dim\" must be even for RoPE (got ", a.head_dim, ")");
  require(a.rope_theta > 0, "layer case: metadata \"rope_theta\" must be > 0 (got ", a.rope_theta, ")");
  require(a.rms_eps >= 0, "layer case: metadata \"rms_eps\" must be >= 0 (got ", a.rms_eps, ")");

  auto xi = f.tensors.find("x");
  require(xi != f.tensors.end(), "layer case: missing tensor \"x\" [T, d_model]");
  require(xi->second.shape.size() == 2 && xi->second.shape[1] >= 1, "layer case: tensor \"x\" must be [T, d_model] ",
          "with d_model >= 1; got ", st::shape_string(xi->second.shape));
  const std::int64_t T = xi->second.shape[0], dm = xi->second.shape[1];
  auto xo = f.tensors.find("x_out");
  require(xo != f.tensors.end(), "layer case: missing tensor \"x_out\" [T_out, d_model] (shape [0, d_model] when "
                                 "T_out = 0)");
  require(xo->second.shape.size() == 2 && xo->second.shape[1] == dm, "layer case: tensor \"x_out\" must be [T_out, ",
          "d_model = ", dm, "]; got ", st::shape_string(xo->second.shape));
  const std::int64_t T_out = xo->second.shape[0];
  require(T_out <= T, "layer case: T_out must be <= T (x_out ", st::shape_string(xo->second.shape), ", x ",
          st::shape_string(xi->second.shape), ")");
  const std::int64_t Hq = a.num_q_heads, Hkv = a.num_kv_heads, D = a.head_dim, d = Hq * D, dkv = Hkv * D;
  auto kc = f.tensors.find("k_cache");
  require(kc != f.tensors.end(), "layer case: missing tensor \"k_cache\" [P, H_kv, D] (shape [0, H_kv, D] when P = 0)");
  require(kc->second.shape.size() == 3, "layer case: tensor \"k_cache\" must be [P, H_kv, D]; got ",
          st::shape_string(kc->second.shape));
  const std::int64_t P = kc->second.shape[0];
  const st::Tensor& kct = detail::layer_tensor(f, "k_cache", {P, Hkv, D}, "[P, H_kv, D]");
  const st::Tensor& vct = detail::layer_tensor(f, "v_cache", {P, Hkv, D}, "[P, H_kv, D] (the shape of k_cache)");
  c.T = T;
  c.P = P;
  c.T_out = T_out;
  c.d_model = dm;
  c.x = st::to_matrix<S>(xi->second, "x");
  c.x_out = st::to_matrix<S>(xo->second, "x_out");
  c.x_out.resize(T_out, dm);  // a [0, d_model] tensor keeps its columns
  c.w.w_q = st::to_matrix<S>(detail::layer_tensor(f, "w_q", {dm, d}, "[d_model, H_q*D]"), "w_q");
  c.w.w_k = st::to_matrix<S>(detail::layer_tensor(f, "w_k", {dm, dkv}, "[d_model, H_kv*D]"), "w_k");
  c.w.w_v = st::to_matrix<S>(detail::layer_tensor(f, "w_v", {dm, dkv}, "[d_model, H_kv*D]"), "w_v");
  c.w.w_o = st::to_matrix<S>(detail::layer_tensor(f, "w_o", {d, dm}, "[H_q*D, d_model]"), "w_o");
  c.w.alpha = detail::to_vec<S>(detail::layer_tensor(f, "alpha", {d}, "[H_q*D]"), "alpha");
  c.w.beta = detail::to_vec<S>(detail::layer_tensor(f, "beta", {d}, "[H_q*D]"), "beta");
  c.w.alpha_out = detail::to_vec<S>(detail::layer_tensor(f, "alpha_out", {d}, "[H_q*D]"), "alpha_out");
  c.w.beta_out = detail::to_vec<S>(detail::layer_tensor(f, "beta_out", {d}, "[H_q*D]"), "beta_out");
  if (a.qk_norm) {
    c.w.q_norm = detail::to_vec<S>(detail::layer_tensor(f, "q_norm", {D}, "[D] (qk_norm is \"1\")"), "q_norm");
    c.w.k_norm = detail::to_vec<S>(detail::layer_tensor(f, "k_norm", {D}, "[D] (qk_norm is \"1\")"), "k_norm");
  } else {
    require(!f.tensors.count("q_norm") && !f.tensors.count("k_norm"),
            "layer case: metadata \"qk_norm\" is \"0\" but the case holds q_norm/k_norm (set qk_norm to \"1\" or drop "
            "them)");
  }
  // A NaN/Inf here would surface later under a derived name (a NaN in w_q as "q contains a non-finite value").
  for (const char* n : {"x", "x_out", "w_q", "w_k", "w_v", "w_o", "alpha", "beta", "alpha_out", "beta_out", "q_norm",
                        "k_norm", "k_cache", "v_cache"})
    if (f.tensors.count(n))
      orthros::detail::require_finite_tensor(f.tensors.at(n), orthros::detail::cat("layer case: tensor \"", n, "\""),
                                             "inputs, weights and the cache must be finite");
  c.cache.k = st::to_matrix<S>(kct, "k_cache");
  c.cache.v = st::to_matrix<S>(vct, "v_cache");
  c.cache.k.resize(P, dkv);
  c.cache.v.resize(P, dkv);
  return c;
}

/// Writes a layer case (inverse of load_layer_case), every tensor rounded once to `dtype`.
inline st::File make_layer_case(const LayerCase<double>& c, st::DType dtype) {
  const AttentionConfig& a = c.cfg;
  check_weights(c.w, a, c.x.cols());
  const std::int64_t Hq = a.num_q_heads, Hkv = a.num_kv_heads, D = a.head_dim;
  st::File f;
  auto vec = [&](const Vec<double>& v) {
    const Mat<double> m = Eigen::Map<const Mat<double>>(v.data(), v.size(), 1);
    return st::from_matrix<double>(m, {v.size()}, dtype);
  };
  f.tensors["x"] = st::from_matrix<double>(c.x, {c.x.rows(), c.x.cols()}, dtype);
  f.tensors["x_out"] = st::from_matrix<double>(c.x_out, {c.x_out.rows(), c.x.cols()}, dtype);
  f.tensors["w_q"] = st::from_matrix<double>(c.w.w_q, {c.w.w_q.rows(), c.w.w_q.cols()}, dtype);
  f.tensors["w_k"] = st::from_matrix<double>(c.w.w_k, {c.w.w_k.rows(), c.w.w_k.cols()}, dtype);
  f.tensors["w_v"] = st::from_matrix<double>(c.w.w_v, {c.w.w_v.rows(), c.w.w_v.cols()}, dtype);
  f.tensors["w_o"] = st::from_matrix<double>(c.w.w_o, {c.w.w_o.rows(), c.w.w_o.cols()}, dtype);
  f.tensors["alpha"] = vec(c.w.alpha);
  f.tensors["beta"] = vec(c.w.beta);
  f.tensors["alpha_out"] = vec(c.w.alpha_out);
  f.tensors["beta_out"] = vec(c.w.beta_out);
  if (a.qk_norm) {
    f.tensors["q_norm"] = vec(c.w.q_norm);
    f.tensors["k_norm"] = vec(c.w.k_norm);
  }
  f.tensors["k_cache"] = st::from_matrix<double>(c.cache.k, {c.cache.k.rows(), Hkv, D}, dtype);
  f.tensors["v_cache"] = st::from_matrix<double>(c.cache.v, {c.cache.v.rows(), Hkv, D}, dtype);
  f.metadata["num_q_heads"] = std::to_string(Hq);
  f.metadata["num_kv_heads"] = std::to_string(Hkv);
  f.metadata["head_dim"] = std::to_string(D);
  f.metadata["window"] = std::to_string(a.window);
  f.metadata["rope_theta"] = fmt17(a.rope_theta);
  f.metadata["rms_eps"] = fmt17(a.rms_eps);
  f.metadata["qk_norm"] = a.qk_norm ? "1" : "0";
  return f;
}

/// What the layer returns for a case: y, y_out and the cache after the call.
template <typename S>
struct LayerOutputs {
  Mat<S> y, y_out;
  KVCache<S> cache;
};

/// Runs orthros_attention_layer<S> on `c` (a copy of its cache is extended).
template <typename S>
LayerOutputs<S> run_layer(const LayerCase<S>& c) {
  LayerOutputs<S> r;
  r.cache = c.cache;
  auto y = orthros_attention_layer<S>(c.w, c.cfg, c.x, c.x_out, r.cache);
  r.y = std::move(y.first);
  r.y_out = std::move(y.second);
  return r;
}

namespace detail {
/// E_X of the four layer tensors: orthros_attention_layer<S> on the case's inputs in S against the
/// float64 results. An overflow of the naive operator at S makes every E_X n/a.
template <typename S>
void layer_oracle_errors(const st::File& case_file, const LayerOutputs<double>& ref,
                         std::map<std::string, check::AbsBaseline>& err) {
  const LayerCase<S> c = load_layer_case<S>(case_file);
  LayerOutputs<S> low;
  try {
    low = run_layer<S>(c);
  } catch (const Error& e) {
    if (!check::is_oracle_overflow(e)) throw;
    for (const char* n : layer_output_names()) err[n] = check::overflow_baseline(dtype_name<S>(), e);
    return;
  }
  err["y"] = check::AbsBaseline::of(check::max_abs_diff(low.y, ref.y));
  err["y_out"] = check::AbsBaseline::of(check::max_abs_diff(low.y_out, ref.y_out));
  err["k_cache_after"] = check::AbsBaseline::of(check::max_abs_diff(low.cache.k, ref.cache.k));
  err["v_cache_after"] = check::AbsBaseline::of(check::max_abs_diff(low.cache.v, ref.cache.v));
}
}  // namespace detail

/// The expected results of a layer case (Expected::layer): y `[T, d_model]`, y_out
/// `[T_out, d_model]`, k_cache_after, v_cache_after `[P+T, H_kv, D]` from the float64 layer
/// oracle, and E_X per tensor from the layer oracle at `dtype` (0 for f64); metadata as
/// compute_expected() (`dtype`, `producer`, `oracle_at_dtype_maxabs.<tensor>`, and `abs_criterion`
/// when n/a) plus `level` = "layer".
/// \throws orthros::Error on a malformed case (load_layer_case), an unknown dtype, or non-finite inputs.
inline Expected compute_layer_expected(const st::File& case_file, const std::string& dtype) {
  Expected e;
  e.dtype = dtype;
  e.layer = true;
  const LayerCase<double> c = load_layer_case<double>(case_file);
  const LayerOutputs<double> ref = run_layer<double>(c);
  const st::DType dt = parse_check_dtype(dtype);
  if (dt == st::DType::F64) {
    for (const std::string& n : e.names()) e.oracle_err[n] = check::AbsBaseline::of(0.0);
  } else if (dt == st::DType::F32) {
    detail::layer_oracle_errors<float>(case_file, ref, e.oracle_err);
  } else if (dt == st::DType::BF16) {
    detail::layer_oracle_errors<Eigen::bfloat16>(case_file, ref, e.oracle_err);
  } else {
    detail::layer_oracle_errors<Eigen::half>(case_file, ref, e.oracle_err);
  }
  const std::int64_t Hkv = c.cfg.num_kv_heads, D = c.cfg.head_dim;
  e.file.tensors["y"] = st::from_matrix<double>(ref.y, {ref.y.rows(), c.d_model}, st::DType::F64);
  e.file.tensors["y_out"] = st::from_matrix<double>(ref.y_out, {ref.y_out.rows(), c.d_model}, st::DType::F64);
  e.file.tensors["k_cache_after"] = st::from_matrix<double>(ref.cache.k, {ref.cache.k.rows(), Hkv, D}, st::DType::F64);
  e.file.tensors["v_cache_after"] = st::from_matrix<double>(ref.cache.v, {ref.cache.v.rows(), Hkv, D}, st::DType::F64);
  e.file.metadata["producer"] = "orthros golden --level layer (float64 layer oracle)";
  e.file.metadata["level"] = "layer";
  e.file.metadata["dtype"] = dtype;
  record_oracle_errors(e);
  return e;
}

/// Shapes the four layer tensors must have for a case with these sizes (report order).
inline std::vector<std::pair<std::string, std::vector<std::int64_t>>> layer_output_shapes(
    std::int64_t T, std::int64_t P, std::int64_t T_out, std::int64_t d_model, std::int64_t Hkv, std::int64_t D) {
  return {{"y", {T, d_model}}, {"y_out", {T_out, d_model}}, {"k_cache_after", {P + T, Hkv, D}},
          {"v_cache_after", {P + T, Hkv, D}}};
}

}  // namespace orthros::portkit
