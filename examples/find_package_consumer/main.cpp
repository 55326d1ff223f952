// A program built against an installed Orthros (find_package(Orthros), targets orthros::reference
// and orthros::kit): the attention operator and its backward on seeded random data, printed as
// checksums, and the output `o` through a safetensors round trip in memory (SPEC §5).
//
// Shapes: T = 12 tokens after a KV cache of P = 4, T_out = 3 output-specific queries, H_q = 4,
// H_kv = 2 (GQA), D = 16, window 5. Exit status 0 when every output is finite and the round trip
// is exact.
#include "orthros/attention.hpp"
#include "orthros/attention_backward.hpp"
#include "orthros/safetensors.hpp"

#include <cmath>
#include <cstdio>
#include <random>

namespace {
orthros::Mat<double> random_mat(std::mt19937_64& rng, Eigen::Index rows, Eigen::Index cols) {
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  orthros::Mat<double> m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = u(rng);
  return m;
}

template <typename M>
double checksum(const M& m, bool& finite) {
  double s = 0;
  for (Eigen::Index i = 0; i < m.size(); ++i) {
    const double x = static_cast<double>(m.data()[i]);
    finite = finite && std::isfinite(x);
    s += x * static_cast<double>(1 + i % 7);  // position-weighted: a permutation changes it
  }
  return s;
}
}  // namespace

int main() {
  const int T = 12, P = 4, T_out = 3;
  const orthros::AttentionDims dims{4, 2, 16};
  const orthros::AttentionOptions opt{5, std::nullopt};  // window 5, scale 1/sqrt(D)
  std::mt19937_64 rng(20261013);
  const auto q = random_mat(rng, T, dims.num_q_heads * dims.head_dim);
  const auto k = random_mat(rng, P + T, dims.num_kv_heads * dims.head_dim);
  const auto v = random_mat(rng, P + T, dims.num_kv_heads * dims.head_dim);
  const auto q_out = random_mat(rng, T_out, dims.num_q_heads * dims.head_dim);
  const auto d_o = random_mat(rng, T, dims.num_q_heads * dims.head_dim);
  const auto d_o_out = random_mat(rng, T_out, dims.num_q_heads * dims.head_dim);

  const auto fwd = orthros::orthros_attention<double>(q, k, v, q_out, dims, opt);
  const auto g = orthros::orthros_attention_backward<double>(q, k, v, q_out, d_o, d_o_out, dims, opt);

  bool finite = true;
  std::printf("orthros_attention:          o %.12f  o_out %.12f  lse %.12f  lse_out %.12f\n",
              checksum(fwd.o, finite), checksum(fwd.o_out, finite), checksum(fwd.lse, finite),
              checksum(fwd.lse_out, finite));
  std::printf("orthros_attention_backward: dq %.12f  dq_out %.12f  dk %.12f  dv %.12f\n", checksum(g.dq, finite),
              checksum(g.dq_out, finite), checksum(g.dk, finite), checksum(g.dv, finite));
  std::printf("checksum %.12f (%s)\n",
              checksum(fwd.o, finite) + checksum(fwd.o_out, finite) + checksum(g.dq, finite) +
                  checksum(g.dk, finite) + checksum(g.dv, finite),
              finite ? "all finite" : "NOT FINITE");
  // The kit: o [T, H_q, D] written as F64 safetensors bytes and parsed back, bitwise.
  orthros::st::File file;
  file.tensors["o"] = orthros::st::from_matrix<double>(fwd.o, {T, dims.num_q_heads, dims.head_dim},
                                                       orthros::st::DType::F64);
  const orthros::st::File back = orthros::st::parse(orthros::st::serialize(file));
  const auto o_back = orthros::st::to_matrix<double>(back.tensors.at("o"), "o");
  const bool exact = o_back == fwd.o;
  std::printf("safetensors round trip of o: %s\n", exact ? "exact" : "DIFFERS");
  return finite && exact ? 0 : 1;
}
