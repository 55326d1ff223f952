// The SPEC §6 report of one tensor (orthros::check::TensorReport, check.hpp) as the Python dict
// that orthros.check, orthros.check_attention and orthros.check_attention_backward return.
#pragma once

#include "orthros/check.hpp"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

namespace orthros::python {

/// The report as a dict: name, shapes, errors and their bounds, the criteria applied or why not,
/// NaN/Inf counts, bad rows (and their runs) and the verdicts; keys as docs/file-format.md's
/// check report.
inline pybind11::dict report_dict(const orthros::check::TensorReport& r) {
  pybind11::dict d;
  d["name"] = r.name;
  d["shape"] = r.shape;
  d["actual_shape"] = r.actual_shape;  // the port's shape (differs from "shape" when shape_ok is false)
  d["dtype"] = r.dtype;
  d["shape_ok"] = r.shape_ok;
  d["rel_fro"] = r.rel_fro;
  d["max_abs"] = r.max_abs;
  d["max_rel"] = r.max_rel;
  d["worst_index"] = r.worst_index;
  d["worst_actual"] = r.worst_actual;
  d["worst_ref"] = r.worst_ref;
  d["nan_count"] = r.nan_count;
  d["inf_count"] = r.inf_count;
  d["rel_tol"] = r.rel_tol;
  d["rel_criterion"] = r.rel_applicable ? std::string("applied") : r.rel_note;
  d["rel_lse_scale"] = r.rel_lse_scale;  // rel_fro divides by ‖max(|ref|, 1)‖_F (lse/lse_out, SPEC §6)
  // Criterion 2 not applicable (no finite naive oracle at the dtype): None, and abs_criterion says why.
  d["abs_tol"] = r.abs_applicable ? pybind11::object(pybind11::float_(r.abs_tol)) : pybind11::object(pybind11::none());
  d["oracle_at_dtype_maxabs"] =
      r.abs_applicable ? pybind11::object(pybind11::float_(r.oracle_at_dtype_maxabs)) : pybind11::object(pybind11::none());
  d["abs_criterion"] = r.abs_applicable ? std::string("applied") : r.abs_note;
  d["lse_f32_floor"] = r.lse_floor;  // F of check.hpp lse_f32_floor() inside abs_tol (lse/lse_out), else 0
  d["pass_rel"] = r.pass_rel;
  d["pass_abs"] = r.pass_abs;
  d["pass_finite"] = r.pass_finite;
  d["bad_rows"] = r.bad_rows;
  d["bad_row_count"] = r.bad_row_count;
  pybind11::list runs;  // every bad row, as (first, last) runs of consecutive rows
  for (const auto& [first, last] : r.bad_row_ranges) runs.append(pybind11::make_tuple(first, last));
  d["bad_row_ranges"] = runs;
  d["pass"] = r.pass;
  return d;
}

}  // namespace orthros::python

