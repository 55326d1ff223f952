// Context parallelism's drivers (docs/context_parallel.md): one attention call over the ranks'
// shards (window stream interior / halo exchange / boundary, then the output stream's partials,
// gathered and merged on the last rank), and one decode step.
#include "context_parallel/internal.hpp"
#include "common/device.cuh"

namespace orthros::cuda {

using namespace cp_detail;

// ---- drivers ------------------------------------------------------------------------------------
void cp_attention(const AttentionConfig& cfg, const CpLayout& layout, std::int64_t T, std::int64_t T_out,
                  CpTransport& tr, const std::vector<CpRankBuffers>& local, cudaStream_t stream,
                  const CpOptions& opt) {
  detail::validate_config(cfg);
  check_layout(layout);
  require(layout.ranks() == tr.ranks(), "the layout has ", layout.ranks(), " shards but the transport ",
          tr.ranks(), " ranks");
  const std::vector<int> ranks = tr.local_ranks();
  require(local.size() == ranks.size(), "cp_attention: ", local.size(), " rank buffers for the transport's ",
          ranks.size(), " local ranks");
  const std::int64_t N = layout.total();
  require(T >= 0 && T <= N, "T (base queries) must be in [0, N = ", N, "] (got ", T, ")");
  require(T_out >= 0 && T_out <= T, "T_out must be in [0, T] (got T_out = ", T_out, ", T = ", T, ")");
  const bool last_local = ranks.back() == layout.ranks() - 1;
  for (size_t i = 0; i < local.size(); ++i) {
    const int r = ranks[i];
    const CpRows rows = cp_rank_rows(layout, r, T);
    if (rows.count > 0 || T_out > 0) check_kv(cfg, layout, r, local[i].kv);
    if (rows.count > 0)
      require(local[i].q && local[i].o, "rank ", r, ": q and o must not be null (", rows.count, " base rows)");
    if (T_out > 0) {
      require(local[i].q_out && local[i].o_part && local[i].lse_part, "rank ", r,
              ": q_out, o_part and lse_part must not be null (T_out = ", T_out, ")");
      require(local[i].scratch && local[i].scratch_bytes >= cp_scratch_bytes(cfg, T_out), "rank ", r,
              ": scratch must hold cp_scratch_bytes() = ", cp_scratch_bytes(cfg, T_out), " bytes (got ",
              local[i].scratch_bytes, ")");
    }
  }
  const bool state_path = T_out > 0 && cp_state_splits(cfg, layout, 0, T_out) > 0;
  if (T_out > 0 && last_local) {
    require(local.back().o_out, "the last rank (", layout.ranks() - 1, ") needs o_out (T_out = ", T_out, ")");
    if (state_path) {
      std::size_t need = 0;
      for (int r = 0; r < layout.ranks(); ++r) need += state_bytes(cfg, splits_for(cfg, layout.length[r]));
      require(local.back().states_all && local.back().states_all_bytes >= need, "the last rank (",
              layout.ranks() - 1, ") needs states_all of ", need,
              " bytes (sum of cp_states_bytes over the shards) on the state path; got ", local.back().states_all_bytes);
    } else {
      require(local.back().o_parts && local.back().lse_parts, "the last rank (", layout.ranks() - 1,
              ") needs o_parts and lse_parts (T_out = ", T_out, ")");
    }
  }

  cudaStream_t comm = opt.comm_stream ? opt.comm_stream : stream;
  cudaEvent_t ready = nullptr, halo = nullptr;
  if (comm != stream) {  // the shards (written on `stream`) must be complete before they are sent
    ORTHROS_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    ORTHROS_CUDA_CHECK(cudaEventCreateWithFlags(&halo, cudaEventDisableTiming));
    ORTHROS_CUDA_CHECK(cudaEventRecord(ready, stream));
    ORTHROS_CUDA_CHECK(cudaStreamWaitEvent(comm, ready, 0));
  }
  struct Events {
    cudaEvent_t a, b;
    ~Events() {
      if (a) cudaEventDestroy(a);
      if (b) cudaEventDestroy(b);
    }
  } guard{ready, halo};
  // 1. Window stream: interior rows (no halo needed) while the halo is in flight on `comm`.
  for (size_t i = 0; i < local.size(); ++i)
    cp_window_stream(cfg, layout, ranks[i], T, local[i], CpPart::interior, stream);
  if (!opt.halo_ready) tr.exchange_halo(cfg, layout, T, local, comm);
  if (comm != stream) {
    ORTHROS_CUDA_CHECK(cudaEventRecord(halo, comm));
    ORTHROS_CUDA_CHECK(cudaStreamWaitEvent(stream, halo, 0));
  }
  // 2. The boundary rows, which read the halo.
  for (size_t i = 0; i < local.size(); ++i)
    cp_window_stream(cfg, layout, ranks[i], T, local[i], CpPart::boundary, stream);
  if (T_out == 0) return;
  // 3. Output stream: partial states per rank, gathered to the last rank, merged in rank order.
  if (opt.broadcast_q_out) tr.broadcast_q_out(cfg, T_out, local, stream);
  for (size_t i = 0; i < local.size(); ++i) cp_output_partials(cfg, layout, ranks[i], T_out, local[i], stream);
  tr.gather_partials(cfg, layout, T_out, local, stream);
  if (!last_local) return;
  if (state_path) {
    const CpRankBuffers& b = local.back();
    merge_states(cfg, state_table(cfg, layout), b.states_all, b.o_out, b.lse_out, stream);
  } else {
    cp_merge_partials(cfg, layout.ranks(), T_out, local.back().o_parts, local.back().lse_parts, local.back().o_out,
                      local.back().lse_out, stream);
  }
}

void cp_decode_step(const AttentionConfig& cfg, CpLayout& layout, CpTransport& tr,
                    const std::vector<CpRankBuffers>& local, const void* k_new, const void* v_new,
                    cudaStream_t stream, const CpOptions& opt) {
  detail::validate_config(cfg);
  check_layout(layout);
  const std::vector<int> ranks = tr.local_ranks();
  require(local.size() == ranks.size() && !local.empty(), "cp_decode_step: ", local.size(),
          " rank buffers for the transport's ", ranks.size(), " local ranks");
  const int last = layout.ranks() - 1;
  if (ranks.back() == last) {
    const CpRankKV& kv = local.back().kv;
    const std::int64_t len = layout.length[last];
    require(kv.shard_capacity > len, "cp_decode_step: the last rank's shard is full (shard_capacity ",
            kv.shard_capacity, ", length ", len, "); allocate room for the decode steps");
    require(k_new && v_new, "cp_decode_step: k_new/v_new must not be null on the last rank");
    const std::size_t kvb = row_bytes(cfg, false);
    ORTHROS_CUDA_CHECK(cudaMemcpyAsync(at_rows(kv.k, kv.halo_rows + len, kvb), k_new, kvb, cudaMemcpyDeviceToDevice,
                                       stream));
    ORTHROS_CUDA_CHECK(cudaMemcpyAsync(at_rows(kv.v, kv.halo_rows + len, kvb), v_new, kvb, cudaMemcpyDeviceToDevice,
                                       stream));
  }
  CpLayout grown = layout;
  grown.length[last] += 1;
  cp_attention(cfg, grown, 1, 1, tr, local, stream, opt);
  layout = grown;
}

}  // namespace orthros::cuda
