/// \file attention_case.hpp
/// \brief One attention (and optionally backward) case on the device: the device tensors of a
/// ragged batch, the one place where orthros::cuda::AttentionBuffers and AttentionBackwardBuffers
/// are filled, and the case's FLOPs and bytes (CaseShape's formula).
#pragma once

#include "case_shape.hpp"
#include "device_buffer.hpp"

#include "orthros/cuda/attention.hpp"
#include "orthros/cuda/attention_backward.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace orthros::gpu_harness {

/// Device tensors of one call over a ragged batch of B sequences (CaseShape::seqs), in the
/// library's layouts (orthros/cuda/attention.hpp):
///   q, o, d_o, dq             [sum T_b, H_q, D]       sequence b from row q_row(b)
///   q_out, o_out, d_o_out, dq_out [sum T_out_b, H_q, D] sequence b from row out_row(b)
///   lse [sum T_b, H_q], lse_out [sum T_out_b, H_q]   float32
///   k_cache, v_cache          [B, capacity, H_kv, D]  sequence b from row cache_row(b)
///   dk, dv                    [sum T_b, H_kv, D]      the backward's packed layout, from q_row(b)
/// capacity = max_b (P_b + T_b) + capacity_slack: the slack rows stay NaN-poisoned, so a kernel
/// that reads past a sequence's cache produces NaN. Every buffer is a guarded DeviceBuffer;
/// inputs start NaN-poisoned until uploaded or filled. The d_o..dv buffers exist only when the
/// case is built with `backward`.
class AttentionCase {
 public:
  /// Throws std::invalid_argument for an invalid shape (CaseShape::validate) or one whose
  /// element size is not dtype's, CudaError when an allocation fails.
  AttentionCase(const CaseShape& shape, cuda::DType dtype, bool backward = false, std::int64_t capacity_slack = 0);

  const CaseShape& shape() const { return shape_; }
  cuda::DType dtype() const { return dtype_; }
  const cuda::BatchLayout& layout() const { return layout_; }
  std::int64_t capacity() const { return capacity_; }
  int batch() const { return static_cast<int>(shape_.seqs.size()); }
  std::int64_t q_row(int b) const { return q_row_[static_cast<std::size_t>(b)]; }      ///< first row of sequence b in q
  std::int64_t out_row(int b) const { return out_row_[static_cast<std::size_t>(b)]; }  ///< ... in q_out
  std::int64_t cache_row(int b) const { return std::int64_t(b) * capacity_; }          ///< ... in k_cache
  std::size_t elem_bytes() const { return static_cast<std::size_t>(shape_.element_bytes); }

  /// `base` with the case's dtype, heads, head dimension and window set (the rest kept).
  cuda::AttentionConfig config(cuda::AttentionConfig base = {}) const;

  /// The forward's buffers: every tensor above; the output-stream pointers null when
  /// sum T_out_b == 0; workspace when set_workspace() gave it bytes (else null: the library
  /// allocates its own).
  cuda::AttentionBuffers forward_buffers() const;
  /// The backward's buffers: the forward's inputs and outputs, d_o, d_o_out, the gradients and
  /// the backward workspace when set. Throws std::logic_error when built without `backward`.
  cuda::AttentionBackwardBuffers backward_buffers() const;

  /// Allocates a NaN-poisoned caller workspace of `bytes` for the forward (0: none).
  void set_workspace(std::size_t bytes);
  /// The same for the backward's pre-pass scratch.
  void set_backward_workspace(std::size_t bytes);

  /// Fills q, q_out, k_cache, v_cache (and d_o, d_o_out when backward) with fill_uniform()
  /// values from `seed` (each tensor its own seed: seed + 1, + 2, ...). For benchmarks.
  void fill_inputs(std::uint64_t seed, cudaStream_t stream = nullptr);
  /// NaN-poisons o, o_out, lse, lse_out and the forward workspace.
  void poison_outputs(cudaStream_t stream = nullptr);
  /// NaN-poisons dq, dq_out, dk, dv and the backward workspace.
  void poison_gradients(cudaStream_t stream = nullptr);
  /// DeviceBuffer::check_canaries() of every buffer of the case; throws naming the buffer.
  void check_canaries() const;

  /// Poisons the outputs, runs attention_forward(cfg) on `stream`, synchronizes and checks the
  /// canaries. cfg must match config() in dtype, heads and D (its window is the caller's).
  void forward(const cuda::AttentionConfig& cfg, cudaStream_t stream = nullptr);
  /// Poisons the gradients, runs attention_backward(cfg), synchronizes and checks the canaries.
  void backward(const cuda::AttentionConfig& cfg, cudaStream_t stream = nullptr);

  /// Uploads sequence b's host rows (row-major, the oracle's layout): q [T_b, H_q*D],
  /// k and v [rows <= capacity, H_kv*D] from cache_row(b), q_out [T_out_b, H_q*D].
  template <typename M>
  void upload_sequence(int b, const M& q_b, const M& k_b, const M& v_b, const M& q_out_b) {
    upload_rows(q, q_b, q_row(b), shape_.q_row_bytes());
    upload_rows(k_cache, k_b, cache_row(b), shape_.kv_row_bytes());
    upload_rows(v_cache, v_b, cache_row(b), shape_.kv_row_bytes());
    upload_rows(q_out, q_out_b, out_row(b), shape_.q_row_bytes());
  }
  /// Uploads sequence b's upstream gradients d_o [T_b, H_q*D] and d_o_out [T_out_b, H_q*D].
  template <typename M>
  void upload_upstream(int b, const M& d_o_b, const M& d_o_out_b) {
    upload_rows(d_o, d_o_b, q_row(b), shape_.q_row_bytes());
    upload_rows(d_o_out, d_o_out_b, out_row(b), shape_.q_row_bytes());
  }
  /// Copies m.rows() rows of `buf` starting at `first_row` (rows of m.cols() elements) into m
  /// (its shape already set).
  template <typename M>
  static void download_rows(const DeviceBuffer& buf, M& m, std::int64_t first_row) {
    buf.download_into(m, static_cast<std::size_t>(first_row) * static_cast<std::size_t>(m.cols()));
  }
  /// Copies host rows into `buf` from row `first_row`, `row_bytes` per row.
  template <typename M>
  static void upload_rows(DeviceBuffer& buf, const M& m, std::int64_t first_row, double row_bytes) {
    if (m.size())
      buf.upload(m.data(), static_cast<std::size_t>(m.size()) * sizeof(typename M::Scalar),
                 static_cast<std::size_t>(first_row) * static_cast<std::size_t>(row_bytes));
  }

  double forward_flops() const { return shape_.forward_flops(); }    ///< CaseShape::forward_flops
  double backward_flops() const { return shape_.backward_flops(); }  ///< CaseShape::backward_flops
  double forward_bytes() const { return shape_.forward_bytes(); }    ///< CaseShape::forward_bytes
  double backward_bytes() const { return shape_.backward_bytes(); }  ///< CaseShape::backward_bytes

  DeviceBuffer q, q_out, k_cache, v_cache, o, o_out, lse, lse_out, workspace;
  DeviceBuffer d_o, d_o_out, dq, dq_out, dk, dv, backward_workspace;

 private:
  std::vector<const DeviceBuffer*> all() const;
  // After a launch on `stream`: the launch status, a synchronization, the canary check.
  void finish_call(cudaStream_t stream, const char* call) const;
  CaseShape shape_;
  cuda::DType dtype_;
  bool backward_ = false;
  cuda::BatchLayout layout_;
  std::int64_t capacity_ = 0;
  std::vector<std::int64_t> q_row_, out_row_;
};

}  // namespace orthros::gpu_harness
