// Python bindings of the Orthros CPU oracle: the compiled module `orthros._core`, re-exported
// by the package `orthros` (verify/python/orthros/__init__.py), so every name is used as `orthros.<name>`.
//
// Tensors are NumPy arrays in the layout of SPEC §5: q [T, H_q, D], k/v [P+T, H_kv, D],
// q_out [T_out, H_q, D]; o [T, H_q, D], lse [T, H_q]. The backward: do [T, H_q, D],
// do_out [T_out, H_q, D] -> dq [T, H_q, D], dq_out [T_out, H_q, D], dk/dv [P+T, H_kv, D]. Every
// orthros::Error surfaces as orthros.Error, a subclass of ValueError carrying the C++ message
// unchanged.
#include "orthros/attention.hpp"
#include "orthros/attention_backward.hpp"
#include "orthros/check.hpp"
#include "orthros/configs.hpp"
#include "orthros/model.hpp"
#include "orthros/regimes.hpp"
#include "orthros/rope.hpp"
#include "orthros/tensor.hpp"
#include "numpy_mat.hpp"
#include "py_args.hpp"
#include "report_dict.hpp"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace py = pybind11;
using orthros::Mat;
using orthros::python::flat_f64;
using orthros::python::from_mat;
using orthros::python::np_dtype;
using orthros::python::require_v_like_k;
using orthros::python::shape_of;
using orthros::python::shape_str;
using orthros::python::to_mat3;
using orthros::python::arg_array;
using orthros::python::arg_count;
using orthros::python::report_dict;
using orthros::python::arg_optional_number;
using orthros::python::arg_scale;
using orthros::python::arg_str;
using orthros::python::arg_window;
using orthros::require;

namespace {

// ---- attention ----------------------------------------------------------------------

template <typename S>
py::dict attention_at(const py::array& q, const py::array& k, const py::array& v, const py::array& q_out,
                      std::int64_t window, std::optional<double> scale) {
  require(q.ndim() == 3, "q must be a 3-d array [T, H_q, D]; got shape ", shape_str(q));
  require(k.ndim() == 3, "k must be a 3-d array [P+T, H_kv, D]; got shape ", shape_str(k));
  const std::int64_t Hq = q.shape(1), D = q.shape(2), Hkv = k.shape(1);
  require_v_like_k(k, v);
  Mat<S> mq = to_mat3<S>(q, "q", Hq, D), mk = to_mat3<S>(k, "k", Hkv, D), mv = to_mat3<S>(v, "v", Hkv, D),
         mqo = to_mat3<S>(q_out, "q_out", Hq, D);
  orthros::AttentionResult<S> r;
  {
    py::gil_scoped_release release;
    r = orthros::orthros_attention<S>(mq, mk, mv, mqo,
                                      orthros::AttentionDims{static_cast<int>(Hq), static_cast<int>(Hkv),
                                                             static_cast<int>(D)},
                                      orthros::AttentionOptions{window, scale});
  }
  py::dict out;
  out["o"] = from_mat(r.o, Hq, D);
  out["o_out"] = from_mat(r.o_out, Hq, D);
  out["lse"] = from_mat(r.lse, Hq, 0);
  out["lse_out"] = from_mat(r.lse_out, Hq, 0);
  return out;
}

py::dict attention(const py::array& q, const py::array& k, const py::array& v, const py::array& q_out,
                   std::int64_t window, std::optional<double> scale, std::optional<std::string> precision) {
  const std::string p = precision ? *precision : np_dtype(q, "q");
  if (p == "f64") return attention_at<double>(q, k, v, q_out, window, scale);
  if (p == "f32") return attention_at<float>(q, k, v, q_out, window, scale);
  if (p == "bf16") return attention_at<Eigen::bfloat16>(q, k, v, q_out, window, scale);
  if (p == "f16") return attention_at<Eigen::half>(q, k, v, q_out, window, scale);
  throw orthros::Error("precision must be one of f64, f32, bf16, f16 (got \"" + p + "\")");
}

// ---- SPEC §6 check -------------------------------------------------------------------

py::dict check_tensor(const py::array& actual, const py::array& reference, const std::string& dtype,
                      std::optional<double> oracle_at_dtype_maxabs, const std::string& name,
                      std::optional<std::string> abs_na_reason, std::int64_t lse_max_keys) {
  orthros::check::rel_tolerance(dtype);  // validates the name
  orthros::check::AbsBaseline b;
  if (oracle_at_dtype_maxabs) {
    require(!abs_na_reason, "give either oracle_at_dtype_maxabs or abs_na_reason, not both");
    b = orthros::check::AbsBaseline::of(*oracle_at_dtype_maxabs);
  } else if (abs_na_reason) {
    b = orthros::check::AbsBaseline::not_applicable(*abs_na_reason);
  } else {
    // A missing E_X is never taken as 0, except at f64 where the oracle is the reference.
    require(dtype == "f64", "oracle_at_dtype_maxabs is required for dtype ", dtype,
            " (the max abs error of the oracle at ", dtype,
            "; check_attention computes it), or abs_na_reason when that oracle has no finite answer");
    b = orthros::check::AbsBaseline::of(0.0);
  }
  return report_dict(orthros::check::compare(name, flat_f64(actual, "actual"), shape_of(actual),
                                             flat_f64(reference, "reference"), shape_of(reference), dtype, b,
                                             lse_max_keys));
}

/// Runs the float64 oracle and the oracle at `dtype` on the case, then SPEC §6 on each of the
/// four outputs of `result` (a mapping with o, o_out, lse, lse_out).
py::dict check_attention(const py::object& result, const py::array& q, const py::array& k, const py::array& v,
                         const py::array& q_out, std::int64_t window, std::optional<double> scale,
                         const std::string& dtype) {
  orthros::check::rel_tolerance(dtype);  // validates the name
  // Inputs as the port saw them: rounded to its dtype, then widened exactly for the f64 oracle.
  // The naive oracle at dtype may have no finite answer (scores overflow it): then E_X does not
  // exist and criterion 2 is n/a for every tensor (check.hpp); never taken as 0.
  py::dict low;
  std::optional<orthros::check::AbsBaseline> na;
  try {
    low = attention(q, k, v, q_out, window, scale, dtype);
  } catch (const orthros::Error& err) {
    if (!orthros::check::is_oracle_overflow(err)) throw;
    na = orthros::check::overflow_baseline(dtype, err);
  }
  py::dict rounded;  // inputs rounded to dtype: round-trip through the oracle's own conversion
  {
    auto round = [&](const py::array& a, const char* n) -> py::array {
      const std::int64_t H = a.ndim() == 3 ? a.shape(1) : -1, Dd = a.ndim() == 3 ? a.shape(2) : -1;
      if (dtype == "f64") return from_mat(to_mat3<double>(a, n, H, Dd), H, Dd);
      if (dtype == "f32") return from_mat(to_mat3<float>(a, n, H, Dd), H, Dd);
      if (dtype == "bf16") return from_mat(to_mat3<Eigen::bfloat16>(a, n, H, Dd), H, Dd);
      return from_mat(to_mat3<Eigen::half>(a, n, H, Dd), H, Dd);
    };
    rounded["q"] = round(q, "q");
    rounded["k"] = round(k, "k");
    rounded["v"] = round(v, "v");
    rounded["q_out"] = round(q_out, "q_out");
  }
  py::dict ref = attention(rounded["q"].cast<py::array>(), rounded["k"].cast<py::array>(),
                           rounded["v"].cast<py::array>(), rounded["q_out"].cast<py::array>(), window, scale,
                           std::string("f64"));
  py::dict tensors;
  bool all = true;
  for (const char* name : {"o", "o_out", "lse", "lse_out"}) {
    require(py::hasattr(result, "__getitem__") && result.attr("__contains__")(name).cast<bool>(),
            "result must contain '", name, "'");
    py::array act = py::array::ensure(result[name]);
    require(static_cast<bool>(act), "result['", name, "'] is not an array");
    const std::vector<double> r64 = flat_f64(ref[name].cast<py::array>(), name);
    orthros::check::AbsBaseline b;
    if (na) {
      b = *na;
    } else {
      const std::vector<double> l64 = flat_f64(low[name].cast<py::array>(), name);
      double e = 0;
      for (size_t i = 0; i < r64.size(); ++i) e = std::max(e, std::abs(l64[i] - r64[i]));
      b = orthros::check::AbsBaseline::of(e);
    }
    const std::int64_t T = q.ndim() >= 1 ? q.shape(0) : 0, T_out = q_out.ndim() >= 1 ? q_out.shape(0) : 0;
    const std::int64_t P = (k.ndim() >= 1 ? k.shape(0) : 0) - T;  // the oracle above validated the shapes
    auto rep = orthros::check::compare(name, flat_f64(act, name), shape_of(act), r64,
                                       shape_of(ref[name].cast<py::array>()), dtype, b,
                                       orthros::check::lse_max_keys(name, P, T, T_out, window));
    all = all && rep.pass;
    tensors[name] = report_dict(rep);
  }
  py::dict out;
  out["pass"] = all;
  out["dtype"] = dtype;
  out["abs_criterion"] = na ? "n/a (" + na->why_na + ")" : std::string("applied");
  out["tensors"] = tensors;
  return out;
}

// ---- backward -----------------------------------------------------------------------

/// The backward's inputs as Mat<S> (each rounded to S once, as to_mat3 does) and their dims.
template <typename S>
struct BackwardArgs {
  Mat<S> q, k, v, q_out, dout, dout_out;  ///< [T, H_q*D], [P+T, H_kv*D] x2, [T_out, H_q*D], [T, H_q*D], [T_out, H_q*D]
  orthros::AttentionDims dims;
};

/// Converts and shape-checks the NumPy inputs of the backward (heads and head_dim from q and k;
/// row counts are checked by orthros_attention(_backward)). \throws orthros::Error naming the array.
template <typename S>
BackwardArgs<S> backward_args(const py::array& q, const py::array& k, const py::array& v, const py::array& q_out,
                              const py::array& dout, const py::array& dout_out) {
  require(q.ndim() == 3, "q must be a 3-d array [T, H_q, D]; got shape ", shape_str(q));
  require(k.ndim() == 3, "k must be a 3-d array [P+T, H_kv, D]; got shape ", shape_str(k));
  const std::int64_t Hq = q.shape(1), D = q.shape(2), Hkv = k.shape(1);
  require_v_like_k(k, v);
  BackwardArgs<S> a;
  a.q = to_mat3<S>(q, "q", Hq, D);
  a.k = to_mat3<S>(k, "k", Hkv, D);
  a.v = to_mat3<S>(v, "v", Hkv, D);
  a.q_out = to_mat3<S>(q_out, "q_out", Hq, D);
  a.dout = to_mat3<S>(dout, "do", Hq, D);
  a.dout_out = to_mat3<S>(dout_out, "do_out", Hq, D);
  a.dims = orthros::AttentionDims{static_cast<int>(Hq), static_cast<int>(Hkv), static_cast<int>(D)};
  return a;
}

/// Names of the four gradients, in report order.
constexpr const char* kGradNames[4] = {"dq", "dq_out", "dk", "dv"};

/// The gradient `name` of `g` (one of kGradNames).
template <typename S>
const Mat<S>& grad_of(const orthros::AttentionGrads<S>& g, const std::string& name) {
  if (name == "dq") return g.dq;
  if (name == "dq_out") return g.dq_out;
  if (name == "dk") return g.dk;
  return g.dv;
}

template <typename S>
py::dict attention_backward_at(const py::array& q, const py::array& k, const py::array& v, const py::array& q_out,
                               const py::array& dout, const py::array& dout_out, std::int64_t window,
                               std::optional<double> scale) {
  const BackwardArgs<S> a = backward_args<S>(q, k, v, q_out, dout, dout_out);
  orthros::AttentionGrads<S> g;
  {
    py::gil_scoped_release release;
    g = orthros::orthros_attention_backward<S>(a.q, a.k, a.v, a.q_out, a.dout, a.dout_out, a.dims,
                                               orthros::AttentionOptions{window, scale});
  }
  py::dict out;
  out["dq"] = from_mat(g.dq, a.dims.num_q_heads, a.dims.head_dim);
  out["dq_out"] = from_mat(g.dq_out, a.dims.num_q_heads, a.dims.head_dim);
  out["dk"] = from_mat(g.dk, a.dims.num_kv_heads, a.dims.head_dim);
  out["dv"] = from_mat(g.dv, a.dims.num_kv_heads, a.dims.head_dim);
  return out;
}

py::dict attention_backward(const py::array& q, const py::array& k, const py::array& v, const py::array& q_out,
                            const py::array& dout, const py::array& dout_out, std::int64_t window,
                            std::optional<double> scale, std::optional<std::string> precision) {
  const std::string p = precision ? *precision : np_dtype(q, "q");
  if (p == "f64") return attention_backward_at<double>(q, k, v, q_out, dout, dout_out, window, scale);
  if (p == "f32") return attention_backward_at<float>(q, k, v, q_out, dout, dout_out, window, scale);
  if (p == "bf16") return attention_backward_at<Eigen::bfloat16>(q, k, v, q_out, dout, dout_out, window, scale);
  if (p == "f16") return attention_backward_at<Eigen::half>(q, k, v, q_out, dout, dout_out, window, scale);
  throw orthros::Error("precision must be one of f64, f32, bf16, f16 (got \"" + p + "\")");
}

/// check_attention for the gradients: inputs and upstream gradients rounded to S (as the port saw
/// them), the float64 backward on them widened exactly, the backward at S for E_X (n/a when the
/// forward or the backward at S overflows), SPEC §6 on dq, dq_out, dk, dv of `result`.
template <typename S>
py::dict check_backward_at(const py::object& result, const py::array& q, const py::array& k, const py::array& v,
                           const py::array& q_out, const py::array& dout, const py::array& dout_out,
                           std::int64_t window, std::optional<double> scale, const std::string& dtype) {
  const BackwardArgs<S> a = backward_args<S>(q, k, v, q_out, dout, dout_out);
  const orthros::AttentionOptions opt{window, scale};
  orthros::AttentionGrads<double> ref;
  orthros::AttentionGrads<S> low;
  std::optional<orthros::check::AbsBaseline> na;
  {
    py::gil_scoped_release release;
    ref = orthros::orthros_attention_backward<double>(
        a.q.template cast<double>(), a.k.template cast<double>(), a.v.template cast<double>(),
        a.q_out.template cast<double>(), a.dout.template cast<double>(), a.dout_out.template cast<double>(), a.dims,
        opt);
    try {
      low = orthros::orthros_attention_backward<S>(a.q, a.k, a.v, a.q_out, a.dout, a.dout_out, a.dims, opt);
    } catch (const orthros::Error& err) {
      if (!orthros::check::is_oracle_overflow(err)) throw;
      na = orthros::check::overflow_baseline(dtype, err);
    }
  }
  const std::int64_t T = a.q.rows(), T_out = a.q_out.rows(), P = a.k.rows() - T;
  py::dict tensors;
  bool all = true;
  for (const char* name : kGradNames) {
    require(py::hasattr(result, "__getitem__") && result.attr("__contains__")(name).cast<bool>(),
            "result must contain '", name, "' (check_attention_backward judges dq, dq_out, dk, dv)");
    py::array act = py::array::ensure(result[name]);
    require(static_cast<bool>(act), "result['", name, "'] is not an array");
    const Mat<double>& r = grad_of(ref, name);
    const bool kv = name[1] == 'k' || name[1] == 'v';
    const std::int64_t H = kv ? a.dims.num_kv_heads : a.dims.num_q_heads;
    const orthros::check::AbsBaseline b =
        na ? *na : orthros::check::AbsBaseline::of(orthros::check::max_abs_diff(grad_of(low, name), r));
    const auto rep = orthros::check::compare(name, flat_f64(act, name), shape_of(act), orthros::check::to_f64(r),
                                             {r.rows(), H, a.dims.head_dim}, dtype, b);
    all = all && rep.pass;
    py::dict d = report_dict(rep);
    // absolute positions: dq base rows, dq_out output rows, dk/dv cache rows
    const std::int64_t first_position = kv ? 1 : (std::string(name) == "dq_out" ? P + T - T_out : P) + 1;
    std::vector<std::int64_t> pos;
    for (auto row : rep.bad_rows) pos.push_back(first_position + row);
    d["bad_positions"] = pos;
    py::list pos_runs;
    for (const auto& [first, last] : rep.bad_row_ranges)
      pos_runs.append(py::make_tuple(first_position + first, first_position + last));
    d["bad_position_ranges"] = pos_runs;
    tensors[name] = d;
  }
  py::dict out;
  out["pass"] = all;
  out["dtype"] = dtype;
  out["abs_criterion"] = na ? "n/a (" + na->why_na + ")" : std::string("applied");
  out["tensors"] = tensors;
  return out;
}

py::dict check_attention_backward(const py::object& result, const py::array& q, const py::array& k,
                                  const py::array& v, const py::array& q_out, const py::array& dout,
                                  const py::array& dout_out, std::int64_t window, std::optional<double> scale,
                                  const std::string& dtype) {
  orthros::check::rel_tolerance(dtype);  // validates the name
  if (dtype == "f64") return check_backward_at<double>(result, q, k, v, q_out, dout, dout_out, window, scale, dtype);
  if (dtype == "f32") return check_backward_at<float>(result, q, k, v, q_out, dout, dout_out, window, scale, dtype);
  if (dtype == "bf16")
    return check_backward_at<Eigen::bfloat16>(result, q, k, v, q_out, dout, dout_out, window, scale, dtype);
  return check_backward_at<Eigen::half>(result, q, k, v, q_out, dout, dout_out, window, scale, dtype);
}

// ---- model and regimes ---------------------------------------------------------------

template <typename S>
struct PyCache {
  orthros::ModelCache<S> cache;
};

template <typename S>
struct PyModel {
  orthros::ModelConfig config;
  orthros::ModelWeights<S> weights;
  PyModel(const std::string& name, int d_model, int num_layers, std::uint64_t seed)
      : config(orthros::model_config(name, d_model, num_layers)),
        weights(orthros::random_weights<S>(config, seed)) {}
};

template <typename S>
void bind_model(py::module_& m, const char* model_name, const char* cache_name) {
  using M = PyModel<S>;
  using C = PyCache<S>;
  py::class_<C>(m, cache_name, "Per-sequence KV cache of every layer (never evicted).")
      .def_property_readonly("length", [](const C& c) { return c.cache.length(); },
                             "P: number of positions already cached")
      .def(
          "layer_kv",
          [](const C& c, int layer) {
            require(layer >= 0 && layer < static_cast<int>(c.cache.layers.size()), "layer must be in [0, ",
                    c.cache.layers.size(), ") (got ", layer, ")");
            const auto& l = c.cache.layers[static_cast<size_t>(layer)];
            const std::int64_t cols = l.k.cols();
            return py::make_tuple(from_mat(l.k, cols, 0), from_mat(l.v, cols, 0));
          },
          py::arg("layer"), "Post-RoPE keys and values of one layer, each [P, H_kv*D].");
  py::class_<M>(m, model_name,
                "Seeded byte-level Orthros Transformer with a named configuration's attention shapes (SPEC §3, §7).")
      .def(py::init<const std::string&, int, int, std::uint64_t>(), py::arg("config") = "tiny",
           py::arg("d_model") = 32, py::arg("num_layers") = 2, py::arg("seed") = 0)
      .def_property_readonly("vocab_size", [](const M& s) { return s.config.vocab_size; })
      .def_property_readonly("window", [](const M& s) { return s.config.attn.window; })
      .def("new_cache", [](const M& s) { return C{orthros::empty_cache<S>(s.config)}; }, "An empty cache (P = 0).")
      .def(
          "pretrain",
          [](const M& s, const std::vector<int>& tokens) {
            py::gil_scoped_release r;
            Mat<S> l = orthros::pretrain<S>(s.weights, s.config, tokens);
            py::gil_scoped_acquire a;
            return from_mat(l, 0, 0);
          },
          py::arg("tokens"), "Pre-training (T_out = T): logits [T, V].")
      .def(
          "sft",
          [](const M& s, const std::vector<int>& tokens, std::int64_t t_out) {
            return from_mat(orthros::sft<S>(s.weights, s.config, tokens, t_out), 0, 0);
          },
          py::arg("tokens"), py::arg("t_out"), "SFT: logits of the last t_out positions [t_out, V].")
      .def(
          "prefill",
          [](const M& s, const std::vector<int>& prompt, C& cache) {
            return from_mat(orthros::prefill<S>(s.weights, s.config, prompt, cache.cache), 0, 0);
          },
          py::arg("prompt"), py::arg("cache"), "Prefill (T_out = 1), continuing `cache`: logits [1, V].")
      .def(
          "prefill_chunk",
          [](const M& s, const std::vector<int>& chunk, C& cache) {
            orthros::prefill_chunk<S>(s.weights, s.config, chunk, cache.cache);
          },
          py::arg("chunk"), py::arg("cache"), "A prefill chunk that is not the last (T_out = 0).")
      .def(
          "prefill_chunked",
          [](const M& s, const std::vector<int>& prompt, const std::vector<Eigen::Index>& sizes, C& cache) {
            return from_mat(orthros::prefill_chunked<S>(s.weights, s.config, prompt, sizes, cache.cache), 0, 0);
          },
          py::arg("prompt"), py::arg("chunk_sizes"), py::arg("cache"), "Chunked prefill: logits [1, V].")
      .def(
          "decode_step",
          [](const M& s, int token, C& cache) {
            return from_mat(orthros::decode_step<S>(s.weights, s.config, token, cache.cache), 0, 0);
          },
          py::arg("token"), py::arg("cache"), "One decode pair: logits [1, V] at the new position.")
      .def(
          "decode_batch",
          [](const M& s, const std::vector<int>& tokens, std::vector<C*> caches) {
            std::vector<orthros::ModelCache<S>*> cs;
            for (C* c : caches) {
              require(c != nullptr, "decode_batch: caches must not contain None");
              cs.push_back(&c->cache);
            }
            return from_mat(orthros::decode_batch<S>(s.weights, s.config, tokens, cs), 0, 0);
          },
          py::arg("tokens"), py::arg("caches"), "Ragged batched decode: logits [B, V].");
}

}  // namespace

void bind_diagnose(py::module_& m);  // diagnose_py.cpp: _diagnose, lse_max_keys, lse_f32_floor
void bind_layer(py::module_& m);  // orthros_py_layer.cpp

PYBIND11_MODULE(_core, m) {
  m.doc() = "Orthros attention CPU oracle (arXiv 2610.13735): attention operator, SPEC §6 checker, model regimes";
  bind_diagnose(m);
  static py::exception<orthros::Error> error(m, "Error", PyExc_ValueError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const orthros::Error& e) {
      PyErr_SetString(error.ptr(), e.what());
    }
  });

  // Arguments arrive as Python objects and are converted here (py_args.hpp): bad ones raise
  // orthros.Error naming the parameter instead of pybind11's signature dump.
  constexpr const char* kQ = "[T, H_q, D]";
  constexpr const char* kKV = "[P+T, H_kv, D]";
  constexpr const char* kQO = "[T_out, H_q, D]";
  constexpr const char* kDtypes = "\"f64\", \"f32\", \"bf16\", \"f16\"";
  auto attention_py = [=](py::object q, py::object k, py::object v, py::object q_out, py::object window,
                          py::object scale, py::object precision) {
    return attention(arg_array(q, "q", kQ), arg_array(k, "k", kKV), arg_array(v, "v", kKV),
                     arg_array(q_out, "q_out", kQO), arg_window(window), arg_scale(scale),
                     arg_str(precision, "precision", kDtypes, true));
  };
  auto check_py = [=](py::object actual, py::object reference, py::object dtype, py::object e_x, py::object name,
                      py::object na, py::object lse_max_keys) {
    return check_tensor(arg_array(actual, "actual", "(the port's tensor)"),
                        arg_array(reference, "reference", "(the float64 oracle's tensor)"),
                        *arg_str(dtype, "dtype", kDtypes, false), arg_optional_number(e_x, "oracle_at_dtype_maxabs"),
                        *arg_str(name, "name", "a tensor name", false),
                        arg_str(na, "abs_na_reason", "a reason (a string)", true),
                        arg_count(lse_max_keys, "lse_max_keys"));
  };
  auto check_attention_py = [=](py::object result, py::object q, py::object k, py::object v, py::object q_out,
                                py::object window, py::object scale, py::object dtype) {
    return check_attention(result, arg_array(q, "q", kQ), arg_array(k, "k", kKV), arg_array(v, "v", kKV),
                           arg_array(q_out, "q_out", kQO), arg_window(window), arg_scale(scale),
                           *arg_str(dtype, "dtype", kDtypes, false));
  };
  auto attention_backward_py = [=](py::object q, py::object k, py::object v, py::object q_out, py::object dout,
                                   py::object dout_out, py::object window, py::object scale, py::object precision) {
    return attention_backward(arg_array(q, "q", kQ), arg_array(k, "k", kKV), arg_array(v, "v", kKV),
                              arg_array(q_out, "q_out", kQO), arg_array(dout, "do", kQ),
                              arg_array(dout_out, "do_out", kQO), arg_window(window), arg_scale(scale),
                              arg_str(precision, "precision", kDtypes, true));
  };
  auto check_attention_backward_py = [=](py::object result, py::object q, py::object k, py::object v,
                                         py::object q_out, py::object dout, py::object dout_out, py::object window,
                                         py::object scale, py::object dtype) {
    return check_attention_backward(result, arg_array(q, "q", kQ), arg_array(k, "k", kKV), arg_array(v, "v", kKV),
                                    arg_array(q_out, "q_out", kQO), arg_array(dout, "do", kQ),
                                    arg_array(dout_out, "do_out", kQO), arg_window(window), arg_scale(scale),
                                    *arg_str(dtype, "dtype", kDtypes, false));
  };

  m.def("attention", attention_py, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("q_out"), py::arg("window"),
        py::arg("scale") = py::none(), py::arg("precision") = py::none(),
        R"doc(The Orthros attention operator (paper Eq. 2; SPEC §2, §5).

q [T, H_q, D], k and v [P+T, H_kv, D], q_out [T_out, H_q, D]: float64, float32 or float16.
window >= 1 (keys, current token included); scale defaults to 1/sqrt(D).
precision: None (the inputs' dtype) or "f64"/"f32"/"bf16"/"f16": the oracle at that precision
(inputs rounded to it). Returns a dict with o [T, H_q, D], o_out [T_out, H_q, D], lse [T, H_q],
lse_out [T_out, H_q] (natural log). Raises orthros.Error (a ValueError) on bad input.)doc");
  m.def("check", check_py, py::arg("actual"), py::arg("reference"), py::arg("dtype"),
        py::arg("oracle_at_dtype_maxabs") = py::none(), py::arg("name") = "out", py::arg("abs_na_reason") = py::none(),
        py::arg("lse_max_keys") = 0,
        R"doc(SPEC §6 on one tensor against a float64 reference; returns the report as a dict (key 'pass').

oracle_at_dtype_maxabs: E_X, the max abs error of the oracle at `dtype` (required unless dtype is
"f64", where it is 0). abs_na_reason instead of it: the naive oracle at `dtype` has no finite
answer, so the max-abs criterion is not applicable (report: abs_tol None, abs_criterion "n/a (...)").
lse_max_keys: for an LSE tensor (lse, lse_out) the most keys one of its rows sees (lse: min(w, P+T),
lse_out: P+T); when > 0 and dtype is not f64 the abs bound gains the float32 LSE floor
F = 2^-24 (5 max|reference| + 6 ln lse_max_keys) (SPEC §6; report key 'lse_f32_floor'), and (any
dtype) the relative error divides by ||max(|reference|, 1)||_F instead of ||reference||_F (SPEC §6: an
LSE near 0 is judged by the relative error of exp(lse); report key 'rel_lse_scale').)doc");
  m.def("check_attention", check_attention_py, py::arg("result"), py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("q_out"), py::arg("window"), py::arg("scale") = py::none(), py::arg("dtype") = "f32",
        R"doc(Checks a port's attention outputs under SPEC §6.

result: mapping with o, o_out, lse, lse_out (any float dtype). The inputs are rounded to `dtype`
(as the port saw them), the float64 oracle and the oracle at `dtype` are run, and each tensor is
compared. When the naive oracle at `dtype` overflows (scores beyond the dtype's range), the
max-abs criterion is not applicable: each report has abs_tol None and abs_criterion
"n/a (naive <dtype> oracle overflows: ...)", and the relative and NaN/Inf criteria decide.
Returns {'pass': bool, 'dtype': str, 'tensors': {name: report}}. One assert:
    assert orthros.check_attention(out, q, k, v, q_out, window=w, dtype="bf16")["pass"])doc");
  m.def("attention_backward", attention_backward_py, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("q_out"),
        py::arg("do"), py::arg("do_out"), py::arg("window"), py::arg("scale") = py::none(),
        py::arg("precision") = py::none(),
        R"doc(Backward of the Orthros attention operator (docs/SPEC.md "Backward").

q [T, H_q, D], k and v [P+T, H_kv, D], q_out [T_out, H_q, D] as for attention(); do [T, H_q, D]
= dL/do and do_out [T_out, H_q, D] = dL/do_out, the upstream gradients of the two streams.
Arrays: float64, float32 or float16, any strides (copied in C order). window >= 1; scale
defaults to 1/sqrt(D). precision: None (q's dtype) or "f64"/"f32"/"bf16"/"f16": the oracle at
that precision (inputs rounded to it once; bf16/f16 accumulate in float32).
Returns a dict with dq [T, H_q, D], dq_out [T_out, H_q, D], dk [P+T, H_kv, D], dv [P+T, H_kv, D]
(float64 at f64, float32 at f32 and bf16, float16 at f16). dk and dv sum both streams and every
query head of the GQA group; cache rows no query sees get 0. Runs the forward, then the
softmax backward from its saved LSE (FlashAttention-2's form).
Raises orthros.Error (a ValueError) naming the parameter on bad input (shapes, window < 1,
H_q % H_kv != 0, T_out > T, a non-finite value in any array), and with a message starting
"attention gradients overflow" (or "scaled scores q.k*scale overflow") when finite inputs have
no finite answer at `precision`.
Source: reference/include/orthros/attention_backward.hpp (orthros_attention_backward).)doc");
  m.def("check_attention_backward", check_attention_backward_py, py::arg("result"), py::arg("q"), py::arg("k"),
        py::arg("v"), py::arg("q_out"), py::arg("do"), py::arg("do_out"), py::arg("window"),
        py::arg("scale") = py::none(), py::arg("dtype") = "f32",
        R"doc(Checks a port's gradients under SPEC §6 (the rule of check_attention, per gradient).

result: mapping with dq [T, H_q, D], dq_out [T_out, H_q, D], dk [P+T, H_kv, D], dv [P+T, H_kv, D]
(any float dtype; other keys such as o are ignored: judge those with check_attention). The
inputs and upstream gradients (shapes as in attention_backward) are rounded to `dtype` (as the
port saw them); the float64 backward runs on them, and the backward at `dtype` (forward then
backward at that precision) gives E_X per gradient. When the oracle at `dtype` overflows
(forward scores or a gradient beyond the dtype's range), the max-abs criterion is not
applicable: abs_tol None, abs_criterion "n/a (naive <dtype> oracle overflows: ...)".
Returns {'pass': bool, 'dtype': str, 'abs_criterion': str, 'tensors': {name: report}}; each
report is check()'s plus 'bad_positions', the absolute positions of 'bad_rows' (dq: P+row+1,
dq_out: P+T-T_out+row+1, dk/dv: cache row + 1). Raises orthros.Error on bad input or a result
without one of the four gradients. One assert:
    assert orthros.check_attention_backward(grads, q, k, v, q_out, do, do_out, window=w, dtype="bf16")["pass"]
Source: verify/python/orthros_py.cpp, verify/kit/include/orthros/check.hpp.)doc");
  m.def("rel_tolerance", &orthros::check::rel_tolerance, py::arg("dtype"),
        "Relative Frobenius tolerance of SPEC §6 for dtype f64/f32/bf16/f16.");
  m.def(
      "rope",
      [](const py::array& x, const std::vector<std::int64_t>& positions, double theta) {
        require(x.ndim() == 3, "x must be [T, H, D]; got shape ", shape_str(x));
        Mat<double> m = to_mat3<double>(x, "x", -1, -1);
        const int D = static_cast<int>(x.shape(2)), H = static_cast<int>(x.shape(1));
        require(D % 2 == 0, "head_dim must be even for RoPE (got ", D, ")");
        require(static_cast<std::int64_t>(positions.size()) == m.rows(), "positions must have one entry per row (",
                m.rows(), "); got ", positions.size());
        for (Eigen::Index r = 0; r < m.rows(); ++r)
          for (int h = 0; h < H; ++h) orthros::apply_rope(m.data() + r * m.cols() + h * D, D, positions[r], theta);
        return from_mat(m, H, D);
      },
      py::arg("x"), py::arg("positions"), py::arg("theta"),
      "Rotate-half RoPE (SPEC §2) of x [T, H, D] at 0-based positions (float64). An output-specific "
      "query takes its base token's position.");
  m.def(
      "attention_config",
      [](const std::string& name) {
        const auto a = orthros::attention_config(name);
        py::dict d;
        d["num_q_heads"] = a.num_q_heads;
        d["num_kv_heads"] = a.num_kv_heads;
        d["head_dim"] = a.head_dim;
        d["window"] = a.window;
        d["rope_theta"] = a.rope_theta;
        d["qk_norm"] = a.qk_norm;
        return d;
      },
      py::arg("name"), "Attention shapes of a SPEC §7 configuration (qwen3-8b, llama3.1-8b, tiny).");

  bind_layer(m);
  bind_model<double>(m, "Model", "Cache");
  bind_model<float>(m, "ModelF32", "CacheF32");
}
