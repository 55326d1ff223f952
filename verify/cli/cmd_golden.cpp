// `orthros golden --out DIR [--dtype f64|f32|bf16|f16] [--config tiny|qwen3-8b|llama3.1-8b] [--seed S] [--grad] [--force]`
// `orthros golden --level layer --out DIR [--dtype ...] [--seed S] [--force]`
// Writes the golden suite a port validates against (the operator suite by default, the layer
// suite with --level layer; orthros/golden.hpp writes them, docs/porting.md describes them).
// DIR must be missing or empty: a non-empty DIR is refused (exit status 2, naming what it holds)
// unless --force, which writes the suite's files over those of the same name (require_empty_out()).
#include "command.hpp"

#include "orthros/golden.hpp"
#include "orthros/tensor.hpp"

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>

namespace orthros::cli {
namespace {

namespace fs = std::filesystem;

struct Args {
  portkit::GoldenOptions golden;  // --out, --dtype, --config, --seed, --grad
  std::string level = "op";       // --level op|layer
  bool force = false;             // --force: write into a non-empty --out
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

const bool reg = add_command(
    "golden",
    "Write the golden suite a port validates against: SPEC §5 cases for every regime and edge, float64 "
    "expected results, manifest.json with the SPEC §6 tolerance of each case (--grad: and the backward)",
    [](CLI::App& sub) -> std::function<int()> {
      auto a = std::make_shared<Args>();
      portkit::GoldenOptions& g = a->golden;
      sub.add_option("--out", g.out, "output directory (created; must be empty or missing unless --force)")
          ->required();
      sub.add_option("--dtype", g.dtype, "dtype of the inputs and of the port under test (default f32)")
          ->check(CLI::IsMember({"f64", "f32", "bf16", "f16"}));
      auto* cfg = sub.add_option("--config", g.config,
                                 "attention shapes of the regime cases (SPEC §7; default tiny; --level op only)")
                      ->check(CLI::IsMember({"tiny", "qwen3-8b", "llama3.1-8b"}));
      sub.add_option("--level", a->level,
                     "op (default): attention-operator cases; layer: cases of the whole attention layer (x, "
                     "weights, KV cache -> y, y_out, cache after) at qwen3-8b and llama3.1-8b head shapes")
          ->check(CLI::IsMember({"op", "layer"}));
      sub.add_option("--seed", g.seed, "seed of the inputs (default 20261013)")
          ->check(unsigned_up_to(std::numeric_limits<std::uint64_t>::max()));
      sub.add_flag("--grad", g.grad,
                   "also write the upstream gradients do, do_out (cases) and the expected gradients dq, dq_out, dk, "
                   "dv with their E_X (expected files), for training kernels");
      sub.add_flag("--force", a->force,
                   "write into a non-empty --out: the suite's files replace files of the same name, other files "
                   "are left as they are");
      return [a, cfg]() -> int {
        const portkit::GoldenOptions& o = a->golden;
        if (a->level == "layer") {
          require(cfg->count() == 0, "--config ", o.config,
                  " applies to --level op only (the layer suite always covers qwen3-8b, llama3.1-8b and tiny edges)");
          require(!o.grad, "--grad applies to --level op only (the layer suite has no gradients)");
          require_empty_out(o.out, a->force);
          const std::size_t n = portkit::write_layer_suite(o);
          std::printf("orthros golden: %zu layer cases (layer suite v%d, dtype %s, seed %llu) -> %s\n", n,
                      portkit::kLayerSuiteVersion, o.dtype.c_str(), static_cast<unsigned long long>(o.seed),
                      o.out.c_str());
          return 0;
        }
        require_empty_out(o.out, a->force);
        const std::size_t n = portkit::write_operator_suite(o);
        std::printf("orthros golden: %zu cases (suite v%d, dtype %s, config %s, seed %llu%s) -> %s\n", n,
                    portkit::kSuiteVersion, o.dtype.c_str(), o.config.c_str(), static_cast<unsigned long long>(o.seed),
                    o.grad ? ", with gradients" : "", o.out.c_str());
        return 0;
      };
    });

}  // namespace
}  // namespace orthros::cli
