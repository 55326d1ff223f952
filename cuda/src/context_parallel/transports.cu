// Context parallelism's transports (docs/context_parallel.md): the loopback transport (R virtual
// ranks on one GPU, device-to-device copies) and, with ORTHROS_HAVE_NCCL, the NCCL transport (one
// process or thread per GPU).
#include "context_parallel/internal.hpp"
#include "common/device.cuh"

#include <algorithm>
#include <cstring>

#if defined(ORTHROS_HAVE_NCCL)
#include <nccl.h>
#endif

namespace orthros::cuda {

using namespace cp_detail;

// ---- loopback transport -------------------------------------------------------------------------
LoopbackTransport::LoopbackTransport(int ranks) : ranks_(ranks) {
  require(ranks >= 1, "LoopbackTransport: ranks must be >= 1 (got ", ranks, ")");
}

std::vector<int> LoopbackTransport::local_ranks() const {
  std::vector<int> r(ranks_);
  for (int i = 0; i < ranks_; ++i) r[i] = i;
  return r;
}

void LoopbackTransport::exchange_halo(const AttentionConfig& cfg, const CpLayout& layout, std::int64_t T,
                                      const std::vector<CpRankBuffers>& local, cudaStream_t stream) {
  require(static_cast<int>(local.size()) == ranks_, "LoopbackTransport: ", local.size(), " rank buffers for ",
          ranks_, " ranks");
  const std::size_t kvb = row_bytes(cfg, false);
  for (int r = 0; r < ranks_; ++r) {
    if (cp_rank_rows(layout, r, T).count == 0) continue;
    const CpHalo h = cp_halo(layout, r, cfg.window, cfg.deterministic);
    check_kv(cfg, layout, r, local[r].kv);
    for (const CpHaloPiece& p : h.pieces) {
      const CpRankKV& src = local[p.src_rank].kv;
      const std::int64_t from = src.halo_rows + (p.first_row - layout.start(p.src_rank)), to = p.first_row - h.first_row;
      const std::size_t bytes = static_cast<std::size_t>(p.rows) * kvb;
      ORTHROS_CUDA_CHECK(cudaMemcpyAsync(at_rows(local[r].kv.k, to, kvb), at_rows(src.k, from, kvb), bytes,
                                         cudaMemcpyDeviceToDevice, stream));
      ORTHROS_CUDA_CHECK(cudaMemcpyAsync(at_rows(local[r].kv.v, to, kvb), at_rows(src.v, from, kvb), bytes,
                                         cudaMemcpyDeviceToDevice, stream));
    }
  }
}

void LoopbackTransport::broadcast_q_out(const AttentionConfig& cfg, std::int64_t T_out,
                                        const std::vector<CpRankBuffers>& local, cudaStream_t stream) {
  if (T_out == 0) return;
  const void* src = local.back().q_out;
  for (int r = 0; r + 1 < ranks_; ++r)
    if (local[r].q_out != src)
      ORTHROS_CUDA_CHECK(cudaMemcpyAsync(local[r].q_out, src, static_cast<std::size_t>(T_out) * row_bytes(cfg, true),
                                         cudaMemcpyDeviceToDevice, stream));
}

void LoopbackTransport::gather_partials(const AttentionConfig& cfg, const CpLayout& layout, std::int64_t T_out,
                                        const std::vector<CpRankBuffers>& local, cudaStream_t stream) {
  if (T_out == 0) return;
  const CpRankBuffers& last = local.back();
  if (cp_state_splits(cfg, layout, 0, T_out) > 0) {
    const StateTable tab = state_table(cfg, layout);
    for (int r = 0; r < ranks_; ++r)
      ORTHROS_CUDA_CHECK(cudaMemcpyAsync(last.states_all + tab.off[r], local[r].states, state_bytes(cfg, tab.ns[r]),
                                         cudaMemcpyDeviceToDevice, stream));
    return;
  }
  require(last.o_parts && last.lse_parts, "the last rank's o_parts/lse_parts must not be null (T_out = ", T_out, ")");
  const std::size_t ob = cp_partial_bytes(cfg, T_out);
  const std::size_t lb = static_cast<std::size_t>(T_out) * cfg.num_q_heads * sizeof(float);
  for (int r = 0; r < ranks_; ++r) {
    ORTHROS_CUDA_CHECK(cudaMemcpyAsync(reinterpret_cast<char*>(last.o_parts) + r * ob, local[r].o_part, ob,
                                       cudaMemcpyDeviceToDevice, stream));
    ORTHROS_CUDA_CHECK(cudaMemcpyAsync(reinterpret_cast<char*>(last.lse_parts) + r * lb, local[r].lse_part, lb,
                                       cudaMemcpyDeviceToDevice, stream));
  }
}

// ---- NCCL transport -----------------------------------------------------------------------------
#if defined(ORTHROS_HAVE_NCCL)
namespace {
void nccl_check(ncclResult_t e, const char* what) {
  if (e != ncclSuccess) throw CudaError(std::string(what) + " failed: " + ncclGetErrorString(e));
}
#define ORTHROS_NCCL_CHECK(call) nccl_check((call), #call)
ncclComm_t comm_of(void* c) { return static_cast<ncclComm_t>(c); }
}  // namespace

bool cp_nccl_available() { return true; }

CpNcclId cp_nccl_unique_id() {
  static_assert(sizeof(ncclUniqueId) == sizeof(CpNcclId), "ncclUniqueId is 128 bytes");
  ncclUniqueId id;
  ORTHROS_NCCL_CHECK(ncclGetUniqueId(&id));
  CpNcclId out;
  std::memcpy(out.data(), &id, sizeof(id));
  return out;
}

NcclTransport::NcclTransport(int ranks, int rank, const CpNcclId& id) : ranks_(ranks), rank_(rank) {
  require(ranks >= 1, "NcclTransport: ranks must be >= 1 (got ", ranks, ")");
  require(rank >= 0 && rank < ranks, "NcclTransport: rank must be in [0, ", ranks, ") (got ", rank, ")");
  ncclUniqueId uid;
  std::memcpy(&uid, id.data(), sizeof(uid));
  ncclComm_t c = nullptr;
  ORTHROS_NCCL_CHECK(ncclCommInitRank(&c, ranks, uid, rank));
  comm_ = c;
}

NcclTransport::~NcclTransport() {
  if (comm_) ncclCommDestroy(comm_of(comm_));
}

void NcclTransport::exchange_halo(const AttentionConfig& cfg, const CpLayout& layout, std::int64_t T,
                                  const std::vector<CpRankBuffers>& local, cudaStream_t stream) {
  require(local.size() == 1, "NcclTransport drives one rank per process (got ", local.size(), " rank buffers)");
  const std::size_t kvb = row_bytes(cfg, false);
  const CpRankKV& me = local[0].kv;
  ORTHROS_NCCL_CHECK(ncclGroupStart());
  // Send: the rows of my shard that later ranks' halos need, ascending destination.
  for (int d = rank_ + 1; d < ranks_; ++d) {
    if (cp_rank_rows(layout, d, T).count == 0) continue;
    for (const CpHaloPiece& p : cp_halo(layout, d, cfg.window, cfg.deterministic).pieces) {
      if (p.src_rank != rank_) continue;
      const std::int64_t from = me.halo_rows + (p.first_row - layout.start(rank_));
      const std::size_t bytes = static_cast<std::size_t>(p.rows) * kvb;
      ORTHROS_NCCL_CHECK(ncclSend(at_rows(me.k, from, kvb), bytes, ncclUint8, d, comm_of(comm_), stream));
      ORTHROS_NCCL_CHECK(ncclSend(at_rows(me.v, from, kvb), bytes, ncclUint8, d, comm_of(comm_), stream));
    }
  }
  // Receive my halo pieces from the earlier ranks.
  if (cp_rank_rows(layout, rank_, T).count > 0) {
    check_kv(cfg, layout, rank_, me);
    const CpHalo h = cp_halo(layout, rank_, cfg.window, cfg.deterministic);
    for (const CpHaloPiece& p : h.pieces) {
      const std::int64_t to = p.first_row - h.first_row;
      const std::size_t bytes = static_cast<std::size_t>(p.rows) * kvb;
      ORTHROS_NCCL_CHECK(ncclRecv(at_rows(me.k, to, kvb), bytes, ncclUint8, p.src_rank, comm_of(comm_), stream));
      ORTHROS_NCCL_CHECK(ncclRecv(at_rows(me.v, to, kvb), bytes, ncclUint8, p.src_rank, comm_of(comm_), stream));
    }
  }
  ORTHROS_NCCL_CHECK(ncclGroupEnd());
}

void NcclTransport::broadcast_q_out(const AttentionConfig& cfg, std::int64_t T_out,
                                    const std::vector<CpRankBuffers>& local, cudaStream_t stream) {
  require(local.size() == 1, "NcclTransport drives one rank per process (got ", local.size(), " rank buffers)");
  if (T_out == 0 || ranks_ == 1) return;
  require(local[0].q_out != nullptr, "rank ", rank_, ": q_out must not be null (T_out = ", T_out, ")");
  const std::size_t bytes = static_cast<std::size_t>(T_out) * row_bytes(cfg, true);
  ORTHROS_NCCL_CHECK(
      ncclBroadcast(local[0].q_out, local[0].q_out, bytes, ncclUint8, ranks_ - 1, comm_of(comm_), stream));
}

void NcclTransport::gather_partials(const AttentionConfig& cfg, const CpLayout& layout, std::int64_t T_out,
                                    const std::vector<CpRankBuffers>& local, cudaStream_t stream) {
  require(local.size() == 1, "NcclTransport drives one rank per process (got ", local.size(), " rank buffers)");
  if (T_out == 0) return;
  const CpRankBuffers& b = local[0];
  if (cp_state_splits(cfg, layout, 0, T_out) > 0) {  // split states, rank-major, to the last rank
    const StateTable tab = state_table(cfg, layout);
    const int last = ranks_ - 1;
    if (rank_ == last)
      ORTHROS_CUDA_CHECK(cudaMemcpyAsync(b.states_all + tab.off[last], b.states, state_bytes(cfg, tab.ns[last]),
                                         cudaMemcpyDeviceToDevice, stream));
    ORTHROS_NCCL_CHECK(ncclGroupStart());
    if (rank_ == last) {
      for (int r = 0; r < last; ++r)
        ORTHROS_NCCL_CHECK(ncclRecv(b.states_all + tab.off[r], state_bytes(cfg, tab.ns[r]), ncclUint8, r,
                                    comm_of(comm_), stream));
    } else {
      ORTHROS_NCCL_CHECK(
          ncclSend(b.states, state_bytes(cfg, tab.ns[rank_]), ncclUint8, last, comm_of(comm_), stream));
    }
    ORTHROS_NCCL_CHECK(ncclGroupEnd());
    return;
  }
  const std::size_t ob = cp_partial_bytes(cfg, T_out);
  const std::size_t lb = static_cast<std::size_t>(T_out) * cfg.num_q_heads * sizeof(float);
  const int last = ranks_ - 1;
  if (rank_ == last) {
    require(b.o_parts && b.lse_parts, "the last rank's o_parts/lse_parts must not be null (T_out = ", T_out, ")");
    ORTHROS_CUDA_CHECK(cudaMemcpyAsync(reinterpret_cast<char*>(b.o_parts) + last * ob, b.o_part, ob,
                                       cudaMemcpyDeviceToDevice, stream));
    ORTHROS_CUDA_CHECK(cudaMemcpyAsync(reinterpret_cast<char*>(b.lse_parts) + last * lb, b.lse_part, lb,
                                       cudaMemcpyDeviceToDevice, stream));
  }
  ORTHROS_NCCL_CHECK(ncclGroupStart());
  if (rank_ == last) {
    for (int r = 0; r < last; ++r) {
      ORTHROS_NCCL_CHECK(ncclRecv(reinterpret_cast<char*>(b.o_parts) + r * ob, ob, ncclUint8, r, comm_of(comm_), stream));
      ORTHROS_NCCL_CHECK(
          ncclRecv(reinterpret_cast<char*>(b.lse_parts) + r * lb, lb, ncclUint8, r, comm_of(comm_), stream));
    }
  } else {
    ORTHROS_NCCL_CHECK(ncclSend(b.o_part, ob, ncclUint8, last, comm_of(comm_), stream));
    ORTHROS_NCCL_CHECK(ncclSend(b.lse_part, lb, ncclUint8, last, comm_of(comm_), stream));
  }
  ORTHROS_NCCL_CHECK(ncclGroupEnd());
}

void NcclTransport::allreduce(float* dev, std::size_t n, int op, cudaStream_t stream) {
  ORTHROS_NCCL_CHECK(ncclAllReduce(dev, dev, n, ncclFloat32, op == 1 ? ncclMax : ncclSum, comm_of(comm_), stream));
  ORTHROS_CUDA_CHECK(cudaStreamSynchronize(stream));
}
#else
namespace {
[[noreturn]] void no_nccl(const char* what) {
  throw Error(std::string(what) +
              ": this build has no NCCL transport (configure with -DORTHROS_NCCL=ON and NCCL at ORTHROS_NCCL_ROOT; "
              "ci/setup.sh unpacks the pinned nvidia-nccl-cu13 wheel into .deps/nccl)");
}
}  // namespace
bool cp_nccl_available() { return false; }
CpNcclId cp_nccl_unique_id() { no_nccl("cp_nccl_unique_id"); }
NcclTransport::NcclTransport(int ranks, int rank, const CpNcclId&) : ranks_(ranks), rank_(rank) {
  no_nccl("NcclTransport");
}
NcclTransport::~NcclTransport() = default;
void NcclTransport::exchange_halo(const AttentionConfig&, const CpLayout&, std::int64_t,
                                  const std::vector<CpRankBuffers>&, cudaStream_t) {
  no_nccl("NcclTransport::exchange_halo");
}
void NcclTransport::broadcast_q_out(const AttentionConfig&, std::int64_t, const std::vector<CpRankBuffers>&,
                                    cudaStream_t) {
  no_nccl("NcclTransport::broadcast_q_out");
}
void NcclTransport::gather_partials(const AttentionConfig&, const CpLayout&, std::int64_t,
                                    const std::vector<CpRankBuffers>&, cudaStream_t) {
  no_nccl("NcclTransport::gather_partials");
}
void NcclTransport::allreduce(float*, std::size_t, int, cudaStream_t) { no_nccl("NcclTransport::allreduce"); }
#endif

}  // namespace orthros::cuda
