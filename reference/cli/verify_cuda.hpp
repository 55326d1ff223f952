/// \file verify_cuda.hpp
/// \brief `orthros verify --device cuda`: the GPU half of the main job (issue 4).
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
