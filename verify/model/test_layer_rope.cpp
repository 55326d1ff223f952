// Layer-level special cases (SPEC §4.4) and RoPE properties (SPEC §2: rotate-half convention).
#include "orthros_model_rc.hpp"

#include "orthros/layer.hpp"
#include "orthros/model.hpp"
#include "orthros/rope.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <complex>

using namespace orthros;
using namespace orthros::testing;

namespace {

// alpha = alpha', beta = beta' and w >= every position: the output stream is the base stream.
// A prefix of P tokens is cached first, then T tokens with output copies of the last T_out
// (x' = x for those rows): y' must equal the last T_out rows of y bit for bit. Non-vacuity: with
// the drawn (different) alpha', beta' the streams differ whenever a query sees >= 2 keys.
template <typename S>
void layer_output_stream_equals_base() {
  const Index P = *rc::gen::inRange<Index>(0, 6), T = *rc::gen::inRange<Index>(1, 9);
  const Index T_out = *rc::gen::inRange<Index>(1, T + 1);
  ModelConfig c = draw_tiny_model_config(P + T);
  c.num_layers = 1;
  c.attn.window = *rc::gen::element<std::int64_t>(P + T, P + T + 2, std::int64_t(1) << 40);
  const std::uint64_t seed = *rc::gen::arbitrary<std::uint64_t>();
  RC_LOG() << dtype_name<S>() << " " << describe(c) << " P=" << P << " T=" << T << " T_out=" << T_out
           << " seed=" << seed << "\n";
  const ModelWeights<S> mw = random_weights<S>(c, seed);
  AttentionWeights<S> w = mw.layers[0].attn;
  Rng rng(seed ^ 0x5eedULL);
  const Mat<S> x_prev = random_mat<S>(P, c.d_model, rng), x = random_mat<S>(T, c.d_model, rng);
  const Mat<S> x_out = x.bottomRows(T_out);
  const Mat<S> none(0, c.d_model);

  auto run = [&](const AttentionWeights<S>& ww) {
    KVCache<S> cache{Mat<S>(0, Index(c.attn.num_kv_heads) * c.attn.head_dim),
                     Mat<S>(0, Index(c.attn.num_kv_heads) * c.attn.head_dim)};
    if (P > 0) orthros_attention_layer<S>(ww, c.attn, x_prev, none, cache);
    return orthros_attention_layer<S>(ww, c.attn, x, x_out, cache);
  };
  const auto differ = run(w);
  w.alpha_out = w.alpha;
  w.beta_out = w.beta;
  const auto same = run(w);
  const Mat<S> base_rows = same.first.bottomRows(T_out);
  fail_if(bitwise_diff(same.second, base_rows, "y' vs y (alpha=alpha', beta=beta', w >= P+T)"));
  if (P + T >= 2) {
    const Mat<S> base_rows2 = differ.first.bottomRows(T_out);
    RC_ASSERT(bitwise_diff(differ.second, base_rows2, "").has_value());
  }
}

}  // namespace

// Proves SPEC §4.4 "alpha=alpha', beta=beta' and w >= T: the output stream equals the base
// stream" for the full layer (QK-norm on/off, RoPE with the output token at its base position,
// GQA, P >= 0), bitwise in double and float; and that differing scale-offsets do change y'.
RC_GTEST_PROP(LayerSpecialCases, OutputStreamEqualsBaseDouble, ()) { layer_output_stream_equals_base<double>(); }
RC_GTEST_PROP(LayerSpecialCases, OutputStreamEqualsBaseFloat, ()) { layer_output_stream_equals_base<float>(); }

namespace {

constexpr long double kU = 0x1p-53L;

Vec<double> random_head(int D, Rng& rng) {
  Vec<double> x(D);
  for (int i = 0; i < D; ++i) x[i] = nonzero_uniform(rng);
  return x;
}

Vec<double> roped(Vec<double> x, std::int64_t pos, double theta) {
  apply_rope(x.data(), int(x.size()), pos, theta);
  return x;
}

// Rounding bound of one rotated pair in double: the angle pos * theta^(-2i/D) carries a relative
// error <= 16u (exponent rounding times |ln theta| <= 14, pow, product), i.e. an absolute error
// <= 16u pos; cos/sin add u each and the rotation 3u: |Δ| <= (16 pos + 6) u |pair|.
long double pair_bound(std::int64_t pos) { return (16.0L * pos + 6) * kU; }

}  // namespace

// Proves RoPE is the rotate-half convention with frequencies theta^(-2i/D): pair (x_i, x_{i+D/2})
// is the complex number x_i + i x_{i+D/2} multiplied by exp(i pos theta^(-2i/D)) (computed
// independently in long double), within the angle rounding bound.
RC_GTEST_PROP(Rope, MatchesComplexRotation, ()) {
  const int D = 2 * *rc::gen::inRange(1, 33);
  const std::int64_t pos = *rc::gen::inRange<std::int64_t>(0, 1 << 17);
  const double theta = *rc::gen::element(1e4, 5e5, 1e6, 10.0);
  Rng rng(*rc::gen::arbitrary<std::uint64_t>());
  const Vec<double> x = random_head(D, rng), r = roped(x, pos, theta);
  const int h = D / 2;
  for (int i = 0; i < h; ++i) {
    const long double freq = std::pow(static_cast<long double>(theta), -2.0L * i / D);
    const std::complex<long double> z(x[i], x[i + h]);
    const std::complex<long double> want = z * std::polar(1.0L, static_cast<long double>(pos) * freq);
    const long double tol = pair_bound(pos) * std::abs(z);
    RC_ASSERT(std::fabs(r[i] - want.real()) <= tol);
    RC_ASSERT(std::fabs(r[i + h] - want.imag()) <= tol);
  }
}

// Proves RoPE preserves the norm of every rotated pair (it is a rotation), within
// |x'|^2 - |x|^2 <= 2 (|c^2 + s^2 - 1| + rotation rounding) |x|^2 <= 16u |x|^2.
RC_GTEST_PROP(Rope, PreservesPairNorms, ()) {
  const int D = 2 * *rc::gen::inRange(1, 33);
  const std::int64_t pos = *rc::gen::inRange<std::int64_t>(0, 1 << 20);
  const double theta = *rc::gen::element(1e4, 5e5, 1e6);
  Rng rng(*rc::gen::arbitrary<std::uint64_t>());
  const Vec<double> x = random_head(D, rng), r = roped(x, pos, theta);
  for (int i = 0; i < D / 2; ++i) {
    const long double n0 = (long double)x[i] * x[i] + (long double)x[i + D / 2] * x[i + D / 2];
    const long double n1 = (long double)r[i] * r[i] + (long double)r[i + D / 2] * r[i + D / 2];
    RC_ASSERT(std::fabs(n1 - n0) <= 16 * kU * n0);
  }
}

// Proves position 0 is the identity, bitwise, in double, float, bf16 and f16
// (cos 0 = 1, sin 0 = 0 exactly).
RC_GTEST_PROP(Rope, PositionZeroIsIdentity, ()) {
  const int D = 2 * *rc::gen::inRange(1, 33);
  const double theta = *rc::gen::element(1e4, 5e5, 1e6);
  Rng rng(*rc::gen::arbitrary<std::uint64_t>());
  const Vec<double> x = random_head(D, rng);
  RC_ASSERT(roped(x, 0, theta) == x);
  Eigen::Matrix<float, Eigen::Dynamic, 1> xf = x.cast<float>(), rf = xf;
  apply_rope(rf.data(), D, 0, theta);
  RC_ASSERT(rf == xf);
  Eigen::Matrix<Eigen::bfloat16, Eigen::Dynamic, 1> xb = x.cast<Eigen::bfloat16>(), rb = xb;
  apply_rope(rb.data(), D, 0, theta);
  RC_ASSERT(std::memcmp(rb.data(), xb.data(), sizeof(Eigen::bfloat16) * size_t(D)) == 0);
  Eigen::Matrix<Eigen::half, Eigen::Dynamic, 1> xh = x.cast<Eigen::half>(), rh = xh;
  apply_rope(rh.data(), D, 0, theta);
  RC_ASSERT(std::memcmp(rh.data(), xh.data(), sizeof(Eigen::half) * size_t(D)) == 0);
}

// Proves the relative-position property: RoPE(q, m) . RoPE(k, n) depends only on m - n:
// shifting both positions by delta changes the dot product by at most the rounding of the two
// rotations, 2 (pair_bound(m+delta) + pair_bound(n+delta) + ...) |q| |k|; and (non-vacuity)
// the dot product does change with m - n for generic q, k.
RC_GTEST_PROP(Rope, DotDependsOnlyOnRelativePosition, ()) {
  const int D = 2 * *rc::gen::inRange(1, 17);
  const std::int64_t m = *rc::gen::inRange<std::int64_t>(0, 4096), n = *rc::gen::inRange<std::int64_t>(0, 4096);
  const std::int64_t delta = *rc::gen::inRange<std::int64_t>(0, 4096);
  const double theta = *rc::gen::element(1e4, 5e5, 1e6);
  Rng rng(*rc::gen::arbitrary<std::uint64_t>());
  const Vec<double> q = random_head(D, rng), k = random_head(D, rng);
  const long double a = roped(q, m, theta).dot(roped(k, n, theta));
  const long double b = roped(q, m + delta, theta).dot(roped(k, n + delta, theta));
  const std::int64_t pmax = std::max(m, n) + delta;
  const long double tol = (4 * pair_bound(pmax) + 2 * D * kU) * q.norm() * k.norm();
  RC_ASSERT(std::fabs(a - b) <= tol);
  // The dot product as a function of m - n: at offsets 0 and 1 it differs (the i = 0 pair
  // rotates by one radian per position).
  const long double d0 = roped(q, 5, theta).dot(roped(k, 5, theta));
  const long double d1 = roped(q, 6, theta).dot(roped(k, 5, theta));
  RC_ASSERT(d0 != d1);
}
