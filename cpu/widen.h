// cpu/widen.h: a contiguous run of T computed in a wider floating type W, a chunk at a time (private to
// cpu/): float16 and bfloat16 through float32 (cpu/elementwise.cpp, Note [16-bit runs through
// float32]), float32 through float64 (cpu/vector_math.cpp, for the functions whose float32 result is
// the float64 one rounded once).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>

namespace kiln::cpu {

// f(in, out, m) computes out[:m] from in[0][:m], ..., in[N-1][:m] (separate buffers of kChunk W each:
// GELU's tail reads x after out is written), or returns false, before writing, for an op it lacks. Each
// result is the W one rounded once to T. Returns how many elements were done: n, or where f declined.
template <typename W, int64_t kChunk, typename T, size_t N, typename F>
int64_t through_wider(const std::array<const T*, N>& in, T* out, int64_t n, const F& f) {
  W in_w[N][kChunk], out_w[kChunk];
  for (int64_t start = 0; start < n; start += kChunk) {
    const int64_t m = std::min(kChunk, n - start);
    for (size_t k = 0; k < N; ++k) {
      for (int64_t i = 0; i < m; ++i) in_w[k][i] = static_cast<W>(in[k][start + i]);
    }
    if (!f(in_w, out_w, m)) return start;
    for (int64_t i = 0; i < m; ++i) out[start + i] = static_cast<T>(out_w[i]);
  }
  return n;
}

}  // namespace kiln::cpu
