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

// Note [cuBLAS opened on first use]: merely loading libcublas.so.13 (and the libcublasLt.so.13 it
// pulls in, 540 MB on disk) costs a process about 150 MiB of resident memory, GPU or not, measured
// with an empty program. Linked normally, every Kiln program built with CUDA paid that, CPU-only
// training included (gpt_char's peak RSS went from 112 to 266 MiB). So kiln_cuda does not link cuBLAS:
// each call names its function through KILN_CUBLAS(fn), which looks the function up once per call
// site in the library, opened with dlopen the first time any is needed (cublas_loader.cpp). The
// function's type comes from the header, so a call is checked at compile time as before. fn may be
// one of cublas_v2.h's macros (cublasCreate is cublasCreate_v2): it is expanded before it is looked up.
namespace kiln::cuda {
void* cublas_symbol(const char* name);  // Error naming the library or function when missing
}  // namespace kiln::cuda
#define KILN_CUBLAS_NAME_(fn) #fn
#define KILN_CUBLAS_EXPANDED_NAME_(fn) KILN_CUBLAS_NAME_(fn)
// KILN_CUBLAS_AS(fn, Pointer) names the function's pointer type, for a function that the headers
// also overload in C++ (decltype(&fn) is then ambiguous).
#define KILN_CUBLAS_AS(fn, Pointer)                                                             \
  ([] {                                                                                         \
    static const auto kiln_cublas_fn_ =                                                         \
        reinterpret_cast<Pointer>(::kiln::cuda::cublas_symbol(KILN_CUBLAS_EXPANDED_NAME_(fn))); \
    return kiln_cublas_fn_;                                                                     \
  }())
#define KILN_CUBLAS(fn) KILN_CUBLAS_AS(fn, decltype(&fn))

#define KILN_CUBLAS_CHECK(call)                                                                 \
  do {                                                                                          \
    cublasStatus_t kiln_cublas_status_ = (call);                                                \
    if (kiln_cublas_status_ != CUBLAS_STATUS_SUCCESS) [[unlikely]] {                            \
      KILN_FAIL("{}:{}: {} failed: {} ({})", __FILE__, __LINE__, #call,                         \
                KILN_CUBLAS(cublasGetStatusString)(kiln_cublas_status_),                        \
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
