// Arguments of the Python bindings (orthros_py.cpp), converted by hand instead of by pybind11's
// overload resolution: a wrong argument (window=2.5, q_out=None, a string for scale) then raises
// orthros.Error naming the parameter, the expected form and what was passed (its value for a
// scalar, its type otherwise), instead of a TypeError that prints the whole binding signature
// and the repr of every array passed.
#pragma once

#include "orthros/tensor.hpp"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <optional>
#include <string>

namespace orthros::python {

namespace py = pybind11;

/// What `obj` is, for a message: the repr of a number, a bool or a short string; else its type name
/// (an array's repr can be megabytes).
inline std::string describe(const py::handle& obj) {
  if (obj.is_none()) return "None";
  const std::string type = py::str(py::type::handle_of(obj).attr("__name__")).cast<std::string>();
  if (PyBool_Check(obj.ptr()) || PyFloat_Check(obj.ptr()) || PyLong_Check(obj.ptr()) ||
      (PyUnicode_Check(obj.ptr()) && PyUnicode_GetLength(obj.ptr()) <= 40))
    return py::repr(obj).cast<std::string>() + " (" + type + ")";
  return "an object of type " + type;
}

/// A NumPy view of array argument `name` (anything NumPy turns into a numeric array: arrays,
/// nested lists, CPU tensors). `layout` is its documented shape, e.g. "[T_out, H_q, D]".
/// \throws orthros::Error for None or anything that is not a numeric array.
inline py::array arg_array(const py::handle& obj, const char* name, const char* layout) {
  require(!obj.is_none(), name, " must be an array ", layout, " (float64, float32 or float16); got None");
  py::array a = py::array::ensure(obj);
  if (!a) PyErr_Clear();
  require(static_cast<bool>(a) && a.dtype().kind() != 'O' && a.dtype().kind() != 'U' && a.dtype().kind() != 'S',
          name, " must be an array ", layout, " (float64, float32 or float16); got ", describe(obj));
  return a;
}

/// The window: an integer (Python int or NumPy integer; not a bool, not a float) >= 1 is checked
/// by the oracle. \throws orthros::Error naming `window` and what was passed otherwise.
inline std::int64_t arg_window(const py::handle& obj) {
  const char* form = "window must be an integer >= 1 (keys seen by a base query, the current token included); got ";
  require(!obj.is_none() && !PyBool_Check(obj.ptr()) && PyIndex_Check(obj.ptr()), form, describe(obj));
  int overflow = 0;
  py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(obj.ptr()));
  if (!index) PyErr_Clear();
  const long long w = index ? PyLong_AsLongLongAndOverflow(index.ptr(), &overflow) : 0;
  require(index && !overflow, form, describe(obj), ", beyond a 64-bit integer");
  return static_cast<std::int64_t>(w);
}

/// A non-negative count (an integer, not a bool, not a float), e.g. `lse_max_keys`.
/// \throws orthros::Error naming `name` and what was passed otherwise.
inline std::int64_t arg_count(const py::handle& obj, const char* name) {
  require(!obj.is_none() && !PyBool_Check(obj.ptr()) && PyIndex_Check(obj.ptr()), name,
          " must be an integer >= 0; got ", describe(obj));
  int overflow = 0;
  py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(obj.ptr()));
  if (!index) PyErr_Clear();
  const long long n = index ? PyLong_AsLongLongAndOverflow(index.ptr(), &overflow) : -1;
  require(index && !overflow && n >= 0, name, " must be an integer >= 0; got ", describe(obj));
  return static_cast<std::int64_t>(n);
}

/// The softmax scale: None (1/sqrt(D)) or a real number. \throws orthros::Error otherwise.
inline std::optional<double> arg_scale(const py::handle& obj) {
  if (obj.is_none()) return std::nullopt;
  require(!PyBool_Check(obj.ptr()) && (PyFloat_Check(obj.ptr()) || PyLong_Check(obj.ptr()) ||
                                       PyIndex_Check(obj.ptr()) || py::hasattr(obj, "__float__")),
          "scale must be a number or None (None: 1/sqrt(D)); got ", describe(obj));
  py::object f = py::reinterpret_steal<py::object>(PyNumber_Float(obj.ptr()));
  if (!f) PyErr_Clear();
  require(static_cast<bool>(f), "scale must be a number or None (None: 1/sqrt(D)); got ", describe(obj));
  return PyFloat_AsDouble(f.ptr());
}

/// A string argument such as dtype or precision (`optional`: None allowed, returned as nullopt).
/// \throws orthros::Error naming `name` otherwise.
inline std::optional<std::string> arg_str(const py::handle& obj, const char* name, const char* choices,
                                          bool optional) {
  if (optional && obj.is_none()) return std::nullopt;
  require(PyUnicode_Check(obj.ptr()), name, " must be ", optional ? "None or " : "", "one of ", choices, "; got ",
          describe(obj));
  return obj.cast<std::string>();
}

/// An optional real number such as oracle_at_dtype_maxabs. \throws orthros::Error otherwise.
inline std::optional<double> arg_optional_number(const py::handle& obj, const char* name) {
  if (obj.is_none()) return std::nullopt;
  py::object f;
  if (!PyBool_Check(obj.ptr()) && !PyUnicode_Check(obj.ptr())) f = py::reinterpret_steal<py::object>(PyNumber_Float(obj.ptr()));
  if (!f) PyErr_Clear();
  require(static_cast<bool>(f), name, " must be a number or None; got ", describe(obj));
  return PyFloat_AsDouble(f.ptr());
}

}  // namespace orthros::python
