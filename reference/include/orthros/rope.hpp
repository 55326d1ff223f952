/// \file rope.hpp
/// \brief Rotary position embedding (RoPE), rotate-half convention (Llama, Qwen; SPEC §2), and
/// its backward.
#pragma once

#include "orthros/tensor.hpp"

#include <cmath>
#include <cstdint>

namespace orthros {

namespace detail {

/// Rotates the pairs (x[i], x[i+D/2]) of one head by the angle `direction * pos * theta^(-2i/D)`
/// (direction +1: RoPE, -1: its inverse = transpose). cos/sin in double, rounded once to Acc.
template <typename S>
void rotate_half_pairs(S* x, int head_dim, std::int64_t pos, double theta, int direction) {
  using Acc = AccumT<S>;
  require(head_dim % 2 == 0, "RoPE needs an even head_dim (got ", head_dim, ")");
  require(pos >= 0, "RoPE position must be >= 0 (got ", pos, ")");
  require(theta > 0, "rope_theta must be > 0 (got ", theta, ")");
  const int half = head_dim / 2;
  for (int i = 0; i < half; ++i) {
    const double angle = static_cast<double>(pos) * std::pow(theta, -2.0 * i / head_dim);
    const Acc c = static_cast<Acc>(std::cos(angle)), s = static_cast<Acc>(direction * std::sin(angle));
    const Acc x1 = static_cast<Acc>(x[i]), x2 = static_cast<Acc>(x[i + half]);
    x[i] = static_cast<S>(x1 * c - x2 * s);
    x[i + half] = static_cast<S>(x2 * c + x1 * s);
  }
}

}  // namespace detail

/// Rotates one head vector in place: for i in [0, D/2), with `a = pos * theta^(-2i/D)`,
///   x[i]       <- x[i] cos a - x[i+D/2] sin a
///   x[i+D/2]   <- x[i+D/2] cos a + x[i] sin a
/// The angle, cos and sin are computed in double and rounded once to the accumulator type.
///
/// \param x     D values of one head (contiguous)
/// \param head_dim D, must be even
/// \param pos   0-based RoPE position: the token at absolute position t (1-based, SPEC §2)
///              uses `pos = t - 1`, like Hugging Face `position_ids`. An output-specific
///              token uses its base token's position.
/// \param theta RoPE base (e.g. 1e6 for Qwen3, 5e5 for Llama 3.1), > 0
/// \throws orthros::Error if D is odd, pos < 0 or theta <= 0.
template <typename S>
void apply_rope(S* x, int head_dim, std::int64_t pos, double theta) {
  detail::rotate_half_pairs(x, head_dim, pos, theta, +1);
}

/// Backward of apply_rope, in place: RoPE is a rotation, so dL/dx = R(a)^T dL/dy = R(-a) dL/dy:
///   g[i]     <- g[i] cos a + g[i+D/2] sin a
///   g[i+D/2] <- g[i+D/2] cos a - g[i] sin a
/// \param g        D values of dL/d(rotated head), replaced by dL/d(head before RoPE)
/// \param head_dim D, even; \param pos 0-based RoPE position; \param theta RoPE base (> 0)
/// \throws orthros::Error as apply_rope.
template <typename S>
void apply_rope_backward(S* g, int head_dim, std::int64_t pos, double theta) {
  detail::rotate_half_pairs(g, head_dim, pos, theta, -1);
}

}  // namespace orthros
