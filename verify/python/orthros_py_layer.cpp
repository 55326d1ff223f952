// Python bindings of the oracle's attention layer (layer.hpp, layer_backward.hpp) in the module
// `orthros._core`: layer_forward over a ragged batch with per-sequence KV caches, and the training
// backward (P = 0). NumPy float32/float64 arrays, C order (any strides are copied); the CPU
// implementation of the orthros.torch layer ops calls these.
//
// Layouts (SPEC §2, §5): x [sum T_b, d_model], x_out [sum T_out_b, d_model], w_q [d_model, H_q*D],
// w_k / w_v [d_model, H_kv*D], w_o [H_q*D, d_model], alpha/beta/alpha_out/beta_out [H_q*D],
// q_norm/k_norm [D]; a KV cache [P_b, H_kv, D] per sequence (post-RoPE keys, values).
#include "orthros/layer.hpp"
#include "orthros/layer_backward.hpp"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace py = pybind11;
using orthros::Mat;
using orthros::require;
using orthros::Vec;

namespace {

std::string shape_of(const py::array& a) {
  std::string s = "[";
  for (py::ssize_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + "]";
}

/// Float32/float64 array of `ndim` dimensions (named in errors) copied into a row-major Mat<S> of
/// `rows` x (product of the other axes).
template <typename S>
Mat<S> to_mat(const py::handle& obj, const char* name, int ndim) {
  require(py::isinstance<py::array>(obj), name, " must be a NumPy array (got ", py::str(py::type::of(obj)).cast<std::string>(), ")");
  const py::array a = py::reinterpret_borrow<py::array>(obj);
  require(a.ndim() == ndim, name, " must be a ", ndim, "-d array; got shape ", shape_of(a));
  const py::dtype dt = a.dtype();
  require(dt.kind() == 'f' && (dt.itemsize() == 4 || dt.itemsize() == 8), name,
          " must be a float32 or float64 array (got dtype ", py::str(static_cast<const py::handle&>(dt)).cast<std::string>(), ")");
  const Eigen::Index rows = ndim == 1 ? 1 : a.shape(0);
  Eigen::Index cols = 1;
  for (int i = ndim == 1 ? 0 : 1; i < ndim; ++i) cols *= a.shape(i);
  Mat<S> m(rows, cols);
  auto c = py::array_t<S, py::array::c_style | py::array::forcecast>::ensure(a);
  if (m.size()) std::memcpy(m.data(), c.data(), sizeof(S) * static_cast<size_t>(m.size()));
  return m;
}

template <typename S>
Vec<S> to_vec(const py::handle& obj, const char* name) {
  const Mat<S> m = to_mat<S>(obj, name, 1);
  return Eigen::Map<const Vec<S>>(m.data(), m.size());
}

/// Mat<S> [rows, cols] -> NumPy array of `shape` (rows * ... = size).
template <typename S>
py::array from_mat(const Mat<S>& m, std::vector<py::ssize_t> shape) {
  py::array_t<S> out(shape);
  if (m.size()) std::memcpy(out.mutable_data(), m.data(), sizeof(S) * static_cast<size_t>(m.size()));
  return std::move(out);
}

template <typename S>
py::array from_vec(const Vec<S>& v) {
  py::array_t<S> out(static_cast<py::ssize_t>(v.size()));
  if (v.size()) std::memcpy(out.mutable_data(), v.data(), sizeof(S) * static_cast<size_t>(v.size()));
  return std::move(out);
}

orthros::AttentionConfig config_of(int num_q_heads, int num_kv_heads, int head_dim, std::int64_t window,
                                   double rope_theta, bool qk_norm, double rms_eps) {
  orthros::AttentionConfig c;
  c.num_q_heads = num_q_heads;
  c.num_kv_heads = num_kv_heads;
  c.head_dim = head_dim;
  c.window = window;
  c.rope_theta = rope_theta;
  c.qk_norm = qk_norm;
  c.rms_eps = rms_eps;
  orthros::check_dims(c.dims());
  orthros::check_window(window);
  require(head_dim % 2 == 0, "head_dim must be even for RoPE (got ", head_dim, ")");
  require(std::isfinite(rope_theta) && rope_theta > 0, "rope_theta must be finite and > 0 (got ", rope_theta, ")");
  require(std::isfinite(rms_eps) && rms_eps >= 0, "rms_eps must be finite and >= 0 (got ", rms_eps, ")");
  return c;
}

/// The weights from a mapping with keys w_q, w_k, w_v, w_o, alpha, beta, alpha_out, beta_out and,
/// when cfg.qk_norm, q_norm and k_norm (absent or None otherwise: then zeros of D entries).
template <typename S>
orthros::AttentionWeights<S> weights_of(const py::dict& w, const orthros::AttentionConfig& cfg) {
  auto get = [&](const char* n) -> py::handle {
    require(w.contains(n) && !w[n].is_none(), "weights must contain '", n, "'");
    return w[n];
  };
  orthros::AttentionWeights<S> r;
  r.w_q = to_mat<S>(get("w_q"), "w_q", 2);
  r.w_k = to_mat<S>(get("w_k"), "w_k", 2);
  r.w_v = to_mat<S>(get("w_v"), "w_v", 2);
  r.w_o = to_mat<S>(get("w_o"), "w_o", 2);
  r.alpha = to_vec<S>(get("alpha"), "alpha");
  r.beta = to_vec<S>(get("beta"), "beta");
  r.alpha_out = to_vec<S>(get("alpha_out"), "alpha_out");
  r.beta_out = to_vec<S>(get("beta_out"), "beta_out");
  if (cfg.qk_norm) {
    r.q_norm = to_vec<S>(get("q_norm"), "q_norm");
    r.k_norm = to_vec<S>(get("k_norm"), "k_norm");
  } else {
    r.q_norm = Vec<S>::Zero(cfg.head_dim);
    r.k_norm = Vec<S>::Zero(cfg.head_dim);
  }
  return r;
}

/// Segments of the stacked rows from per-sequence lengths. \throws orthros::Error naming the length.
std::vector<orthros::Segment> segments_of(const std::vector<std::int64_t>& q_lens, const std::vector<std::int64_t>& out_lens,
                                          Eigen::Index rows, Eigen::Index out_rows) {
  require(q_lens.size() == out_lens.size(), "q_lens has ", q_lens.size(), " sequences but out_lens has ", out_lens.size());
  std::vector<orthros::Segment> segs;
  Eigen::Index b0 = 0, o0 = 0;
  for (size_t b = 0; b < q_lens.size(); ++b) {
    require(q_lens[b] >= 0 && out_lens[b] >= 0 && out_lens[b] <= q_lens[b], "sequence ", b,
            ": need 0 <= T_out <= T (got T = ", q_lens[b], ", T_out = ", out_lens[b], ")");
    segs.push_back(orthros::Segment{b0, q_lens[b], o0, out_lens[b]});
    b0 += q_lens[b];
    o0 += out_lens[b];
  }
  require(b0 == rows, "x has ", rows, " rows but the sequence lengths q_lens sum to ", b0);
  require(o0 == out_rows, "x_out has ", out_rows, " rows but the output lengths out_lens sum to ", o0);
  return segs;
}

template <typename S>
py::dict layer_forward_at(const py::handle& x_in, const py::handle& x_out_in, const py::dict& weights,
                          const std::vector<py::object>& k_caches, const std::vector<py::object>& v_caches,
                          const std::vector<std::int64_t>& q_lens, const std::vector<std::int64_t>& out_lens,
                          const orthros::AttentionConfig& cfg) {
  const Mat<S> x = to_mat<S>(x_in, "x", 2), x_out = to_mat<S>(x_out_in, "x_out", 2);
  const orthros::AttentionWeights<S> w = weights_of<S>(weights, cfg);
  const auto segs = segments_of(q_lens, out_lens, x.rows(), x_out.rows());
  require(k_caches.size() == segs.size() && v_caches.size() == segs.size(), "k_caches/v_caches must have one cache per sequence (",
          segs.size(), "); got ", k_caches.size(), "/", v_caches.size());
  const Eigen::Index kv = Eigen::Index(cfg.num_kv_heads) * cfg.head_dim;
  std::vector<orthros::KVCache<S>> caches(segs.size());
  std::vector<orthros::KVCache<S>*> ptrs;
  for (size_t b = 0; b < segs.size(); ++b) {
    const std::string kn = "k_caches[" + std::to_string(b) + "]", vn = "v_caches[" + std::to_string(b) + "]";
    caches[b].k = to_mat<S>(k_caches[b], kn.c_str(), 3);
    caches[b].v = to_mat<S>(v_caches[b], vn.c_str(), 3);
    require(caches[b].k.cols() == kv && caches[b].v.cols() == kv && caches[b].k.rows() == caches[b].v.rows(), kn, " and ", vn,
            " must be [P, H_kv = ", cfg.num_kv_heads, ", D = ", cfg.head_dim, "] with the same P");
    ptrs.push_back(&caches[b]);
  }
  Mat<S> y, y_out;
  {
    py::gil_scoped_release release;
    orthros::orthros_attention_layer_batch<S>(w, cfg, x, x_out, segs, ptrs, y, y_out);
  }
  const py::ssize_t dm = x.cols(), H = cfg.num_kv_heads, D = cfg.head_dim;
  py::list kc, vc;
  for (const auto& c : caches) {
    kc.append(from_mat(c.k, {c.k.rows(), H, D}));
    vc.append(from_mat(c.v, {c.v.rows(), H, D}));
  }
  py::dict out;
  out["y"] = from_mat(y, {y.rows(), dm});
  out["y_out"] = from_mat(y_out, {y_out.rows(), dm});
  out["k_caches"] = kc;
  out["v_caches"] = vc;
  return out;
}

template <typename S>
py::dict layer_backward_at(const py::handle& x_in, const py::handle& x_out_in, const py::dict& weights,
                           const py::handle& dy_in, const py::handle& dy_out_in, const std::vector<std::int64_t>& q_lens,
                           const std::vector<std::int64_t>& out_lens, const orthros::AttentionConfig& cfg) {
  const Mat<S> x = to_mat<S>(x_in, "x", 2), x_out = to_mat<S>(x_out_in, "x_out", 2);
  const Mat<S> dy = to_mat<S>(dy_in, "dy", 2), dy_out = to_mat<S>(dy_out_in, "dy_out", 2);
  require(dy.rows() == x.rows() && dy.cols() == x.cols(), "dy must have the shape of x [", x.rows(), ", ", x.cols(), "]; got [",
          dy.rows(), ", ", dy.cols(), "]");
  require(dy_out.rows() == x_out.rows() && dy_out.cols() == x_out.cols(), "dy_out must have the shape of x_out [", x_out.rows(),
          ", ", x_out.cols(), "]; got [", dy_out.rows(), ", ", dy_out.cols(), "]");
  const orthros::AttentionWeights<S> w = weights_of<S>(weights, cfg);
  const auto segs = segments_of(q_lens, out_lens, x.rows(), x_out.rows());
  Mat<S> dx(x.rows(), x.cols()), dx_out(x_out.rows(), x_out.cols());
  orthros::AttentionWeights<S> dw = orthros::zeros_like(w);
  {
    py::gil_scoped_release release;
    // One training sequence at a time (orthros_attention_layer_backward, P = 0); the weight
    // gradients are summed over the sequences in batch order.
    for (const auto& s : segs) {
      const orthros::LayerGrads<S> g = orthros::orthros_attention_layer_backward<S>(
          w, cfg, x.middleRows(s.base_begin, s.T), x_out.middleRows(s.out_begin, s.T_out), dy.middleRows(s.base_begin, s.T),
          dy_out.middleRows(s.out_begin, s.T_out));
      dx.middleRows(s.base_begin, s.T) = g.dx;
      dx_out.middleRows(s.out_begin, s.T_out) = g.dx_out;
      dw.w_q += g.dw.w_q;
      dw.w_k += g.dw.w_k;
      dw.w_v += g.dw.w_v;
      dw.w_o += g.dw.w_o;
      dw.alpha += g.dw.alpha;
      dw.beta += g.dw.beta;
      dw.alpha_out += g.dw.alpha_out;
      dw.beta_out += g.dw.beta_out;
      dw.q_norm += g.dw.q_norm;
      dw.k_norm += g.dw.k_norm;
    }
  }
  py::dict out;
  out["dx"] = from_mat(dx, {dx.rows(), dx.cols()});
  out["dx_out"] = from_mat(dx_out, {dx_out.rows(), dx_out.cols()});
  out["w_q"] = from_mat(dw.w_q, {dw.w_q.rows(), dw.w_q.cols()});
  out["w_k"] = from_mat(dw.w_k, {dw.w_k.rows(), dw.w_k.cols()});
  out["w_v"] = from_mat(dw.w_v, {dw.w_v.rows(), dw.w_v.cols()});
  out["w_o"] = from_mat(dw.w_o, {dw.w_o.rows(), dw.w_o.cols()});
  out["alpha"] = from_vec(dw.alpha);
  out["beta"] = from_vec(dw.beta);
  out["alpha_out"] = from_vec(dw.alpha_out);
  out["beta_out"] = from_vec(dw.beta_out);
  out["q_norm"] = from_vec(dw.q_norm);
  out["k_norm"] = from_vec(dw.k_norm);
  return out;
}

std::string precision_of(const py::handle& x, const std::optional<std::string>& precision) {
  if (precision) {
    require(*precision == "f64" || *precision == "f32", "precision must be \"f64\" or \"f32\" (got \"", *precision, "\")");
    return *precision;
  }
  require(py::isinstance<py::array>(x), "x must be a NumPy array");
  const py::dtype dt = py::reinterpret_borrow<py::array>(x).dtype();
  require(dt.kind() == 'f' && (dt.itemsize() == 4 || dt.itemsize() == 8), "x must be a float32 or float64 array (got dtype ",
          py::str(static_cast<const py::handle&>(dt)).cast<std::string>(), ")");
  return dt.itemsize() == 8 ? "f64" : "f32";
}

}  // namespace

/// Registers layer_forward and layer_backward in `m` (called from orthros_py.cpp's module init).
void bind_layer(py::module_& m) {
  m.def(
      "layer_forward",
      [](const py::object& x, const py::object& x_out, const py::dict& weights, const std::vector<py::object>& k_caches,
         const std::vector<py::object>& v_caches, const std::vector<std::int64_t>& q_lens,
         const std::vector<std::int64_t>& out_lens, int num_q_heads, int num_kv_heads, int head_dim, std::int64_t window,
         double rope_theta, bool qk_norm, double rms_eps, std::optional<std::string> precision) {
        const auto cfg = config_of(num_q_heads, num_kv_heads, head_dim, window, rope_theta, qk_norm, rms_eps);
        if (precision_of(x, precision) == "f64")
          return layer_forward_at<double>(x, x_out, weights, k_caches, v_caches, q_lens, out_lens, cfg);
        return layer_forward_at<float>(x, x_out, weights, k_caches, v_caches, q_lens, out_lens, cfg);
      },
      py::arg("x"), py::arg("x_out"), py::arg("weights"), py::arg("k_caches"), py::arg("v_caches"), py::arg("q_lens"),
      py::arg("out_lens"), py::kw_only(), py::arg("num_q_heads"), py::arg("num_kv_heads"), py::arg("head_dim"),
      py::arg("window"), py::arg("rope_theta"), py::arg("qk_norm"), py::arg("rms_eps") = 1e-6,
      py::arg("precision") = py::none(),
      R"doc(The Orthros attention layer over a ragged batch (paper Algorithm 1; SPEC §2; layer.hpp).

x [sum T_b, d_model], x_out [sum T_out_b, d_model]: the normed hidden states of the base and of
the output-specific tokens, sequences stacked; weights: a dict with w_q [d_model, H_q*D], w_k and
w_v [d_model, H_kv*D], w_o [H_q*D, d_model], alpha, beta, alpha_out, beta_out [H_q*D], q_norm and
k_norm [D] (when qk_norm). k_caches / v_caches: one array [P_b, H_kv, D] per sequence (post-RoPE
keys, values of positions 1..P_b); q_lens (T_b) and out_lens (T_out_b) per sequence. Base row i
of sequence b is position P_b+i+1 (RoPE index P_b+i); its output rows are the last T_out_b base
positions. float32 or float64 (precision None: x's dtype); softmax scale 1/sqrt(D).
Returns a dict: y [sum T_b, d_model], y_out [sum T_out_b, d_model], k_caches / v_caches (lists of
[P_b+T_b, H_kv, D]: the caches after the call). Raises orthros.Error naming the argument on bad
input (shapes, lengths, config).)doc");
  m.def(
      "layer_backward",
      [](const py::object& x, const py::object& x_out, const py::dict& weights, const py::object& dy, const py::object& dy_out,
         const std::vector<std::int64_t>& q_lens, const std::vector<std::int64_t>& out_lens, int num_q_heads, int num_kv_heads,
         int head_dim, std::int64_t window, double rope_theta, bool qk_norm, double rms_eps,
         std::optional<std::string> precision) {
        const auto cfg = config_of(num_q_heads, num_kv_heads, head_dim, window, rope_theta, qk_norm, rms_eps);
        if (precision_of(x, precision) == "f64")
          return layer_backward_at<double>(x, x_out, weights, dy, dy_out, q_lens, out_lens, cfg);
        return layer_backward_at<float>(x, x_out, weights, dy, dy_out, q_lens, out_lens, cfg);
      },
      py::arg("x"), py::arg("x_out"), py::arg("weights"), py::arg("dy"), py::arg("dy_out"), py::arg("q_lens"),
      py::arg("out_lens"), py::kw_only(), py::arg("num_q_heads"), py::arg("num_kv_heads"), py::arg("head_dim"),
      py::arg("window"), py::arg("rope_theta"), py::arg("qk_norm"), py::arg("rms_eps") = 1e-6,
      py::arg("precision") = py::none(),
      R"doc(Backward of the Orthros attention layer for training sequences (P = 0; SPEC §9; layer_backward.hpp).

x, x_out, weights, q_lens, out_lens and the config as layer_forward (every cache empty);
dy [sum T_b, d_model] = dL/dy, dy_out [sum T_out_b, d_model] = dL/dy'. Each sequence is
differentiated by orthros_attention_layer_backward (the forward recomputed); the weight
gradients are summed over the sequences in batch order. Returns a dict: dx, dx_out and the
gradient of every weight under its name (w_q, w_k, w_v, w_o, alpha, beta, alpha_out, beta_out,
q_norm, k_norm; q_norm/k_norm are zeros [D] when qk_norm is off). Raises orthros.Error on bad input.)doc");
}
