// The operator golden suite (`orthros golden`, `--level op`): every case of the attention
// operator a port validates against, and its files (docs/porting.md, docs/file-format.md):
//   DIR/manifest.json              every case: files, regime, group, shapes, dtype, tolerance
//   DIR/cases/NAME.safetensors     inputs (SPEC §5): q, k, v, q_out in the suite dtype; window[, scale]
//   DIR/expected/NAME.safetensors  float64 oracle outputs o, o_out, lse, lse_out + E_X per tensor
// With --grad (GoldenOptions::grad) every case also holds the upstream gradients do [T,H_q,D] and do_out
// [T_out,H_q,D] (suite dtype, seeded, never zero) and its expected file the float64 gradients
// dq, dq_out, dk, dv + E_X per gradient; the manifest says "grad": true, and per case "grad":
// true or false. Two cases differ from the rest in a --grad suite: `edge_large_logits` stays a
// forward-only probe ("grad": false: no do/do_out, no expected gradients; its one-hot softmax makes
// the float64 dq, dq_out, dk rounding residue of order 1e-18..1e-70, which no dtype resolves), and
// `edge_grad_large_logits` (only in --grad suites) is its well-conditioned gradient counterpart.
// Without --grad the suite's bytes are exactly those of the forward-only suite (the gradients'
// generator is a separate stream, so q, k, v, q_out do not change).
// Inputs come from a portable generator (splitmix64) seeded by (seed, case name), so a case's
// bytes depend only on the seed, dtype, config and its own definition: regenerating gives
// identical bytes, and adding a case never changes the others.
#include "golden_common.hpp"

#include "orthros/attention.hpp"
#include "orthros/case_io.hpp"
#include "orthros/check.hpp"
#include "orthros/configs.hpp"
#include "orthros/golden.hpp"
#include "orthros/portkit.hpp"
#include "orthros/safetensors.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace orthros::portkit {
namespace {

using namespace golden_detail;

/// A whole sequence of N positions: base queries, keys, values and an output query at every
/// position. Regime cases are windows of one sequence, so their expected outputs are rows of
/// the PT case's (a port can check its regimes agree, as SPEC §4 requires of the oracle).
struct Sequence {
  Mat<double> q, k, v, q_out;  // [N, H_q*D], [N, H_kv*D], [N, H_kv*D], [N, H_q*D]
  Mat<double> dout, dout_out;  // upstream gradients dL/do, dL/do_out at every position: [N, H_q*D] each
  AttentionDims dims;
};

/// The inputs of a sequence from the SplitMix stream seeded by (seed, name), and its upstream
/// gradients from a second stream seeded by (seed, name + "/grad"): magnitudes in [0.05, 1), so
/// never zero in any dtype. The second stream leaves q, k, v, q_out (and so the bytes of a suite
/// without --grad) unchanged.
Sequence make_sequence(std::uint64_t seed, const std::string& name, Index N, const AttentionDims& d, double amp) {
  SplitMix g{seed ^ fnv1a(name)};
  Sequence s;
  s.dims = d;
  s.q = random_mat(N, Index(d.num_q_heads) * d.head_dim, g, amp);
  s.k = random_mat(N, Index(d.num_kv_heads) * d.head_dim, g, amp);
  s.v = random_mat(N, Index(d.num_kv_heads) * d.head_dim, g, 1.0);
  s.q_out = random_mat(N, Index(d.num_q_heads) * d.head_dim, g, amp);
  SplitMix gg{seed ^ fnv1a(name + "/grad")};
  s.dout = random_mat(N, Index(d.num_q_heads) * d.head_dim, gg, 1.0);
  s.dout_out = random_mat(N, Index(d.num_q_heads) * d.head_dim, gg, 1.0);
  return s;
}

/// One case of the suite, before it is written.
struct CaseSpec {
  std::string name, regime, group, description;
  int group_index = -1, group_size = 0;
  Mat<double> q, k, v, q_out;
  Mat<double> dout, dout_out;  // upstream gradients, rows of the sequence's (written with --grad only)
  AttentionDims dims;
  AttentionOptions opt;
  bool grad = true;       // --grad: this case carries do/do_out and expected gradients (manifest "grad")
  std::string grad_note;  // --grad: appended to the description (why the case is forward-only)
};

/// The call on tokens P+1..P+T of `s` with output queries for the last T_out of them.
CaseSpec slice(const Sequence& s, Index P, Index T, Index T_out, std::int64_t window) {
  CaseSpec c;
  c.dims = s.dims;
  c.opt.window = window;
  c.q = s.q.middleRows(P, T);
  c.k = s.k.topRows(P + T);
  c.v = s.v.topRows(P + T);
  c.q_out = s.q_out.middleRows(P + T - T_out, T_out);
  c.dout = s.dout.middleRows(P, T);  // same rows as q / q_out: a position's dL/do is the same in every regime
  c.dout_out = s.dout_out.middleRows(P + T - T_out, T_out);
  return c;
}

CaseSpec named(CaseSpec c, std::string name, std::string regime, std::string description, std::string group = "",
               int idx = -1, int size = 0) {
  c.name = std::move(name);
  c.regime = std::move(regime);
  c.description = std::move(description);
  c.group = std::move(group);
  c.group_index = idx;
  c.group_size = size;
  return c;
}


/// Name of the gradient counterpart of edge_large_logits (written only with --grad).
constexpr const char* kGradLargeLogits = "edge_grad_large_logits";
/// Its scores: 8*b + (an integer in [-kLargeK, kLargeK]) with |b| in [kLargeB0, kLargeB1]: |s| in [132, 244].
constexpr int kLargeB0 = 17, kLargeB1 = 30, kLargeK = 4;

/// edge_grad_large_logits (--grad only): large scores whose softmax rows are peaked but not
/// one-hot, so the backward needs max subtraction (exp(244) overflows f32, exp(-244) underflows
/// it) while dq, dq_out, dk stay O(1) and well-conditioned. H_q 4, H_kv 2, D 64 (scale 1/8),
/// T 24, T_out 4, w 8, as edge_large_logits. Per KV head a sign vector u (u_d = ±1); in each of
/// the 32 dim pairs (2m, 2m+1) a vector x is made orthogonal to u by x_{2m+1} = -u_{2m} u_{2m+1} x_{2m}.
///   k_j = u + r_j       r_j ⟂ u, r_j,2m in {0, ±4}            (entries ±1, ±3, ±5)
///   q_i = b_i u + p_i   p_i ⟂ u, p_i,2m = ±1 on 4 random pairs, 0 elsewhere; |b_i| in [17, 30], sign random
/// so q_i·k_j = 64 b_i + p_i·r_j with p_i·r_j = 2 Σ_m p_i,2m r_j,2m in 8·[-4, 4]: every score
/// s·q·k = 8 b_i + (an integer in [-4, 4]) is an integer of magnitude 132..244 shared by the keys
/// up to O(1) differences. All q, k entries are integers below 32 and every product, partial sum
/// and score is exact in f32 accumulation and representable in bf16/f16 (integers below 256), so
/// no dtype perturbs the scores: what a port at the dtype gets wrong is its own arithmetic. Why
/// not larger: an f32 port stores lse = m + log(l) in f32 and recomputes P = exp(s - lse); from
/// |s| >= 256 that rounding (up to 1.5e-5 relative in P, and so in dq, dk) reaches the 1e-5 f32
/// bound (docs/porting.md "Gradients"). v, do, do_out: as every case (magnitudes [0.05, 1)).
CaseSpec grad_large_logits_case(std::uint64_t seed) {
  const AttentionDims d{4, 2, 64};
  const Index T = 24, T_out = 4, D = d.head_dim, pairs = D / 2;
  const int group = d.num_q_heads / d.num_kv_heads;
  SplitMix g{seed ^ fnv1a(kGradLargeLogits)};
  Mat<double> u(d.num_kv_heads, D);
  for (Index i = 0; i < u.size(); ++i) u.data()[i] = (g.next() & 1) ? 1.0 : -1.0;
  // x_{2m} = a, x_{2m+1} = -u_{2m} u_{2m+1} a: u_{2m} x_{2m} + u_{2m+1} x_{2m+1} = 0 exactly.
  auto put_pair = [&](double* row, int kvh, Index m, double a) {
    row[2 * m] += a;
    row[2 * m + 1] -= u(kvh, 2 * m) * u(kvh, 2 * m + 1) * a;
  };
  CaseSpec c;
  c.dims = d;
  c.opt.window = 8;
  c.k.resize(T, Index(d.num_kv_heads) * D);
  for (Index j = 0; j < T; ++j)
    for (int h = 0; h < d.num_kv_heads; ++h) {
      double* row = c.k.data() + j * c.k.cols() + Index(h) * D;
      for (Index e = 0; e < D; ++e) row[e] = u(h, e);
      for (Index m = 0; m < pairs; ++m) put_pair(row, h, m, 4.0 * (static_cast<double>(g.next() % 3) - 1.0));
    }
  auto queries = [&](Index rows) {
    Mat<double> q(rows, Index(d.num_q_heads) * D);
    for (Index i = 0; i < rows; ++i)
      for (int h = 0; h < d.num_q_heads; ++h) {
        const int kvh = h / group;
        double* row = q.data() + i * q.cols() + Index(h) * D;
        const int mag = kLargeB0 + static_cast<int>(g.next() % (kLargeB1 - kLargeB0 + 1));  // two draws, in order
        const double b = (g.next() & 1) ? mag : -mag;
        for (Index e = 0; e < D; ++e) row[e] = b * u(kvh, e);
        std::vector<bool> used(static_cast<size_t>(pairs), false);
        for (int n = 0; n < kLargeK;) {  // kLargeK distinct pairs
          const Index m = static_cast<Index>(g.next() % static_cast<std::uint64_t>(pairs));
          if (used[static_cast<size_t>(m)]) continue;
          used[static_cast<size_t>(m)] = true;
          put_pair(row, kvh, m, (g.next() & 1) ? 1.0 : -1.0);
          ++n;
        }
      }
    return q;
  };
  c.q = queries(T);
  c.q_out = queries(T_out);
  c.v = random_mat(T, Index(d.num_kv_heads) * D, g, 1.0);
  SplitMix gg{seed ^ fnv1a(std::string(kGradLargeLogits) + "/grad")};
  c.dout = random_mat(T, Index(d.num_q_heads) * D, gg, 1.0);
  c.dout_out = random_mat(T_out, Index(d.num_q_heads) * D, gg, 1.0);
  return c;
}

/// Builds every case of the suite (regimes at the config's shapes; edges at fixed shapes); with
/// `grad` also the gradient-only case edge_grad_large_logits, last (the others are unchanged).
std::vector<CaseSpec> build_suite(const AttentionConfig& cfg, std::uint64_t seed, json& groups, bool grad) {
  std::vector<CaseSpec> out;
  const AttentionDims cd = cfg.dims();
  const std::int64_t w = cfg.window;
  const Index N = 2 * w + 13;  // crosses the window twice, not a multiple of it
  const Sequence seq = make_sequence(seed, "sequence", N, cd, 1.0);

  // ---- regimes of SPEC §4 on one sequence ----
  out.push_back(named(slice(seq, 0, N, N, w), "pt", "pt", "pre-training: T_out = T, P = 0 (all positions predict)"));
  const Index sft_out = std::max<Index>(1, N / 4);
  out.push_back(named(slice(seq, 0, N, sft_out, w), "sft", "sft",
                      "SFT: output queries for the last " + I(sft_out) + " positions (the response), P = 0"));
  out.push_back(named(slice(seq, 0, N, 1, w), "prefill", "prefill",
                      "prefill: one output query at the last prompt token, P = 0"));
  {
    const std::vector<Index> chunks{w + 1, w / 2 + 3, N - (w + 1) - (w / 2 + 3)};
    json g = {{"name", "chunked_prefill"}, {"regime", "chunked_prefill"}, {"cases", json::array()},
              {"note", "one prompt in 3 chunks; chunk i continues the cache of chunks < i (P > 0); only the last "
                       "chunk has an output query. Rows equal rows of 'pt' (o) and 'prefill' (o_out)."}};
    Index P = 0;
    for (size_t i = 0; i < chunks.size(); ++i) {
      const bool last = i + 1 == chunks.size();
      const std::string n = "chunked_prefill_" + I(Index(i) + 1) + "of3";
      out.push_back(named(slice(seq, P, chunks[i], last ? 1 : 0, w), n, "chunked_prefill",
                          "chunk " + I(Index(i) + 1) + " of 3: tokens " + I(P + 1) + ".." + I(P + chunks[i]) +
                              (last ? ", output query at the last token" : ", T_out = 0 (only fills the cache)"),
                          "chunked_prefill", int(i), int(chunks.size())));
      g["cases"].push_back(n);
      P += chunks[i];
    }
    groups.push_back(g);
  }
  {
    const int steps = 4;
    json g = {{"name", "decode"}, {"regime", "decode"}, {"cases", json::array()},
              {"note", "prefill of the first N-4 tokens (not a case), then 4 decode pairs: T = 1, T_out = 1, "
                       "P = t - 1. Each step's o row equals row t of 'pt'.o; its o_out row equals 'pt'.o_out row t."}};
    for (int i = 0; i < steps; ++i) {
      const Index P = N - steps + i;
      const std::string n = "decode_step_" + I(i + 1);
      out.push_back(named(slice(seq, P, 1, 1, w), n, "decode",
                          "decode pair at position t = " + I(P + 1) + " over a cache of P = " + I(P), "decode", i,
                          steps));
      g["cases"].push_back(n);
    }
    groups.push_back(g);
  }
  // ---- ragged batches: one case per sequence, grouped (see docs/porting.md) ----
  {
    const std::vector<Index> lens{3, w + 2, 2 * w + 7};
    json gp = {{"name", "ragged_prefill"}, {"regime", "ragged_prefill"}, {"cases", json::array()},
               {"note", "a batch of 3 prompts of different lengths, one case per sequence; pack them in manifest "
                        "order for a cu_seqlens-style kernel (cu_seqlens_q = prefix sums of T)."}};
    json gd = {{"name", "ragged_decode"}, {"regime", "ragged_decode"}, {"cases", json::array()},
               {"note", "one decode step of a batch of 3 sequences with caches of different lengths, one case per "
                        "sequence (cu_seqlens_k = prefix sums of P+1)."}};
    for (size_t b = 0; b < lens.size(); ++b) {
      const Sequence s = make_sequence(seed, "ragged_" + I(Index(b)), lens[b] + 1, cd, 1.0);
      const std::string np = "ragged_prefill_b" + I(Index(b)), nd = "ragged_decode_b" + I(Index(b));
      out.push_back(named(slice(s, 0, lens[b], 1, w), np, "ragged_prefill",
                          "sequence " + I(Index(b)) + " of a ragged prefill batch: T = " + I(lens[b]),
                          "ragged_prefill", int(b), int(lens.size())));
      out.push_back(named(slice(s, lens[b], 1, 1, w), nd, "ragged_decode",
                          "sequence " + I(Index(b)) + " of a ragged decode batch: P = " + I(lens[b]),
                          "ragged_decode", int(b), int(lens.size())));
      gp["cases"].push_back(np);
      gd["cases"].push_back(nd);
    }
    groups.push_back(gp);
    groups.push_back(gd);
  }

  // ---- edges (fixed shapes, head dims 64/128) ----
  struct Edge {
    std::string name, description;
    int Hq, Hkv, D;
    Index P, T, T_out;
    std::int64_t w;
    double amp;    // magnitude of q, k (v is always 1)
    double scale;  // softmax scale written to the metadata; 0: none (default 1/sqrt(D))
  };
  const std::vector<Edge> edges{
      {"edge_w1", "w = 1: a token sees only itself, o_t = v_t", 4, 2, 64, 0, 12, 3, 1, 1.0, 0},
      {"edge_w_eq_T", "w = T: the base stream is plain causal attention", 4, 2, 64, 0, 10, 2, 10, 1.0, 0},
      {"edge_T_lt_w", "T < w: window larger than the sequence", 4, 2, 64, 0, 10, 10, 64, 1.0, 0},
      {"edge_gqa1", "GQA ratio 1 (H_q = H_kv = 8)", 8, 8, 64, 0, 40, 4, 16, 1.0, 0},
      {"edge_gqa4", "GQA ratio 4 (8 query heads, 2 KV heads)", 8, 2, 64, 0, 40, 4, 16, 1.0, 0},
      {"edge_gqa8", "GQA ratio 8 (8 query heads, 1 KV head)", 8, 1, 64, 0, 40, 4, 16, 1.0, 0},
      {"edge_gqa3", "GQA ratio 3, not a power of two (6/2)", 6, 2, 64, 0, 20, 2, 8, 1.0, 0},
      {"edge_gqa7", "GQA ratio 7, not a power of two (28/4)", 28, 4, 64, 0, 20, 2, 8, 1.0, 0},
      {"edge_d128", "head dim 128", 4, 2, 128, 0, 33, 5, 8, 1.0, 0},
      {"edge_d64", "head dim 64", 4, 2, 64, 0, 33, 5, 8, 1.0, 0},
      {"edge_large_logits", "|q|,|k| up to 120: scores of order 1e4 (max subtraction needed)", 4, 2, 64, 0, 24, 4, 8,
       120.0, 0},
      {"edge_scale", "softmax scale 0.3 given in the metadata (not 1/sqrt(D))", 4, 2, 64, 0, 20, 3, 5, 1.0, 0.3},
      {"edge_cache_sft", "P > 0 and T_out > 1: SFT continuing a cache of 20", 4, 2, 64, 20, 16, 6, 8, 1.0, 0},
      {"edge_single_token", "T = 1, P = 0: the first token of a sequence", 4, 2, 64, 0, 1, 1, 4, 1.0, 0},
      {"edge_window_probe", "SPEC §8: T = 8, w = 4 (off-by-one windows fail rows 5..8)", 2, 1, 64, 0, 8, 1, 4, 1.0, 0},
      {"edge_long_window", "w = 128 over T = 300 (window longer than a tile, T not a tile multiple)", 8, 2, 64, 0,
       300, 3, 128, 1.0, 0},
  };
  for (const Edge& e : edges) {
    const AttentionDims d{e.Hq, e.Hkv, e.D};
    const Sequence s = make_sequence(seed, e.name, e.P + e.T, d, e.amp);
    CaseSpec c = slice(s, e.P, e.T, e.T_out, e.w);
    if (e.scale != 0) c.opt.scale = e.scale;
    if (e.name == "edge_large_logits") {  // --grad: a forward-only probe (docs/porting.md "Gradients")
      c.grad = false;
      c.grad_note =
          "; forward only in --grad suites (\"grad\": false: no do/do_out, no expected gradients): its softmax "
          "rows are one-hot, so dS = P (dP - Delta) is ~e^-1000 and the float64 dq, dq_out, dk are rounding residue "
          "(1e-18..1e-70) below every dtype's resolution, where the SPEC §6 relative criterion judges nothing (even "
          "the naive oracle at the dtype fails it); the backward's max subtraction is judged on "
          "edge_grad_large_logits";
    }
    out.push_back(named(std::move(c), e.name, "edge", e.description));
  }
  if (grad)
    out.push_back(named(grad_large_logits_case(seed), kGradLargeLogits, "edge",
                        "--grad only: scores of magnitude 132..244 (q = b u + p, k = u + r with p, r orthogonal to "
                        "u: a large common component, integer score differences of at most 8 within a row), softmax "
                        "rows peaked but not one-hot; exact in every dtype. The gradient counterpart of "
                        "edge_large_logits: the backward needs max subtraction (exp(244) overflows f32) while dq, "
                        "dq_out, dk stay O(1). Not larger: from |s| = 256 an f32 port's lse rounding alone (P = "
                        "exp(s - lse)) reaches the 1e-5 bound"));
  return out;
}

}  // namespace

std::size_t write_operator_suite(const GoldenOptions& a) {
  const st::DType dt = portkit::parse_check_dtype(a.dtype);
  const AttentionConfig cfg = attention_config(a.config);
  const fs::path root(a.out);
  std::error_code ec;
  fs::create_directories(root / "cases", ec);
  require(!ec, "--out: cannot create directory ", (root / "cases").string(), ": ", ec.message());
  fs::create_directories(root / "expected", ec);
  require(!ec, "--out: cannot create directory ", (root / "expected").string(), ": ", ec.message());

  json groups = json::array();
  const std::vector<CaseSpec> specs = build_suite(cfg, a.seed, groups, a.grad);
  const double rel = check::rel_tolerance(a.dtype);
  json cases = json::array();
  for (const CaseSpec& c : specs) {
    st::File cf = make_attention_case<double>(c.q, c.k, c.v, c.q_out, c.dims, c.opt, dt);
    cf.metadata["suite_version"] = std::to_string(kSuiteVersion);
    cf.metadata["case"] = c.name;
    cf.metadata["regime"] = c.regime;
    cf.metadata["dtype"] = a.dtype;
    const bool grad = a.grad && c.grad;  // this case carries gradients
    if (grad) {
      const std::int64_t Hq = c.dims.num_q_heads, D = c.dims.head_dim;
      cf.tensors["do"] = st::from_matrix<double>(c.dout, {c.dout.rows(), Hq, D}, dt);
      cf.tensors["do_out"] = st::from_matrix<double>(c.dout_out, {c.dout_out.rows(), Hq, D}, dt);
    }
    const portkit::Expected e = portkit::compute_expected(cf, a.dtype);
    const auto [case_rel, exp_rel] = write_case_files(root, c.name, kSuiteVersion, cf, e);
    const st::File& ef = e.file;

    json shapes, abs_tol, errs;
    std::string abs_note;  // "n/a (...)" when the naive oracle at the dtype overflows on this case
    for (const char* t : {"q", "k", "v", "q_out"}) shapes[t] = shape_json(cf.tensors.at(t));
    if (grad)
      for (const char* t : portkit::upstream_names()) shapes[t] = shape_json(cf.tensors.at(t));
    for (const std::string& t : e.names()) {
      shapes[t] = shape_json(ef.tensors.at(t));
      const check::AbsBaseline& b = e.oracle_err.at(t);
      abs_tol[t] = b.maxabs ? json(check::abs_tolerance(*b.maxabs)) : json(nullptr);
      errs[t] = b.maxabs ? json(*b.maxabs) : json(portkit::kNotApplicable);
      if (!b.maxabs) abs_note = "n/a (" + b.why_na + ")";
    }
    const Index T = c.q.rows(), T_out = c.q_out.rows(), P = c.k.rows() - T;
    json j = {{"name", c.name},
              {"file", case_rel},
              {"expected", exp_rel},
              {"regime", c.regime},
              {"description", a.grad ? c.description + c.grad_note : c.description},
              {"T", T},
              {"P", P},
              {"T_out", T_out},
              {"H_q", c.dims.num_q_heads},
              {"H_kv", c.dims.num_kv_heads},
              {"D", c.dims.head_dim},
              {"window", c.opt.window},
              {"scale", softmax_scale(c.opt, c.dims.head_dim)},
              {"scale_in_metadata", c.opt.scale.has_value()},
              {"shapes", shapes},
              {"dtype", a.dtype},
              {"tolerance", {{"rel", rel}, {"abs", abs_tol}, {"oracle_at_dtype_maxabs", errs}}}};
    if (!abs_note.empty()) j["tolerance"]["abs_criterion"] = abs_note;
    if (!c.group.empty()) j["group"] = {{"name", c.group}, {"index", c.group_index}, {"size", c.group_size}};
    if (a.grad) j["grad"] = grad;  // only with --grad: the forward-only suite keeps its bytes
    cases.push_back(j);
  }
  json manifest = {
      {"format", "orthros-golden"},
      {"suite_version", kSuiteVersion},
      {"spec", "SPEC.md §5 (files), §6 (tolerance); docs/porting.md"},
      {"seed", a.seed},
      {"dtype", a.dtype},
      {"config", a.config}};
  if (a.grad) manifest["grad"] = true;  // only with --grad: the forward-only suite keeps its bytes
  json rest = {
      {"layout",
       {{"case", "cases/NAME.safetensors: q [T,H_q,D], k [P+T,H_kv,D], v [P+T,H_kv,D], q_out [T_out,H_q,D] in "
                 "dtype; __metadata__ window (keys, current token included), optional scale"},
        {"expected", "expected/NAME.safetensors: o [T,H_q,D], o_out [T_out,H_q,D], lse [T,H_q], lse_out "
                     "[T_out,H_q] in F64 (natural-log LSE); __metadata__ oracle_at_dtype_maxabs.<tensor>"},
        {"result", "a port writes ACTUAL_DIR/NAME.safetensors with o, o_out, lse, lse_out in any of F64, F32, "
                   "BF16, F16; then: orthros check --suite DIR --actual-dir ACTUAL_DIR"},
        {"positions", "base row i of a case is absolute position P+i+1; output row i is position P+T-T_out+i+1"}}},
      {"tolerance_rule", {{"rel", "||out-ref||_F / ||ref||_F <= rel (f64 1e-12, f32 1e-5, f16 2e-3, bf16 1e-2)"},
                          {"abs", "max|out-ref| <= 2 * oracle_at_dtype_maxabs + 1e-6 (per tensor); n/a (abs null, "
                                  "abs_criterion says why) where the naive oracle at the dtype overflows"},
                          {"finite", "no NaN/Inf in any output"}}},
      {"groups", groups},
      {"cases", cases}};
  if (a.grad) {
    rest["layout"]["gradients"] =
        "--grad: every case with \"grad\": true also holds do [T,H_q,D] = dL/do and do_out [T_out,H_q,D] = "
        "dL/do_out in dtype, and its expected file dq [T,H_q,D], dq_out [T_out,H_q,D], dk [P+T,H_kv,D], dv "
        "[P+T,H_kv,D] in F64 (dk/dv sum both streams and every query head of the GQA group; cache rows no query "
        "sees are 0) with oracle_at_dtype_maxabs.<tensor>; a port's result adds dq, dq_out, dk, dv; dk/dv row i is "
        "position i+1. A case with \"grad\": false (edge_large_logits) is forward-only: no do/do_out, no "
        "expected gradients, only o, o_out, lse, lse_out judged";
    rest["tolerance_rule"]["gradients"] = "dq, dq_out, dk, dv: the same rel/abs/finite rule, per tensor, with their own "
                                          "oracle_at_dtype_maxabs (oracle forward + backward at the dtype)";
  }
  for (auto it = rest.begin(); it != rest.end(); ++it) manifest[it.key()] = it.value();
  write_manifest(root, manifest);
  return specs.size();
}

}  // namespace orthros::portkit
