// Tests of the model file (verify/kit/include/orthros/model_io.hpp): a round trip gives the
// weights back bitwise and the loaded model's logits are the original's bitwise; every malformed
// file is an orthros::Error naming the key or tensor.
#include "orthros/model_io.hpp"
#include "orthros/regimes.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace orthros {
namespace {

ModelConfig small_config(bool qk_norm) {
  ModelConfig c;
  c.vocab_size = 40;
  c.d_model = 12;
  c.d_ff = 20;
  c.num_layers = 2;
  c.attn = AttentionConfig{4, 2, 6, 3, 1e4, qk_norm, 1e-6};  // d = H_q*D = 24 != d_model
  return c;
}

void expect_error(const st::File& f, const std::string& needle) {
  try {
    load_model<double>(f);
    ADD_FAILURE() << "no error; expected one containing: " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(ModelFile, RoundTripIsBitwiseAndGivesTheSameLogits) {
  for (bool qk : {true, false}) {
    const ModelConfig c = small_config(qk);
    const ModelWeights<double> w = random_weights<double>(c, 7);
    const st::File f = st::parse(st::serialize(model_file(w, c, st::DType::F64)));
    const LoadedModel<double> m = load_model<double>(f);
    EXPECT_EQ(m.config.attn.qk_norm, qk);
    EXPECT_EQ(m.config.d_ff, c.d_ff);
    EXPECT_EQ(m.config.attn.window, c.attn.window);
    EXPECT_EQ(m.config.attn.rope_theta, c.attn.rope_theta);
    std::vector<std::pair<std::string, std::vector<double>>> a, b;
    auto collect = [](auto& out) {
      return [&out](const std::string& n, const double* p, Eigen::Index k) { out.push_back({n, {p, p + k}}); };
    };
    for_each_parameter(w, collect(a));
    for_each_parameter(m.weights, collect(b));
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      if (!qk && (a[i].first.find("_norm") != std::string::npos) && a[i].first.find("attn.") != std::string::npos)
        continue;  // q_norm/k_norm are not stored without QK-norm (unused by the layer)
      EXPECT_EQ(a[i].first, b[i].first);
      EXPECT_EQ(a[i].second, b[i].second) << a[i].first;
    }
    const std::vector<int> tokens{3, 17, 39, 0, 22, 5, 5, 11};
    EXPECT_TRUE(pretrain(w, c, tokens) == pretrain(m.weights, m.config, tokens));
  }
}

TEST(ModelFile, MalformedFilesNameTheProblem) {
  const ModelConfig c = small_config(true);
  const st::File good = model_file(random_weights<double>(c, 3), c, st::DType::F32);
  {
    st::File f = good;
    f.metadata.erase("orthros_model");
    expect_error(f, "orthros_model");
  }
  {
    st::File f = good;
    f.metadata["window"] = "0";
    expect_error(f, "\"window\" must be an integer in [1,");
  }
  {
    st::File f = good;
    f.metadata["rope_theta"] = "abc";
    expect_error(f, "\"rope_theta\" must be a finite number");
  }
  {
    st::File f = good;
    f.metadata["qk_norm"] = "yes";
    expect_error(f, "\"qk_norm\" must be \"true\" or \"false\"");
  }
  {
    st::File f = good;
    f.metadata["qk_norm"] = "false";
    expect_error(f, "layers.0.attn.q_norm\" is present but metadata qk_norm is \"false\"");
  }
  {
    st::File f = good;
    f.tensors.erase("layers.1.w_up");
    expect_error(f, "missing tensor \"layers.1.w_up\" [12, 20]");
  }
  {
    st::File f = good;
    f.tensors["lm_head"] = f.tensors["embedding"];  // [V, d_model] where [d_model, V] is expected
    expect_error(f, "tensor \"lm_head\" must have shape [12, 40]; got [40, 12]");
  }
  {
    st::File f = good;
    f.metadata["num_kv_heads"] = "3";  // H_q = 4 is no multiple of 3
    expect_error(f, "");
  }
  {
    st::File f = good;
    Mat<double> bad = st::to_matrix<double>(f.tensors["final_norm"], "final_norm");
    bad(2, 0) = std::nan("");
    f.tensors["final_norm"] = st::from_matrix(bad, {12}, st::DType::F64);
    expect_error(f, "tensor \"final_norm\" holds NaN at [2]");
  }
}

}  // namespace
}  // namespace orthros
