/// \file golden_common.hpp
/// \brief What the operator and layer suite writers (golden_operator.cpp, golden_layer.cpp) share:
/// the portable seeded generator of every input, and writing one case's two files.
#pragma once

#include "orthros/portkit.hpp"
#include "orthros/safetensors.hpp"
#include "orthros/seeded_inputs.hpp"
#include "orthros/tensor.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>

namespace orthros::portkit::golden_detail {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;  // keeps the order written: format and version first
using Index = Eigen::Index;

/// The suite's engine: splitmix64 (orthros/seeded_inputs.hpp), portable and free to seed, one
/// stream per case; its draws are the project's shared ones (uniform, nonzero: never zero, never tiny).
struct SplitMix : verify::SplitMix64 {
  std::uint64_t next() { return (*this)(); }
  /// Uniform in [0, 1) with 53 random bits.
  double uniform() { return verify::unit_uniform(*this); }
  /// Magnitude in [0.05, 1) * amp with a random sign: never zero, never tiny.
  double nonzero(double amp) { return verify::nonzero_uniform(*this, amp); }
};

/// FNV-1a of a name: a per-case seed offset that does not depend on the case's rank in the suite.
inline std::uint64_t fnv1a(const std::string& s) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

inline Mat<double> random_mat(Index rows, Index cols, SplitMix& g, double amp) { return verify::nonzero_mat(rows, cols, g, amp); }

/// Writes `root/manifest.json` (two-space indent, trailing newline); throws orthros::Error naming
/// the file when it cannot be opened or written.
inline void write_manifest(const fs::path& root, const json& manifest) {
  std::ofstream mf(root / "manifest.json", std::ios::binary | std::ios::trunc);
  require(static_cast<bool>(mf), "--out: cannot write ", (root / "manifest.json").string());
  mf << manifest.dump(2) << "\n";
  require(static_cast<bool>(mf), "--out: failed writing ", (root / "manifest.json").string());
}

/// Decimal text of an index, for case names and descriptions.
inline std::string I(Index x) { return std::to_string(x); }

/// The shape of a tensor as a JSON array (manifest "shapes").
inline json shape_json(const st::Tensor& t) { return json(t.shape); }

/// Writes DIR/cases/NAME.safetensors (the case) and DIR/expected/NAME.safetensors (the expected
/// results, with metadata `case` and `suite_version`); returns both paths relative to DIR.
inline std::pair<std::string, std::string> write_case_files(const fs::path& root, const std::string& name, int version,
                                                            const st::File& case_file, const Expected& e) {
  const std::string case_rel = "cases/" + name + ".safetensors", exp_rel = "expected/" + name + ".safetensors";
  st::write_file((root / case_rel).string(), case_file);
  st::File ef = e.file;
  ef.metadata["case"] = name;
  ef.metadata["suite_version"] = std::to_string(version);
  st::write_file((root / exp_rel).string(), ef);
  return {case_rel, exp_rel};
}

}  // namespace orthros::portkit::golden_detail
