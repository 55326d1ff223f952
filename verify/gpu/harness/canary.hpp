/// \file canary.hpp
/// \brief Canary guards of the GPU harness's device buffers (host logic, no CUDA).
///
/// Every DeviceBuffer allocation is laid out as [front guard | payload | back guard], each guard
/// kGuardBytes bytes of a fixed pattern. A kernel that writes before its buffer's first byte or
/// past its last byte changes a guard; DeviceBuffer::check_canaries() downloads both guards after
/// a call and compares them byte for byte with the pattern (the check llama.cpp's
/// test-backend-ops makes with its sentinel tensors). The back guard starts at the byte right
/// after the payload, so an overrun of a single byte is caught. Reads cannot be caught that way
/// (and compute-sanitizer's memcheck sees them as in bounds), so the pattern reads as NaN in
/// every dtype: an over-read shows up as NaN in the outputs.
#pragma once

#include <cstddef>
#include <cstdint>

namespace orthros::gpu_harness {

/// Bytes of each guard: a multiple of 256, so the payload keeps cudaMalloc's 256-byte alignment.
constexpr std::size_t kGuardBytes = 256;

/// Which side of the payload a guard sits on (the two patterns differ, so a copy of one guard
/// over the other is caught too).
enum class GuardSide : std::uint8_t { front = 0, back = 1 };

/// Byte i of the guard pattern of `side`. Read as little-endian f32, f16 or bf16 at any aligned
/// offset the pattern is a NaN (odd bytes 0x7F or 0xFF: sign + all-ones exponent of bf16 and f32,
/// all-ones exponent of f16; even bytes 0x81..0xFD: the top mantissa bit of f32 set, mantissas
/// nonzero), so a kernel that reads past its buffer gets NaN, as it does from the poisoned payload.
/// The even bytes are never 0xFF, so a poison memset over the guard changes it, and both bytes
/// differ between the two sides at every index (a copy of one guard over the other is caught).
constexpr std::uint8_t canary_byte(std::size_t i, GuardSide side) {
  const unsigned s = static_cast<unsigned>(side);
  const unsigned k = static_cast<unsigned>(i / 2);
  if (i % 2 == 1) return ((k + s) % 2) ? 0xFF : 0x7F;
  return static_cast<std::uint8_t>(0x81u + (k * 37u + 11u + 101u * s) % 125u);  // 0x81 .. 0xFD
}

/// Writes the pattern of `side` into guard[0, kGuardBytes).
inline void fill_canary(std::uint8_t* guard, GuardSide side) {
  for (std::size_t i = 0; i < kGuardBytes; ++i) guard[i] = canary_byte(i, side);
}

/// Index of the first byte of guard[0, kGuardBytes) that differs from the pattern of `side`,
/// or -1 when the guard is intact.
inline long first_overwritten(const std::uint8_t* guard, GuardSide side) {
  for (std::size_t i = 0; i < kGuardBytes; ++i)
    if (guard[i] != canary_byte(i, side)) return static_cast<long>(i);
  return -1;
}

/// Number of bytes of guard[0, kGuardBytes) that differ from the pattern of `side`.
inline std::size_t overwritten_count(const std::uint8_t* guard, GuardSide side) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < kGuardBytes; ++i) n += guard[i] != canary_byte(i, side);
  return n;
}

}  // namespace orthros::gpu_harness
