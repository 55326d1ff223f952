// AttentionCase: the device tensors of one attention case (attention_case.hpp).
#include "attention_case.hpp"

#include <stdexcept>

namespace orthros::gpu_harness {

AttentionCase::AttentionCase(const CaseShape& shape, cuda::DType dtype, bool backward, std::int64_t capacity_slack)
    : shape_(shape), dtype_(dtype), backward_(backward) {
  shape_.validate();
  if (shape_.element_bytes != element_bytes(dtype))
    throw std::invalid_argument("AttentionCase: element_bytes " + std::to_string(shape_.element_bytes) +
                                " does not match dtype " + cuda::dtype_name(dtype));
  if (capacity_slack < 0)
    throw std::invalid_argument("AttentionCase: capacity_slack must be >= 0 (got " + std::to_string(capacity_slack) +
                                ")");
  std::int64_t rq = 0, ro = 0;
  for (const auto& s : shape_.seqs) {
    layout_.q_lens.push_back(static_cast<int>(s.T));
    layout_.out_lens.push_back(static_cast<int>(s.T_out));
    layout_.cache_lens.push_back(s.P + s.T);
    q_row_.push_back(rq);
    out_row_.push_back(ro);
    rq += s.T;
    ro += s.T_out;
  }
  capacity_ = shape_.max_cache() + capacity_slack;
  const auto qb = static_cast<std::size_t>(shape_.q_row_bytes()), kvb = static_cast<std::size_t>(shape_.kv_row_bytes());
  const auto tq = static_cast<std::size_t>(rq), to = static_cast<std::size_t>(ro);
  const std::size_t cache = static_cast<std::size_t>(batch()) * static_cast<std::size_t>(capacity_) * kvb;
  const std::size_t lse_row = 4 * static_cast<std::size_t>(shape_.num_q_heads);
  q = DeviceBuffer("q", tq * qb);
  q_out = DeviceBuffer("q_out", to * qb);
  k_cache = DeviceBuffer("k_cache", cache);
  v_cache = DeviceBuffer("v_cache", cache);
  o = DeviceBuffer("o", tq * qb);
  o_out = DeviceBuffer("o_out", to * qb);
  lse = DeviceBuffer("lse", tq * lse_row);
  lse_out = DeviceBuffer("lse_out", to * lse_row);
  if (backward_) {
    d_o = DeviceBuffer("d_o", tq * qb);
    d_o_out = DeviceBuffer("d_o_out", to * qb);
    dq = DeviceBuffer("dq", tq * qb);
    dq_out = DeviceBuffer("dq_out", to * qb);
    dk = DeviceBuffer("dk", tq * kvb);
    dv = DeviceBuffer("dv", tq * kvb);
  }
}

cuda::AttentionConfig AttentionCase::config(cuda::AttentionConfig base) const {
  base.dtype = dtype_;
  base.num_q_heads = shape_.num_q_heads;
  base.num_kv_heads = shape_.num_kv_heads;
  base.head_dim = shape_.head_dim;
  base.window = shape_.window;
  return base;
}

namespace {

// The fields AttentionBuffers and AttentionBackwardBuffers share: the forward's inputs and
// outputs; the output-stream pointers null when the batch has no output rows.
template <typename Buffers>
void fill_forward_fields(const AttentionCase& c, Buffers& b) {
  const bool outs = c.shape().total_out() > 0;
  b.q = c.q.data();
  b.q_out = outs ? c.q_out.data() : nullptr;
  b.k_cache = c.k_cache.data();
  b.v_cache = c.v_cache.data();
  b.capacity = c.capacity();
  b.o = c.o.data();
  b.o_out = outs ? c.o_out.data() : nullptr;
  b.lse = c.lse.as<float>();
  b.lse_out = outs ? c.lse_out.as<float>() : nullptr;
}

}  // namespace

cuda::AttentionBuffers AttentionCase::forward_buffers() const {
  cuda::AttentionBuffers b;
  fill_forward_fields(*this, b);
  b.workspace = workspace.bytes() ? workspace.data() : nullptr;
  b.workspace_bytes = workspace.bytes();
  return b;
}

cuda::AttentionBackwardBuffers AttentionCase::backward_buffers() const {
  if (!backward_) throw std::logic_error("AttentionCase::backward_buffers: the case was built without backward");
  const bool outs = shape_.total_out() > 0;
  cuda::AttentionBackwardBuffers b;
  fill_forward_fields(*this, b);
  b.d_o = d_o.data();
  b.d_o_out = outs ? d_o_out.data() : nullptr;
  b.dq = dq.data();
  b.dq_out = outs ? dq_out.data() : nullptr;
  b.dk = dk.data();
  b.dv = dv.data();
  b.workspace = backward_workspace.bytes() ? backward_workspace.data() : nullptr;
  b.workspace_bytes = backward_workspace.bytes();
  return b;
}

void AttentionCase::set_workspace(std::size_t bytes) { workspace = DeviceBuffer("forward workspace", bytes); }

void AttentionCase::set_backward_workspace(std::size_t bytes) {
  backward_workspace = DeviceBuffer("backward workspace", bytes);
}

void AttentionCase::fill_inputs(std::uint64_t seed, cudaStream_t stream) {
  q.fill_uniform(dtype_, seed + 1, stream);
  q_out.fill_uniform(dtype_, seed + 2, stream);
  k_cache.fill_uniform(dtype_, seed + 3, stream);
  v_cache.fill_uniform(dtype_, seed + 4, stream);
  if (backward_) {
    d_o.fill_uniform(dtype_, seed + 5, stream);
    d_o_out.fill_uniform(dtype_, seed + 6, stream);
  }
}

void AttentionCase::poison_outputs(cudaStream_t stream) {
  for (DeviceBuffer* b : {&o, &o_out, &lse, &lse_out, &workspace}) b->poison(stream);
}

void AttentionCase::poison_gradients(cudaStream_t stream) {
  for (DeviceBuffer* b : {&dq, &dq_out, &dk, &dv, &backward_workspace}) b->poison(stream);
}

std::vector<const DeviceBuffer*> AttentionCase::all() const {
  return {&q, &q_out, &k_cache, &v_cache, &o, &o_out, &lse, &lse_out, &workspace,
          &d_o, &d_o_out, &dq, &dq_out, &dk, &dv, &backward_workspace};
}

void AttentionCase::check_canaries() const {
  for (const DeviceBuffer* b : all()) b->check_canaries();
}

void AttentionCase::finish_call(cudaStream_t stream, const char* call) const {
  check_cuda(cudaGetLastError(), std::string(call) + " launch");
  check_cuda(stream ? cudaStreamSynchronize(stream) : cudaDeviceSynchronize(), std::string("synchronize after ") + call);
  check_canaries();
}

void AttentionCase::forward(const cuda::AttentionConfig& cfg, cudaStream_t stream) {
  poison_outputs(stream);
  cuda::attention_forward(cfg, layout_, forward_buffers(), stream);
  finish_call(stream, "attention_forward");
}

void AttentionCase::backward(const cuda::AttentionConfig& cfg, cudaStream_t stream) {
  poison_gradients(stream);
  cuda::attention_backward(cfg, layout_, backward_buffers(), stream);
  finish_call(stream, "attention_backward");
}

}  // namespace orthros::gpu_harness
