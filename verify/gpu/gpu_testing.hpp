/// \file gpu_testing.hpp
/// \brief Helpers of the GPU suites on top of the GPU harness (verify/gpu/harness: guarded,
/// NaN-poisoned device buffers, AttentionCase): skipping without a GPU, running the CUDA
/// operator on oracle-style matrices (one sequence or a ragged batch), SPEC §6 comparison.
#pragma once

#include "attention_case.hpp"
#include "device_buffer.hpp"
#include "orthros_testing.hpp"

#include "orthros/attention.hpp"
#include "orthros/check.hpp"
#include "orthros/cuda/attention.hpp"
#include "orthros/tensor.hpp"

#include <cstdlib>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace orthros::gputest {

/// Reason string when no usable GPU is present, empty otherwise.
inline std::string no_gpu_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return std::string("no CUDA device: cudaGetDeviceCount: ") + cudaGetErrorString(e);
  if (n == 0) return "no CUDA device present";
  return "";
}
#define ORTHROS_REQUIRE_GPU()                                          \
  do {                                                                 \
    const std::string _why = ::orthros::gputest::no_gpu_reason();      \
    if (!_why.empty()) GTEST_SKIP() << "GPU test skipped: " << _why;   \
  } while (0)

using gpu_harness::check_cuda;
using gpu_harness::DeviceBuffer;

template <typename S>
constexpr cuda::DType dtype_of() {
  if constexpr (std::is_same_v<S, float>) return cuda::DType::f32;
  else if constexpr (std::is_same_v<S, Eigen::half>) return cuda::DType::f16;
  else return cuda::DType::bf16;
}

/// One sequence of a call, in the oracle's layout: q [T, Hq*D], k/v [P+T, Hkv*D], q_out [T_out, Hq*D].
template <typename S>
struct SeqIn {
  Mat<S> q, k, v, q_out;
};

/// A random sequence (T tokens after P cached ones, T_out output queries) with entries uniform in
/// [-1, 1], q/k/q_out scaled by amp_qk (large logits).
template <typename S>
SeqIn<S> make_case(testing::Rng& rng, const AttentionDims& d, Eigen::Index T, Eigen::Index P, Eigen::Index T_out,
                   double amp_qk = 1.0) {
  SeqIn<S> s;
  s.q = testing::random_mat<S>(T, d.num_q_heads * d.head_dim, rng, amp_qk);
  s.k = testing::random_mat<S>(P + T, d.num_kv_heads * d.head_dim, rng, amp_qk);
  s.v = testing::random_mat<S>(P + T, d.num_kv_heads * d.head_dim, rng);
  s.q_out = testing::random_mat<S>(T_out, d.num_q_heads * d.head_dim, rng, amp_qk);
  return s;
}

/// One line naming a forward case (for failure messages).
inline std::string describe(const AttentionDims& d, Eigen::Index T, Eigen::Index P, Eigen::Index T_out,
                            std::int64_t w, bool det, int splits, std::uint64_t seed) {
  std::ostringstream os;
  os << "H_q=" << d.num_q_heads << " H_kv=" << d.num_kv_heads << " D=" << d.head_dim << " T=" << T << " P=" << P
     << " T_out=" << T_out << " w=" << w << " det=" << det << " splits=" << splits << " seed=" << seed;
  return os.str();
}

/// GPU outputs of one sequence.
template <typename S>
struct SeqOut {
  Mat<S> o, o_out;
  Mat<float> lse, lse_out;
};

/// Kernel family under test: ORTHROS_TEST_KERNEL = generic | hopper | automatic (unset:
/// automatic). ctest runs test_attention_gpu once as is and once with generic (suffix .generic),
/// so on a Hopper GPU both the wgmma kernel and the fallback are tested.
inline cuda::KernelPath test_kernel_path() {
  const char* e = std::getenv("ORTHROS_TEST_KERNEL");
  const std::string v = e ? e : "";
  if (v == "generic") return cuda::KernelPath::generic;
  if (v == "hopper") return cuda::KernelPath::hopper;
  if (v.empty() || v == "automatic") return cuda::KernelPath::automatic;
  throw std::runtime_error("ORTHROS_TEST_KERNEL must be generic, hopper or automatic (got '" + v + "')");
}

/// The sequences `seqs` uploaded into one forward AttentionCase (sequence b's rows from its
/// q_row / out_row / cache_row) with window `window` and `slack` NaN-poisoned cache rows.
template <typename S>
gpu_harness::AttentionCase upload_case(const std::vector<SeqIn<S>>& seqs, const AttentionDims& dims, std::int64_t window,
                                       Eigen::Index slack) {
  gpu_harness::CaseShape shape{dims.num_q_heads, dims.num_kv_heads, dims.head_dim, window, int(sizeof(S)), {}};
  for (const auto& s : seqs) shape.seqs.push_back({s.q.rows(), s.k.rows() - s.q.rows(), s.q_out.rows()});
  gpu_harness::AttentionCase c(shape, dtype_of<S>(), false, slack);
  for (size_t b = 0; b < seqs.size(); ++b) c.upload_sequence(int(b), seqs[b].q, seqs[b].k, seqs[b].v, seqs[b].q_out);
  return c;
}

/// Runs attention_forward on a ragged batch through an AttentionCase (each sequence's cache
/// holds its own k/v rows; the capacity has `slack` extra rows poisoned with NaN, which the
/// kernels must never read). The outputs are NaN-poisoned before the launch and every buffer's
/// canaries are checked after it.
template <typename S>
std::vector<SeqOut<S>> run_gpu(const std::vector<SeqIn<S>>& seqs, const AttentionDims& dims, cuda::AttentionConfig cfg,
                               Eigen::Index slack = 37) {
  if (cfg.kernel == cuda::KernelPath::automatic) cfg.kernel = test_kernel_path();
  gpu_harness::AttentionCase c = upload_case(seqs, dims, cfg.window, slack);
  cfg = c.config(cfg);
  // Calls alternate in pairs between a caller workspace (attention_workspace_bytes, NaN-poisoned:
  // the split-KV states must be written before merge_kernel reads them) and the library's internal
  // one, so tests that run two kernel paths per case (HopperMatchesGeneric) see both on both.
  static int calls = 0;
  c.set_workspace(((calls++ >> 1) % 2 == 0) ? cuda::attention_workspace_bytes(cfg, c.layout()) : 0);
  c.forward(cfg);
  const int Hq = dims.num_q_heads, D = dims.head_dim;
  std::vector<SeqOut<S>> out(seqs.size());
  for (size_t b = 0; b < seqs.size(); ++b) {
    const auto& s = seqs[b];
    auto& r = out[b];
    r.o.resize(s.q.rows(), Hq * D);
    r.o_out.resize(s.q_out.rows(), Hq * D);
    r.lse.resize(s.q.rows(), Hq);
    r.lse_out.resize(s.q_out.rows(), Hq);
    gpu_harness::AttentionCase::download_rows(c.o, r.o, c.q_row(int(b)));
    gpu_harness::AttentionCase::download_rows(c.o_out, r.o_out, c.out_row(int(b)));
    gpu_harness::AttentionCase::download_rows(c.lse, r.lse, c.q_row(int(b)));
    gpu_harness::AttentionCase::download_rows(c.lse_out, r.lse_out, c.out_row(int(b)));
  }
  return out;
}

template <typename S>
SeqOut<S> run_gpu1(const SeqIn<S>& s, const AttentionDims& dims, const cuda::AttentionConfig& cfg) {
  return run_gpu<S>(std::vector<SeqIn<S>>{s}, dims, cfg)[0];
}

/// Result of comparing one GPU run with the float64 oracle under SPEC §6 (all four tensors).
struct OracleCheck {
  bool pass = true;
  std::string report;
  double max_err = 0;  // max abs error over o and o_out
};

template <typename S>
OracleCheck check_vs_oracle(const SeqIn<S>& in, const SeqOut<S>& got, const AttentionDims& dims,
                            const AttentionOptions& opt) {
  const auto ref = orthros_attention<double>(in.q.template cast<double>(), in.k.template cast<double>(),
                                             in.v.template cast<double>(), in.q_out.template cast<double>(), dims, opt);
  const auto at = orthros_attention<S>(in.q, in.k, in.v, in.q_out, dims, opt);
  const std::string dt = dtype_name<S>();
  OracleCheck oc;
  std::ostringstream os;
  // SPEC §6's LSE rules (the float32 floor F, criterion 1's scale max(|lse|, 1)) need the most
  // keys a row sees: P = cache rows - T.
  const std::int64_t T = in.q.rows(), P = in.k.rows() - T, T_out = in.q_out.rows();
  auto one = [&](const std::string& name, const auto& actual, const Mat<double>& r, const auto& oracle_at, int heads,
                 int inner) {
    if (r.rows() == 0) return;
    const double ex = check::max_abs_diff(oracle_at, r);
    const auto rep =
        check::compare(name, actual, r, heads, inner, dt, ex, check::lse_max_keys(name, P, T, T_out, opt.window));
    if (name == "o" || name == "o_out") oc.max_err = std::max(oc.max_err, rep.max_abs);
    if (!rep.pass) {
      oc.pass = false;
      os << name << ": rel_fro=" << rep.rel_fro << " (tol " << rep.rel_tol << ") max_abs=" << rep.max_abs
         << " (tol " << rep.abs_tol << ", oracle@" << dt << "=" << ex << ") nan=" << rep.nan_count
         << " inf=" << rep.inf_count << " worst at row " << (rep.worst_index.empty() ? -1 : rep.worst_index[0])
         << " got " << rep.worst_actual << " ref " << rep.worst_ref << "\n";
    }
  };
  const int Hq = dims.num_q_heads, D = dims.head_dim;
  one("o", got.o, ref.o, at.o, Hq, D);
  one("o_out", got.o_out, ref.o_out, at.o_out, Hq, D);
  one("lse", got.lse, ref.lse, at.lse, Hq, 1);
  one("lse_out", got.lse_out, ref.lse_out, at.lse_out, Hq, 1);
  oc.report = os.str();
  return oc;
}

/// Bitwise equality of two matrices; returns a message on the first difference.
template <typename S>
std::string bitwise(const Mat<S>& a, const Mat<S>& b, const std::string& what) {
  if (a.rows() != b.rows() || a.cols() != b.cols()) return what + ": shapes differ";
  for (Eigen::Index r = 0; r < a.rows(); ++r)
    for (Eigen::Index c = 0; c < a.cols(); ++c)
      if (std::memcmp(&a(r, c), &b(r, c), sizeof(S)) != 0) {
        std::ostringstream os;
        os.precision(9);
        os << what << ": first bitwise difference at [" << r << ", " << c << "]: " << static_cast<double>(a(r, c))
           << " vs " << static_cast<double>(b(r, c));
        return os.str();
      }
  return "";
}

}  // namespace orthros::gputest
