/// \file regimes.hpp
/// \brief The four regimes of paper §3.2 (SPEC §4) as the API a user calls. All of them are
/// `forward_batch` with a different (T, T_out, P); docs/regimes.md draws each one.
///
/// | regime            | T_in      | T_out | cache P before |
/// |-------------------|-----------|-------|----------------|
/// | pretrain          | 0         | T     | 0              |
/// | sft               | T - T_out | T_out | 0              |
/// | prefill           | T - 1     | 1     | 0, or > 0 when continuing a cache |
/// | prefill chunk     | T         | 0     | >= 0 (fills the cache only) |
/// | decode_step       | 0         | 1     | t - 1          |
#pragma once

#include "orthros/model.hpp"

#include <numeric>

namespace orthros {

/// Pre-training (T_in = 0, T_out = T): logits at every position. Returns [T, V].
/// \throws orthros::Error on empty input or bad tokens.
template <typename S>
Mat<S> pretrain(const ModelWeights<S>& w, const ModelConfig& c, const std::vector<int>& tokens) {
  require(!tokens.empty(), "pretrain needs T >= 1 tokens");
  ModelCache<S> cache = empty_cache<S>(c);
  return forward(w, c, tokens, static_cast<Eigen::Index>(tokens.size()), cache);
}

/// Supervised fine-tuning (T_in = T - T_out): logits of the last T_out positions, [T_out, V].
/// \throws orthros::Error unless 1 <= T_out <= T.
template <typename S>
Mat<S> sft(const ModelWeights<S>& w, const ModelConfig& c, const std::vector<int>& tokens, Eigen::Index T_out) {
  require(T_out >= 1 && T_out <= static_cast<Eigen::Index>(tokens.size()), "sft needs 1 <= T_out <= T (got T_out = ",
          T_out, ", T = ", tokens.size(), ")");
  ModelCache<S> cache = empty_cache<S>(c);
  return forward(w, c, tokens, T_out, cache);
}

/// Prefill (T_in = T - 1, T_out = 1): fills `cache` with the prompt and returns the logits of the
/// last prompt token, [1, V]. A non-empty cache is continued (the last chunk of a chunked prefill).
/// \throws orthros::Error on an empty prompt.
template <typename S>
Mat<S> prefill(const ModelWeights<S>& w, const ModelConfig& c, const std::vector<int>& prompt, ModelCache<S>& cache) {
  require(!prompt.empty(), "prefill needs a prompt of >= 1 tokens");
  return forward(w, c, prompt, 1, cache);
}

/// A prefill chunk that is not the last (T_out = 0): only appends the chunk to `cache`.
template <typename S>
void prefill_chunk(const ModelWeights<S>& w, const ModelConfig& c, const std::vector<int>& chunk, ModelCache<S>& cache) {
  forward(w, c, chunk, 0, cache);
}

/// Chunked prefill: `prompt` split into consecutive chunks of the given sizes (which must sum to
/// the prompt length, each >= 1); every chunk but the last has T_out = 0, the last T_out = 1.
/// Returns the logits of the last prompt token, [1, V].
/// \throws orthros::Error if the chunk sizes are not positive or do not sum to the prompt length.
template <typename S>
Mat<S> prefill_chunked(const ModelWeights<S>& w, const ModelConfig& c, const std::vector<int>& prompt,
                       const std::vector<Eigen::Index>& chunk_sizes, ModelCache<S>& cache) {
  require(!chunk_sizes.empty(), "chunk_sizes must not be empty");
  Eigen::Index total = 0;
  for (Eigen::Index s : chunk_sizes) {
    require(s >= 1, "every chunk size must be >= 1 (got ", s, ")");
    total += s;
  }
  require(total == static_cast<Eigen::Index>(prompt.size()), "chunk sizes sum to ", total, " but the prompt has ",
          prompt.size(), " tokens");
  auto it = prompt.begin();
  for (size_t i = 0; i + 1 < chunk_sizes.size(); ++i) {
    prefill_chunk(w, c, std::vector<int>(it, it + chunk_sizes[i]), cache);
    it += chunk_sizes[i];
  }
  return prefill(w, c, std::vector<int>(it, prompt.end()), cache);
}

/// One decode step (T = 1, T_out = 1, P = t - 1): the decoupled pair. The base token appends to
/// the cache and attends within the window; its output-specific copy attends to all t positions.
/// Returns the logits at position t, [1, V].
template <typename S>
Mat<S> decode_step(const ModelWeights<S>& w, const ModelConfig& c, int token, ModelCache<S>& cache) {
  return forward(w, c, {token}, 1, cache);
}

/// Batched decode over sequences of different lengths (ragged): one pair per sequence per step,
/// token-wise modules on the stacked rows, attention per sequence against its own cache.
/// \param w      model weights
/// \param c      model configuration
/// \param tokens one token per sequence
/// \param caches their caches (lengths may differ); each grows by one position
/// \throws orthros::Error if the counts differ or a token is out of range.
/// \returns [B, V], row b the logits of sequence b at its new position.
template <typename S>
Mat<S> decode_batch(const ModelWeights<S>& w, const ModelConfig& c, const std::vector<int>& tokens,
                    const std::vector<ModelCache<S>*>& caches) {
  require(tokens.size() == caches.size(), "decode_batch: ", tokens.size(), " tokens for ", caches.size(), " caches");
  std::vector<SequenceInput> seqs;
  for (int t : tokens) seqs.push_back(SequenceInput{{t}, 1});
  const std::vector<Mat<S>> per_seq = forward_batch<S>(w, c, seqs, caches);
  Mat<S> logits(static_cast<Eigen::Index>(tokens.size()), c.vocab_size);
  for (size_t b = 0; b < per_seq.size(); ++b) logits.row(static_cast<Eigen::Index>(b)) = per_seq[b].row(0);
  return logits;
}

}  // namespace orthros
