// `orthros._core._diagnose`: the binding of orthros/diagnose.hpp (which known convention mistake
// reproduces a port's result), called by orthros.diagnosis.diagnose() and, on a failing case, by
// orthros.testing. Arrays are read as float64 exactly (float64, float32 or float16; bf16 results
// come as float32): the caller passes the inputs as the port saw them, rounded to its dtype.
#include "orthros/check.hpp"
#include "orthros/diagnose.hpp"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

/// A `[rows, heads, dim]` array as Mat<double> `[rows, heads*dim]` (exact widening).
orthros::Mat<double> mat3(const py::array& a, const char* name) {
  orthros::require(a.ndim() == 3, name, " must be a 3-d array [rows, heads, head_dim]; got ", a.ndim(), " dims");
  auto c = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(a);
  orthros::require(static_cast<bool>(c), name, " must be a float array");
  orthros::Mat<double> m(a.shape(0), a.shape(1) * a.shape(2));
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = c.data()[i];
  return m;
}

py::dict diagnose_binding(const py::object& result, const py::array& q, const py::array& k, const py::array& v,
                          const py::array& q_out, std::int64_t window, std::optional<double> scale,
                          const std::string& dtype, std::optional<py::array> dout, std::optional<py::array> dout_out,
                          const std::map<std::string, std::optional<double>>& oracle_at_dtype_maxabs,
                          const std::map<std::string, std::string>& abs_na_reason) {
  orthros::check::rel_tolerance(dtype);  // validates the name
  orthros::require(dout.has_value() == dout_out.has_value(), "give both do and do_out, or neither");
  orthros::diagnose::CaseInputs in{mat3(q, "q"), mat3(k, "k"), mat3(v, "v"), mat3(q_out, "q_out"),
                                   std::nullopt, std::nullopt, {}, {window, scale}};
  in.dims = orthros::AttentionDims{static_cast<int>(q.shape(1)), static_cast<int>(k.shape(1)),
                                   static_cast<int>(q.shape(2))};
  if (dout) {
    in.dout = mat3(*dout, "do");
    in.dout_out = mat3(*dout_out, "do_out");
  }
  std::map<std::string, orthros::diagnose::Actual> act;
  std::map<std::string, orthros::check::AbsBaseline> base;
  for (const auto& [name, e] : oracle_at_dtype_maxabs) {
    orthros::require(result.attr("__contains__")(name).cast<bool>(), "result has no tensor '", name, "'");
    auto a = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(result[py::str(name)]);
    orthros::require(static_cast<bool>(a), "result['", name, "'] is not a float array");
    orthros::diagnose::Actual x;
    x.values.assign(a.data(), a.data() + a.size());
    for (py::ssize_t i = 0; i < a.ndim(); ++i) x.shape.push_back(a.shape(i));
    act[name] = std::move(x);
    if (e) {
      base[name] = orthros::check::AbsBaseline::of(*e);
    } else {
      auto why = abs_na_reason.find(name);
      orthros::require(why != abs_na_reason.end(), "tensor '", name, "': E_X is None and abs_na_reason gives no reason");
      base[name] = orthros::check::AbsBaseline::not_applicable(why->second);
    }
  }
  orthros::diagnose::Diagnosis d;
  {
    py::gil_scoped_release release;
    d = orthros::diagnose::explain(in, act, base, dtype);
  }
  py::list fits, matches;
  for (const auto& f : d.fits) {
    py::dict ts;
    for (const auto& r : f.tensors) {
      py::dict t;
      t["max_abs"] = r.max_abs;
      t["abs_tol"] = r.abs_applicable ? py::object(py::float_(r.abs_tol)) : py::object(py::none());
      t["rel_fro"] = r.rel_fro;
      t["rel_tol"] = r.rel_tol;
      t["shape_ok"] = r.shape_ok;
      t["pass"] = r.pass;
      ts[py::str(r.name)] = t;
    }
    py::dict fd;
    fd["id"] = f.hypothesis.id;
    fd["description"] = f.hypothesis.description;
    fd["match"] = f.match;
    fd["worst_ratio"] = f.worst_ratio;
    fd["tensors"] = ts;
    fits.append(fd);
    if (f.match) matches.append(f.hypothesis.id);
  }
  py::dict out;
  out["cause"] = matches.empty() ? py::object(py::none()) : py::object(matches[0]);
  out["matches"] = matches;
  out["fits"] = fits;
  out["indistinguishable"] = d.indistinguishable;
  return out;
}

}  // namespace

/// Registers `_diagnose` and the LSE floor helpers of check.hpp on the module (called from
/// orthros_py.cpp's module definition).
void bind_diagnose(py::module_& m) {
  m.def("lse_max_keys", &orthros::check::lse_max_keys, py::arg("name"), py::arg("P"), py::arg("T"),
        py::arg("T_out"), py::arg("window"),
        "Most keys a row of result tensor `name` sees (SPEC §2): lse min(window, P+T), lse_out P+T (0 when T_out "
        "= 0), 0 for any other tensor; the lse_max_keys argument of check().");
  m.def("lse_f32_floor", &orthros::check::lse_f32_floor, py::arg("max_abs_lse"), py::arg("max_keys"),
        "The float32 LSE floor of SPEC §6: 2^-24 (5 max_abs_lse + 6 ln max_keys), derivation in "
        "verify/kit/include/orthros/check.hpp.");
  m.def("_diagnose", &diagnose_binding, py::arg("result"), py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("q_out"), py::arg("window"), py::arg("scale"), py::arg("dtype"), py::arg("do"), py::arg("do_out"),
        py::arg("oracle_at_dtype_maxabs"), py::arg("abs_na_reason"),
        "orthros/diagnose.hpp explain(): use orthros.diagnosis.diagnose().");
}
