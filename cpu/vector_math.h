// cpu/vector_math.h: the pointwise functions computed by glibc's vector math library over contiguous
// float32 and float64 runs (cpu/vector_math.cpp), and the modified Bessel functions I0, I1 and their
// scalings, and polygamma(1, x), a block of elements at a time (cpu/vector_special.cpp). Each returns
// false, having written nothing, for an op it does not cover, or (vector_unary, vector_binary) where
// Kiln was built without libmvec.
#pragma once

#include <cstdint>

#include "core/backend.h"

namespace kiln::cpu {

bool vector_unary(UnaryOp op, const float* x, float* y, int64_t n);
bool vector_unary(UnaryOp op, const double* x, double* y, int64_t n);
bool vector_binary(BinaryOp op, const float* a, const float* b, float* y, int64_t n);
bool vector_binary(BinaryOp op, const double* a, const double* b, double* y, int64_t n);
bool vector_bessel_i(UnaryOp op, const float* x, float* y, int64_t n);
bool vector_bessel_i(UnaryOp op, const double* x, double* y, int64_t n);
bool vector_trigamma(const float* x, float* y, int64_t n);  // polygamma(1, x)
bool vector_trigamma(const double* x, double* y, int64_t n);

}  // namespace kiln::cpu
