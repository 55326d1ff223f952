/// \file verify_cuda.hpp
/// \brief `orthros verify --device cuda`: the GPU half of the main job.
#pragma once

#include <string>

/// Runs the CUDA Orthros attention operator (bf16, fast and deterministic modes) across the
/// regimes PT, SFT, prefill, chunked prefill, prefill + decode steps (with the GPU KV-cache
/// append) and a ragged decode batch, for the attention shapes of `config` ("qwen3-8b",
/// "llama3.1-8b", "tiny"; SPEC §7) on seeded random post-projection q/k/v of `seq_len` tokens.
/// Prints one table row per regime and mode: positions covered, max |Δ| vs PT on the GPU,
/// bitwise equality with PT (required in deterministic mode, SPEC §4.3), max error vs the
/// float64 oracle, pass/fail under SPEC §6 (both criteria, on o, o_out, lse, lse_out), time.
/// \returns 0 when every row passes, 1 otherwise.
/// \throws orthros::Error on an unknown config or seq_len < 8; orthros::cuda::CudaError on a
///   CUDA failure (no GPU, launch error).
int orthros_verify_cuda(const std::string& config, int seq_len, unsigned seed);

/// `orthros verify --grad --device cuda`: the backward on the GPU in bf16 against the
/// float64 oracle under SPEC §6/§9, for four training sequences of the attention shapes of
/// `config` (PT; SFT with T_out = T'/2 and 1; window only, T_out = 0), each alone and all four in
/// one ragged call: (1) attention_backward's dq, dq_out, dk, dv on seeded random q/k/v and dO
/// (the batch call also bitwise equal to the single calls); (2) a training step of the
/// attention layer, attention_layer_backward with the model's layer-0 weights
/// (random_weights(model_config(config, d_model, 1), seed)): dx, dx_out and the gradient of every
/// parameter, weight gradients summed over the batch. Prints one row per sequence and part.
/// \returns 0 when every row passes, 1 otherwise.
/// \throws orthros::Error on an unknown config, seq_len < 8 or d_model < 1, or no GPU;
///   orthros::cuda::CudaError / CublasError on a CUDA failure.
int orthros_verify_grad_cuda(const std::string& config, int d_model, int seq_len, unsigned seed);
