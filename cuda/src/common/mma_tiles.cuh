// Tile primitives shared by the tensor-core kernels (forward: attention_kernels.cuh, backward:
// attention_backward_kernels.cuh): cp.async, ldmatrix, mma.sync m16n8k16 (bf16/f16 -> fp32) and the
// XOR swizzle of shared-memory tiles.
//
// Fragment layouts (PTX ISA, m16n8k16; g = lane / 4, c = lane % 4):
//   C/D (16x8 fp32): c[0], c[1] at row g, cols 2c, 2c+1; c[2], c[3] at row g+8, same cols.
//   A (16x16): a[0] row g, k 2c..2c+1; a[1] row g+8; a[2] row g, k 2c+8..; a[3] row g+8, k 2c+8..
//   so two C tiles (n 0-7, 8-15) of one 16-row block pack into one A operand (pack_a below).
#pragma once

#include "common/device.cuh"

#include <cstdint>

namespace orthros::cuda::detail {

// ---- PTX helpers ---------------------------------------------------------------------------
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int sz = valid ? 16 : 0;  // 0: zero-fill, nothing read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(sz));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ void ldsm_x4(uint32_t* r, const void* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t* r, const void* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

template <typename T>
struct Mma;
template <>
struct Mma<__nv_bfloat16> {
  __device__ static void run(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ static uint32_t pack(float x, float y) {
    __nv_bfloat162 v = __floats2bfloat162_rn(x, y);
    return *reinterpret_cast<uint32_t*>(&v);
  }
};
template <>
struct Mma<__half> {
  __device__ static void run(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ static uint32_t pack(float x, float y) {
    __half2 v = __floats2half2_rn(x, y);
    return *reinterpret_cast<uint32_t*>(&v);
  }
};

/// Two accumulator tiles c0 (k 0-7) and c1 (k 8-15) of a 16-row block as an A operand.
template <typename T>
__device__ __forceinline__ void pack_a(uint32_t* a, const float* c0, const float* c1) {
  a[0] = Mma<T>::pack(c0[0], c0[1]);
  a[1] = Mma<T>::pack(c0[2], c0[3]);
  a[2] = Mma<T>::pack(c1[0], c1[1]);
  a[3] = Mma<T>::pack(c1[2], c1[3]);
}

// Shared memory tiles are [rows][D] with 16-byte chunks XOR-swizzled by (row % 8): conflict-free
// for cp.async writes and ldmatrix reads.
template <int D>
__device__ __forceinline__ int swz(int row, int chunk) {
  return row * D + ((chunk ^ (row & 7)) << 3);
}

// ldmatrix addresses (one per lane) of the three operand shapes, for swizzled [rows][D] tiles:
/// A operand: rows row0..row0+15 of the tile, k = 16*kk .. 16*kk+15 (ldsm_x4 -> a[0..3]).
template <int D>
__device__ __forceinline__ int frag_a(int row0, int kk, int lane) {
  return swz<D>(row0 + (lane & 7) + (((lane >> 3) & 1) << 3), kk * 2 + (lane >> 4));
}
/// B operand from a tile stored [n][k] (e.g. K for S = Q K^T): n = n0..n0+15, k = 16*kk..;
/// ldsm_x4 -> {b[0], b[1]} for n-tile n0/8 and {b[2], b[3]} for n-tile n0/8 + 1.
template <int D>
__device__ __forceinline__ int frag_b_nk(int n0, int kk, int lane) {
  return swz<D>(n0 + (lane & 7) + ((lane >> 4) << 3), kk * 2 + ((lane >> 3) & 1));
}
/// B operand from a tile stored [k][n] (e.g. V for O = P V): k = k0..k0+15, n = 16*dp..16*dp+15;
/// ldsm_x4_t -> {b[0], b[1]} for n-tile 2*dp and {b[2], b[3]} for n-tile 2*dp + 1.
template <int D>
__device__ __forceinline__ int frag_b_kn(int k0, int dp, int lane) {
  return frag_a<D>(k0, dp, lane);
}

/// 4-byte cp.async (zero-fills when !valid).
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int sz = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem), "r"(sz));
}

}  // namespace orthros::cuda::detail
