// core/half.h: the two 16-bit float types, Half (IEEE binary16) and BFloat16, as storage types.
//
// They hold bits only; arithmetic happens in float (convert, compute, round back), which is what
// PyTorch does on the CPU too. Rounding float -> 16 bits is round-to-nearest-even, NaN stays NaN.
// KILN_HOST_DEVICE lets the CUDA backend share these conversions.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define KILN_HOST_DEVICE __host__ __device__
#else
#define KILN_HOST_DEVICE
#endif

namespace kiln {

namespace detail {

KILN_HOST_DEVICE inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
KILN_HOST_DEVICE inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
//
// Note [branch-free half conversions]: both directions compute every case (normal, subnormal,
// inf/nan, overflow) and pick one with bit masks instead of branching. The answer is the same bits
// (checked against the branching form on all 2^32 floats and all 2^16 halves), but a loop over an
// array of them has no control flow, so the compiler vectorizes it: on 2^21 elements on a 2-core
// AVX2 EPYC (Zen 1), float16 -> float32 went from 4.2 to 1.9 ms and float32 -> float16 from 4.4 to
// 2.0 ms (medians of 41 calls; 1.9 ms is about this machine's memory bandwidth).
// On the GPU, the same source compiles to selects: a kernel that decodes and one that encodes went
// from 14 branches in their PTX to 2 (their bounds checks).
//
// Note [16-bit conversions on the GPU]: device code converts with the hardware's cvt instead (one
// instruction: cvt.rn.f16.f32, cvt.f32.f16, and from sm_80 cvt.rn.bf16.f32), where the bit
// arithmetic below took 8 (float -> bfloat16) to 15 (float -> half) instructions an element: in a
// 16-bit kernel that moves 4 bytes an element, such as GELU or the cross-entropy's gradient in
// bfloat16, that was a quarter to a half of what a multiprocessor can issue at 4.2 TB/s (SASS,
// sm_90). The values are the same (round to nearest even, subnormals kept, overflow to inf); a NaN
// comes out as the hardware's canonical NaN where the CPU keeps its sign and top payload bits.
KILN_HOST_DEVICE inline uint16_t float_to_half_bits(float f) {
#if defined(__CUDA_ARCH__)
  uint16_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
#else
  uint32_t x = float_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t abs = x & 0x7fffffffu;
  // |f| >= 65520 rounds to inf; nan keeps one (quiet) mantissa bit.
  uint32_t big = 0x7c00u | (static_cast<uint32_t>(abs > 0x7f800000u) << 9);
  // |f| < 2^-14 is subnormal (or zero) in half: adding 0.5 (as a float) makes the FPU's own
  // round-to-nearest-even land the mantissa in the low bits.
  uint32_t tiny = float_bits(bits_float(abs) + 0.5f) - 0x3f000000u;
  // Otherwise rebias the exponent (-112 << 23) and round to nearest even (unsigned wrap-around in
  // the lanes that are not taken is harmless).
  uint32_t normal = (abs + 0xc8000fffu + ((abs >> 13) & 1u)) >> 13;
  uint32_t take_big = 0u - static_cast<uint32_t>(abs >= 0x477ff000u);
  uint32_t take_tiny = 0u - static_cast<uint32_t>(abs < 0x38800000u);
  return static_cast<uint16_t>(sign | (big & take_big) | (tiny & take_tiny) |
                               (normal & ~(take_big | take_tiny)));
#endif
}

KILN_HOST_DEVICE inline float half_bits_to_float(uint16_t h) {
#if defined(__CUDA_ARCH__)  // Note [16-bit conversions on the GPU]
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
#else
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t body = static_cast<uint32_t>(h & 0x7fffu) << 13;  // exponent and mantissa in place
  uint32_t normal = body + 0x38000000u;                         // exponent rebiased by +112
  uint32_t special = body | 0x7f800000u;                        // inf / nan keep the mantissa
  uint32_t tiny = float_bits(static_cast<float>(h & 0x3ffu) * 5.9604644775390625e-08f);  // m * 2^-24
  uint32_t take_tiny = 0u - static_cast<uint32_t>(exp == 0);
  uint32_t take_special = 0u - static_cast<uint32_t>(exp == 0x1fu);
  return bits_float(sign | (tiny & take_tiny) | (special & take_special) |
                    (normal & ~(take_tiny | take_special)));
#endif
}

// bfloat16: the top 16 bits of a float.
KILN_HOST_DEVICE inline uint16_t float_to_bf16_bits(float f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800  // Note [16-bit conversions on the GPU]
  uint16_t b;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(f));
  return b;
#else
  uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet nan
  x += 0x7fffu + ((x >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(x >> 16);
#endif
}
KILN_HOST_DEVICE inline float bf16_bits_to_float(uint16_t b) {
  return bits_float(static_cast<uint32_t>(b) << 16);
}

}  // namespace detail

struct Half {
  uint16_t bits = 0;
  Half() = default;
  KILN_HOST_DEVICE Half(float f) : bits(detail::float_to_half_bits(f)) {}  // NOLINT: implicit like float
  KILN_HOST_DEVICE operator float() const { return detail::half_bits_to_float(bits); }
  KILN_HOST_DEVICE static Half from_bits(uint16_t b) {
    Half h;
    h.bits = b;
    return h;
  }
};

struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  KILN_HOST_DEVICE BFloat16(float f) : bits(detail::float_to_bf16_bits(f)) {}  // NOLINT
  KILN_HOST_DEVICE operator float() const { return detail::bf16_bits_to_float(bits); }
  KILN_HOST_DEVICE static BFloat16 from_bits(uint16_t b) {
    BFloat16 h;
    h.bits = b;
    return h;
  }
};

}  // namespace kiln
