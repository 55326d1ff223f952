// Internal helpers of the CUDA kernels: error checks, dtype traits, the softmax-state merge.
#pragma once

#include "orthros/cuda/attention.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <map>
#include <mutex>
#include <string>

namespace orthros::cuda::detail {

/// Throws CudaError naming `what` when `e` is not cudaSuccess.
inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw CudaError(std::string(what) + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}
#define ORTHROS_CUDA_CHECK(call) ::orthros::cuda::detail::check((call), #call)
/// Checks the launch just issued (configuration errors) by name.
#define ORTHROS_CUDA_LAUNCH_CHECK(name) ::orthros::cuda::detail::check(cudaGetLastError(), "launch of " name)

/// A launch setting CUDA keeps per device (a kernel's cudaFuncSetAttribute, its occupancy):
/// get(compute) runs compute() the first time it is asked on the current device and returns that
/// device's value from then on, so a process that drives several GPUs sets every one of them up.
/// Thread-safe. CudaError from cudaGetDevice or from compute().
class PerDeviceSetting {
 public:
  template <typename Compute>
  int get(Compute&& compute) {
    int dev = 0;
    check(cudaGetDevice(&dev), "cudaGetDevice");
    std::lock_guard<std::mutex> lock(mu_);
    auto it = value_.find(dev);
    if (it != value_.end()) return it->second;
    const int v = compute();
    value_.emplace(dev, v);
    return v;
  }

 private:
  std::mutex mu_;
  std::map<int, int> value_;
};

/// Lets `Kernel` use `bytes` of dynamic shared memory (cudaFuncAttributeMaxDynamicSharedMemorySize),
/// once per kernel instantiation and device (the attribute is per device). CudaError when the GPU
/// refuses (more than it has).
template <auto Kernel>
void opt_in_shared_memory(int bytes) {
  static PerDeviceSetting done;
  done.get([&] {
    check(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
          "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
    return bytes;
  });
}

template <typename T>
struct Elem;
template <>
struct Elem<float> {
  __device__ static float to_f(float x) { return x; }
  __device__ static float from_f(float x) { return x; }
};
template <>
struct Elem<__nv_bfloat16> {
  __device__ static float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
  __device__ static __nv_bfloat16 from_f(float x) { return __float2bfloat16_rn(x); }
};
template <>
struct Elem<__half> {
  __device__ static float to_f(__half x) { return __half2float(x); }
  __device__ static __half from_f(float x) { return __float2half_rn(x); }
};

constexpr float kNegInf = -INFINITY;
constexpr float kLn2 = 0.693147180559945309f;
constexpr float kLog2e = 1.4426950408889634f;

/// 2^x by the SFU (ex2.approx.ftz: ~2 ulp, 2^-inf = +0, 2^0 = 1 exactly); one instruction,
/// deterministic, used by every kernel for every exponential.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// One softmax state (m: running max of scores in the log2 domain, l: sum of exp2(s - m),
// acc: sum of exp2(s - m) * v). merge_coeffs() gives the factors that combine state A (M) and
// state B (m) into max(M, m). Every kernel (tensor-core, SIMT, split-KV merge) uses these
// exact operations, with explicit round-to-nearest intrinsics (no contraction), so chunk
// merges are bitwise the same wherever they happen (deterministic mode).
struct MergeCoeffs {
  float m, fa, fb;
};
__device__ __forceinline__ MergeCoeffs merge_coeffs(float M, float m) {
  MergeCoeffs c;
  c.m = fmaxf(M, m);
  if (c.m == kNegInf) {
    c.fa = 0.f;
    c.fb = 0.f;
  } else {
    c.fa = fast_exp2(__fsub_rn(M, c.m));
    c.fb = fast_exp2(__fsub_rn(m, c.m));
  }
  return c;
}
__device__ __forceinline__ float merge_val(float a, float b, const MergeCoeffs& c) {
  return __fadd_rn(__fmul_rn(a, c.fa), __fmul_rn(b, c.fb));
}
/// Natural-log LSE of a finished state: (m + log2 l)·ln2 in float64, rounded once to float32.
/// In float32 the sum at |m| ~ 300 and the product would each round at ~2^-24·|lse|, which the
/// backward's P = exp(s − lse) turns into a relative error of ~1e-5 at scores ~200, the size of
/// the f32 tolerance. One rounding, same in every kernel.
__device__ __forceinline__ float state_lse(float m, float l) {
  return __double2float_rn(
      __dmul_rn(__dadd_rn(static_cast<double>(m), log2(static_cast<double>(l))), 0.69314718055994530942));
}

/// Rotates the pair (x[d], x[d + D/2]) of one head by angle pos * theta^(-2d/D) (RoPE, rope.cu);
/// with -pos it applies the inverse rotation (the RoPE backward, layer_backward.cu): the angle
/// changes sign exactly, cos is even and sin odd.
template <typename TS, typename TD>
__device__ __forceinline__ void rope_pair(const TS* src, TD* dst, int d, int D, double pos, double theta) {
  const int half = D / 2;
  const double a = pos * pow(theta, -2.0 * d / D);  // the CPU reference's formula (rope.hpp)
  double sn, cs;
  sincos(a, &sn, &cs);
  const float c = static_cast<float>(cs), s = static_cast<float>(sn);
  const float x1 = Elem<TS>::to_f(src[d]), x2 = Elem<TS>::to_f(src[d + half]);
  dst[d] = Elem<TD>::from_f(__fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s)));
  dst[d + half] = Elem<TD>::from_f(__fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s)));
}

/// Division by a runtime divisor d >= 1 known at launch (the GQA group) as a multiply-high and a
/// shift, for numerators in [0, 2^31): q = umulhi(n, mul) >> shr with mul = ceil(2^p / d),
/// p = 31 + ceil(log2 d) (the round-up method; exact for n < 2^31). Integer division is ~20
/// instructions; the backward's per-step loads divide a row index by the group.
struct FastDiv {
  unsigned mul = 0;
  int shr = 0, d = 1;
  static FastDiv of(int divisor) {
    FastDiv f;
    f.d = divisor;
    if (divisor > 1) {
      int l = 0;
      while ((1u << l) < static_cast<unsigned>(divisor)) ++l;  // ceil(log2 d)
      const unsigned p = 31u + static_cast<unsigned>(l);
      f.mul = static_cast<unsigned>(((1ull << p) + static_cast<unsigned>(divisor) - 1) / static_cast<unsigned>(divisor));
      f.shr = static_cast<int>(p) - 32;
    }
    return f;
  }
  __device__ __forceinline__ int div(int n) const {
    return d == 1 ? n : static_cast<int>(__umulhi(static_cast<unsigned>(n), mul) >> shr);
  }
};

/// Host-side argument checks shared by the forward and the backward (attention.cu); each throws
/// orthros::Error naming the parameter and values.
void validate_config(const AttentionConfig& c);
void validate_batch(const BatchLayout& b);
bool aligned16(const void* p);

/// Per-launch sequence table (kernel parameters, no device metadata).
constexpr int kMaxSeqPerLaunch = 48;
struct SeqDesc {
  long long cache_len;  // P_b + T_b
  long long kv_base;    // element offset of sequence b in the cache (b * capacity * H_kv * D)
  int q_off, T;         // base rows
  int out_off, T_out;   // output rows
};

/// Fills `seq` with the sequences s0 .. s0+n-1 of `b` (n = min(kMaxSeqPerLaunch, B - s0)), their
/// rows counted from the running offsets `q_off`/`out_off` (advanced past them); kv_stride is
/// capacity * H_kv * D. Returns n. One launch's sequence table: every kernel family uses it.
inline int fill_seq_group(const BatchLayout& b, int s0, long long kv_stride, SeqDesc* seq, int& q_off,
                          int& out_off) {
  const int n = b.batch() - s0 < kMaxSeqPerLaunch ? b.batch() - s0 : kMaxSeqPerLaunch;
  for (int j = 0; j < n; ++j) {
    const int s = s0 + j;
    SeqDesc& d = seq[j];
    d.cache_len = b.cache_lens[s];
    d.kv_base = static_cast<long long>(s) * kv_stride;
    d.q_off = q_off;
    d.T = b.q_lens[s];
    d.out_off = out_off;
    d.T_out = b.out_lens[s];
    q_off += d.T;
    out_off += d.T_out;
  }
  return n;
}

struct KernelParams {
  const void* q;
  const void* q_out;
  const void* k;
  const void* v;
  void* o;
  void* o_out;
  float* lse;
  float* lse_out;
  float* partial;  // [total_out, H_q, nsplit, D+2] split-KV states (m, l, acc[D])
  int o_out_f32;   // o_out holds float32 (AttentionBuffers::o_out_float32), else the dtype
  long long window;
  float scale_log2;  // softmax scale * log2(e)
  int Hq, Hkv, group, D;
  // Set only through set_group / set_nsplit (a default FastDiv divides by 1).
  FastDiv group_div;   // division by group (row -> token, head); set with group (set_group)
  FastDiv nsplit_div;  // division by nsplit (block index -> row block, split); set with nsplit
  int nsplit;          // output-stream splits (1: no split)
  int split_chunked;   // deterministic split: split sp == chunk sp
  int chunk_tiles;     // deterministic mode: tiles per chunk (in-kernel chunk merges)
  int max_out_blocks;  // row blocks of the output stream, max over sequences
  int nseq;
  SeqDesc seq[kMaxSeqPerLaunch];
};

/// Sets p.group / p.nsplit together with their FastDiv (the kernels divide by the divisor).
inline void set_group(KernelParams& p, int group) {
  p.group = group;
  p.group_div = FastDiv::of(group);
}
inline void set_nsplit(KernelParams& p, int nsplit) {
  p.nsplit = nsplit;
  p.nsplit_div = FastDiv::of(nsplit);
}

}  // namespace orthros::cuda::detail
