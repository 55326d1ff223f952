/// \file golden.hpp
/// \brief Writing a golden suite (`orthros golden`; docs/porting.md, docs/file-format.md): the
/// cases a port validates against, their float64 expected results with the SPEC §6 E_X of each
/// output, and manifest.json.
///
/// A suite directory holds
///   DIR/manifest.json              every case: files, regime, group, shapes, dtype, tolerance
///   DIR/cases/NAME.safetensors     the inputs in the suite dtype (SPEC §5)
///   DIR/expected/NAME.safetensors  the float64 oracle's outputs, with E_X per tensor in the metadata
/// Operator suite: cases of orthros_attention (q, k, v, q_out -> o, o_out, lse, lse_out), every
/// regime of SPEC §4 at the shapes of one configuration plus fixed-shape edges; with `grad` also
/// the upstream gradients and the expected dq, dq_out, dk, dv. Layer suite: cases of
/// orthros_attention_layer (x, x_out, weights, KV cache -> y, y_out, cache after; layer_suite.hpp)
/// at the qwen3-8b and llama3.1-8b head shapes plus tiny edges.
///
/// Inputs come from a portable generator (splitmix64) seeded by (seed, case name): a case's bytes
/// depend only on the seed, the dtype, the configuration and its own definition, so regenerating a
/// suite gives identical bytes and adding a case never changes the others.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace orthros::portkit {

/// Version of the operator suite's contents and layout (manifest "suite_version"); bumped when a
/// case or the layout changes.
constexpr int kSuiteVersion = 1;
/// Version of the layer suite's contents and layout; bumped when a layer case or the layout changes.
constexpr int kLayerSuiteVersion = 1;

/// What to write.
struct GoldenOptions {
  std::string out;               ///< the suite directory (created with cases/ and expected/)
  std::string dtype = "f32";     ///< dtype of the inputs and of the port under test: f64, f32, bf16, f16
  std::string config = "tiny";   ///< shapes of the operator suite's regime cases: tiny, qwen3-8b, llama3.1-8b
  std::uint64_t seed = 20261013; ///< seed of every input
  bool grad = false;             ///< operator suite: also upstream gradients and expected gradients
};

/// Writes the operator suite into `o.out` (files of the same name are replaced; the caller decides
/// whether a non-empty directory may be written into). \returns the number of cases.
/// \throws orthros::Error on an unknown dtype or config, or naming the path that cannot be created
/// or written.
std::size_t write_operator_suite(const GoldenOptions& o);

/// Writes the layer suite into `o.out` (`o.config` and `o.grad` do not apply: the layer suite always
/// covers qwen3-8b, llama3.1-8b and tiny edges and has no gradients). \returns the number of cases.
/// \throws orthros::Error on an unknown dtype, or naming the path that cannot be created or written.
std::size_t write_layer_suite(const GoldenOptions& o);

}  // namespace orthros::portkit
