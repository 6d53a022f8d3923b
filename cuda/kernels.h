// cuda/kernels.h: the CUDA launchers, one group per file (private to cuda/), each file with the
// stem of its CPU sibling in cpu/ (copy, elementwise, reduce, matmul, index, random). backend.cu binds
// them to the Backend contract of core/backend.h, whose comments say what each computes. Each
// launcher runs on the stream it is given, on the current device (the caller holds a DeviceGuard;
// copy_between sets the devices itself), and checks its launch with
// KILN_CUDA_CHECK(cudaGetLastError()).
#pragma once

#include "core/backend.h"

namespace kiln::cuda {

// copy.cpp: Backend::copy, every direction (host code around copy_on_device).
void copy_between(const View& src, Device src_device, const View& dst, Device dst_device,
                  const Stream& s);

// copy.cu. copy_on_device: dst = src, both on the current device, any dtypes and strides
// (src already has dst's sizes).
void copy_on_device(const View& src, const View& dst, const Stream& s);
void fill_launch(const View& out, const Scalar& value, const Stream& s);
void arange_launch(const View& out, double start, double step, const Stream& s);

// random.cu
void random_launch(RandomKind kind, const View& out, uint64_t seed, uint64_t offset, double a,
                   double b, const Stream& s);

// elementwise.cu
void unary_launch(UnaryOp op, const View& in, const View& out, UnaryArgs args, const Stream& s);
void binary_launch(BinaryOp op, const View& a, const View& b, const View& out, double alpha,
                   const Stream& s);
void where_launch(const View& cond, const View& a, const View& b, const View& out,
                  const Stream& s);

// reduce.cu
void reduce_launch(ReduceKind op, const View& in, const View& out, const Stream& s);
void softmax_launch(const View& in, const View& out, int dim, bool log, const Stream& s);

// matmul.cu: c = a @ b on device `device` (cuBLAS for the floating dtypes).
void matmul_launch(const View& a, const View& b, const View& c, int device, const Stream& s);

// index.cu. Indices are checked on the device; a bad one is an Error after the kernel (which
// synchronizes the stream: see Note [index checks on the device] in index.cu).
void index_select_launch(const View& in, int dim, const View& index, const View& out,
                         const Stream& s);
void index_add_launch(const View& out, int dim, const View& index, const View& src,
                      const Stream& s);
void gather_launch(const View& in, int dim, const View& index, const View& out, const Stream& s);
void scatter_launch(const View& out, int dim, const View& index, const View& src, bool accumulate,
                    const Stream& s);

}  // namespace kiln::cuda
