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
KILN_HOST_DEVICE inline uint16_t float_to_half_bits(float f) {
  uint32_t x = float_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or nan
    return static_cast<uint16_t>(sign | (abs > 0x7f800000u ? 0x7e00u : 0x7c00u));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {  // result is subnormal (or zero) in half: |f| < 2^-14
    // Add 0.5 (as a float) so the FPU's own round-to-nearest-even lands the mantissa in place.
    float shifted = bits_float(abs) + 0.5f;
    return static_cast<uint16_t>(sign | (float_bits(shifted) - 0x3f000000u));
  }
  uint32_t mant_odd = (abs >> 13) & 1u;
  abs += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round to nearest even
  return static_cast<uint16_t>(sign | (abs >> 13));
}

KILN_HOST_DEVICE inline float half_bits_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1fu) return bits_float(sign | 0x7f800000u | (mant << 13));  // inf / nan
  if (exp == 0) {                                                          // zero / subnormal
    float m = static_cast<float>(mant) * 5.9604644775390625e-08f;          // mant * 2^-24
    return sign ? -m : m;
  }
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

// bfloat16: the top 16 bits of a float.
KILN_HOST_DEVICE inline uint16_t float_to_bf16_bits(float f) {
  uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet nan
  x += 0x7fffu + ((x >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(x >> 16);
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
