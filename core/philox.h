// core/philox.h: Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", 2011),
// the counter-based generator behind every random op on every device.
//
// A counter-based generator is a pure function: (counter, key) -> four 32-bit words. Element i of a
// random tensor reads the words of counter `offset + i / 2` (two words per element, see
// Note [random element mapping] in core/generator.h), so a CPU thread or a CUDA thread can make
// element i without making elements 0..i-1, and both devices produce the same numbers.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

#include "core/backend.h"  // RandomKind
#include "core/half.h"     // KILN_HOST_DEVICE

namespace kiln {

struct Philox4x32 {
  static constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // round multipliers
  static constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // key schedule (Weyl)

  // counter: 128 bits as c[0] (low) .. c[3]; key: the seed's two halves.
  KILN_HOST_DEVICE static std::array<uint32_t, 4> block(std::array<uint32_t, 4> c, uint32_t k0,
                                                          uint32_t k1) {
    for (int round = 0; round < 10; ++round) {
      uint64_t p0 = static_cast<uint64_t>(kM0) * c[0];
      uint64_t p1 = static_cast<uint64_t>(kM1) * c[2];
      uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
      uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
      c = {hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0};
      k0 += kW0;
      k1 += kW1;
    }
    return c;
  }

  // The four words of a 64-bit counter for `seed`: elements 2 counter and 2 counter + 1 of a draw
  // from offset 0 take words 0-1 and 2-3.
  KILN_HOST_DEVICE static std::array<uint32_t, 4> words(uint64_t seed, uint64_t counter) {
    return block({static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), 0u, 0u},
                 static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  }

#if !defined(__CUDACC__)
  // words() of the 8 counters [counter, counter + 8): w[k][c] is word k of counter + c (the CPU's
  // draws, 8 counters at a time; core/philox.cpp, with AVX2 where the library is built with it).
  static void words8(uint64_t seed, uint64_t counter, uint32_t w[4][8]);
#endif

  // The two words element `i` of a draw that starts at counter `offset` gets, for `seed`.
  KILN_HOST_DEVICE static void element_words(uint64_t seed, uint64_t offset, uint64_t i,
                                             uint32_t& w0, uint32_t& w1) {
    auto r = words(seed, offset + i / 2);
    w0 = (i & 1) ? r[2] : r[0];
    w1 = (i & 1) ? r[3] : r[1];
  }
};

// A Bernoulli(a) element (0 <= a <= 1) whose first word is w0 is 1 when its uniform (w0 >> 8) 2^-24
// is below a, that is when (w0 >> 8) < bernoulli_threshold(a): for an integer x, x 2^-24 < a <=>
// x < a 2^24 (exact in double) <=> x < ceil(a 2^24). A caller that tests many elements against one
// a computes the threshold once.
KILN_HOST_DEVICE inline uint32_t bernoulli_threshold(double a) {
  using std::ceil;
  return static_cast<uint32_t>(ceil(a * 0x1.0p24));
}
KILN_HOST_DEVICE inline bool bernoulli_word(uint32_t w0, double a) { return (w0 >> 8) < bernoulli_threshold(a); }

// random_value: the value of element i of a draw, in double, before rounding to the output dtype:
// Note [random element mapping] in core/generator.h, computed by these functions on the CPU and on
// CUDA. kDoubleUniform: the output is float64, so a uniform draw uses 53 bits instead of 24.
// random_value_of_words: the same from the element's two words (w0, w1), for a caller that makes
// the words of several elements at once (Philox4x32::words8).
template <bool kDoubleUniform>
KILN_HOST_DEVICE inline double random_value_of_words(RandomKind kind, uint32_t w0, uint32_t w1, double a,
                                                     double b) {
  using std::cos, std::log, std::sqrt;
  switch (kind) {
    case RandomKind::Uniform: {
      double u = kDoubleUniform ? static_cast<double>((static_cast<uint64_t>(w0) << 21) ^ (w1 >> 11)) * 0x1.0p-53
                                : static_cast<double>(w0 >> 8) * 0x1.0p-24;
      return a + (b - a) * u;
    }
    case RandomKind::Normal: {  // Box-Muller; u1 in (0, 1] so the log is finite
      double u1 = static_cast<double>((w0 >> 8) + 1) * 0x1.0p-24;
      double u2 = static_cast<double>(w1 >> 8) * 0x1.0p-24;
      return a + b * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
    }
    case RandomKind::Randint: break;  // random_integer(), below, in integers
    case RandomKind::Bernoulli: return bernoulli_word(w0, a) ? 1 : 0;
  }
  return 0;
}

template <bool kDoubleUniform>
KILN_HOST_DEVICE inline double random_value(RandomKind kind, uint64_t seed, uint64_t offset, uint64_t i,
                                            double a, double b) {
  uint32_t w0, w1;
  Philox4x32::element_words(seed, offset, i, w0, w1);
  return random_value_of_words<kDoubleUniform>(kind, w0, w1, a, b);
}

// Element i of a randint draw: low + (the 64-bit word mod range), computed in integers so that every
// int64 range is exact (range = high - low, which fits 64 bits unsigned for any int64 bounds). The
// sum wraps modulo 2^64 and lands in [low, high).
KILN_HOST_DEVICE inline int64_t random_integer(uint64_t seed, uint64_t offset, uint64_t i, int64_t low,
                                               uint64_t range) {
  uint32_t w0, w1;
  Philox4x32::element_words(seed, offset, i, w0, w1);
  const uint64_t word = (static_cast<uint64_t>(w0) << 32) | w1;
  return static_cast<int64_t>(static_cast<uint64_t>(low) + word % range);
}

}  // namespace kiln
