// NumPy arrays <-> the oracle's row-major Mat<S> `[rows, H*D]` for the Python bindings
// (orthros_py.cpp): shapes, dtype names, exact widening and one-step rounding to S.
#pragma once

#include "orthros/tensor.hpp"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace orthros::python {

namespace py = pybind11;
using orthros::Mat;
using orthros::require;

/// Shape of a NumPy array as int64s.
inline std::vector<std::int64_t> shape_of(const py::array& a) {
  std::vector<std::int64_t> s;
  for (py::ssize_t i = 0; i < a.ndim(); ++i) s.push_back(static_cast<std::int64_t>(a.shape(i)));
  return s;
}

inline std::string shape_str(const py::array& a) {
  std::string s = "[";
  for (py::ssize_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + "]";
}

/// Name of the array's dtype ("f64", "f32", "f16") or throws for anything else.
inline std::string np_dtype(const py::array& a, const char* name) {
  const py::dtype dt = a.dtype();
  if (dt.is(py::dtype::of<double>())) return "f64";
  if (dt.is(py::dtype::of<float>())) return "f32";
  if (dt.kind() == 'f' && dt.itemsize() == 2) return "f16";
  throw orthros::Error(std::string(name) + " must be a float64, float32 or float16 array (got dtype " +
                       py::str(static_cast<const py::handle&>(dt)).cast<std::string>() + ")");
}

/// Checks that v has k's shape, named in the 3-d layout [P+T, H_kv, D] the caller passed.
inline void require_v_like_k(const py::array& k, const py::array& v) {
  require(shape_of(v) == shape_of(k), "v must have the shape of k, [P+T, H_kv, D] = ", shape_str(k), "; got ",
          shape_str(v));
}

/// Copies a `[rows, H, D]` NumPy array (any float dtype, any strides) into Mat<S> `[rows, H*D]`,
/// rounding to S once, directly from the exact value (orthros::round_rne: round to nearest even,
/// no double rounding through float32; exact when the values are representable in S).
template <typename S>
Mat<S> to_mat3(const py::array& a, const char* name, std::int64_t heads, std::int64_t dim) {
  require(a.ndim() == 3, name, " must be a 3-d array [rows, heads, head_dim]; got shape ", shape_str(a));
  if (heads >= 0)
    require(a.shape(1) == heads, name, " must have ", heads, " heads (axis 1); got shape ", shape_str(a));
  if (dim >= 0) require(a.shape(2) == dim, name, " must have head_dim ", dim, " (axis 2); got shape ", shape_str(a));
  Mat<S> m(a.shape(0), a.shape(1) * a.shape(2));
  const std::string dt = np_dtype(a, name);
  auto fill = [&](auto tag) {
    using T = decltype(tag);
    auto c = py::array_t<T, py::array::c_style | py::array::forcecast>::ensure(a);
    const T* p = c.data();
    for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = orthros::round_rne<S>(static_cast<double>(p[i]));
  };
  if (dt == "f64") fill(double{});
  else if (dt == "f32") fill(float{});
  else {  // f16: read the raw bits through Eigen::half
    auto c = py::array::ensure(a, py::array::c_style);
    const auto* p = static_cast<const std::uint16_t*>(c.data());
    for (Eigen::Index i = 0; i < m.size(); ++i)
      m.data()[i] = orthros::round_rne<S>(static_cast<double>(Eigen::numext::bit_cast<Eigen::half>(p[i])));
  }
  return m;
}

/// Mat<S> `[rows, H*inner]` -> NumPy `[rows, H, inner]` (or `[rows, H]` when inner == 0) in the
/// nearest NumPy dtype: f64 -> float64, f32/bf16 -> float32 (exact), f16 -> float16.
template <typename S>
py::array from_mat(const Mat<S>& m, std::int64_t heads, std::int64_t inner) {
  std::vector<py::ssize_t> shape{static_cast<py::ssize_t>(m.rows())};
  if (inner > 0) {
    shape.push_back(static_cast<py::ssize_t>(heads));
    shape.push_back(static_cast<py::ssize_t>(inner));
  } else {
    shape.push_back(static_cast<py::ssize_t>(m.cols()));
  }
  if constexpr (std::is_same_v<S, double> || std::is_same_v<S, float>) {
    py::array_t<S> out(shape);
    std::memcpy(out.mutable_data(), m.data(), sizeof(S) * static_cast<size_t>(m.size()));
    return std::move(out);
  } else if constexpr (std::is_same_v<S, Eigen::half>) {
    py::array out(py::dtype("float16"), shape);
    std::memcpy(out.mutable_data(), m.data(), 2 * static_cast<size_t>(m.size()));
    return out;
  } else {
    py::array_t<float> out(shape);
    for (Eigen::Index i = 0; i < m.size(); ++i) out.mutable_data()[i] = static_cast<float>(m.data()[i]);
    return std::move(out);
  }
}

/// Flat float64 copy of any float NumPy array.
inline std::vector<double> flat_f64(const py::array& a, const char* name) {
  const std::string dt = np_dtype(a, name);
  std::vector<double> out(static_cast<size_t>(a.size()));
  if (dt == "f64") {
    auto c = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(a);
    std::memcpy(out.data(), c.data(), sizeof(double) * out.size());
  } else if (dt == "f32") {
    auto c = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(a);
    for (size_t i = 0; i < out.size(); ++i) out[i] = c.data()[i];
  } else {
    auto c = py::array::ensure(a, py::array::c_style);
    const auto* p = static_cast<const std::uint16_t*>(c.data());
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<double>(Eigen::numext::bit_cast<Eigen::half>(p[i]));
  }
  return out;
}

}  // namespace orthros::python
