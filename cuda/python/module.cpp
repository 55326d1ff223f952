// The Python extension `orthros._cuda`: the CUDA library (cuda/include/orthros/cuda/*.hpp) on any
// array that speaks DLPack (torch tensors, CuPy arrays, JAX arrays, raw "dltensor" capsules),
// through nanobind's nb::ndarray; it links no framework. Built only with ORTHROS_CUDA=ON, next to
// the oracle's `orthros._core` in the package `orthros`.
//
// Conventions of every function (keyword arguments only): outputs are preallocated by the caller;
// lengths are host-side lists; `stream` is a cudaStream_t handle value (0: the legacy default
// stream), the work is asynchronous on it; the current device is used. Bad input raises
// orthros.Error (orthros._core.Error, a ValueError) naming the argument and the values, before
// any CUDA call; a failing CUDA / cuBLAS call raises RuntimeError with the call's name.
#include "orthros/error.hpp"

#include <nanobind/nanobind.h>

#include <exception>

namespace nb = nanobind;

namespace orthros::pycuda {
void bind_attention(nb::module_& m);
void bind_layer(nb::module_& m);
}  // namespace orthros::pycuda

NB_MODULE(_cuda, m) {
  m.doc() =
      "Orthros CUDA kernels on DLPack arrays (torch, CuPy, JAX, capsules): attention_forward, "
      "attention_backward, rope_append_kv, layer_forward, layer_backward and their workspace sizes. "
      "Bad input raises orthros.Error naming the argument; CUDA failures raise RuntimeError.";
  // orthros.Error is the oracle module's exception type, so one `except orthros.Error` catches
  // bad input from both modules.
  nb::object error = nb::module_::import_("orthros._core").attr("Error");
  m.attr("Error") = error;
  nb::register_exception_translator(
      [](const std::exception_ptr& p, void* type) {
        try {
          std::rethrow_exception(p);
        } catch (const orthros::Error& e) {
          PyErr_SetString(static_cast<PyObject*>(type), e.what());
        }
      },
      error.release().ptr());  // a reference kept for the life of the process
  orthros::pycuda::bind_attention(m);
  orthros::pycuda::bind_layer(m);
}
