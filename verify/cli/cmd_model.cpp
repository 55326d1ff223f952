// `orthros model`: one forward (and optionally one training step's backward) of a model read from
// a model file (model_io.hpp), written as a safetensors result, so a port of the whole model (e.g.
// orthros.torch's converted Hugging Face model) can be compared with the oracle on the same weights.
#include "command.hpp"

#include "orthros/model_io.hpp"
#include "orthros/regimes.hpp"
#include "orthros/training.hpp"

#include <cstdio>
#include <string>
#include <vector>

namespace orthros::cli {
namespace {

struct ModelArgs {
  std::string weights, out, dtype = "f64";
  std::vector<int> tokens, targets;
  long t_out = -1;  // -1: T (pre-training: every position predicts)
};

template <typename S>
int run_model(const ModelArgs& a) {
  LoadedModel<S> m = load_model<S>(a.weights);
  const Eigen::Index T = static_cast<Eigen::Index>(a.tokens.size());
  require(T >= 1, "--tokens must hold at least one token id");
  const Eigen::Index T_out = a.t_out < 0 ? T : a.t_out;
  require(T_out >= 1 && T_out <= T, "--t-out must be in [1, T = ", T, "] (got ", a.t_out, ")");
  const st::DType out_dtype = a.dtype == "f32" ? st::DType::F32 : st::DType::F64;
  st::File f;
  f.metadata = {{"tokens", std::to_string(T)}, {"t_out", std::to_string(T_out)}, {"dtype", a.dtype}};
  if (a.targets.empty()) {
    ModelCache<S> cache = empty_cache<S>(m.config);
    const Mat<S> logits = forward(m.weights, m.config, a.tokens, T_out, cache);
    f.tensors["logits"] = st::from_matrix(logits, {T_out, m.config.vocab_size}, out_dtype);
  } else {
    require(static_cast<Eigen::Index>(a.targets.size()) == T_out, "--targets must hold T_out = ", T_out,
            " next-token ids, one per predicting position (got ", a.targets.size(), ")");
    const TrainingStep<S> step = loss_and_gradients(m.weights, m.config, a.tokens, a.targets);
    f.tensors["logits"] = st::from_matrix(step.logits, {T_out, m.config.vocab_size}, out_dtype);
    Mat<S> loss(1, 1);
    loss(0, 0) = static_cast<S>(step.loss);
    f.tensors["loss"] = st::from_matrix(loss, {}, out_dtype);
    parameter_tensors(step.grads, m.config, out_dtype, "grad.", f);
  }
  st::write_file(a.out, f);
  std::fprintf(stderr, "orthros model: wrote %s (T = %lld, T_out = %lld%s)\n", a.out.c_str(),
               static_cast<long long>(T), static_cast<long long>(T_out), a.targets.empty() ? "" : ", loss + gradients");
  return 0;
}

const bool registered = add_command(
    "model",
    "Forward (and with --targets one training step's gradients) of a model file, written as safetensors",
    [](CLI::App& sub) {
      auto a = std::make_shared<ModelArgs>();
      sub.add_option("--weights", a->weights, "model file (docs/file-format.md)")->required()->check(CLI::ExistingFile);
      sub.add_option("--tokens", a->tokens, "T input token ids, comma separated")->required()->delimiter(',');
      sub.add_option("--t-out", a->t_out, "predicting positions: the last T_out (default T: pre-training)");
      sub.add_option("--targets", a->targets,
                     "T_out next-token ids (comma separated): also write the mean cross-entropy `loss` and every "
                     "parameter's gradient `grad.<name>`")
          ->delimiter(',');
      sub.add_option("--dtype", a->dtype, "oracle precision (results are written in it)")
          ->check(CLI::IsMember({"f64", "f32"}))
          ->capture_default_str();
      sub.add_option("--out", a->out, "result file: logits [T_out, V], loss [], grad.<name>")->required();
      return [a]() -> int { return a->dtype == "f32" ? run_model<float>(*a) : run_model<double>(*a); };
    });

}  // namespace
}  // namespace orthros::cli
