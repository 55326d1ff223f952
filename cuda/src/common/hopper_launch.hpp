// Host side of launching the wgmma (sm_90a) kernels: the dispatch over the instantiated element
// types and head dims (the shared-memory opt-in, opt_in_shared_memory, is in common/device.cuh).
#pragma once

#include "common/device.cuh"

#include <type_traits>

namespace orthros::cuda::detail {

/// A type as a value, for generic lambdas: `typename decltype(tag)::type`.
template <typename T>
struct TypeTag {
  using type = T;
};

/// Calls fn(TypeTag<T>{}, std::integral_constant<int, D>{}) for the element type of `dtype`
/// (bf16 -> __nv_bfloat16, f16 -> __half) and head dim D, the combinations every wgmma kernel is
/// instantiated for (D = 64 or 128), and returns its result. Throws orthros::Error naming `what`
/// (the kernel) for f32 or another D: the dispatch in attention.cu / attention_backward.cu sends
/// those to the generic kernels, so reaching this is an internal error.
template <typename Fn>
decltype(auto) dispatch_hopper_types(DType dtype, int D, const char* what, Fn&& fn) {
  require(dtype != DType::f32 && (D == 64 || D == 128), "internal: no ", what, " for dtype ", dtype_name(dtype),
          ", D = ", D);
  auto by_d = [&](auto tag) -> decltype(auto) {
    if (D == 64) return fn(tag, std::integral_constant<int, 64>{});
    return fn(tag, std::integral_constant<int, 128>{});
  };
  if (dtype == DType::bf16) return by_d(TypeTag<__nv_bfloat16>{});
  return by_d(TypeTag<__half>{});
}

}  // namespace orthros::cuda::detail
