/// \file check_diagnose.hpp
/// \brief `orthros check --diagnose`: for a failing operator case, which known convention mistake
/// (orthros/diagnose.hpp) reproduces the port's result, as report lines and JSON.
#pragma once

#include "orthros/case_io.hpp"
#include "orthros/check.hpp"
#include "orthros/diagnose.hpp"
#include "orthros/portkit.hpp"
#include "orthros/safetensors.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace orthros::portkit {

/// What --diagnose adds to a case's report.
struct DiagnosisReport {
  std::vector<std::string> lines;  ///< printed under the case's table
  nlohmann::ordered_json json;     ///< the case's "diagnosis" in --json
};

namespace diagnose_text {
inline std::string fmt_e(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2e", x);
  return b;
}

/// "o max_abs 1.2e-03 (bound 4.3e-03), rel 2.0e-03 (tol 1e-02)" for one tensor under a hypothesis.
inline std::string fit_text(const check::TensorReport& r) {
  if (!r.shape_ok) return r.name + " shape differs";
  std::string s = r.name + " max_abs " + fmt_e(r.max_abs) + " (bound " +
                  (r.abs_applicable ? fmt_e(r.abs_tol) : std::string("n/a")) + ")";
  if (r.rel_applicable) s += ", rel " + fmt_e(r.rel_fro) + " (tol " + fmt_e(r.rel_tol) + ")";
  return s;
}
}  // namespace diagnose_text

/// Diagnoses one operator case: `case_file` (its inputs), `e` (the expected results and E_X of
/// the real check), `actual` (the port's result file), `reports` (the real check's per-tensor
/// reports). A passing case gets "no failure"; a layer case is not diagnosed (said so).
/// \throws orthros::Error on a malformed case file (load_attention_case, load_upstream).
inline DiagnosisReport diagnose_case(const st::File& case_file, const Expected& e, const st::File& actual,
                                     const std::vector<check::TensorReport>& reports) {
  using json = nlohmann::ordered_json;
  DiagnosisReport d;
  std::vector<std::string> failing;
  for (const auto& r : reports)
    if (!r.pass) failing.push_back(r.name);
  if (failing.empty()) {
    d.lines.push_back("diagnose: no failure, nothing to diagnose");
    d.json = json{{"cause", nullptr}, {"note", "no failure"}};
    return d;
  }
  if (e.layer) {
    d.lines.push_back("diagnose: layer cases are not diagnosed (it names operator convention mistakes)");
    d.json = json{{"cause", nullptr}, {"note", "layer case"}};
    return d;
  }
  const AttentionCase<double> ac = load_attention_case<double>(case_file);
  diagnose::CaseInputs in{ac.q, ac.k, ac.v, ac.q_out, std::nullopt, std::nullopt, ac.dims, ac.options};
  if (e.grad) {
    auto [g, go] = load_upstream<double>(case_file, ac);
    in.dout = g;
    in.dout_out = go;
  }
  std::map<std::string, diagnose::Actual> act;
  for (const auto& r : reports) {
    const st::Tensor& t = actual.tensors.at(r.name);
    act[r.name] = diagnose::Actual{values(t), t.shape};
  }
  const diagnose::Diagnosis dg = diagnose::explain(in, act, e.oracle_err, e.dtype);
  json fits = json::array();
  for (const auto& f : dg.fits) {
    json ts = json::array();
    for (const auto& r : f.tensors)
      ts.push_back(json{{"name", r.name}, {"max_abs", r.max_abs},
                        {"abs_tol", r.abs_applicable ? json(r.abs_tol) : json(nullptr)},
                        {"rel_err", r.rel_fro}, {"rel_tol", r.rel_tol}, {"pass", r.pass}});
    fits.push_back(json{{"id", f.hypothesis.id}, {"description", f.hypothesis.description}, {"match", f.match},
                        {"worst_ratio", f.worst_ratio}, {"tensors", ts}});
  }
  std::vector<const diagnose::Fit*> matches;
  for (const auto& f : dg.fits)
    if (f.match) matches.push_back(&f);
  auto failing_fits = [&](const diagnose::Fit& f) {
    std::string s;
    for (const auto& r : f.tensors)
      if (std::find(failing.begin(), failing.end(), r.name) != failing.end())
        s += (s.empty() ? "" : "; ") + diagnose_text::fit_text(r);
    return s;
  };
  if (!matches.empty()) {
    const diagnose::Fit& m = *matches.front();
    d.lines.push_back("diagnose: cause: " + m.hypothesis.id + ": " + m.hypothesis.description);
    d.lines.push_back("    the port's result is that convention's within SPEC §6: " + failing_fits(m));
    if (matches.size() > 1) {
      std::string also;
      for (size_t i = 1; i < matches.size(); ++i) also += (i > 1 ? ", " : "") + matches[i]->hypothesis.id;
      d.lines.push_back("    also matching on this case (not told apart by it): " + also);
    }
  } else {
    std::string s = "diagnose: none of the " + std::to_string(dg.fits.size()) +
                    " known convention mistakes reproduces the port's result";
    if (!dg.fits.empty()) {
      const diagnose::Fit& c = dg.fits.front();
      char r[32];
      std::snprintf(r, sizeof r, "%.3g", c.worst_ratio);
      s += "; closest: " + c.hypothesis.id + " (" + r + "x its bound: " + failing_fits(c) + ")";
    }
    d.lines.push_back(s);
  }
  json cause = matches.empty() ? json(nullptr) : json(matches.front()->hypothesis.id);
  json all_matches = json::array();
  for (const auto* m : matches) all_matches.push_back(m->hypothesis.id);
  d.json = json{{"cause", cause}, {"matches", all_matches}, {"indistinguishable", dg.indistinguishable},
                {"fits", fits}};
  return d;
}

}  // namespace orthros::portkit
