// cpu/kernels.h: the CPU kernels, one group per file (private to cpu/). backend.cpp binds them to
// the Backend contract of core/backend.h, whose comments say what each computes. Each file's CUDA
// counterpart has the same stem in cuda/ (copy, elementwise, reduce, matmul, index, random).
#pragma once

#include "core/backend.h"

namespace kiln::cpu {

void copy_kernel(const View& src, const View& dst);                          // copy.cpp
void fill_kernel(const View& out, const Scalar& value);                      // copy.cpp
void arange_kernel(const View& out, double start, double step);              // copy.cpp
void unary_kernel(UnaryOp op, const View& in, const View& out, UnaryArgs args);  // elementwise.cpp
void binary_kernel(BinaryOp op, const View& a, const View& b, const View& out,
                   double alpha);                                            // elementwise.cpp
void where_kernel(const View& cond, const View& a, const View& b, const View& out);  // elementwise.cpp
void reduce_kernel(ReduceOp op, const View& in, const View& out);            // reduce.cpp
void matmul_kernel(const View& a, const View& b, const View& c);             // matmul.cpp
void softmax_kernel(const View& in, const View& out, int dim, bool log);     // reduce.cpp
void index_select_kernel(const View& in, int dim, const View& index, const View& out);  // index.cpp
void index_add_kernel(const View& out, int dim, const View& index, const View& src);
void gather_kernel(const View& in, int dim, const View& index, const View& out);
void scatter_kernel(const View& out, int dim, const View& index, const View& src, bool accumulate);
void random_kernel(RandomKind kind, const View& out, uint64_t seed, uint64_t offset, double a,
                   double b);                                                // random.cpp

}  // namespace kiln::cpu
