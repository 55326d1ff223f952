// SPEC §4.1/§4.2 at model level: the logits and every layer's y' at absolute position t are the
// same bits in every regime (PT, SFT with any split, prefill, chunked prefill with any chunking,
// prefill + decode, batched ragged decode, mixed ragged batches), in float and in double.
#include "orthros_model_rc.hpp"

#include "orthros/regimes.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <omp.h>

#include <string>
#include <vector>

using namespace orthros;
using namespace orthros::testing;

namespace {

// The PT run of one sequence: logits [N, V], per-layer y' [N, d_model], final caches.
template <typename S>
struct PtRef {
  Mat<S> logits;
  ForwardTrace<S> trace;
  ModelCache<S> cache;
};

template <typename S>
PtRef<S> run_pt(const ModelWeights<S>& w, const ModelConfig& c, const std::vector<int>& tokens) {
  PtRef<S> r;
  r.cache = empty_cache<S>(c);
  r.logits = forward(w, c, tokens, static_cast<Index>(tokens.size()), r.cache, &r.trace);
  RC_ASSERT(all_finite(r.logits));
  return r;
}

// Compares rows [row0, row0+n) of a call's logits / trace (its output rows start at out_row0 in
// the stacked trace) with the PT rows of absolute positions first_pos..first_pos+n-1 (1-based).
template <typename S>
void expect_matches_pt(const PtRef<S>& pt, const Mat<S>& logits, Index row0, const ForwardTrace<S>* trace,
                       Index out_row0, Index first_pos, Index n, const std::string& regime) {
  for (Index i = 0; i < n; ++i) {
    const Index p = first_pos + i - 1;  // 0-based PT row
    const std::string at = regime + " position " + std::to_string(p + 1);
    fail_if(bitwise_row_diff(logits, row0 + i, pt.logits, p, at + " logits"));
    if (trace) {
      RC_ASSERT(trace->y_out.size() == pt.trace.y_out.size());
      for (size_t l = 0; l < trace->y_out.size(); ++l)
        fail_if(bitwise_row_diff(trace->y_out[l], out_row0 + i, pt.trace.y_out[l], p,
                                 at + " layer " + std::to_string(l) + " y'"));
    }
  }
}

// Caches built by any regime hold the same keys/values as the PT cache (positions 1..len).
template <typename S>
void expect_cache_prefix(const ModelCache<S>& got, const ModelCache<S>& pt, const std::string& regime) {
  for (size_t l = 0; l < got.layers.size(); ++l) {
    const Index n = got.layers[l].length();
    const Mat<S> kp = pt.layers[l].k.topRows(n), vp = pt.layers[l].v.topRows(n);
    fail_if(bitwise_diff(got.layers[l].k, kp, regime + " layer " + std::to_string(l) + " cached k"));
    fail_if(bitwise_diff(got.layers[l].v, vp, regime + " layer " + std::to_string(l) + " cached v"));
  }
}

template <typename S>
void single_sequence_regimes() {
  const Index N = *rc::gen::inRange<Index>(1, 13);
  const ModelConfig c = draw_tiny_model_config(N);
  const std::uint64_t seed = *rc::gen::arbitrary<std::uint64_t>();
  const std::vector<int> tokens = draw_tokens(N, c.vocab_size);
  RC_LOG() << dtype_name<S>() << " " << describe(c) << " N=" << N << " seed=" << seed << "\n";
  const ModelWeights<S> w = random_weights<S>(c, seed);
  const PtRef<S> pt = run_pt(w, c, tokens);

  // pretrain() API = the PT reference.
  fail_if(bitwise_diff(pretrain(w, c, tokens), pt.logits, "pretrain() logits"));

  // SFT with a random split (API and traced forward).
  {
    const Index T_out = *rc::gen::inRange<Index>(1, N + 1);
    const std::string r = "SFT(T_out=" + std::to_string(T_out) + ")";
    expect_matches_pt(pt, sft(w, c, tokens, T_out), 0, static_cast<const ForwardTrace<S>*>(nullptr), 0, N - T_out + 1,
                      T_out, r);
    ModelCache<S> cache = empty_cache<S>(c);
    ForwardTrace<S> tr;
    const Mat<S> lg = forward(w, c, tokens, T_out, cache, &tr);
    expect_matches_pt(pt, lg, 0, &tr, 0, N - T_out + 1, T_out, r);
    expect_cache_prefix(cache, pt.cache, r);
  }

  // Prefill of the prompt 1..t.
  {
    const Index t = *rc::gen::inRange<Index>(1, N + 1);
    ModelCache<S> cache = empty_cache<S>(c);
    const std::vector<int> prompt(tokens.begin(), tokens.begin() + t);
    expect_matches_pt(pt, prefill(w, c, prompt, cache), 0, static_cast<const ForwardTrace<S>*>(nullptr), 0, t, 1,
                      "prefill(t=" + std::to_string(t) + ")");
    expect_cache_prefix(cache, pt.cache, "prefill");
  }

  // Chunked prefill (API: T_out = 0 for all chunks but the last) with a random chunking.
  {
    const std::vector<Index> sizes = draw_chunking(N);
    ModelCache<S> cache = empty_cache<S>(c);
    expect_matches_pt(pt, prefill_chunked(w, c, tokens, sizes, cache), 0, static_cast<const ForwardTrace<S>*>(nullptr),
                      0, N, 1, "prefill_chunked (" + std::to_string(sizes.size()) + " chunks)");
    expect_cache_prefix(cache, pt.cache, "prefill_chunked");
  }

  // General chunked forward: random chunking, each chunk with a random T_out in [0, T_chunk]
  // (covers SFT-like chunks, prefill chunks and decode pairs when T_chunk = 1), traced.
  {
    const std::vector<Index> sizes = draw_chunking(N);
    ModelCache<S> cache = empty_cache<S>(c);
    Index p0 = 0;
    for (size_t ci = 0; ci < sizes.size(); ++ci) {
      const Index T = sizes[ci], T_out = *rc::gen::inRange<Index>(0, T + 1);
      ForwardTrace<S> tr;
      const std::vector<int> chunk(tokens.begin() + p0, tokens.begin() + p0 + T);
      const Mat<S> lg = forward(w, c, chunk, T_out, cache, &tr);
      RC_ASSERT(lg.rows() == T_out);
      expect_matches_pt(pt, lg, 0, &tr, 0, p0 + T - T_out + 1, T_out,
                        "chunk " + std::to_string(ci) + " (P=" + std::to_string(p0) + ", T=" + std::to_string(T) +
                            ", T_out=" + std::to_string(T_out) + ")");
      p0 += T;
    }
    expect_cache_prefix(cache, pt.cache, "chunked forward");
  }

  // Prefill of 1..n0, then decode steps n0+1..N (the decoupled pair, one token per step).
  {
    const Index n0 = *rc::gen::inRange<Index>(1, N + 1);
    ModelCache<S> cache = empty_cache<S>(c);
    const std::vector<int> prompt(tokens.begin(), tokens.begin() + n0);
    expect_matches_pt(pt, prefill(w, c, prompt, cache), 0, static_cast<const ForwardTrace<S>*>(nullptr), 0, n0, 1,
                      "prefill before decode");
    for (Index t = n0 + 1; t <= N; ++t)
      expect_matches_pt(pt, decode_step(w, c, tokens[size_t(t - 1)], cache), 0,
                        static_cast<const ForwardTrace<S>*>(nullptr), 0, t, 1, "decode_step t=" + std::to_string(t));
    RC_ASSERT(cache.length() == N);
    expect_cache_prefix(cache, pt.cache, "prefill + decode");
  }
}

// B sequences of different lengths and prompt lengths: each prefilled alone, then decoded in
// ragged batches (decode_batch over the sequences that still have tokens). Every row must equal
// that sequence's own PT logits.
template <typename S>
void batched_ragged_decode() {
  const Index B = *rc::gen::inRange<Index>(2, 5);
  const ModelConfig c = draw_tiny_model_config(10);
  const std::uint64_t seed = *rc::gen::arbitrary<std::uint64_t>();
  RC_LOG() << dtype_name<S>() << " " << describe(c) << " B=" << B << " seed=" << seed << "\n";
  const ModelWeights<S> w = random_weights<S>(c, seed);
  std::vector<std::vector<int>> toks;
  std::vector<Index> prompt_len;
  std::vector<PtRef<S>> pts;
  std::vector<ModelCache<S>> caches;
  for (Index b = 0; b < B; ++b) {
    const Index N = *rc::gen::inRange<Index>(1, 11);
    toks.push_back(draw_tokens(N, c.vocab_size));
    prompt_len.push_back(*rc::gen::inRange<Index>(1, N + 1));
    pts.push_back(run_pt(w, c, toks.back()));
    caches.push_back(empty_cache<S>(c));
    const std::vector<int> prompt(toks.back().begin(), toks.back().begin() + prompt_len.back());
    expect_matches_pt(pts.back(), prefill(w, c, prompt, caches.back()), 0,
                      static_cast<const ForwardTrace<S>*>(nullptr), 0, prompt_len.back(), 1,
                      "prefill of sequence " + std::to_string(b));
  }
  for (int step = 0;; ++step) {
    std::vector<int> step_tokens;
    std::vector<ModelCache<S>*> step_caches;
    std::vector<Index> who;
    for (Index b = 0; b < B; ++b) {
      const Index t = caches[size_t(b)].length() + 1;  // next absolute position of sequence b
      if (t <= Index(toks[size_t(b)].size())) {
        who.push_back(b);
        step_tokens.push_back(toks[size_t(b)][size_t(t - 1)]);
        step_caches.push_back(&caches[size_t(b)]);
      }
    }
    if (who.empty()) break;
    std::vector<Index> pos;
    for (Index b : who) pos.push_back(caches[size_t(b)].length() + 1);
    const Mat<S> lg = decode_batch(w, c, step_tokens, step_caches);
    RC_ASSERT(lg.rows() == Index(who.size()));
    for (size_t i = 0; i < who.size(); ++i)
      expect_matches_pt(pts[size_t(who[i])], lg, Index(i), static_cast<const ForwardTrace<S>*>(nullptr), 0, pos[i], 1,
                        "decode_batch step " + std::to_string(step) + " sequence " + std::to_string(who[i]));
  }
  for (Index b = 0; b < B; ++b) expect_cache_prefix(caches[size_t(b)], pts[size_t(b)].cache, "ragged decode");
}

// Mixed ragged batches through forward_batch: in every call each unfinished sequence takes a
// random next chunk with a random T_out (one may decode while another prefills or trains).
// Logits and every layer's y' rows must equal each sequence's own PT rows.
template <typename S>
void mixed_ragged_batches() {
  const Index B = *rc::gen::inRange<Index>(1, 4);
  const ModelConfig c = draw_tiny_model_config(10);
  const std::uint64_t seed = *rc::gen::arbitrary<std::uint64_t>();
  RC_LOG() << dtype_name<S>() << " " << describe(c) << " B=" << B << " seed=" << seed << "\n";
  const ModelWeights<S> w = random_weights<S>(c, seed);
  std::vector<std::vector<int>> toks;
  std::vector<PtRef<S>> pts;
  std::vector<ModelCache<S>> caches;
  for (Index b = 0; b < B; ++b) {
    toks.push_back(draw_tokens(*rc::gen::inRange<Index>(1, 11), c.vocab_size));
    pts.push_back(run_pt(w, c, toks.back()));
    caches.push_back(empty_cache<S>(c));
  }
  for (int call = 0;; ++call) {
    std::vector<SequenceInput> seqs;
    std::vector<ModelCache<S>*> cs;
    std::vector<Index> who, p0s;
    for (Index b = 0; b < B; ++b) {
      const Index p0 = caches[size_t(b)].length(), N = Index(toks[size_t(b)].size());
      if (p0 >= N) continue;
      const Index T = *rc::gen::inRange<Index>(1, N - p0 + 1);
      const Index T_out = *rc::gen::inRange<Index>(0, T + 1);
      seqs.push_back(SequenceInput{std::vector<int>(toks[size_t(b)].begin() + p0, toks[size_t(b)].begin() + p0 + T), T_out});
      cs.push_back(&caches[size_t(b)]);
      who.push_back(b);
      p0s.push_back(p0);
    }
    if (who.empty()) break;
    ForwardTrace<S> tr;
    const std::vector<Mat<S>> out = forward_batch(w, c, seqs, cs, &tr);
    Index out_row0 = 0;
    for (size_t i = 0; i < who.size(); ++i) {
      const Index T = Index(seqs[i].tokens.size()), T_out = seqs[i].T_out;
      expect_matches_pt(pts[size_t(who[i])], out[i], 0, &tr, out_row0, p0s[i] + T - T_out + 1, T_out,
                        "forward_batch call " + std::to_string(call) + " sequence " + std::to_string(who[i]) +
                            " (P=" + std::to_string(p0s[i]) + ", T=" + std::to_string(T) +
                            ", T_out=" + std::to_string(T_out) + ")");
      out_row0 += T_out;
    }
  }
  for (Index b = 0; b < B; ++b) expect_cache_prefix(caches[size_t(b)], pts[size_t(b)].cache, "mixed ragged batch");
}

}  // namespace

// Proves SPEC §4.1/§4.2 for one sequence, double: pretrain(), SFT (random split), prefill of a
// random prefix, prefill_chunked (random chunking), chunked forward with random T_out per chunk,
// and prefill + decode_step give bit-identical logits (and per-layer y' where traced) at every
// absolute position, and KV caches bit-identical to PT's. Random tiny configs: L 1-2, GQA
// 1/2/3/7, D 2-8, any window incl. 1 and >= T, theta 1e4/1e6, QK-norm on/off.
RC_GTEST_PROP(ModelRegimes, SingleSequenceBitwiseDouble, ()) { single_sequence_regimes<double>(); }
RC_GTEST_PROP(ModelRegimes, SingleSequenceBitwiseFloat, ()) { single_sequence_regimes<float>(); }

// Proves batched ragged decode (decode_batch over sequences of different cache lengths) equals
// each sequence's own PT logits bitwise, and leaves every cache equal to its PT cache.
RC_GTEST_PROP(ModelRegimes, BatchedRaggedDecodeBitwiseDouble, ()) { batched_ragged_decode<double>(); }
RC_GTEST_PROP(ModelRegimes, BatchedRaggedDecodeBitwiseFloat, ()) { batched_ragged_decode<float>(); }

// Proves forward_batch over mixed ragged batches (sequences in different regimes in one call)
// gives each sequence's PT logits and per-layer y' bitwise: a token's arithmetic does not
// depend on the other sequences in the batch.
RC_GTEST_PROP(ModelRegimes, MixedRaggedBatchesBitwiseDouble, ()) { mixed_ragged_batches<double>(); }
RC_GTEST_PROP(ModelRegimes, MixedRaggedBatchesBitwiseFloat, ()) { mixed_ragged_batches<float>(); }

// Proves the model's logits and per-layer y' do not depend on the OpenMP thread count
// (1 vs 3 threads), for T up to 24 rows so that the row-parallel projections do split.
RC_GTEST_PROP(ModelRegimes, ThreadCountInvarianceDouble, ()) {
  const Index N = *rc::gen::inRange<Index>(8, 25);
  const ModelConfig c = draw_tiny_model_config(N);
  const std::uint64_t seed = *rc::gen::arbitrary<std::uint64_t>();
  RC_LOG() << describe(c) << " N=" << N << " seed=" << seed << "\n";
  const ModelWeights<double> w = random_weights<double>(c, seed);
  const std::vector<int> tokens = draw_tokens(N, c.vocab_size);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const PtRef<double> a = run_pt(w, c, tokens);
  omp_set_num_threads(3);
  const PtRef<double> b = run_pt(w, c, tokens);
  omp_set_num_threads(saved);
  fail_if(bitwise_diff(a.logits, b.logits, "logits 1 vs 3 threads"));
  for (size_t l = 0; l < a.trace.y_out.size(); ++l)
    fail_if(bitwise_diff(a.trace.y_out[l], b.trace.y_out[l], "y' layer " + std::to_string(l) + " 1 vs 3 threads"));
}
