/// \file case_shape.hpp
/// \brief Shape of one attention call (a ragged batch) and its FLOP and byte counts: the one
/// formula that the GPU benchmarks report and the harness's unit test checks against a
/// brute-force count. Host logic only (no CUDA).
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace orthros::gpu_harness {

/// One sequence of a call: T base tokens after P cached ones, the last T_out of them with
/// output queries (SPEC §2; 0 <= T_out <= T, P >= 0).
struct SequenceShape {
  std::int64_t T = 0, P = 0, T_out = 0;
};

/// Sum of min(u, w) over the integers u in [lo, hi] (0 when hi < lo).
inline double sum_min(std::int64_t lo, std::int64_t hi, std::int64_t w) {
  if (hi < lo) return 0.0;
  const std::int64_t cut = std::min(hi, w);  // u in [lo, cut] contributes u, u in (max(cut, lo - 1), hi] w
  double s = 0.0;
  if (cut >= lo) s += (static_cast<double>(lo) + static_cast<double>(cut)) * static_cast<double>(cut - lo + 1) / 2.0;
  const std::int64_t first_w = std::max(lo, cut + 1);
  if (hi >= first_w) s += static_cast<double>(w) * static_cast<double>(hi - first_w + 1);
  return s;
}

/// Shape of one call: heads, head dimension, window, element size and the sequences.
///
/// Pair counts (SPEC §2, positions 0-based and absolute within the sequence):
/// - base stream: the row at position t (P <= t < P+T) attends keys j with t - w < j <= t, that
///   is min(t + 1, w) keys;
/// - output stream: the row at position t (P+T-T_out <= t < P+T) attends every key j <= t, that
///   is t + 1 keys (full causal).
/// So base_pairs = sum over t in [P, P+T) of min(t+1, w) and output_pairs = sum over t in
/// [P+T-T_out, P+T) of (t+1), per sequence and query head, summed over the sequences.
///
/// FLOPs (multiply-add = 2 FLOPs; softmax, scaling and merges not counted, as FlashAttention
/// counts them): per (query row, key) pair and query head, the forward runs two GEMMs of inner
/// size D, S = Q K^T and O = P V, so 2*D + 2*D = 4*D FLOPs; the backward runs five, the
/// recomputed S = Q K^T, dP = dO V^T, dV += P^T dO, dQ = dS K and dK = dS^T Q, so 10*D FLOPs =
/// 2.5 x the forward.
///
/// Bytes (compulsory HBM traffic, each tensor moved once; the LSEs, 4 bytes per row and head,
/// are not counted): the forward reads q, q_out and the K/V rows the call needs and writes o and
/// o_out; the K/V rows needed are the whole cache P+T when T_out > 0 (the output stream reads
/// from key 0), else the rows from the first base row's window start max(0, P-w+1). The backward
/// reads q, q_out, o, o_out, dO, dO_out and those K/V rows and writes dq, dq_out, dk and dv
/// (dk, dv: one row per base token, the backward's packed layout).
struct CaseShape {
  int num_q_heads = 0;   ///< H_q
  int num_kv_heads = 0;  ///< H_kv
  int head_dim = 0;      ///< D
  std::int64_t window = 128;  ///< w >= 1 (w >= P+T: full causal attention in the base stream)
  int element_bytes = 2;      ///< bytes of one element of q, k, v, o (4 f32, 2 f16/bf16)
  std::vector<SequenceShape> seqs;

  /// B identical sequences (T, P, T_out).
  static CaseShape uniform(int Hq, int Hkv, int D, std::int64_t w, int element_bytes, int B, std::int64_t T,
                           std::int64_t P, std::int64_t T_out) {
    CaseShape c{Hq, Hkv, D, w, element_bytes, std::vector<SequenceShape>(static_cast<std::size_t>(B), {T, P, T_out})};
    c.validate();
    return c;
  }

  /// Throws std::invalid_argument naming the field and value when the shape is not a valid call.
  void validate() const {
    auto bad = [](const std::string& what) { throw std::invalid_argument("CaseShape: " + what); };
    if (num_q_heads < 1 || num_kv_heads < 1 || head_dim < 1)
      bad("heads and head_dim must be >= 1 (got H_q=" + std::to_string(num_q_heads) + " H_kv=" +
          std::to_string(num_kv_heads) + " D=" + std::to_string(head_dim) + ")");
    if (window < 1) bad("window must be >= 1 (got " + std::to_string(window) + ")");
    if (element_bytes != 2 && element_bytes != 4)
      bad("element_bytes must be 2 or 4 (got " + std::to_string(element_bytes) + ")");
    for (std::size_t b = 0; b < seqs.size(); ++b) {
      const auto& s = seqs[b];
      if (s.T < 0 || s.P < 0 || s.T_out < 0 || s.T_out > s.T)
        bad("sequence " + std::to_string(b) + " needs T >= 0, P >= 0, 0 <= T_out <= T (got T=" + std::to_string(s.T) +
            " P=" + std::to_string(s.P) + " T_out=" + std::to_string(s.T_out) + ")");
    }
  }

  std::int64_t total_q() const { return sum([](const SequenceShape& s) { return s.T; }); }      ///< sum T_b
  std::int64_t total_out() const { return sum([](const SequenceShape& s) { return s.T_out; }); }  ///< sum T_out_b
  /// Largest cache length P_b + T_b of the batch.
  std::int64_t max_cache() const {
    std::int64_t m = 0;
    for (const auto& s : seqs) m = std::max(m, s.P + s.T);
    return m;
  }

  /// Base-stream (row, key) pairs per query head, summed over the sequences.
  double base_pairs() const {
    double p = 0;
    for (const auto& s : seqs) p += sum_min(s.P + 1, s.P + s.T, window);
    return p;
  }
  /// Output-stream (row, key) pairs per query head, summed over the sequences.
  double output_pairs() const {
    double p = 0;
    for (const auto& s : seqs) p += sum_min(s.P + s.T - s.T_out + 1, s.P + s.T, s.P + s.T);
    return p;
  }
  double pairs() const { return base_pairs() + output_pairs(); }  ///< both streams

  double forward_flops() const { return 4.0 * head_dim * num_q_heads * pairs(); }   ///< see the struct comment
  double backward_flops() const { return 2.5 * forward_flops(); }                     ///< 10*D per pair and head

  /// K/V cache rows the call reads, summed over the sequences (the struct comment says which).
  double kv_rows_read() const {
    double r = 0;
    for (const auto& s : seqs) {
      if (s.T == 0) continue;
      const std::int64_t first_key = s.T_out > 0 ? 0 : std::max<std::int64_t>(0, s.P - window + 1);
      r += static_cast<double>(s.P + s.T - first_key);
    }
    return r;
  }
  double q_row_bytes() const { return double(element_bytes) * num_q_heads * head_dim; }    ///< one q/o row
  double kv_row_bytes() const { return double(element_bytes) * num_kv_heads * head_dim; }  ///< one k or v row

  /// Compulsory bytes of attention_forward: q, q_out read, o, o_out written, K and V rows read.
  double forward_bytes() const {
    return q_row_bytes() * 2.0 * double(total_q() + total_out()) + kv_row_bytes() * 2.0 * kv_rows_read();
  }
  /// Compulsory bytes of attention_backward: per stream q, o, dO read and dq written (four row
  /// sets of q_row_bytes), K and V rows read, dk and dv written (one row per base token).
  double backward_bytes() const {
    return q_row_bytes() * 4.0 * double(total_q() + total_out()) + kv_row_bytes() * 2.0 * kv_rows_read() +
           kv_row_bytes() * 2.0 * double(total_q());
  }

 private:
  template <typename F>
  std::int64_t sum(F f) const {
    std::int64_t n = 0;
    for (const auto& s : seqs) n += f(s);
    return n;
  }
};

}  // namespace orthros::gpu_harness
