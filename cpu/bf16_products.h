// cpu/bf16_products.h: products of bfloat16 operands with float32 results, for the CPU kernels that
// read bfloat16 tensors and compute in float32 (attention.cpp's Note [bfloat16 attention], conv.cpp's
// Note [bfloat16 convolution]). Each kernel is a template on its element type T and computes in
// ComputeOf<T>: float32 and float64 kernels go on as before, gemm() of matmul.cpp doing their
// products; a bfloat16 kernel's products take bfloat16 operands and give float32 sums, on
// bf16gemm.cpp's kernels where matmul takes them (AMX's tiles, or AVX512-BF16's dot products: Note
// [which bfloat16 GEMM] in matmul.cpp), elsewhere through float32 copies of the two operands.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cpu/kernels.h"

namespace kiln::cpu {

// The type a kernel computes in: float32 for bfloat16 inputs, the inputs' own type otherwise.
template <typename T>
struct ComputeOf {
  using type = T;
};
template <>
struct ComputeOf<BFloat16> {
  using type = float;
};

// Whether the bfloat16 products of a kernel on T go to bf16gemm.cpp: where a bfloat16 matmul goes
// there (Note [which bfloat16 GEMM] in matmul.cpp). Asked once per kernel call.
template <typename T>
bool own_bf16_products() {
  return std::is_same_v<T, BFloat16> && bf16gemm_choice() != Bf16Gemm::kFloat;
}

// c (m, n) = op(a) @ op(b) (+ c when accumulate), op transposing when ta or tb (a stored (m, k) with
// leading dim lda, or (k, m) when ta; b likewise), a and b of type T, c of the compute type F. For
// float32 and float64, gemm(); for bfloat16, bf16gemm.cpp's chosen kernel (bf16gemm_amx_f32 or
// bf16gemm_avx512_f32) where own_bf16, else float32 copies of a and b into gemm<float>. Threads as
// those do: serial inside a caller's parallel_for.
template <typename T, typename F>
void mixed_gemm(bool own_bf16, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
                const T* b, int64_t ldb, bool accumulate, F* c, int64_t ldc) {
  if constexpr (std::is_same_v<T, F>) {
    gemm<T>(ta, tb, m, n, k, a, lda, b, ldb, accumulate, c, ldc);
  } else {
    static_assert(std::is_same_v<T, BFloat16> && std::is_same_v<F, float>);
    if (own_bf16) {
      const auto product = bf16gemm_choice() == Bf16Gemm::kAmx ? bf16gemm_amx_f32 : bf16gemm_avx512_f32;
      product(m, n, k, a, ta ? 1 : lda, ta ? lda : 1, b, tb ? 1 : ldb, tb ? ldb : 1, accumulate, c, ldc);
      return;
    }
    // Each operand's rows as stored, widened into a contiguous float32 copy.
    auto widen = [](const T* x, int64_t rows, int64_t cols, int64_t ld, F* out) {
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) out[i * cols + j] = static_cast<F>(x[i * ld + j]);
    };
    const int64_t a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
    ScratchBuffer<F> af(static_cast<size_t>(a_rows * a_cols)), bf(static_cast<size_t>(b_rows * b_cols));
    widen(a, a_rows, a_cols, lda, af.data());
    widen(b, b_rows, b_cols, ldb, bf.data());
    gemm<F>(ta, tb, m, n, k, af.data(), a_cols, bf.data(), b_cols, accumulate, c, ldc);
  }
}

// y[0, n) = x[0, n) converted to T: for bfloat16, rounded by bf16gemm.cpp's vector code where
// own_bf16 (the CPU then has AVX-512), else by core/half.h's, which rounds the same.
template <typename T, typename F>
void narrow(const F* x, T* y, int64_t n, bool own_bf16) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    if (own_bf16) {
      round_to_bf16_run(x, y, n);
      return;
    }
  }
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(x[i]);
}

// x[0, n) as an operand of type T of a product: x itself when T is the compute type F, else rounded
// into scratch.
template <typename T, typename F>
const T* as_operand(const F* x, T* scratch, int64_t n, bool own_bf16) {
  if constexpr (std::is_same_v<T, F>) {
    return x;
  } else {
    narrow(x, scratch, n, own_bf16);
    return scratch;
  }
}

}  // namespace kiln::cpu
