// cuda/check.h: KILN_CUDA_CHECK, KILN_CUBLAS_CHECK and KILN_CUDNN_CHECK, the checked calls of the
// CUDA backend (private to cuda/). A failing call throws kiln::Error (core/error.h) naming the site, the call
// and the library's own error string:
//   cuda/backend.cu:120: cudaMemcpyAsync(dst, src, n, kind, stream) failed: invalid argument
//   (cudaErrorInvalidValue)
// Included by the plain C++ files (runtime.cpp, allocator.cpp) and the .cu files alike. cudnn.h is
// not included here (it is large, and only conv.cu calls cuDNN): KILN_CUDNN_CHECK expands where it
// is used, so a file that uses it includes <cudnn.h> itself.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "core/error.h"

#define KILN_CUDA_CHECK(call)                                                                   \
  do {                                                                                          \
    cudaError_t kiln_cuda_status_ = (call);                                                     \
    if (kiln_cuda_status_ != cudaSuccess) [[unlikely]] {                                        \
      (void)cudaGetLastError(); /* clear a non-sticky error so the next call starts clean */    \
      KILN_FAIL("{}:{}: {} failed: {} ({})", __FILE__, __LINE__, #call,                         \
                cudaGetErrorString(kiln_cuda_status_), cudaGetErrorName(kiln_cuda_status_));    \
    }                                                                                           \
  } while (0)

#define KILN_CUBLAS_CHECK(call)                                                                 \
  do {                                                                                          \
    cublasStatus_t kiln_cublas_status_ = (call);                                                \
    if (kiln_cublas_status_ != CUBLAS_STATUS_SUCCESS) [[unlikely]] {                            \
      KILN_FAIL("{}:{}: {} failed: {} ({})", __FILE__, __LINE__, #call,                         \
                cublasGetStatusString(kiln_cublas_status_),                                     \
                static_cast<int>(kiln_cublas_status_));                                         \
    }                                                                                           \
  } while (0)

#define KILN_CUDNN_CHECK(call)                                                                  \
  do {                                                                                          \
    cudnnStatus_t kiln_cudnn_status_ = (call);                                                  \
    if (kiln_cudnn_status_ != CUDNN_STATUS_SUCCESS) [[unlikely]] {                              \
      KILN_FAIL("{}:{}: {} failed: {} ({})", __FILE__, __LINE__, #call,                         \
                cudnnGetErrorString(kiln_cudnn_status_), static_cast<int>(kiln_cudnn_status_)); \
    }                                                                                           \
  } while (0)
