/// \file orthros_model_rc.hpp
/// \brief rapidcheck helpers for model-level tests: tiny random ModelConfigs (every draw is
/// part of the printed counterexample) and random token sequences.
#pragma once

#include "orthros_rc.hpp"

#include "orthros/model.hpp"

#include <rapidcheck.h>

#include <sstream>
#include <string>
#include <vector>

namespace orthros::testing {

/// A tiny model configuration: L in {1, 2}, d_model in {8, 12, 16}, d_ff in {8, 16, 24},
/// V = 32, GQA ratio in {1, 2, 3, 7} with H_kv in {1, 2}, even D in {2, 4, 6, 8} (RoPE),
/// window from draw_window(n_max), theta in {1e4, 1e6}, QK-norm on or off.
inline ModelConfig draw_tiny_model_config(Index n_max) {
  ModelConfig c;
  c.name = "rc-tiny";
  c.vocab_size = 32;
  c.num_layers = *rc::gen::inRange(1, 3);
  c.d_model = *rc::gen::element(8, 12, 16);
  c.d_ff = *rc::gen::element(8, 16, 24);
  const AttentionDims d = draw_dims();
  c.attn.num_q_heads = d.num_q_heads;
  c.attn.num_kv_heads = d.num_kv_heads;
  c.attn.head_dim = *rc::gen::element(2, 4, 6, 8);
  c.attn.window = draw_window(n_max);
  c.attn.rope_theta = *rc::gen::element(1e4, 1e6);
  c.attn.qk_norm = *rc::gen::arbitrary<bool>();
  return c;
}

inline std::string describe(const ModelConfig& c) {
  std::ostringstream os;
  os << "V=" << c.vocab_size << " L=" << c.num_layers << " d_model=" << c.d_model << " d_ff=" << c.d_ff
     << " H_q=" << c.attn.num_q_heads << " H_kv=" << c.attn.num_kv_heads << " D=" << c.attn.head_dim
     << " w=" << c.attn.window << " theta=" << c.attn.rope_theta << " qk_norm=" << c.attn.qk_norm;
  return os.str();
}

/// n random token ids in [0, V).
inline std::vector<int> draw_tokens(Index n, int vocab) {
  return *rc::gen::container<std::vector<int>>(static_cast<size_t>(n), rc::gen::inRange(0, vocab));
}

/// Random split of n >= 1 into consecutive chunk sizes >= 1.
inline std::vector<Index> draw_chunking(Index n) {
  std::vector<Index> sizes;
  Index left = n;
  while (left > 0) {
    const Index s = *rc::gen::inRange<Index>(1, left + 1);
    sizes.push_back(s);
    left -= s;
  }
  return sizes;
}

}  // namespace orthros::testing
