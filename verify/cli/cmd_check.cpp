// `orthros check`: validates a port's attention outputs against the float64 oracle under SPEC §6.
//   orthros check --case CASE --actual RESULT [--expected EXPECTED] [--dtype X] [--json] [--diagnose]
//   orthros check --suite DIR --actual-dir DIR2 [--only SUBSTR] [--skip-missing] [--min-judged N] [--json] [--diagnose]
// --diagnose: for each failing operator case, which known convention mistake reproduces the
// port's result (check_diagnose.hpp, orthros/diagnose.hpp), or that none does.
// Per tensor (o, o_out, lse, lse_out; and dq, dq_out, dk, dv when the expected results hold
// gradients: a case of a suite written with `orthros golden --grad` whose manifest entry says
// "grad": true, or a --case holding do/do_out; a "grad": false case of such a suite, e.g.
// edge_large_logits, is judged on its forward tensors only):
// relative Frobenius error, max abs error, max relative error, worst index [t, h, d], NaN/Inf
// counts, the rows over the abs bound with their absolute positions (dk/dv rows are cache rows:
// row i is position i+1), pass/fail; then `N passed, N failed`. Exit status 0 when every case passes, 1 when a
// result of the port is missing, unreadable, incomplete or wrong, or (--skip-missing) when no case
// was judged or fewer than --min-judged N; 2 (orthros::Error, one line from main) when an input of
// the check itself is bad: usage, the case file, --expected, the suite (manifest entries, every
// selected case file and expected file, read and checked against the manifest before any result is
// judged), a missing --actual-dir, or a --dtype other than the one the expected files' E_X are for.
// Layer suites (`orthros golden --level layer`, manifest "level": "layer"; layer_suite.hpp) and layer
// case files (holding x, x_out, the weights and k_cache/v_cache) are judged the same way on y
// [T, d_model], y_out [T_out, d_model], k_cache_after and v_cache_after [P+T, H_kv, D]: y rows are
// positions P+i+1, y_out rows P+T-T_out+i+1, cache rows i+1.
#include "command.hpp"

#include "orthros/case_io.hpp"
#include "orthros/check_diagnose.hpp"
#include "orthros/check.hpp"
#include "orthros/layer_suite.hpp"
#include "orthros/portkit.hpp"
#include "orthros/safetensors.hpp"
#include "orthros/suite_manifest.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace orthros::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

struct CaseReport {
  std::string name, regime, dtype, error;
  std::int64_t T = 0, P = 0, T_out = 0, Hq = 0, Hkv = 0, D = 0, window = 0;
  std::vector<check::TensorReport> tensors;
  bool pass = false, skipped = false;
  bool grad = false;  ///< gradients judged too (the expected results hold dq, dq_out, dk, dv)
  bool forward_only = false;  ///< a "grad": false case of a --grad suite (only the forward judged)
  bool layer = false;         ///< a layer case (y, y_out, k_cache_after, v_cache_after judged)
  std::int64_t d_model = 0;   ///< layer cases: width of x and y
  portkit::DiagnosisReport diagnosis;  ///< --diagnose (empty otherwise)
};

/// "a, b, c and d" from the names a result must hold.
std::string name_list(const std::vector<std::string>& n) {
  std::string s;
  for (size_t i = 0; i < n.size(); ++i) s += (i == 0 ? "" : (i + 1 == n.size() ? " and " : ", ")) + n[i];
  return s;
}

/// Absolute (1-based) position of row `row` of tensor `name` (SPEC §2: base row i is position
/// P+i+1, output row i is position P+T-T_out+i+1, dk/dv row i is position i+1).
std::int64_t position(const CaseReport& c, const std::string& name, std::int64_t row) {
  return portkit::row_position(name, row, c.P, c.T, c.T_out);
}

/// Compares each output (and gradient, when `expected.grad`) of `actual` with `expected` (F64)
/// under SPEC §6; fills c.tensors, c.pass. \throws orthros::Error naming a missing tensor.
void compare_outputs(CaseReport& c, const portkit::Expected& expected, const st::File& actual) {
  c.pass = true;
  for (const std::string& n : expected.names()) {
    const st::Tensor& ref = expected.file.tensors.at(n);
    auto it = actual.tensors.find(n);
    if (expected.layer)
      require(it != actual.tensors.end(), "the result file has no tensor \"", n, "\" (a layer case needs ",
              name_list(expected.names()), ")");
    require(it != actual.tensors.end(), "the result file has no tensor \"", n, "\" (needs o, o_out, lse, lse_out",
            expected.grad ? "; the expected results include gradients, so also dq, dq_out, dk, dv" : "", ")");
    check::TensorReport r = check::compare(n, portkit::values(it->second), it->second.shape, portkit::values(ref),
                                           ref.shape, expected.dtype, expected.oracle_err.at(n),
                                           check::lse_max_keys(n, c.P, c.T, c.T_out, c.window));
    c.pass = c.pass && r.pass;
    c.tensors.push_back(std::move(r));
  }
}

void fill_shape_info(CaseReport& c, const st::File& case_file) {
  if (portkit::is_layer_case(case_file)) {
    const portkit::LayerCase<double> lc = portkit::load_layer_case<double>(case_file);
    c.layer = true;
    c.T = lc.T;
    c.P = lc.P;
    c.T_out = lc.T_out;
    c.d_model = lc.d_model;
    c.Hq = lc.cfg.num_q_heads;
    c.Hkv = lc.cfg.num_kv_heads;
    c.D = lc.cfg.head_dim;
    c.window = lc.cfg.window;
    return;
  }
  const AttentionCase<double> ac = load_attention_case<double>(case_file);
  c.T = ac.T;
  c.P = ac.P;
  c.T_out = ac.T_out;
  c.Hq = ac.dims.num_q_heads;
  c.Hkv = ac.dims.num_kv_heads;
  c.D = ac.dims.head_dim;
  c.window = ac.options.window;
}

std::string index_str(const std::vector<std::int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

/// Most runs of bad rows printed per tensor (the JSON report lists every run).
constexpr std::size_t kMaxRunsShown = 16;

/// "4-7, 9" from runs of consecutive rows (each shifted by `offset`); past kMaxRunsShown runs,
/// ", ... (N more runs)".
std::string ranges(const std::vector<std::pair<std::int64_t, std::int64_t>>& runs, std::int64_t offset) {
  std::string s;
  for (size_t i = 0; i < runs.size() && i < kMaxRunsShown; ++i) {
    if (!s.empty()) s += ", ";
    s += std::to_string(runs[i].first + offset);
    if (runs[i].second > runs[i].first) s += "-" + std::to_string(runs[i].second + offset);
  }
  if (runs.size() > kMaxRunsShown) s += ", ... (" + std::to_string(runs.size() - kMaxRunsShown) + " more runs)";
  return s;
}

void print_case(const CaseReport& c) {
  const char* tag = c.skipped ? "SKIP" : (c.pass ? "PASS" : "FAIL");
  std::printf("[%s] %s  (%s%s%sT=%lld P=%lld T_out=%lld H_q=%lld H_kv=%lld D=%lld w=%lld, %s%s)\n", tag,
              c.name.c_str(), c.layer ? "layer, " : "", c.regime.c_str(), c.regime.empty() ? "" : ", ",
              (long long)c.T, (long long)c.P, (long long)c.T_out, (long long)c.Hq, (long long)c.Hkv, (long long)c.D,
              (long long)c.window, c.dtype.c_str(),
              c.grad ? ", with gradients" : (c.forward_only ? ", forward only: \"grad\": false" : ""));
  if (!c.error.empty()) {
    std::printf("    error: %s\n", c.error.c_str());
    return;
  }
  if (c.skipped) return;
  const int nw = c.layer ? 13 : 8;  // tensor-name column: k_cache_after is 13 wide
  std::printf("    %-*s %-14s %-21s %-21s %-9s %-14s %-25s %4s %4s  %s\n", nw, "tensor", "shape", "rel_err (tol)",
              "max_abs (tol)", "max_rel", "worst", "actual / expected", "NaN", "Inf", "result");
  for (const auto& r : c.tensors) {
    char rel[32], ab[32], wv[48];
    if (r.rel_applicable) std::snprintf(rel, sizeof rel, "%.2e (%.0e)", r.rel_fro, r.rel_tol);
    else std::snprintf(rel, sizeof rel, "%.2e (n/a)", r.rel_fro);
    if (r.abs_applicable) std::snprintf(ab, sizeof ab, "%.2e (%.2e)", r.max_abs, r.abs_tol);
    else std::snprintf(ab, sizeof ab, "%.2e (n/a)", r.max_abs);
    std::snprintf(wv, sizeof wv, "%.6g / %.6g", r.worst_actual, r.worst_ref);
    std::string res = r.pass ? "pass" : "FAIL";
    if (!r.pass) {
      res += " (";
      if (!r.shape_ok) res += "shape " + index_str(r.actual_shape);
      else {
        std::string why;
        if (r.nan_count) why += std::to_string(r.nan_count) + " NaN";
        if (r.inf_count) why += std::string(why.empty() ? "" : ",") + std::to_string(r.inf_count) + " Inf";
        if (!r.pass_rel) why += std::string(why.empty() ? "" : ",") + "rel";
        if (!r.pass_abs) why += std::string(why.empty() ? "" : ",") + "abs";
        res += why;
      }
      res += ")";
    }
    std::printf("    %-*s %-14s %-21s %-21s %-9.2e %-14s %-25s %4lld %4lld  %s\n", nw, r.name.c_str(),
                index_str(r.shape).c_str(), rel, ab, r.max_rel,
                r.worst_index.empty() ? "-" : index_str(r.worst_index).c_str(), r.worst_index.empty() ? "-" : wv,
                (long long)r.nan_count, (long long)r.inf_count, res.c_str());
  }
  // Criterion 2 not applicable (no finite naive oracle at the dtype): say so, once per reason.
  std::vector<std::string> notes;
  for (const auto& r : c.tensors)
    if (!r.abs_applicable && std::find(notes.begin(), notes.end(), r.abs_note) == notes.end()) {
      notes.push_back(r.abs_note);
      std::printf("    abs criterion: %s; judged by the relative criterion and the NaN/Inf rule only\n",
                  r.abs_note.c_str());
    }
  for (const auto& r : c.tensors)
    if (!r.rel_applicable) std::printf("    %s: rel criterion %s\n", r.name.c_str(), r.rel_note.c_str());
  for (const auto& r : c.tensors) {  // NaN/Inf: say how many and where, and why the errors read inf
    if (!r.shape_ok || (r.nan_count == 0 && r.inf_count == 0)) continue;
    std::string what = r.nan_count ? std::to_string(r.nan_count) + " NaN" : "";
    if (r.inf_count) what += (what.empty() ? "" : " and ") + std::to_string(r.inf_count) + " Inf";
    std::printf("    %s: %s of %lld values (the first at %s): rel_err, max_abs and max_rel are inf\n", r.name.c_str(),
                what.c_str(), (long long)check::numel(r.shape), index_str(r.worst_index).c_str());
  }
  for (const auto& r : c.tensors) {
    if (r.bad_row_count == 0) continue;
    const std::int64_t rows = r.shape.empty() ? 0 : r.shape[0];
    const bool one = r.bad_row_count == 1;
    std::printf(r.abs_applicable ? "    %s: %lld of %lld rows over the abs bound or non-finite: %s %s = %s t = %s\n"
                                 : "    %s: %lld of %lld rows non-finite: %s %s = %s t = %s\n",
                r.name.c_str(), (long long)r.bad_row_count, (long long)rows, one ? "row" : "rows",
                ranges(r.bad_row_ranges, 0).c_str(), one ? "position" : "positions",
                ranges(r.bad_row_ranges, position(c, r.name, 0)).c_str());
  }
  if (!c.pass)  // --diagnose: a passing case has nothing to diagnose (its JSON says so)
    for (const auto& line : c.diagnosis.lines) std::printf("    %s\n", line.c_str());
}

json tensor_json(const check::TensorReport& r, const CaseReport& c) {
  std::vector<std::int64_t> pos;
  for (auto row : r.bad_rows) pos.push_back(position(c, r.name, row));
  json row_runs = json::array(), pos_runs = json::array();  // every bad row, as [first, last] runs
  for (const auto& [first, last] : r.bad_row_ranges) {
    row_runs.push_back({first, last});
    pos_runs.push_back({position(c, r.name, first), position(c, r.name, last)});
  }
  auto num = [](double x) -> json { return std::isfinite(x) ? json(x) : json(std::isnan(x) ? "nan" : (x > 0 ? "inf" : "-inf")); };
  return json{{"name", r.name},         {"shape", r.shape}, {"actual_shape", r.actual_shape},
              {"shape_ok", r.shape_ok}, {"rel_err", num(r.rel_fro)},
              {"rel_tol", r.rel_tol},   {"rel_criterion", r.rel_applicable ? json("applied") : json(r.rel_note)},
              {"rel_lse_scale", r.rel_lse_scale},
              {"max_abs", num(r.max_abs)},
              {"abs_tol", r.abs_applicable ? json(r.abs_tol) : json(nullptr)},
              {"oracle_at_dtype_maxabs", r.abs_applicable ? json(r.oracle_at_dtype_maxabs) : json(nullptr)},
              {"lse_f32_floor", r.lse_floor},
              {"abs_criterion", r.abs_applicable ? json("applied") : json(r.abs_note)},
              {"max_rel", num(r.max_rel)}, {"worst_index", r.worst_index},
              {"worst_actual", num(r.worst_actual)}, {"worst_expected", num(r.worst_ref)},
              {"nan_count", r.nan_count}, {"inf_count", r.inf_count},
              {"bad_rows", r.bad_rows}, {"bad_positions", pos},
              {"bad_row_count", r.bad_row_count}, {"bad_row_ranges", row_runs},
              {"bad_position_ranges", pos_runs}, {"pass_rel", r.pass_rel},
              {"pass_abs", r.pass_abs}, {"pass_finite", r.pass_finite},
              {"pass", r.pass}};
}

json case_json(const CaseReport& c) {
  json t = json::array();
  for (const auto& r : c.tensors) t.push_back(tensor_json(r, c));
  json j{{"name", c.name}, {"regime", c.regime}, {"dtype", c.dtype}, {"T", c.T}, {"P", c.P}, {"T_out", c.T_out},
         {"H_q", c.Hq}, {"H_kv", c.Hkv}, {"D", c.D}, {"window", c.window},
         {"status", c.skipped ? "skipped" : (c.pass ? "pass" : "fail")}, {"tensors", t}};
  if (c.layer) {  // only then: operator reports keep their keys
    j["level"] = "layer";
    j["d_model"] = c.d_model;
  }
  if (c.grad) j["grad"] = true;  // only then (or below): forward-only suites' reports keep their keys
  if (c.forward_only) j["grad"] = false;  // a forward-only case of a --grad suite
  if (!c.error.empty()) j["error"] = c.error;
  if (!c.diagnosis.json.is_null()) j["diagnosis"] = c.diagnosis.json;
  return j;
}

/// Prints every case (table or JSON) and the summary; returns the exit status: 0 when no case
/// failed, at least one was judged (passed or failed; a skipped case is not judged) and at least
/// `min_judged` (when given) were, else 1. With skipped cases the report says how many of the
/// selected cases were judged, and why the status is 1 when the gate is not met.
int finish(const std::vector<CaseReport>& cases, bool as_json, std::optional<std::int64_t> min_judged = std::nullopt) {
  std::int64_t passed = 0, failed = 0, skipped = 0;
  for (const auto& c : cases) (c.skipped ? skipped : (c.pass ? passed : failed))++;
  const std::int64_t judged = passed + failed, total = static_cast<std::int64_t>(cases.size());
  std::string why_not;  // why the status is 1 although no judged case failed
  if (failed == 0 && judged == 0)
    why_not = "no case judged: all " + std::to_string(total) + " selected cases lack a result file (--skip-missing)";
  else if (failed == 0 && min_judged && judged < *min_judged)
    why_not = std::to_string(judged) + " of " + std::to_string(total) + " cases judged (" + std::to_string(skipped) +
              " without a result file), fewer than --min-judged " + std::to_string(*min_judged);
  const bool pass = failed == 0 && why_not.empty();
  if (as_json) {
    json all = json::array();
    for (const auto& c : cases) all.push_back(case_json(c));
    json out{{"passed", passed}, {"failed", failed}, {"skipped", skipped}, {"judged", judged}, {"total", total}};
    if (min_judged) out["min_judged"] = *min_judged;
    out["pass"] = pass;
    if (!why_not.empty()) out["reason"] = why_not;
    out["cases"] = all;
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    for (const auto& c : cases) print_case(c);
    if (skipped) {
      std::printf("%lld passed, %lld failed, %lld skipped (no result file)\n", (long long)passed, (long long)failed,
                  (long long)skipped);
      std::printf("judged %lld of %lld cases%s\n", (long long)judged, (long long)total,
                  min_judged ? (" (--min-judged " + std::to_string(*min_judged) + ")").c_str() : "");
    } else {
      std::printf("%lld passed, %lld failed\n", (long long)passed, (long long)failed);
    }
    if (!why_not.empty()) std::printf("FAIL: %s\n", why_not.c_str());
  }
  return pass ? 0 : 1;
}

struct Args {
  std::string case_path, actual, expected, dtype, suite, actual_dir, only;
  bool json = false, skip_missing = false, diagnose = false;
  std::optional<std::int64_t> min_judged;  ///< --min-judged N (--suite)
};

/// Runs `f`; an orthros::Error it throws is rethrown with `what` in front (names the bad input).
template <typename F>
auto with_context(const std::string& what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    throw Error(what + ": " + e.what());
  }
}

/// Reads the port's result file; a problem with it is the port's failure (exit 1), not an error.
bool read_actual(CaseReport& c, const std::string& path, st::File& out) {
  try {
    out = st::read_file(path);
    return true;
  } catch (const Error& err) {
    c.pass = false;
    c.error = "result file " + path + ": " + err.what();
    return false;
  }
}

/// Compares the port's result file with `e`; result-file problems become c.error (a failure).
/// With `case_path` (--diagnose) a judged case also gets c.diagnosis (a bad case file throws).
void check_result(CaseReport& c, const portkit::Expected& e, const std::string& actual_path,
                  const std::string& case_path = "") {
  st::File actual;
  if (!read_actual(c, actual_path, actual)) return;
  try {
    compare_outputs(c, e, actual);
  } catch (const Error& err) {
    c.pass = false;
    c.tensors.clear();
    c.error = "result file " + actual_path + ": " + err.what();
  }
  if (!case_path.empty() && c.error.empty())
    c.diagnosis = with_context("--diagnose, case " + case_path,
                               [&] { return portkit::diagnose_case(st::read_file(case_path), e, actual, c.tensors); });
}

/// The shapes the expected results of case `c` must have (from the case's T, P, T_out, heads,
/// D, d_model): an expected file of another case would otherwise blame the port for shapes.
std::map<std::string, std::vector<std::int64_t>> expected_shapes(const CaseReport& c, bool grad) {
  std::map<std::string, std::vector<std::int64_t>> want;
  if (c.layer) {
    for (const auto& [n, shape] : portkit::layer_output_shapes(c.T, c.P, c.T_out, c.d_model, c.Hkv, c.D))
      want[n] = shape;
  } else {
    want = {{"o", {c.T, c.Hq, c.D}}, {"o_out", {c.T_out, c.Hq, c.D}}, {"lse", {c.T, c.Hq}}, {"lse_out", {c.T_out, c.Hq}}};
  }
  if (grad) {
    want["dq"] = {c.T, c.Hq, c.D};
    want["dq_out"] = {c.T_out, c.Hq, c.D};
    want["dk"] = want["dv"] = {c.P + c.T, c.Hkv, c.D};
  }
  return want;
}

/// Reads a case file of the check's input and fills c's shape fields from it.
/// \throws orthros::Error when the file is missing, not a regular file, malformed, or not a case.
st::File read_case(CaseReport& c, const std::string& path) {
  st::File f = st::read_file(path);
  require(portkit::is_layer_case(f) ||
              (f.tensors.count("q") && f.tensors.count("k") && f.tensors.count("v") && f.tensors.count("q_out")),
          "not a case file: it needs tensors q, k, v, q_out (SPEC §5), or x, x_out, the weights and k_cache, "
          "v_cache (a layer case)",
          f.tensors.count("o") || f.tensors.count("y") ? "; this looks like a result file, give it as --actual" : "");
  fill_shape_info(c, f);
  return f;
}

/// A --dtype that differs from the dtype the expected file's E_X were computed for would judge by
/// one dtype's relative bound and another's absolute bound. \throws orthros::Error then.
void require_same_dtype(const Args& a, const portkit::Expected& e, const std::string& source) {
  require(a.dtype.empty() || a.dtype == e.dtype, "--dtype ", a.dtype, ": ", source, " holds the max-abs baselines E_X of ",
          e.dtype, ", so judging at ", a.dtype, " would mix ", a.dtype, "'s relative bound with ", e.dtype,
          "'s absolute one; write expected results at ", a.dtype, " (orthros golden --dtype ", a.dtype,
          ") or leave out --dtype");
}

int run_case(const Args& a) {
  CaseReport c;
  c.name = fs::path(a.case_path).stem().string();
  // The case and the expected file are inputs of the check: problems with them throw (exit 2).
  const st::File cf = with_context("--case " + a.case_path, [&] { return read_case(c, a.case_path); });
  auto reg = cf.metadata.find("regime");
  if (reg != cf.metadata.end()) c.regime = reg->second;
  portkit::Expected e;
  if (!a.expected.empty()) {
    e = with_context("--expected " + a.expected, [&] { return portkit::load_expected(st::read_file(a.expected)); });
  } else {
    // dtype: --dtype, else the case's "dtype" metadata (golden files), else q's storage dtype.
    std::string dt = a.dtype;
    auto m = cf.metadata.find("dtype");
    if (dt.empty() && m != cf.metadata.end()) dt = m->second;
    if (dt.empty()) dt = portkit::check_dtype(cf.tensors.at(c.layer ? "x" : "q").dtype);
    e = with_context("--case " + a.case_path, [&] {
      return c.layer ? portkit::compute_layer_expected(cf, dt) : portkit::compute_expected(cf, dt);
    });
  }
  if (!a.expected.empty() && e.layer != c.layer)
    throw Error(detail::cat("--expected ", a.expected, ": ", e.layer ? "a layer expected file" : "an operator expected file",
                            " does not go with --case ", a.case_path, c.layer ? " (a layer case)" : " (an operator case)"));
  if (!a.expected.empty()) {
    for (const auto& [n, shape] : expected_shapes(c, e.grad))
      require(e.file.tensors.at(n).shape == shape, "--expected ", a.expected, ": tensor \"", n, "\" has shape ",
              index_str(e.file.tensors.at(n).shape), " but --case ", a.case_path, " needs ", index_str(shape),
              " (expected file of another case?)");
    require_same_dtype(a, e, "--expected " + a.expected);
  }
  if (!a.dtype.empty()) e.dtype = a.dtype;
  c.dtype = e.dtype;
  c.grad = e.grad;
  check_result(c, e, a.actual, a.diagnose ? a.case_path : "");
  return finish({c}, a.json);
}

int run_suite(const Args& a) {
  const auto [root, manifest_path] = portkit::suite_paths(a.suite);
  const std::string mpath = manifest_path.string();
  {
    std::error_code ec;
    const fs::file_status s = fs::status(a.actual_dir, ec);
    require(fs::exists(s), "--actual-dir: directory ", a.actual_dir, " does not exist");
    require(fs::is_directory(s), "--actual-dir: ", a.actual_dir,
            " is a file, not a directory (give the directory holding the port's NAME.safetensors results)");
  }
  with_context("--suite " + a.suite, [&] { st::require_regular_file(mpath, "a manifest.json file"); });
  std::ifstream mf(manifest_path);
  require(static_cast<bool>(mf), "--suite: cannot read ", mpath, " (write a suite with `orthros golden --out DIR`)");
  json m;
  try {
    m = json::parse(mf);
  } catch (const std::exception& e) {
    throw Error(detail::cat(mpath, ": invalid JSON: ", e.what()));
  }
  require(m.is_object() && m.value("format", "") == "orthros-golden" && m.contains("cases") && m["cases"].is_array(),
          mpath, " is not an orthros golden manifest");
  portkit::require_complete_manifest(m, mpath);
  std::string level = "op";
  try {
    if (m.contains("level")) level = m["level"].get<std::string>();
  } catch (const json::exception& err) {
    throw Error(detail::cat(mpath, ": \"level\" must be \"op\" or \"layer\": ", err.what()));
  }
  require(level == "op" || level == "layer", mpath, ": \"level\" must be \"op\" or \"layer\" (got \"", level, "\")");
  std::vector<CaseReport> out;
  std::optional<bool> suite_grad;
  try {
    if (m.contains("grad")) suite_grad = m["grad"].get<bool>();
  } catch (const json::exception& err) {
    throw Error(detail::cat(mpath, ": \"grad\" must be true or false: ", err.what()));
  }
  for (const json& jc : m["cases"]) {
    CaseReport c, from_file;
    portkit::Expected e;
    std::optional<bool> case_grad;
    try {  // the suite is an input of the check: a bad manifest entry, case or expected file throws (exit 2)
      c.name = jc.at("name").get<std::string>();
      if (!a.only.empty() && c.name.find(a.only) == std::string::npos) continue;
      c.regime = jc.value("regime", "");
      c.dtype = jc.value("dtype", "");
      c.T = jc.at("T");
      c.P = jc.at("P");
      c.T_out = jc.at("T_out");
      c.Hq = jc.at("H_q");
      c.Hkv = jc.at("H_kv");
      c.D = jc.at("D");
      c.window = jc.at("window");
      c.layer = level == "layer";
      if (c.layer) c.d_model = jc.at("d_model");
      if (jc.contains("grad")) case_grad = jc["grad"].get<bool>();
      // The case file is read and validated too: a missing, truncated or foreign case is the
      // suite's defect, whatever the port wrote.
      const fs::path cp = root / jc.at("file").get<std::string>();
      with_context("suite " + a.suite + ", case " + c.name + ", case file " + cp.string(),
                   [&] { read_case(from_file, cp.string()); });
      const fs::path ep = root / jc.at("expected").get<std::string>();
      e = with_context("suite " + a.suite + ", case " + c.name + ", expected file " + ep.string(),
                       [&] { return portkit::load_expected(st::read_file(ep.string())); });
    } catch (const json::exception& err) {
      throw Error(detail::cat(mpath, ": bad case entry \"", c.name, "\": ", err.what()));
    }
    require(from_file.layer == c.layer, "suite ", a.suite, ", case ", c.name, ": the manifest says \"level\": \"",
            level, "\" but its case file is ", from_file.layer ? "a layer" : "an operator", " case");
    const std::vector<std::int64_t> listed{c.T, c.P, c.T_out, c.Hq, c.Hkv, c.D, c.window, c.d_model},
        found{from_file.T, from_file.P, from_file.T_out, from_file.Hq, from_file.Hkv, from_file.D, from_file.window,
              c.layer ? from_file.d_model : 0};
    require(listed == found, "suite ", a.suite, ", case ", c.name,
            ": the case file does not match its manifest entry (T, P, T_out, H_q, H_kv, D, window",
            c.layer ? ", d_model" : "", ": manifest ", index_str(listed), ", file ", index_str(found), ")");
    require(e.layer == c.layer, "suite ", a.suite, ", case ", c.name, ": the manifest says \"level\": \"", level,
            "\" but its expected file is ", e.layer ? "a layer" : "an operator", " expected file");
    // The per-case "grad" decides (edge_large_logits is forward-only in a --grad suite); it must
    // match the expected file.
    e.grad = with_context("suite " + a.suite + ", case " + c.name,
                          [&] { return portkit::suite_case_grad(suite_grad, case_grad, e.grad); });
    for (const auto& [n, shape] : expected_shapes(c, e.grad))
      require(e.file.tensors.at(n).shape == shape, "suite ", a.suite, ", case ", c.name, ": expected tensor \"", n,
              "\" has shape ", index_str(e.file.tensors.at(n).shape), " but the case needs ", index_str(shape));
    require_same_dtype(a, e, "suite " + a.suite + " (case " + c.name + "'s expected file)");
    if (!a.dtype.empty()) e.dtype = a.dtype;
    c.dtype = e.dtype;
    c.grad = e.grad;
    c.forward_only = suite_grad.value_or(false) && !e.grad;
    const fs::path actual = fs::path(a.actual_dir) / (c.name + ".safetensors");
    if (!fs::exists(actual)) {
      c.skipped = a.skip_missing;
      c.pass = false;
      if (!c.skipped) c.error = "no result file " + actual.string();
    } else {
      check_result(c, e, actual.string(), a.diagnose ? (root / jc.value("file", std::string())).string() : "");
    }
    out.push_back(c);
  }
  require(!out.empty(), "no case of ", mpath, " matches --only \"", a.only, "\"");
  require(!a.min_judged || *a.min_judged <= static_cast<std::int64_t>(out.size()), "--min-judged ", *a.min_judged,
          " exceeds the ", out.size(), " cases selected", a.only.empty() ? "" : " by --only", " from ", mpath);
  return finish(out, a.json, a.min_judged);
}

const bool reg = add_command(
    "check",
    "Check a port's outputs (and gradients dq, dq_out, dk, dv against a `golden --grad` suite or a case holding "
    "do/do_out) against the float64 oracle under SPEC §6 (one case, or a golden suite)",
    [](CLI::App& sub) -> std::function<int()> {
      auto a = std::make_shared<Args>();
      auto* c = sub.add_option("--case", a->case_path, "case .safetensors (SPEC §5 inputs)");
      auto* r = sub.add_option("--actual", a->actual, "the port's result .safetensors for --case");
      sub.add_option("--expected", a->expected,
                     "expected file from `orthros golden` for --case (default: run the oracle on the case now)")
          ->needs(c);
      auto* s = sub.add_option("--suite", a->suite, "golden suite directory (with manifest.json), or its manifest.json");
      auto* d = sub.add_option("--actual-dir", a->actual_dir, "directory of the port's results, NAME.safetensors");
      sub.add_option("--dtype", a->dtype,
                     "--case without --expected: dtype whose tolerance applies (default: the case's); elsewhere it "
                     "must equal the expected files' dtype")
          ->check(CLI::IsMember({"f64", "f32", "bf16", "f16"}));
      sub.add_option("--only", a->only, "--suite: check only cases whose name contains this")->needs(s);
      sub.add_flag("--skip-missing", a->skip_missing,
                   "--suite: report cases without a result file as skipped (not judged) instead of failed")
          ->needs(s);
      sub.add_option("--min-judged", a->min_judged,
                     "--suite: exit status 1 unless at least N cases were judged (with --skip-missing)")
          ->check(CLI::PositiveNumber)
          ->needs(s);
      sub.add_flag("--json", a->json, "print the report as JSON (for CI)");
      sub.add_flag("--diagnose", a->diagnose,
                   "for a failing case, name the known convention mistake (window w+-1, LSE in log2, top-left "
                   "causal alignment, scale, GQA mapping, ...) whose oracle the port's result matches");
      // --case/--suite needing --actual/--actual-dir is checked below, not with CLI11 `needs`: CLI11
      // checks an option's `needs` before its `excludes`, so `--suite X --case Y` would report the
      // missing --actual instead of the conflict.
      r->needs(c);
      d->needs(s);
      c->excludes(s);
      s->excludes(c);
      return [a]() -> int {
        require(!a->case_path.empty() || !a->suite.empty(),
                "give --case CASE --actual RESULT, or --suite DIR --actual-dir DIR2");
        require(a->case_path.empty() || !a->actual.empty(), "--case requires --actual (the port's result file)");
        require(a->suite.empty() || !a->actual_dir.empty(),
                "--suite requires --actual-dir (the directory of the port's results)");
        return a->suite.empty() ? run_case(*a) : run_suite(*a);
      };
    });

}  // namespace
}  // namespace orthros::cli
