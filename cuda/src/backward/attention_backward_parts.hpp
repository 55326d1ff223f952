// Internal entries of the attention backward that run one half of it (after the pre-pass), so a
// benchmark can time the dq kernel and the dk/dv kernel apart. Not installed: the library's users
// call orthros::cuda::attention_backward, which runs both.
#pragma once

#include "orthros/cuda/attention_backward.hpp"

namespace orthros::cuda::detail {

/// attention_backward (same arguments, validation and errors) running the pre-pass and the dq
/// kernel only: dq and dq_out are written, dk and dv are left untouched.
void attention_backward_dq_only(const AttentionConfig& cfg, const BatchLayout& batch,
                                const AttentionBackwardBuffers& buffers, cudaStream_t stream = nullptr);

/// attention_backward (same arguments, validation and errors) running the pre-pass and the dk/dv
/// kernel only: dk and dv are written, dq and dq_out are left untouched.
void attention_backward_dkdv_only(const AttentionConfig& cfg, const BatchLayout& batch,
                                  const AttentionBackwardBuffers& buffers, cudaStream_t stream = nullptr);

}  // namespace orthros::cuda::detail
