// cpu/vector_math.h: the pointwise functions computed by glibc's vector math library over contiguous
// float32 and float64 runs (cpu/vector_math.cpp), and the modified Bessel functions I0, I1 and their
// scalings, the Bessel functions J, Y and K, lgamma, digamma, polygamma(1, x) and the orthogonal
// polynomials, a block of elements at a time (cpu/vector_special.cpp). Each returns
// false, having written nothing, for an op it does not cover, or (vector_unary, vector_binary) where
// Kiln was built without libmvec.
#pragma once

#include <cstdint>

#include "core/backend.h"
#include "core/polynomial_math.h"

namespace kiln::cpu {

bool vector_unary(UnaryOp op, const float* x, float* y, int64_t n);
bool vector_unary(UnaryOp op, const double* x, double* y, int64_t n);
bool vector_binary(BinaryOp op, const float* a, const float* b, float* y, int64_t n);
bool vector_binary(BinaryOp op, const double* a, const double* b, double* y, int64_t n);
// I0, I0e, I1, I1e, J0, J1, Y0, Y1, K0, K1, K0e, K1e, lgamma, digamma and polygamma(a, x) for a = 1;
// a: the op's scalar argument.
bool vector_special(UnaryOp op, const float* x, float* y, int64_t n, double a);
bool vector_special(UnaryOp op, const double* x, double* y, int64_t n, double a);
// The orthogonal polynomial op's p_n(x) of one degree n (the value, not a derivative), or false for a
// degree the scalar loop handles (n < 1, NaN, inf).
bool vector_polynomial(BinaryOp op, const float* x, float* y, int64_t count, double degree);
bool vector_polynomial(BinaryOp op, const double* x, double* y, int64_t count, double degree);
// s = sin x and c = cos x over float64 x, through glibc's SIMD functions (a plain loop of the scalar ones
// where Kiln was built without libmvec); both reduce their argument exactly.
void vector_sin_cos(const double* x, double* s, double* c, int64_t n);
// Chebyshev's T, U, V or W of degree n >= 16 (degree, whole) by its closed form through glibc's SIMD
// functions, for the x with |x| < 1; returns whether some x was not (+-1, beyond, NaN): the caller
// computes those again. Only where Kiln was built with libmvec (KILN_HAVE_LIBMVEC).
bool vector_chebyshev_closed_form(math::Polynomial family, const double* x, double* y, int64_t n, double degree);

}  // namespace kiln::cpu
