// cuda/norm.cu: norm_rows, the normalisation of each row of a contiguous (R, M) view behind
// layer_norm, rms_norm, group_norm and batch_norm (ops/norm.cpp reshapes them all to rows). CPU
// sibling: cpu/norm.cpp, whose semantics these follow: per row, mean and rstd = 1 / sqrt(var + eps)
// (biased variance) in double, two passes (the mean, then the sum of squared deviations: one pass
// of sum(x^2) - M * mean^2 loses every digit when |mean| >> std), then mean and rstd rounded to the
// row's dtype and out = (x - mean) * rstd in that dtype. rms: mean = 0, var = mean(x^2).
// Siblings: backend.cu, reduce.cu (the other row kernels); helpers in loops.cuh.
//
// Note [norm statistics in double]
// float32 rows accumulate in double, as on the CPU, not in float: a float32 sum of a row with
// |mean| = 1e4 is off by about one float32 ulp of the mean, and (x - mean) * rstd then differs from
// the CPU's by that ulp (1e-3) times rstd, beyond float32 tolerance. The kernel is bound by memory,
// not arithmetic, so the double adds cost little. (16-bit floats never get here: ops/norm.cpp runs
// them in float32.)
//
// Short rows (M <= kWarpRowMax) get one warp each, eight rows to a block; longer rows one block of
// kThreads each. Rows up to kRegPer * kThreads (4096) stay in the block's registers, so they are
// read from memory once; the others are walked three times (sum, squared deviations, output), from
// L2 after the first pass for any row that fits there.
#include <cmath>

#include "cuda/context.h"
#include "cuda/kernels.h"
#include "cuda/loops.cuh"

namespace kiln::cuda {
namespace {

constexpr int64_t kWarpRowMax = 1024;  // rows up to this length get a warp, longer ones a block
constexpr int kRegPer = 16;            // ... which holds rows of up to kRegPer * kThreads in registers

// ---- kernels ----

// One row per group of threads: a warp (kWarp) or the whole block. `lane` and `width` are the
// thread's place in its group and the group's size; `sum` reduces over the group.
template <typename T, typename Sum>
__device__ __forceinline__ void norm_row(const T* x, T* y, T* mean, T* rstd, int64_t M, double eps,
                                         bool rms, int lane, int width, const Sum& sum) {
  double m = 0;
  if (!rms) {
    double s = 0;
    for (int64_t i = lane; i < M; i += width) s += static_cast<double>(x[i]);
    m = sum(s) / static_cast<double>(M);
  }
  double ss = 0;
  for (int64_t i = lane; i < M; i += width) {
    const double d = static_cast<double>(x[i]) - m;
    ss += d * d;
  }
  ss = sum(ss);
  const double inv = 1.0 / sqrt(ss / static_cast<double>(M) + eps);
  const T tm = static_cast<T>(m), ti = static_cast<T>(inv);
  for (int64_t i = lane; i < M; i += width) y[i] = (x[i] - tm) * ti;
  if (lane == 0) {
    *mean = tm;
    *rstd = ti;
  }
}

// Rows of up to kWarpRowMax: warp w of block b takes rows (b * warps + w), then a grid-stride on.
// Every lane of a warp runs the same rows, so the full-mask shuffles are safe.
template <typename T>
__global__ void norm_rows_warp_kernel(const T* x, T* y, T* mean, T* rstd, int64_t R, int64_t M,
                                      double eps, bool rms) {
  const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * warps + (threadIdx.x >> 5);
  const int64_t step = static_cast<int64_t>(gridDim.x) * warps;
  for (int64_t r = first; r < R; r += step) {
    norm_row(x + r * M, y + r * M, mean + r, rstd + r, M, eps, rms, lane, 32,
             [](double v) { return warp_sum(v); });
  }
}

// Longer rows: block b takes rows b, b + gridDim.x, ... (the same number in every thread, so the
// block's __syncthreads() are safe).
template <typename T>
__global__ void norm_rows_block_kernel(const T* x, T* y, T* mean, T* rstd, int64_t R, int64_t M,
                                       double eps, bool rms) {
  __shared__ double shared[32];
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    norm_row(x + r * M, y + r * M, mean + r, rstd + r, M, eps, rms, static_cast<int>(threadIdx.x),
             static_cast<int>(blockDim.x), [&](double v) { return block_sum(v, shared); });
  }
}

// Rows of up to kPer * blockDim.x elements (longer than a warp's): the block keeps its row in
// registers, so the row is read from memory once (norm_row reads it three times). The same sums
// in the same order as norm_row's.
template <typename T, int kPer>
__global__ void norm_rows_reg_kernel(const T* x, T* y, T* mean, T* rstd, int64_t R, int64_t M, double eps,
                                     bool rms) {
  __shared__ double shared[32];
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const T* xr = x + r * M;
    T* yr = y + r * M;
    T v[kPer];
    double s = 0;
    KILN_CUDA_UNROLL
    for (int u = 0; u < kPer; ++u) {
      const int64_t j = threadIdx.x + static_cast<int64_t>(u) * blockDim.x;
      v[u] = j < M ? xr[j] : T(0);
      s += static_cast<double>(v[u]);
    }
    const double m = rms ? 0.0 : block_sum(s, shared) / static_cast<double>(M);
    double ss = 0;
    KILN_CUDA_UNROLL
    for (int u = 0; u < kPer; ++u) {
      const int64_t j = threadIdx.x + static_cast<int64_t>(u) * blockDim.x;
      const double d = static_cast<double>(v[u]) - m;
      if (j < M) ss += d * d;
    }
    ss = block_sum(ss, shared);
    const double inv = 1.0 / sqrt(ss / static_cast<double>(M) + eps);
    const T tm = static_cast<T>(m), ti = static_cast<T>(inv);
    KILN_CUDA_UNROLL
    for (int u = 0; u < kPer; ++u) {
      const int64_t j = threadIdx.x + static_cast<int64_t>(u) * blockDim.x;
      if (j < M) yr[j] = (v[u] - tm) * ti;
    }
    if (threadIdx.x == 0) {
      mean[r] = tm;
      rstd[r] = ti;
    }
  }
}

}  // namespace

// ---- launchers ----

void norm_rows_launch(const View& in, const View& out, const View& mean, const View& rstd,
                      double eps, bool rms, const Stream& s) {
  check_nn_dtype(in.dtype, "norm_rows");
  KILN_CHECK(in.ndim() == 2 && out.sizes == in.sizes && mean.ndim() == 1 && rstd.ndim() == 1 &&
                 mean.sizes[0] == in.sizes[0] && rstd.sizes[0] == in.sizes[0],
             "norm_rows: expected in and out (R, M) and mean and rstd (R), got {}, {}, {} and {}",
             in.sizes.str(), out.sizes.str(), mean.sizes.str(), rstd.sizes.str());
  KILN_CHECK(in.is_contiguous() && out.is_contiguous() && mean.is_contiguous() &&
                 rstd.is_contiguous(),
             "norm_rows: the CUDA kernel expects contiguous views");
  KILN_CHECK(out.dtype == in.dtype && mean.dtype == in.dtype && rstd.dtype == in.dtype,
             "norm_rows: in, out, mean and rstd must share one dtype, got {}, {}, {} and {}",
             dtype_name(in.dtype), dtype_name(out.dtype), dtype_name(mean.dtype),
             dtype_name(rstd.dtype));
  const int64_t R = in.sizes[0], M = in.sizes[1];
  if (R == 0 || M == 0) return;
  cudaStream_t stream = stream_of(s);
  KILN_DISPATCH_F32_F64(in.dtype, "norm_rows", [&] {
    using T = scalar_t;
    if (M <= kWarpRowMax) {
      constexpr int kRowsPerBlock = kThreads / 32;
      const auto blocks = static_cast<unsigned>(
          std::clamp<int64_t>((R + kRowsPerBlock - 1) / kRowsPerBlock, 1, kMaxBlocks));
      norm_rows_warp_kernel<T><<<blocks, kThreads, 0, stream>>>(
          in.ptr<T>(), out.ptr<T>(), mean.ptr<T>(), rstd.ptr<T>(), R, M, eps, rms);
    } else if (M <= kRegPer * kThreads) {
      const auto blocks = static_cast<unsigned>(std::clamp<int64_t>(R, 1, kMaxBlocks));
      norm_rows_reg_kernel<T, kRegPer><<<blocks, kThreads, 0, stream>>>(
          in.ptr<T>(), out.ptr<T>(), mean.ptr<T>(), rstd.ptr<T>(), R, M, eps, rms);
    } else {
      const auto blocks = static_cast<unsigned>(std::clamp<int64_t>(R, 1, kMaxBlocks));
      norm_rows_block_kernel<T><<<blocks, kThreads, 0, stream>>>(
          in.ptr<T>(), out.ptr<T>(), mean.ptr<T>(), rstd.ptr<T>(), R, M, eps, rms);
    }
    KILN_CUDA_CHECK(cudaGetLastError());
  });
}

}  // namespace kiln::cuda
