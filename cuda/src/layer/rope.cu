// RoPE (rotate-half) and KV-cache append kernels, optionally fused (SPEC §2).
#include "common/device.cuh"

#include <algorithm>

namespace orthros::cuda {
namespace {
using namespace detail;

template <typename T>
__global__ void rope_kernel(T* x, const std::int64_t* positions, int H, int D, double theta) {
  const long long n = blockIdx.x;
  const double pos = static_cast<double>(positions[n]);
  const int half = D / 2;
  for (int idx = threadIdx.x; idx < H * half; idx += blockDim.x) {
    T* row = x + ((size_t)n * H + idx / half) * D;
    rope_pair(row, row, idx % half, D, pos, theta);
  }
}

struct AppendParams {
  const void* k_new;
  const void* v_new;
  void* k_cache;
  void* v_cache;
  void* q;
  void* q_out;
  long long capacity, pos_offset;
  int Hq, Hkv, D, rope;
  double theta;
  int nseq;
  SeqDesc seq[kMaxSeqPerLaunch];
};

// grid (max T, 1, sequences): one block per new token.
template <typename T>
__global__ void append_kernel(const __grid_constant__ AppendParams p) {
  const SeqDesc& sd = p.seq[blockIdx.z];
  const int i = blockIdx.x;
  if (i >= sd.T) return;
  const long long row = sd.cache_len - sd.T + i;
  const double pos = static_cast<double>(row + p.pos_offset);
  const int D = p.D, half = D / 2;
  const size_t src_off = ((size_t)(sd.q_off + i)) * p.Hkv * D;
  const size_t dst_off = (size_t)sd.kv_base + (size_t)row * p.Hkv * D;
  const T* kn = static_cast<const T*>(p.k_new) + src_off;
  const T* vn = static_cast<const T*>(p.v_new) + src_off;
  T* kc = static_cast<T*>(p.k_cache) + dst_off;
  T* vc = static_cast<T*>(p.v_cache) + dst_off;
  for (int idx = threadIdx.x; idx < p.Hkv * D; idx += blockDim.x) vc[idx] = vn[idx];
  if (p.rope) {
    for (int idx = threadIdx.x; idx < p.Hkv * half; idx += blockDim.x) {
      const int h = idx / half, d = idx % half;
      rope_pair(kn + (size_t)h * D, kc + (size_t)h * D, d, D, pos, p.theta);
    }
    if (p.q) {
      T* qr = static_cast<T*>(p.q) + (size_t)(sd.q_off + i) * p.Hq * D;
      for (int idx = threadIdx.x; idx < p.Hq * half; idx += blockDim.x)
        rope_pair(qr + (size_t)(idx / half) * D, qr + (size_t)(idx / half) * D, idx % half, D, pos, p.theta);
    }
    const int first_out = sd.T - sd.T_out;
    if (p.q_out && i >= first_out) {
      T* qr = static_cast<T*>(p.q_out) + (size_t)(sd.out_off + i - first_out) * p.Hq * D;
      for (int idx = threadIdx.x; idx < p.Hq * half; idx += blockDim.x)
        rope_pair(qr + (size_t)(idx / half) * D, qr + (size_t)(idx / half) * D, idx % half, D, pos, p.theta);
    }
  } else {
    for (int idx = threadIdx.x; idx < p.Hkv * D; idx += blockDim.x) kc[idx] = kn[idx];
  }
}

template <typename T>
void launch_rope(void* x, const std::int64_t* positions, std::int64_t N, int H, int D, double theta,
                 cudaStream_t stream) {
  rope_kernel<T><<<static_cast<unsigned>(N), 128, 0, stream>>>(static_cast<T*>(x), positions, H, D, theta);
  ORTHROS_CUDA_LAUNCH_CHECK("rope_kernel");
}

template <typename T>
void launch_append(AppendParams& ap, const BatchLayout& b, cudaStream_t stream) {
  int q_off = 0, out_off = 0;
  for (int s0 = 0; s0 < b.batch(); s0 += kMaxSeqPerLaunch) {
    const int ns = fill_seq_group(b, s0, static_cast<long long>(ap.capacity) * ap.Hkv * ap.D, ap.seq, q_off, out_off);
    ap.nseq = ns;
    int max_t = 0;
    for (int j = 0; j < ns; ++j) max_t = std::max(max_t, ap.seq[j].T);
    if (max_t == 0) continue;
    append_kernel<T><<<dim3(static_cast<unsigned>(max_t), 1, ns), 128, 0, stream>>>(ap);
    ORTHROS_CUDA_LAUNCH_CHECK("append_kernel");
  }
}

}  // namespace

void apply_rope(DType dtype, void* x, const std::int64_t* positions, std::int64_t N, int H, int D, double theta,
                cudaStream_t stream) {
  require(N >= 0, "N (rows) must be >= 0 (got ", N, ")");
  require(H >= 1, "H (heads) must be >= 1 (got ", H, ")");
  require(D >= 2 && D % 2 == 0, "head_dim (D) must be even and >= 2 for rotate-half RoPE (got ", D, ")");
  require(std::isfinite(theta) && theta > 0, "theta must be finite and > 0 (got ", theta, ")");
  require(N < (1LL << 31), "N must be < 2^31 (got ", N, ")");
  if (N == 0) return;
  require(x != nullptr && positions != nullptr, "x and positions must not be null");
  switch (dtype) {
    case DType::f32: launch_rope<float>(x, positions, N, H, D, theta, stream); break;
    case DType::f16: launch_rope<__half>(x, positions, N, H, D, theta, stream); break;
    case DType::bf16: launch_rope<__nv_bfloat16>(x, positions, N, H, D, theta, stream); break;
  }
}

void rope_append_kv(DType dtype, const BatchLayout& b, int num_q_heads, int num_kv_heads, int head_dim,
                    const void* k_new, const void* v_new, void* k_cache, void* v_cache, std::int64_t capacity,
                    double theta, std::int64_t position_offset, void* q, void* q_out, cudaStream_t stream) {
  require(b.out_lens.size() == b.q_lens.size() && b.cache_lens.size() == b.q_lens.size(),
          "batch layout vectors must have one entry per sequence");
  require(num_q_heads >= 1 && num_kv_heads >= 1, "num_q_heads and num_kv_heads must be >= 1 (got ", num_q_heads,
          ", ", num_kv_heads, ")");
  require(head_dim >= 2 && head_dim % 2 == 0, "head_dim (D) must be even and >= 2 (got ", head_dim, ")");
  require(std::isfinite(theta) && theta >= 0, "theta must be finite and >= 0 (0 = no RoPE; got ", theta, ")");
  for (size_t i = 0; i < b.q_lens.size(); ++i) {
    require(b.q_lens[i] >= 0 && b.out_lens[i] >= 0 && b.out_lens[i] <= b.q_lens[i], "sequence ", i,
            ": need 0 <= T_out <= T (got T = ", b.q_lens[i], ", T_out = ", b.out_lens[i], ")");
    require(b.cache_lens[i] >= b.q_lens[i] && b.cache_lens[i] <= capacity, "cache_lens[", i,
            "] must be in [T, capacity] (got ", b.cache_lens[i], ", T = ", b.q_lens[i], ", capacity = ", capacity,
            ")");
  }
  if (b.total_q() == 0) return;
  require(k_new && v_new && k_cache && v_cache, "k_new, v_new, k_cache, v_cache must not be null");
  AppendParams ap{};
  ap.k_new = k_new;
  ap.v_new = v_new;
  ap.k_cache = k_cache;
  ap.v_cache = v_cache;
  ap.q = q;
  ap.q_out = q_out;
  ap.capacity = capacity;
  ap.pos_offset = position_offset;
  ap.Hq = num_q_heads;
  ap.Hkv = num_kv_heads;
  ap.D = head_dim;
  ap.rope = theta > 0 ? 1 : 0;
  ap.theta = theta;
  switch (dtype) {
    case DType::f32: launch_append<float>(ap, b, stream); break;
    case DType::f16: launch_append<__half>(ap, b, stream); break;
    case DType::bf16: launch_append<__nv_bfloat16>(ap, b, stream); break;
  }
}

}  // namespace orthros::cuda
