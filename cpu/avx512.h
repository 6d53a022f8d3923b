// cpu/avx512.h: small helpers shared by the GEMMs (sgemm.cpp, bf16gemm.cpp), which are compiled
// with AVX-512 flags whatever the target CPU (cpu/CMakeLists.txt). Include it only there.
#pragma once

// GCC 12's _mm512_undefined_* initialise a variable from itself, and its -Wuninitialized reports
// that at every inlined use (GCC bug 105593); the pragma silences it for that header alone.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>

#include "cpu/parallel.h"

namespace kiln::cpu::avx512 {
// Internal linkage: sgemm.cpp and bf16gemm.cpp are compiled with different -m flags, and one
// out-of-line copy must not serve the other.
namespace {

// How a GEMM's c is shared out between the threads: each its rows (m_tiles tiles of rows), or, when
// c has too few rows for that, each its panels of b.
inline bool split_by_rows(int64_t m_tiles, int64_t panels) {
  const int threads = get_num_threads();
  return m_tiles >= 2 * threads || panels < threads;
}

inline __mmask16 lanes(int64_t n) {  // the first n of 16 lanes (none for n <= 0, all for n >= 16)
  return n >= 16 ? __mmask16(0xFFFF) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

// 16 x 16 transpose of 32-bit lanes in registers: r[i] holds row i; afterwards r[j] holds column j.
inline void transpose16(__m512 r[16]) {
  __m512 t[16], u[16];
  for (int i = 0; i < 8; ++i) {  // 32-bit interleave of row pairs, within each 128-bit lane
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int g = 0; g < 4; ++g) {  // 64-bit interleave: u[4g + s] has column 4L + s of rows 4g..4g+3
    const __m512d t0 = _mm512_castps_pd(t[4 * g]), t1 = _mm512_castps_pd(t[4 * g + 1]);
    const __m512d t2 = _mm512_castps_pd(t[4 * g + 2]), t3 = _mm512_castps_pd(t[4 * g + 3]);
    u[4 * g + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
    u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
    u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
    u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
  }
  for (int s = 0; s < 4; ++s) {  // gather lane L of the four row groups: column 4L + s
    const __m512 v0 = _mm512_shuffle_f32x4(u[s], u[4 + s], 0x44);
    const __m512 v1 = _mm512_shuffle_f32x4(u[s], u[4 + s], 0xEE);
    const __m512 w0 = _mm512_shuffle_f32x4(u[8 + s], u[12 + s], 0x44);
    const __m512 w1 = _mm512_shuffle_f32x4(u[8 + s], u[12 + s], 0xEE);
    r[s] = _mm512_shuffle_f32x4(v0, w0, 0x88);
    r[4 + s] = _mm512_shuffle_f32x4(v0, w0, 0xDD);
    r[8 + s] = _mm512_shuffle_f32x4(v1, w1, 0x88);
    r[12 + s] = _mm512_shuffle_f32x4(v1, w1, 0xDD);
  }
}

}  // namespace
}  // namespace kiln::cpu::avx512
