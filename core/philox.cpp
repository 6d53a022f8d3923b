// core/philox.cpp: Philox4x32::words8, out of line so that its body (AVX2 or not) is the one the
// library was built with, whatever flags a file that includes core/philox.h is compiled with.
#include "core/philox.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace kiln {

// words() of the 8 counters [counter, counter + 8): w[k][c] is word k of counter + c (the CPU's
// draws, 8 counters at a time). With AVX2, the 8 lanes go through the rounds together: each
// round's two 32 x 32 -> 64-bit products per lane are 4 _mm256_mul_epu32 (even lanes, then the
// odd ones shifted down), their halves put back in lane order by blends.
void Philox4x32::words8(uint64_t seed, uint64_t counter, uint32_t w[4][8]) {
#if defined(__AVX2__)
  alignas(32) uint32_t lo[8], hi[8];
  for (int c = 0; c < 8; ++c) {
    lo[c] = static_cast<uint32_t>(counter + c);
    hi[c] = static_cast<uint32_t>((counter + c) >> 32);
  }
  __m256i c0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(lo));
  __m256i c1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(hi));
  __m256i c2 = _mm256_setzero_si256(), c3 = _mm256_setzero_si256();
  __m256i k0 = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(seed)));
  __m256i k1 = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(seed >> 32)));
  const __m256i m0 = _mm256_set1_epi32(static_cast<int>(kM0)), m1 = _mm256_set1_epi32(static_cast<int>(kM1));
  const __m256i w0 = _mm256_set1_epi32(static_cast<int>(kW0)), w1 = _mm256_set1_epi32(static_cast<int>(kW1));
  // The high and low 32 bits of m * a, lane by lane.
  auto mul_hi_lo = [](__m256i a, __m256i m, __m256i& high, __m256i& low) {
    const __m256i even = _mm256_mul_epu32(a, m);                         // lanes 0, 2, 4, 6, 64-bit
    const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);  // lanes 1, 3, 5, 7
    low = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
    high = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
  };
  for (int round = 0; round < 10; ++round) {
    __m256i hi0, lo0, hi1, lo1;
    mul_hi_lo(c0, m0, hi0, lo0);
    mul_hi_lo(c2, m1, hi1, lo1);
    c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), k0);
    c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), k1);
    c1 = lo1;
    c3 = lo0;
    k0 = _mm256_add_epi32(k0, w0);
    k1 = _mm256_add_epi32(k1, w1);
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(w[0]), c0);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(w[1]), c1);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(w[2]), c2);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(w[3]), c3);
#else
  for (int c = 0; c < 8; ++c) {
    const auto r = words(seed, counter + c);
    for (int k = 0; k < 4; ++k) w[k][c] = r[k];
  }
#endif
}

}  // namespace kiln
