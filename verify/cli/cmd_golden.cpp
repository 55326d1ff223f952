// `orthros golden --out DIR [--dtype f64|f32|bf16|f16] [--config tiny|qwen3-8b|llama3.1-8b] [--seed S] [--grad] [--force]`
// `orthros golden --level layer --out DIR [--dtype ...] [--seed S] [--force]`: the layer suite (issue 11; see
// run_golden_layer() and layer_suite.hpp); the default `--level op` is the operator suite below:
// writes the versioned golden suite a port validates against (issue 3; docs/porting.md):
//   DIR/manifest.json              every case: files, regime, group, shapes, dtype, tolerance
//   DIR/cases/NAME.safetensors     inputs (SPEC §5): q, k, v, q_out in the suite dtype; window[, scale]
//   DIR/expected/NAME.safetensors  float64 oracle outputs o, o_out, lse, lse_out + E_X per tensor
// With --grad (issue 8) every case also holds the upstream gradients do [T,H_q,D] and do_out
// [T_out,H_q,D] (suite dtype, seeded, never zero) and its expected file the float64 gradients
// dq, dq_out, dk, dv + E_X per gradient; the manifest says "grad": true, and per case "grad":
// true or false. Two cases differ from the rest in a --grad suite: `edge_large_logits` stays a
// forward-only probe ("grad": false: no do/do_out, no expected gradients; its one-hot softmax makes
// the float64 dq, dq_out, dk rounding residue of order 1e-18..1e-70, which no dtype resolves), and
// `edge_grad_large_logits` (only in --grad suites) is its well-conditioned gradient counterpart.
// Without --grad the suite's bytes are exactly those of the forward-only suite (the gradients'
// generator is a separate stream, so q, k, v, q_out do not change).
// DIR must be missing or empty: a non-empty DIR is refused (exit status 2, naming what it holds)
// unless --force, which writes the suite's files over those of the same name (require_empty_out()).
// Inputs come from a portable generator (splitmix64) seeded by (seed, case name), so a case's
// bytes depend only on the seed, dtype, config and its own definition: regenerating gives
// identical bytes, and adding a case never changes the others.
#include "command.hpp"

#include "orthros/attention.hpp"
#include "orthros/case_io.hpp"
#include "orthros/check.hpp"
#include "orthros/configs.hpp"
#include "orthros/layer.hpp"
#include "orthros/layer_suite.hpp"
#include "orthros/portkit.hpp"
#include "orthros/safetensors.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <limits>
#include <string>
#include <vector>

namespace orthros::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;  // keeps the order written: format and version first
using Index = Eigen::Index;

/// Version of the suite's contents and layout; bump when a case or the layout changes.
constexpr int kSuiteVersion = 1;

/// splitmix64: tiny, portable, identical on every platform (unlike std::*_distribution).
struct SplitMix {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  /// Magnitude in [0.05, 1) * amp with a random sign: never zero, never tiny.
  double nonzero(double amp) {
    const double m = amp * (0.05 + 0.95 * uniform());
    return (next() & 1) ? -m : m;
  }
};

/// FNV-1a of a name: a per-case seed offset that does not depend on the case's rank in the suite.
std::uint64_t fnv1a(const std::string& s) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

Mat<double> random_mat(Index rows, Index cols, SplitMix& g, double amp) {
  Mat<double> m(rows, cols);
  for (Index i = 0; i < m.size(); ++i) m.data()[i] = g.nonzero(amp);
  return m;
}

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

std::string I(Index x) { return std::to_string(x); }

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

json shape_json(const st::Tensor& t) { return json(t.shape); }

/// Writes DIR/cases/NAME.safetensors (the case) and DIR/expected/NAME.safetensors (the expected
/// results, with metadata `case` and `suite_version`); returns both paths relative to DIR.
std::pair<std::string, std::string> write_case_files(const fs::path& root, const std::string& name, int version,
                                                     const st::File& case_file, const portkit::Expected& e) {
  const std::string case_rel = "cases/" + name + ".safetensors", exp_rel = "expected/" + name + ".safetensors";
  st::write_file((root / case_rel).string(), case_file);
  st::File ef = e.file;
  ef.metadata["case"] = name;
  ef.metadata["suite_version"] = std::to_string(version);
  st::write_file((root / exp_rel).string(), ef);
  return {case_rel, exp_rel};
}


struct Args {
  std::string out, dtype = "f32", config = "tiny", level = "op";
  std::uint64_t seed = 20261013;
  bool grad = false;   // --grad: upstream gradients in the cases, expected gradients (issue 8)
  bool force = false;  // --force: write into a non-empty --out
};

/// Refuses a non-empty --out unless --force: writing a suite over another one would silently
/// replace it, or mix the two (a case the new suite does not have keeps its old files). A missing
/// or empty directory is fine. \throws orthros::Error naming the directory, how many files it
/// holds and one of them (manifest.json when it is there), or when --out is not a directory.
void require_empty_out(const fs::path& root, bool force) {
  std::error_code ec;
  const fs::file_status st = fs::status(root, ec);
  if (ec || !fs::exists(st)) return;  // missing: created later (which reports an unusable path)
  require(fs::is_directory(st), "golden: --out ", root.string(), " exists and is not a directory");
  if (force) return;
  std::int64_t files = 0, dirs = 0;
  std::string first_file, first_dir;  // smallest relative paths, for a deterministic example
  for (fs::recursive_directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const bool is_dir = it->is_directory(ec);
    const std::string rel = it->path().lexically_relative(root).generic_string();
    std::string& first = is_dir ? first_dir : first_file;
    if (first.empty() || rel < first) first = rel;
    (is_dir ? dirs : files)++;
  }
  require(!ec, "golden: --out ", root.string(), ": cannot list it: ", ec.message());
  const std::string example =
      fs::exists(root / "manifest.json") ? "manifest.json" : (files ? first_file : first_dir + "/");
  require(files + dirs == 0, "golden: --out ", root.string(), " is not empty (holds ", files,
          files == 1 ? " file" : " files",
          files ? "" : " and " + std::to_string(dirs) + (dirs == 1 ? " directory" : " directories"), ", e.g. ", example,
          "); pass --force to overwrite");
}

// ---------------------------------------------------------------------------------------------
// The layer suite (issue 11; `--level layer`): one call of the Orthros attention layer per case
// (layer_suite.hpp has the file format, the loader and the expected results).

/// Version of the layer suite's contents and layout; bump when a layer case or the layout changes.
constexpr int kLayerSuiteVersion = 1;
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
  for (const auto& [config, prefix] : {std::pair<std::string, std::string>{"qwen3-8b", "qwen3_8b"},
                                       {"llama3.1-8b", "llama3_1_8b"}}) {
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

int run_golden_layer(const Args& a) {
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
  std::ofstream mf(root / "manifest.json", std::ios::binary | std::ios::trunc);
  require(static_cast<bool>(mf), "--out: cannot write ", (root / "manifest.json").string());
  mf << manifest.dump(2) << "\n";
  require(static_cast<bool>(mf), "--out: failed writing ", (root / "manifest.json").string());
  std::printf("orthros golden: %zu layer cases (layer suite v%d, dtype %s, seed %llu) -> %s\n", specs.size(),
              kLayerSuiteVersion, a.dtype.c_str(), static_cast<unsigned long long>(a.seed), a.out.c_str());
  return 0;
}

int run_golden(const Args& a) {
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
  int n = 0;
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
    ++n;
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
  std::ofstream mf(root / "manifest.json", std::ios::binary | std::ios::trunc);
  require(static_cast<bool>(mf), "--out: cannot write ", (root / "manifest.json").string());
  mf << manifest.dump(2) << "\n";
  require(static_cast<bool>(mf), "--out: failed writing ", (root / "manifest.json").string());
  std::printf("orthros golden: %d cases (suite v%d, dtype %s, config %s, seed %llu%s) -> %s\n", n, kSuiteVersion,
              a.dtype.c_str(), a.config.c_str(), static_cast<unsigned long long>(a.seed),
              a.grad ? ", with gradients" : "", a.out.c_str());
  return 0;
}

const bool reg = add_command(
    "golden",
    "Write the golden suite a port validates against: SPEC §5 cases for every regime and edge, float64 "
    "expected results, manifest.json with the SPEC §6 tolerance of each case (--grad: and the backward)",
    [](CLI::App& sub) -> std::function<int()> {
      auto a = std::make_shared<Args>();
      sub.add_option("--out", a->out, "output directory (created; must be empty or missing unless --force)")
          ->required();
      sub.add_option("--dtype", a->dtype, "dtype of the inputs and of the port under test (default f32)")
          ->check(CLI::IsMember({"f64", "f32", "bf16", "f16"}));
      auto* cfg = sub.add_option("--config", a->config,
                                 "attention shapes of the regime cases (SPEC §7; default tiny; --level op only)")
                      ->check(CLI::IsMember({"tiny", "qwen3-8b", "llama3.1-8b"}));
      sub.add_option("--level", a->level,
                     "op (default): attention-operator cases; layer: cases of the whole attention layer (x, "
                     "weights, KV cache -> y, y_out, cache after) at qwen3-8b and llama3.1-8b head shapes")
          ->check(CLI::IsMember({"op", "layer"}));
      sub.add_option("--seed", a->seed, "seed of the inputs (default 20261013)")
          ->check(unsigned_up_to(std::numeric_limits<std::uint64_t>::max()));
      sub.add_flag("--grad", a->grad,
                   "also write the upstream gradients do, do_out (cases) and the expected gradients dq, dq_out, dk, "
                   "dv with their E_X (expected files), for training kernels");
      sub.add_flag("--force", a->force,
                   "write into a non-empty --out: the suite's files replace files of the same name, other files "
                   "are left as they are");
      return [a, cfg]() -> int {
        if (a->level == "layer") {
          require(cfg->count() == 0, "--config ", a->config,
                  " applies to --level op only (the layer suite always covers qwen3-8b, llama3.1-8b and tiny edges)");
          require(!a->grad, "--grad applies to --level op only (the layer suite has no gradients)");
          require_empty_out(a->out, a->force);
          return run_golden_layer(*a);
        }
        require_empty_out(a->out, a->force);
        return run_golden(*a);
      };
    });

}  // namespace
}  // namespace orthros::cli
