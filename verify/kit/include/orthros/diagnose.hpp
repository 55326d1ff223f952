/// \file diagnose.hpp
/// \brief Names the convention mistake behind a port's failing result: the float64 oracle is
/// recomputed under each mistake that attention ports are known to make, and a mistake whose
/// result the port reproduces within SPEC §6 (every judged tensor within its bound) is the cause.
///
/// The mistakes (SPEC §2 is the correct convention; §8 lists where they were seen):
///   - `window+1` / `window-1`: the base window holds w+1 / w-1 keys (FlashAttention's
///     `window_size=(w, 0)` where `(w-1, 0)` was meant, or cuDNN's `window_left = w-1` where
///     `w` was meant, and the reverse);
///   - `lse-log2`: the LSE returned in log2 units (`log2 Σ 2^(s log2 e)`, the kernels' internal unit);
///   - `out-top-left`: the output stream's causal mask aligned top-left (output row i sees keys
///     [1, i+1]) instead of bottom-right (keys [1, P+T-T_out+i+1]); `base-top-left`: the same for
///     the base stream when P > 0;
///   - `scale-1/D`, `scale-1`: softmax scale 1/D or 1 instead of 1/sqrt(D) (or the case's scale);
///     `scale-default`: 1/sqrt(D) where the case sets its own scale;
///   - `gqa-modulo`: query head h reads KV head h % H_kv instead of h / (H_q / H_kv);
///   - `out-at-t+1`: the output query placed at position t+1 (it sees one key more);
///   - `dkv-without-out`: dk and dv from the base stream only (the output stream's share dropped);
///   - `streams-masks-swapped`: base queries under full causal attention, output queries under the
///     window; `streams-queries-swapped` (T_out = T): each stream computed from the other's queries;
///     `streams-outputs-swapped` (T_out = T): o/o_out, lse/lse_out, dq/dq_out exchanged.
/// A mistake that gives the correct result on the case (e.g. w ± 1 when every row sees all its
/// keys anyway, gqa-modulo with one KV head) cannot be told apart there and is skipped.
///
/// All arithmetic is float64 and dense (per row: scores, max, softmax, o; the backward from the
/// softmax's vector-Jacobian product, SPEC §9), written for clarity, not speed: it runs only on
/// failing cases.
#pragma once

#include "orthros/attention.hpp"
#include "orthros/check.hpp"
#include "orthros/tensor.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace orthros::diagnose {

/// How a (possibly mistaken) port lays out the attention. The default-constructed fields with
/// `lookback = w-1` and `scale = softmax_scale()` are SPEC §2.
struct Convention {
  std::int64_t lookback = 0;       ///< keys before the query a base row sees (SPEC: w-1)
  double scale = 0;                ///< softmax scale used
  bool base_top_left = false;      ///< base row i taken at position i instead of P+i
  bool out_top_left = false;       ///< output row i sees keys [0, i] (0-based) instead of [0, P+T-T_out+i]
  std::int64_t out_shift = 0;      ///< output row's last key moved by this many (1: query at t+1), clamped
  bool gqa_modulo = false;         ///< query head h reads KV head h % H_kv
  bool lse_log2 = false;           ///< lse / lse_out in log2 units
  bool dkv_without_out = false;    ///< dk, dv without the output stream's share
  bool masks_swapped = false;      ///< base queries full causal, output queries windowed
  bool queries_swapped = false;    ///< each stream computed from the other's queries (needs T_out = T)
  bool outputs_swapped = false;    ///< o <-> o_out, lse <-> lse_out, dq <-> dq_out (needs T_out = T)
};

/// One known mistake: a short id, what a porter did, and its convention.
struct Hypothesis {
  std::string id;           ///< e.g. "window+1"
  std::string description;  ///< e.g. "the base window holds w+1 keys (FlashAttention window_size=(w, 0))"
  Convention convention;
};

/// The inputs of one operator case in float64 (widened exactly from the case file).
struct CaseInputs {
  Mat<double> q, k, v, q_out;            ///< [T, H_q*D], [P+T, H_kv*D] x2, [T_out, H_q*D]
  std::optional<Mat<double>> dout, dout_out;  ///< upstream gradients [T, H_q*D], [T_out, H_q*D] (gradient cases)
  AttentionDims dims;
  AttentionOptions options;              ///< window and optional scale, as the case says
};

/// Result tensors of a convention, `[rows, heads*inner]` Mats keyed o, o_out, lse, lse_out (and dq,
/// dq_out, dk, dv when the case has upstream gradients).
using Tensors = std::map<std::string, Mat<double>>;

/// SPEC §2's convention for `c`.
inline Convention spec_convention(const CaseInputs& c) {
  Convention v;
  v.lookback = c.options.window - 1;
  v.scale = softmax_scale(c.options, c.dims.head_dim);
  return v;
}

/// The known mistakes that make sense for `c` (queries-/outputs-swapped only when T_out = T,
/// base-top-left only when P > 0, scale-default only when the case sets a scale, window-1 only
/// when w >= 2). Skipping the ones that change nothing on the case is up to explain().
inline std::vector<Hypothesis> hypotheses(const CaseInputs& c) {
  const Convention spec = spec_convention(c);
  const std::int64_t T = c.q.rows(), T_out = c.q_out.rows(), P = c.k.rows() - T;
  const double D = c.dims.head_dim;
  std::vector<Hypothesis> h;
  auto add = [&](std::string id, std::string what, auto&& edit) {
    Convention v = spec;
    edit(v);
    h.push_back({std::move(id), std::move(what), v});
  };
  add("window+1", "the base window holds w+1 keys [t-w, t] (FlashAttention window_size=(w, 0) for (w-1, 0); "
                  "cuDNN window_left = w+1)",
      [](Convention& v) { v.lookback += 1; });
  if (c.options.window >= 2)
    add("window-1", "the base window holds w-1 keys [t-w+2, t] (window_size=(w-2, 0); cuDNN window_left = w-1)",
        [](Convention& v) { v.lookback -= 1; });
  add("lse-log2", "lse/lse_out in log2 units (the kernel's exp2-domain LSE, not multiplied by ln 2)",
      [](Convention& v) { v.lse_log2 = true; });
  add("out-top-left", "output stream causal mask aligned top-left: output row i sees keys 1..i+1 instead of "
                      "1..P+T-T_out+i+1 (bottom-right)",
      [](Convention& v) { v.out_top_left = true; });
  if (P > 0)
    add("base-top-left", "base stream aligned top-left: base row i taken at position i+1 instead of P+i+1 "
                         "(the KV cache ignored in the mask)",
        [](Convention& v) { v.base_top_left = true; });
  add("scale-1/D", "softmax scale 1/D instead of " + std::string(c.options.scale ? "the case's" : "1/sqrt(D)"),
      [&](Convention& v) { v.scale = 1.0 / D; });
  add("scale-1", "softmax scale 1 (scores not scaled)", [](Convention& v) { v.scale = 1.0; });
  if (c.options.scale)
    add("scale-default", "softmax scale 1/sqrt(D): the case's own scale ignored",
        [&](Convention& v) { v.scale = 1.0 / std::sqrt(D); });
  add("gqa-modulo", "GQA mapping h % H_kv instead of h / (H_q/H_kv) (KV heads interleaved, not grouped)",
      [](Convention& v) { v.gqa_modulo = true; });
  add("out-at-t+1", "the output query at position t+1: it sees keys 1..t+1", [](Convention& v) { v.out_shift = 1; });
  if (c.dout)
    add("dkv-without-out", "dk/dv without the output stream: only the base queries' share summed",
        [](Convention& v) { v.dkv_without_out = true; });
  add("streams-masks-swapped", "the two streams' masks swapped: base queries full causal, output queries windowed",
      [](Convention& v) { v.masks_swapped = true; });
  if (T_out == T) {
    add("streams-queries-swapped", "the two streams' queries swapped: o from q_out under the window, o_out from q",
        [](Convention& v) { v.queries_swapped = true; });
    add("streams-outputs-swapped", "the two streams' results swapped: o holds o_out, lse lse_out, dq dq_out",
        [](Convention& v) { v.outputs_swapped = true; });
  }
  return h;
}

namespace detail {

/// One stream of query rows under convention `v`: keys [lo(i), hi(i)] per row, forward and (when
/// `dout`) backward, added into dk/dv when `into_kv`. q [rows, H_q*D]; out: o, lse and dq.
template <typename Lo, typename Hi>
void run_stream(const Mat<double>& q, const Mat<double>& k, const Mat<double>& vv, const Mat<double>* dout,
                const AttentionDims& d, const Convention& v, Lo lo, Hi hi, bool into_kv, Mat<double>& o,
                Mat<double>& lse, Mat<double>& dq, Mat<double>& dk, Mat<double>& dvv) {
  const int Hq = d.num_q_heads, Hkv = d.num_kv_heads, D = d.head_dim, group = Hq / Hkv;
  const Eigen::Index rows = q.rows();
  o = Mat<double>::Zero(rows, Eigen::Index(Hq) * D);
  lse = Mat<double>::Zero(rows, Hq);
  dq = Mat<double>::Zero(rows, Eigen::Index(Hq) * D);
  // One thread per KV head: every query head writes only its own columns of o, lse, dq, and the
  // query heads reading KV head g write only g's columns of dk, dv (no two threads share a value).
#pragma omp parallel for schedule(dynamic) if (rows * k.rows() * Hq * D >= (Eigen::Index(1) << 20))
  for (int g = 0; g < Hkv; ++g)
    for (int h = 0; h < Hq; ++h)
      for (Eigen::Index i = 0; i < rows; ++i) {
        const int kvh = v.gqa_modulo ? h % Hkv : h / group;
        if (kvh != g) continue;
        const Eigen::Index a = std::max<Eigen::Index>(0, lo(i)), b = std::min<Eigen::Index>(k.rows() - 1, hi(i));
        if (b < a) {  // no key: an empty softmax (o = 0, lse = -inf would not be finite: report a huge negative)
          lse(i, h) = -std::numeric_limits<double>::max();
          continue;
        }
        const double* qi = q.data() + i * q.cols() + h * D;
        std::vector<double> p(static_cast<size_t>(b - a + 1));
        double m = -std::numeric_limits<double>::infinity();
        for (Eigen::Index j = a; j <= b; ++j) {
          const double* kj = k.data() + j * k.cols() + kvh * D;
          double s = 0;
          for (int e = 0; e < D; ++e) s += qi[e] * kj[e];
          p[j - a] = s * v.scale;
          m = std::max(m, p[j - a]);
        }
        double l = 0;
        for (double& x : p) l += (x = std::exp(x - m));
        for (double& x : p) x /= l;
        lse(i, h) = (m + std::log(l)) * (v.lse_log2 ? 1.4426950408889634 : 1.0);
        for (Eigen::Index j = a; j <= b; ++j)
          for (int e = 0; e < D; ++e) o(i, h * D + e) += p[j - a] * vv(j, kvh * D + e);
        if (!dout) continue;
        const double* gi = dout->data() + i * dout->cols() + h * D;
        std::vector<double> dp(p.size());
        double delta = 0;
        for (Eigen::Index j = a; j <= b; ++j) {
          double x = 0;
          for (int e = 0; e < D; ++e) x += gi[e] * vv(j, kvh * D + e);
          dp[j - a] = x;
          delta += p[j - a] * x;
        }
        for (Eigen::Index j = a; j <= b; ++j) {
          const double ds = p[j - a] * (dp[j - a] - delta);
          for (int e = 0; e < D; ++e) {
            dq(i, h * D + e) += v.scale * ds * k(j, kvh * D + e);
            if (into_kv) {
              dk(j, kvh * D + e) += v.scale * ds * qi[e];
              dvv(j, kvh * D + e) += p[j - a] * gi[e];
            }
          }
        }
      }
}

}  // namespace detail

/// The results of `c` under convention `v` (float64, dense): o, o_out, lse, lse_out, and dq,
/// dq_out, dk, dv when the case has upstream gradients. With the SPEC convention this is the
/// oracle's result up to float64 summation order. \throws orthros::Error on invalid dims or window.
inline Tensors run(const CaseInputs& c, const Convention& v) {
  check_dims(c.dims);
  check_window(c.options.window);
  const std::int64_t T = c.q.rows(), T_out = c.q_out.rows(), P = c.k.rows() - T;
  require(P >= 0 && T_out <= T, "diagnose: need k rows >= T and T_out <= T (got k rows ", c.k.rows(), ", T ", T,
          ", T_out ", T_out, ")");
  const bool swap_q = v.queries_swapped && T_out == T;
  const Mat<double>& qb = swap_q ? c.q_out : c.q;
  const Mat<double>& qo = swap_q ? c.q : c.q_out;
  // The upstream gradients belong to the result slots (o gets do, o_out do_out) whatever queries
  // fill them; with swapped queries the base slot's dq is the gradient of q_out and vice versa.
  const Mat<double>* gb = c.dout ? &*c.dout : nullptr;
  const Mat<double>* go = c.dout_out ? &*c.dout_out : nullptr;
  Tensors t;
  Mat<double> dk = Mat<double>::Zero(c.k.rows(), c.k.cols()), dv = dk, dq, dq_out;
  const std::int64_t lb = v.lookback;
  auto base_pos = [&](Eigen::Index i) { return v.base_top_left ? i : P + i; };
  auto out_last = [&](Eigen::Index i) { return (v.out_top_left ? i : P + T - T_out + i) + v.out_shift; };
  auto window_lo = [&](Eigen::Index pos) { return pos - lb; };
  if (!v.masks_swapped) {
    detail::run_stream(qb, c.k, c.v, gb, c.dims, v, [&](Eigen::Index i) { return window_lo(base_pos(i)); }, base_pos,
                       true, t["o"], t["lse"], dq, dk, dv);
    detail::run_stream(qo, c.k, c.v, go, c.dims, v, [](Eigen::Index) { return Eigen::Index(0); }, out_last,
                       !v.dkv_without_out, t["o_out"], t["lse_out"], dq_out, dk, dv);
  } else {
    detail::run_stream(qb, c.k, c.v, gb, c.dims, v, [](Eigen::Index) { return Eigen::Index(0); }, base_pos, true,
                       t["o"], t["lse"], dq, dk, dv);
    detail::run_stream(qo, c.k, c.v, go, c.dims, v, [&](Eigen::Index i) { return window_lo(out_last(i)); }, out_last,
                       !v.dkv_without_out, t["o_out"], t["lse_out"], dq_out, dk, dv);
  }
  if (c.dout) {
    t["dq"] = swap_q ? dq_out : dq;
    t["dq_out"] = swap_q ? dq : dq_out;
    t["dk"] = dk;
    t["dv"] = dv;
  }
  if (v.outputs_swapped && T_out == T) {
    std::swap(t["o"], t["o_out"]);
    std::swap(t["lse"], t["lse_out"]);
    if (c.dout) std::swap(t["dq"], t["dq_out"]);
  }
  return t;
}

/// A port's result tensor (flat row-major float64, as `orthros check` reads it) and its shape.
struct Actual {
  std::vector<double> values;
  std::vector<std::int64_t> shape;
};

/// How well one hypothesis explains the port's result: per judged tensor, SPEC §6 of the port's
/// tensor against the hypothesis's (same dtype, E_X and LSE floor as the real check).
struct Fit {
  Hypothesis hypothesis;
  std::vector<check::TensorReport> tensors;  ///< one per judged tensor, in the order given
  bool match = false;                        ///< every judged tensor passes against the hypothesis
  double worst_ratio = 0;  ///< max over tensors of max_abs / abs_tol (rel_fro / rel_tol when abs is n/a)
};

/// What explain() found for a failing result.
struct Diagnosis {
  std::vector<Fit> fits;                  ///< every distinguishable hypothesis, matches first, then by worst_ratio
  std::vector<std::string> indistinguishable;  ///< ids of mistakes that change nothing on this case
};

/// Recomputes the float64 oracle of `c` under every hypothesis() and judges the port's tensors
/// `actual` (name -> values; the names judged by the real check, each with its `baseline` E_X)
/// against each, by check::compare with `dtype` and the LSE floor of the case's key counts.
/// \returns fits sorted matches first; a hypothesis whose tensors equal the SPEC result on every
///   judged name (within 1e-12 relative) is listed as indistinguishable instead.
/// \throws orthros::Error when a name has no baseline, no hypothesis tensor (a gradient name
///   without upstream gradients), or a shape that disagrees with its values.
inline Diagnosis explain(const CaseInputs& c, const std::map<std::string, Actual>& actual,
                         const std::map<std::string, check::AbsBaseline>& baseline, const std::string& dtype) {
  const std::int64_t T = c.q.rows(), T_out = c.q_out.rows(), P = c.k.rows() - T;
  const Tensors spec = run(c, spec_convention(c));
  Diagnosis out;
  for (const Hypothesis& h : hypotheses(c)) {
    const Tensors t = run(c, h.convention);
    bool same = true;
    Fit f{h, {}, true, 0};
    for (const auto& [name, a] : actual) {
      auto it = t.find(name);
      require(it != t.end(), "diagnose: no tensor \"", name, "\" under any convention (gradients need do/do_out)");
      auto b = baseline.find(name);
      require(b != baseline.end(), "diagnose: no E_X for tensor \"", name, "\"");
      const Mat<double>& ref = it->second;
      const Mat<double>& sref = spec.at(name);
      same = same && ref.rows() == sref.rows() && ref.cols() == sref.cols() &&
             (ref.size() == 0 ||
              (ref - sref).cwiseAbs().maxCoeff() <= 1e-12 * std::max(1.0, sref.cwiseAbs().maxCoeff()));
      // A hypothesis may produce a tensor of another shape (swapped streams): compare() reports it.
      std::vector<double> r(static_cast<size_t>(ref.size()));
      for (Eigen::Index i = 0; i < ref.size(); ++i) r[static_cast<size_t>(i)] = ref.data()[i];
      std::vector<std::int64_t> rshape = a.shape;
      if (check::numel(rshape) != ref.size()) rshape = {ref.rows(), ref.cols()};
      check::TensorReport rep = check::compare(name, a.values, a.shape, r, rshape, dtype, b->second,
                                               check::lse_max_keys(name, P, T, T_out, c.options.window));
      f.match = f.match && rep.pass;
      const double ratio = !rep.shape_ok ? std::numeric_limits<double>::infinity()
                           : rep.abs_applicable ? rep.max_abs / rep.abs_tol
                                                : rep.rel_fro / rep.rel_tol;
      f.worst_ratio = std::max(f.worst_ratio, ratio);
      f.tensors.push_back(std::move(rep));
    }
    if (same) {
      out.indistinguishable.push_back(h.id);
      continue;
    }
    out.fits.push_back(std::move(f));
  }
  std::stable_sort(out.fits.begin(), out.fits.end(), [](const Fit& x, const Fit& y) {
    if (x.match != y.match) return x.match;
    return x.worst_ratio < y.worst_ratio;
  });
  return out;
}

}  // namespace orthros::diagnose
