/// \file configs.hpp
/// \brief The named configurations of SPEC §7 (real attention shapes).
#pragma once

#include "orthros/model.hpp"

#include <string>

namespace orthros {

/// Attention shapes of a named configuration: "qwen3-8b", "llama3.1-8b" or "tiny".
/// \throws orthros::Error for an unknown name (listing the known ones).
inline AttentionConfig attention_config(const std::string& name) {
  AttentionConfig a;
  if (name == "qwen3-8b") {
    a = AttentionConfig{32, 8, 128, 128, 1e6, true, 1e-6};
  } else if (name == "llama3.1-8b") {
    a = AttentionConfig{32, 8, 128, 128, 5e5, false, 1e-6};
  } else if (name == "tiny") {
    a = AttentionConfig{4, 2, 16, 8, 1e4, true, 1e-6};
  } else {
    throw Error("unknown config '" + name + "' (known: qwen3-8b, llama3.1-8b, tiny)");
  }
  return a;
}

/// A byte-level model (V = 256) with a named configuration's real attention shapes and a small
/// residual stream: `d_model` and `num_layers` are free (the real 4096/36 would take hours on a
/// CPU oracle), `d_ff = 2 * d_model`.
/// \throws orthros::Error for an unknown name or non-positive sizes.
inline ModelConfig model_config(const std::string& name, int d_model, int num_layers) {
  ModelConfig c;
  c.name = name;
  c.vocab_size = 256;
  c.d_model = d_model;
  c.d_ff = 2 * d_model;
  c.num_layers = num_layers;
  c.attn = attention_config(name);
  check_config(c);
  return c;
}

}  // namespace orthros
