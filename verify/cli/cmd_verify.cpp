// `orthros verify`: the main job. Builds a byte-level model with a named configuration's real
// attention shapes, runs every regime of SPEC §4 on real text and checks that the logits at
// each position agree bitwise with pre-training (SPEC §4.1-4.2).
#include "command.hpp"

#include "orthros/configs.hpp"
#include "orthros/model_io.hpp"
#include "orthros/regimes.hpp"
#include "orthros/safetensors.hpp"
#include "verify_grad.hpp"

#ifdef ORTHROS_HAVE_CUDA
#include "verify_cuda.hpp"
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace orthros::cli {
namespace {

struct VerifyArgs {
  std::string config = "qwen3-8b";
  int layers = 2;
  int d_model = 256;
  int seq_len = 256;
  unsigned seed = 1234;
  std::string text = "/usr/share/common-licenses/GPL-3";
  std::string dtype = "f64";
  std::string device = "cpu";
  std::string weights;  // model file (model_io.hpp); empty: seeded random weights of --config
  bool grad = false;
};

/// Byte-level tokens of a text file: every byte is one token id in [0, 256).
std::vector<int> read_tokens(const std::string& path) {
  try {  // checked before opening: a FIFO or a device such as /dev/zero would block or never end
    st::require_regular_file(path, "a text file");
  } catch (const Error& e) {
    throw Error(std::string("--text: ") + e.what());
  }
  std::ifstream f(path, std::ios::binary);
  require(f.good(), "--text: cannot open '", path, "'");
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t first = bytes.find_first_not_of(" \t\r\n");  // skip leading blank space
  require(first != std::string::npos, "--text: '", path, "' holds no text");
  std::vector<int> tokens;
  for (size_t i = first; i < bytes.size(); ++i) tokens.push_back(static_cast<unsigned char>(bytes[i]));
  return tokens;
}

/// One row of the result table.
struct Row {
  std::string regime;
  long positions = 0;
  double max_abs = 0;
  bool bitwise = true;
  double seconds = 0;
};

template <typename S>
class Verifier {
 public:
  Verifier(const ModelConfig& c, std::uint64_t seed, std::vector<int> text)
      : c_(c), w_(random_weights<S>(c, seed)), text_(std::move(text)) {}
  Verifier(LoadedModel<S> m, std::vector<int> text)
      : c_(m.config), w_(std::move(m.weights)), text_(std::move(text)) {}

  /// Compares `got` row r with reference row ref_row0 + r for every r.
  static void compare(Row& row, const Mat<S>& got, const Mat<S>& ref, Eigen::Index ref_row0) {
    for (Eigen::Index r = 0; r < got.rows(); ++r) {
      for (Eigen::Index j = 0; j < got.cols(); ++j) {
        const S a = got(r, j), b = ref(ref_row0 + r, j);
        if (!(a == b)) row.bitwise = false;  // NaN never compares equal
        const double d = std::abs(static_cast<double>(a) - static_cast<double>(b));
        row.max_abs = std::max(row.max_abs, std::isnan(d) ? INFINITY : d);
      }
      ++row.positions;
    }
  }

  std::vector<Row> run(int T, std::uint64_t seed) {
    using Clock = std::chrono::steady_clock;
    require(T >= 8, "--seq-len must be >= 8 (got ", T, ")");
    require(static_cast<size_t>(2 * T) <= text_.size(), "--text holds ", text_.size(), " tokens; --seq-len ", T,
            " needs ", 2 * T);
    const std::vector<int> tokens(text_.begin(), text_.begin() + T);
    std::vector<Row> rows;
    auto timed = [&](const std::string& name, auto&& body) {
      Row row{name};
      const auto t0 = Clock::now();
      body(row);
      row.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      rows.push_back(row);
      std::fprintf(stderr, "  %-34s done (%.1f s)\n", name.c_str(), row.seconds);
    };

    Mat<S> pt;  // reference: PT logits at positions 1..T
    timed("PT (T_out = T)", [&](Row& row) {
      pt = pretrain(w_, c_, tokens);
      row.positions = pt.rows();
      for (Eigen::Index i = 0; i < pt.size(); ++i)
        if (!std::isfinite(static_cast<double>(pt.data()[i]))) row.bitwise = false;
    });
    for (int T_out : {1, T / 4, T - 1})
      timed("SFT (T_out = " + std::to_string(T_out) + ")",
            [&](Row& row) { compare(row, sft(w_, c_, tokens, T_out), pt, T - T_out); });
    timed("prefill (T_in = T-1)", [&](Row& row) {
      ModelCache<S> cache = empty_cache<S>(c_);
      compare(row, prefill(w_, c_, tokens, cache), pt, T - 1);
    });
    std::mt19937_64 rng(seed);
    std::vector<std::pair<std::string, std::vector<Eigen::Index>>> chunkings;
    {
      const Eigen::Index step = std::max<Eigen::Index>(c_.attn.window - 1, 1);  // chunks just under the window
      std::vector<Eigen::Index> by_window, uneven{1, T / 3, T - 1 - T / 3}, random;
      for (Eigen::Index left = T; left > 0; left -= by_window.back()) by_window.push_back(std::min(left, step));
      for (Eigen::Index left = T; left > 0;) {
        const Eigen::Index s = std::min<Eigen::Index>(left, 1 + static_cast<Eigen::Index>(rng() % (T / 3)));
        random.push_back(s);
        left -= s;
      }
      chunkings = {{"w-1", by_window}, {"1, T/3, rest", uneven}, {"random", random}};
    }
    for (auto& [name, chunk_sizes] : chunkings) {
      const std::vector<Eigen::Index>& sizes = chunk_sizes;  // a C++17 lambda cannot capture a binding
      timed("chunked prefill (" + name + ", " + std::to_string(sizes.size()) + " chunks)", [&](Row& row) {
        ModelCache<S> cache = empty_cache<S>(c_);
        compare(row, prefill_chunked(w_, c_, tokens, sizes, cache), pt, T - 1);
      });
    }
    timed("prefill T/2 + decode T/2 steps", [&](Row& row) {
      ModelCache<S> cache = empty_cache<S>(c_);
      const int half = T / 2;
      compare(row, prefill(w_, c_, std::vector<int>(tokens.begin(), tokens.begin() + half), cache), pt, half - 1);
      for (int t = half; t < T; ++t) compare(row, decode_step(w_, c_, tokens[t], cache), pt, t);
    });
    timed("batched ragged decode (B = 3)", [&](Row& row) {
      // Three sequences of different lengths from different parts of the text; each is
      // prefilled to a different length, then all decode together for `steps` steps.
      const std::vector<int> lengths{T / 2, 3 * T / 8, T / 4 + 3}, offsets{T, T / 3, T / 2};
      // up to 8 steps, each sequence keeping a prompt of >= 1 token (short --seq-len: fewer steps)
      const int steps = std::min(8, *std::min_element(lengths.begin(), lengths.end()) - 1);
      std::vector<std::vector<int>> seq;
      std::vector<Mat<S>> ref;
      std::vector<ModelCache<S>> caches;
      for (size_t b = 0; b < lengths.size(); ++b) {
        seq.emplace_back(text_.begin() + offsets[b], text_.begin() + offsets[b] + lengths[b]);
        ref.push_back(pretrain(w_, c_, seq.back()));
        caches.push_back(empty_cache<S>(c_));
        prefill(w_, c_, std::vector<int>(seq[b].begin(), seq[b].end() - steps), caches[b]);
      }
      std::vector<ModelCache<S>*> ptrs;
      for (auto& cch : caches) ptrs.push_back(&cch);
      for (int s = 0; s < steps; ++s) {
        std::vector<int> next;
        for (size_t b = 0; b < seq.size(); ++b) next.push_back(seq[b][seq[b].size() - steps + s]);
        const Mat<S> logits = decode_batch(w_, c_, next, ptrs);
        for (size_t b = 0; b < seq.size(); ++b)
          compare(row, logits.middleRows(static_cast<Eigen::Index>(b), 1), ref[b],
                  static_cast<Eigen::Index>(seq[b].size()) - steps + s);
      }
    });
    return rows;
  }

 private:
  ModelConfig c_;
  ModelWeights<S> w_;
  std::vector<int> text_;
};

/// Refuses every option given on the command line that the chosen mode does not use, instead of
/// running without it: throws orthros::Error naming the option, the value given, the mode and the
/// options it honours. Options left at their defaults are never refused.
/// \param sub       the `verify` subcommand after parsing (count() of each option: times given)
/// \param honoured  long names of the options the mode reads ("--help" always passes)
/// \param mode      the mode as the message names it, e.g. "--device cuda"
void reject_unhonoured(const CLI::App& sub, const std::vector<std::string>& honoured, const std::string& mode) {
  for (const CLI::Option* o : sub.get_options()) {
    const std::string name = o->get_name();
    if (o->count() == 0 || name == "--help" || std::find(honoured.begin(), honoured.end(), name) != honoured.end())
      continue;
    std::string value, uses;
    for (const std::string& r : o->results()) value += (value.empty() ? "" : " ") + r;
    for (const std::string& h : honoured) uses += (uses.empty() ? "" : ", ") + h;
    throw Error(mode + " does not use " + name + (o->get_expected_min() > 0 ? " (got " + value + ")" : "") +
                "; it honours only " + uses);
  }
}

int print_table(const std::vector<Row>& rows, const VerifyArgs& a, const ModelConfig& c) {
  if (!a.weights.empty())
    std::printf("\northros verify: weights=%s V=%d d_ff=%d rms_eps=%g", a.weights.c_str(), c.vocab_size, c.d_ff,
                c.rms_eps);
  std::printf("\northros verify: config=%s (H_q=%d H_kv=%d D=%d w=%lld theta=%g qk_norm=%s) d_model=%d layers=%d "
              "T=%d dtype=%s seed=%u\n",
              (a.weights.empty() ? a.config : std::string("(--weights)")).c_str(), c.attn.num_q_heads, c.attn.num_kv_heads, c.attn.head_dim,
              static_cast<long long>(c.attn.window), c.attn.rope_theta, c.attn.qk_norm ? "yes" : "no", c.d_model,
              c.num_layers, a.seq_len, a.dtype.c_str(), a.seed);
  std::printf("%-40s %10s %16s %8s %9s\n", "regime", "positions", "max|dlogit| vs PT", "bitwise", "time (s)");
  int failures = 0;
  for (const Row& r : rows) {
    std::printf("%-40s %10ld %16.3g %8s %9.2f\n", r.regime.c_str(), r.positions, r.max_abs, r.bitwise ? "yes" : "NO",
                r.seconds);
    failures += r.bitwise ? 0 : 1;
  }
  if (failures)
    std::printf("FAIL: %d regime(s) disagree with PT\n", failures);
  else
    std::printf("PASS: all %zu regimes bitwise equal to PT\n", rows.size());
  return failures ? 1 : 0;
}

const bool registered = add_command(
    "verify", "Run every regime on real text and check the logits agree bitwise with pre-training", [](CLI::App& sub) {
      auto a = std::make_shared<VerifyArgs>();
      sub.add_option("--config", a->config, "qwen3-8b | llama3.1-8b | tiny")
          ->check(CLI::IsMember({"qwen3-8b", "llama3.1-8b", "tiny"}))
          ->capture_default_str();
      sub.add_option("--layers", a->layers, "decoder layers L")->check(CLI::Range(1, 64))->capture_default_str();
      sub.add_option("--d-model", a->d_model, "residual width")->check(CLI::Range(1, 8192))->capture_default_str();
      sub.add_option("--seq-len", a->seq_len, "tokens T of the main sequence")
          ->check(CLI::Range(8, 1 << 16))
          ->capture_default_str();
      sub.add_option("--seed", a->seed, "seed of the random weights")
          ->check(unsigned_up_to(std::numeric_limits<unsigned>::max()))
          ->capture_default_str();
      sub.add_option("--text", a->text, "text file, tokenized at byte level")->capture_default_str();
      sub.add_option("--weights", a->weights,
                     "model file (docs/file-format.md, e.g. a converted Llama/Qwen3 saved by "
                     "orthros.torch.save_for_oracle): run the regimes on its weights instead of --config's seeded ones; "
                     "token ids are the text's bytes modulo V")
          ->check(CLI::ExistingFile);
      sub.add_option("--dtype", a->dtype, "oracle precision")->check(CLI::IsMember({"f64", "f32"}))->capture_default_str();
      sub.add_option("--device", a->device, "cpu: the oracle; cuda: the GPU kernels")
          ->check(CLI::IsMember({"cpu", "cuda"}))
          ->capture_default_str();
      sub.add_flag("--grad", a->grad,
                   "check the backward instead: operator gradients per regime and a PT/SFT training step against "
                   "finite differences, SFT = masked PT bitwise (f64; --seq-len defaults to 32); with --device cuda: the GPU "
                   "backward (operator and layer training step, bf16) against the float64 oracle");
      auto* seq_len_opt = sub.get_option("--seq-len");
      const CLI::App* app = &sub;
      return [a, seq_len_opt, app]() -> int {
        // --device cuda runs the kernels on seeded random q, k, v (with --grad: and a layer of
        // --config's weights at --d-model), not the model on text: checked in every build, so a
        // build without CUDA names an unused option before it says it has no kernels.
        if (a->device == "cuda" && a->grad)
          reject_unhonoured(*app, {"--device", "--grad", "--config", "--d-model", "--seq-len", "--seed"},
                            "--grad --device cuda (the GPU backward on random q, k, v and one layer's weights)");
        else if (a->device == "cuda")
          reject_unhonoured(*app, {"--device", "--config", "--seq-len", "--seed"},
                            "--device cuda (the GPU operator on random q, k, v of --config's head shapes)");
        else if (a->grad)
          reject_unhonoured(*app, {"--device", "--grad", "--config", "--layers", "--d-model", "--seq-len", "--seed",
                                   "--text", "--dtype"},
                            "--grad (seeded random weights of --config)");
        else if (!a->weights.empty())
          reject_unhonoured(*app, {"--device", "--weights", "--seq-len", "--seed", "--text", "--dtype"},
                            "--weights (the model file defines the configuration)");
        if (a->grad && a->device == "cuda") {
#ifdef ORTHROS_HAVE_CUDA
          return orthros_verify_grad_cuda(a->config, a->d_model, a->seq_len, a->seed);
#else
          throw Error("--device cuda: this build has no CUDA kernels (configure with nvcc on PATH, -DORTHROS_CUDA=ON)");
#endif
        }
        if (a->grad) {
          require(a->dtype == "f64", "--grad needs --dtype f64: finite differences are not meaningful in f32");
          const int T = seq_len_opt->count() ? a->seq_len : 32;
          const ModelConfig c = model_config(a->config, a->d_model, a->layers);
          const std::vector<int> text = read_tokens(a->text);
          require(static_cast<size_t>(T) + 1 <= text.size(), "--text holds ", text.size(), " tokens; --seq-len ", T,
                  " needs ", T + 1);
          return run_verify_grad(c, a->config, std::vector<int>(text.begin(), text.begin() + T + 1), a->seed);
        }
        if (a->device == "cuda") {
#ifdef ORTHROS_HAVE_CUDA
          return orthros_verify_cuda(a->config, a->seq_len, a->seed);
#else
          throw Error("--device cuda: this build has no CUDA kernels (configure with nvcc on PATH, -DORTHROS_CUDA=ON)");
#endif
        }
        if (!a->weights.empty()) {
          std::vector<int> text = read_tokens(a->text);
          std::fprintf(stderr, "orthros verify: running regimes (%s, T=%d)...\n", a->weights.c_str(), a->seq_len);
          if (a->dtype == "f32") {
            LoadedModel<float> m = load_model<float>(a->weights);
            const ModelConfig c = m.config;
            for (int& t : text) t %= c.vocab_size;
            return print_table(Verifier<float>(std::move(m), text).run(a->seq_len, a->seed), *a, c);
          }
          LoadedModel<double> m = load_model<double>(a->weights);
          const ModelConfig c = m.config;
          for (int& t : text) t %= c.vocab_size;
          return print_table(Verifier<double>(std::move(m), text).run(a->seq_len, a->seed), *a, c);
        }
        const ModelConfig c = model_config(a->config, a->d_model, a->layers);
        const std::vector<int> text = read_tokens(a->text);
        std::fprintf(stderr, "orthros verify: running regimes (%s, T=%d)...\n", a->config.c_str(), a->seq_len);
        if (a->dtype == "f32") return print_table(Verifier<float>(c, a->seed, text).run(a->seq_len, a->seed), *a, c);
        return print_table(Verifier<double>(c, a->seed, text).run(a->seq_len, a->seed), *a, c);
      };
    });

}  // namespace
}  // namespace orthros::cli
