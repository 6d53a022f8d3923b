// cuda/pool.cu: max, average, adaptive average and adaptive max pooling over the (H, W) planes of contiguous
// (N, C, H, W) views, forward and backward. CPU sibling: cpu/pool.cpp, whose semantics these follow
// window for window: the same window bounds and divisors (PyTorch's), the same scan order for max
// (a later element wins when larger or NaN, so indices agree), sums in the view's dtype.
// Siblings: backend.cu, conv.cu, norm.cu; helpers in loops.cuh.
//
// Forward: one thread per output element (grid-stride), which scans its window.
// Backward of the average poolings: one thread per input element, which gathers the shares
// g / divisor of the outputs whose windows hold it (no atomics, so the result does not depend on
// timing). Backward of max pooling: the contract hands over only the indices, not the window
// geometry, so grad_in is zeroed and each output's gradient is added at its index with atomicAdd
// (overlapping windows may pick one element twice); the order of those adds, and so the last bits
// of such an element, may vary from run to run. With use_deterministic_algorithms(true)
// (core/deterministic.h), one thread per plane instead walks the plane's outputs in order and adds
// without atomics: the same bits every run, and the CPU's order.
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/deterministic.h"
#include "cuda/context.h"
#include "cuda/kernels.h"
#include "cuda/loops.cuh"

namespace kiln::cuda {
namespace {

// floor(a / b) for b > 0 and any sign of a.
__host__ __device__ __forceinline__ int64_t floor_div(int64_t a, int64_t b) {
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}

// The window of one output, clipped to the input, and its divisor (cpu/pool.cpp's AvgWindow).
struct Window {
  int64_t h0, h1, w0, w1;
  double divisor;
};

// avg_pool2d's windows: window (oh, ow) covers rows [oh * stride_h - pad_h, + kernel_h) clipped to
// the padded input for the count_include_pad divisor, then to the input (cpu/pool.cpp's
// avg_window). candidates_h(h) gives a range of outputs that holds every window containing input
// row h (maybe one more: the gather checks membership with the window itself); likewise columns.
struct AvgWindows {
  int64_t H, W;
  Pool2dArgs a;
  __device__ Window operator()(int64_t oh, int64_t ow) const {
    int64_t h0 = oh * a.stride_h - a.pad_h, w0 = ow * a.stride_w - a.pad_w;
    int64_t h1 = std::min<int64_t>(h0 + a.kernel_h, H + a.pad_h);
    int64_t w1 = std::min<int64_t>(w0 + a.kernel_w, W + a.pad_w);
    const int64_t padded_size = (h1 - h0) * (w1 - w0);
    h0 = std::max<int64_t>(h0, 0), w0 = std::max<int64_t>(w0, 0);
    h1 = std::min<int64_t>(h1, H), w1 = std::min<int64_t>(w1, W);
    const double divisor = a.divisor != 0          ? static_cast<double>(a.divisor)
                           : a.count_include_pad ? static_cast<double>(padded_size)
                                                 : static_cast<double>((h1 - h0) * (w1 - w0));
    return {h0, h1, w0, w1, divisor};
  }
  __device__ void candidates_h(int64_t h, int64_t& lo, int64_t& hi) const {
    lo = floor_div(h + a.pad_h - a.kernel_h, a.stride_h), hi = (h + a.pad_h) / a.stride_h + 1;
  }
  __device__ void candidates_w(int64_t w, int64_t& lo, int64_t& hi) const {
    lo = floor_div(w + a.pad_w - a.kernel_w, a.stride_w), hi = (w + a.pad_w) / a.stride_w + 1;
  }
};

// The adaptive poolings' windows: [floor(i * in / out), ceil((i + 1) * in / out)) in each dim; the
// average divides by their size. Input row h lies in the windows of outputs
// [floor(h * Ho / H), ceil((h + 1) * Ho / H)).
struct AdaptiveWindows {
  int64_t H, W, Ho, Wo;
  __device__ Window operator()(int64_t oh, int64_t ow) const {
    const int64_t h0 = oh * H / Ho, h1 = ((oh + 1) * H + Ho - 1) / Ho;
    const int64_t w0 = ow * W / Wo, w1 = ((ow + 1) * W + Wo - 1) / Wo;
    return {h0, h1, w0, w1, static_cast<double>((h1 - h0) * (w1 - w0))};
  }
  __device__ void candidates_h(int64_t h, int64_t& lo, int64_t& hi) const {
    lo = h * Ho / H, hi = ((h + 1) * Ho + H - 1) / H;
  }
  __device__ void candidates_w(int64_t w, int64_t& lo, int64_t& hi) const {
    lo = w * Wo / W, hi = ((w + 1) * Wo + W - 1) / W;
  }
};

// ---- kernels ----

// The max of rows [h0, h1) and columns [w0, w1) (steps dh, dw) of the plane xp, scanned row by row: a
// later element wins when larger or NaN; the index is h * W + w, the window's first when all is -inf.
template <typename T>
__device__ void window_max(const T* xp, int64_t W, int64_t h0, int64_t h1, int64_t dh, int64_t w0, int64_t w1,
                           int64_t dw, T& out, int64_t& index) {
  T best = -std::numeric_limits<T>::infinity();
  int64_t bi = h0 * W + w0;
  for (int64_t h = h0; h < h1; h += dh) {
    for (int64_t w = w0; w < w1; w += dw) {
      const T v = xp[h * W + w];
      if (v > best || isnan(v)) {
        best = v;
        bi = h * W + w;
      }
    }
  }
  out = best;
  index = bi;
}

// Output i (plane p, row oh, column ow): the max over its window, scanned row by row as
// cpu/pool.cpp does; padding never wins, NaN does, and the index is h * W + w in the plane.
template <typename T>
__global__ void max_pool2d_kernel(const T* x, T* y, int64_t* idx, int64_t n, int64_t H, int64_t W,
                                  int64_t Ho, int64_t Wo, Pool2dArgs a) {
  const int64_t step = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const int64_t ow = i % Wo, oh = (i / Wo) % Ho, p = i / (Wo * Ho);
    int64_t h0 = oh * a.stride_h - a.pad_h;
    const int64_t h1 = std::min<int64_t>(h0 + (a.kernel_h - 1) * a.dilation_h + 1, H);
    while (h0 < 0) h0 += a.dilation_h;
    int64_t w0 = ow * a.stride_w - a.pad_w;
    const int64_t w1 = std::min<int64_t>(w0 + (a.kernel_w - 1) * a.dilation_w + 1, W);
    while (w0 < 0) w0 += a.dilation_w;
    window_max(x + p * H * W, W, h0, h1, a.dilation_h, w0, w1, a.dilation_w, y[i], idx[i]);
  }
}

// Output i of adaptive max pooling: the max over its adaptive window.
template <typename T>
__global__ void adaptive_max_pool2d_kernel(const T* x, T* y, int64_t* idx, int64_t n, AdaptiveWindows windows) {
  const int64_t step = static_cast<int64_t>(blockDim.x) * gridDim.x;
  const int64_t H = windows.H, W = windows.W, Ho = windows.Ho, Wo = windows.Wo;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const int64_t ow = i % Wo, oh = (i / Wo) % Ho, p = i / (Wo * Ho);
    const Window win = windows(oh, ow);
    window_max(x + p * H * W, W, win.h0, win.h1, 1, win.w0, win.w1, 1, y[i], idx[i]);
  }
}

// grad_in (zeroed by the launcher) [plane][indices[i]] += grad_out[i], i over every output.
template <typename T>
__global__ void max_pool2d_backward_kernel(const T* gy, const int64_t* idx, T* gx, int64_t n,
                                           int64_t out_hw, int64_t hw) {
  const int64_t step = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const int64_t j = idx[i];
    if (j >= 0 && j < hw) atomicAdd(gx + (i / out_hw) * hw + j, gy[i]);  // out of range: ignored
  }
}

// The same, deterministic: one thread per plane adds the plane's outputs in order.
template <typename T>
__global__ void max_pool2d_backward_planes_kernel(const T* gy, const int64_t* idx, T* gx, int64_t planes,
                                                  int64_t out_hw, int64_t hw) {
  const int64_t step = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < planes; p += step) {
    for (int64_t i = p * out_hw; i < (p + 1) * out_hw; ++i) {
      const int64_t j = idx[i];
      if (j >= 0 && j < hw) gx[p * hw + j] += gy[i];
    }
  }
}

// Output i: the sum of its window over the window's divisor (an empty window, all padding, is 0).
template <typename T, typename Windows>
__global__ void avg_pool_kernel(const T* x, T* y, int64_t n, int64_t H, int64_t W, int64_t Ho,
                                int64_t Wo, Windows windows) {
  const int64_t step = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const int64_t ow = i % Wo, oh = (i / Wo) % Ho, p = i / (Wo * Ho);
    const T* xp = x + p * H * W;
    const Window win = windows(oh, ow);
    T sum = 0;
    for (int64_t h = win.h0; h < win.h1; ++h) {
      for (int64_t w = win.w0; w < win.w1; ++w) sum += xp[h * W + w];
    }
    y[i] = win.h0 < win.h1 && win.w0 < win.w1 ? sum / static_cast<T>(win.divisor) : T(0);
  }
}

// Input element i (plane p, row h, column w): the sum of grad_out / divisor over the outputs whose
// windows hold it.
template <typename T, typename Windows>
__global__ void avg_pool_backward_kernel(const T* gy, T* gx, int64_t n, int64_t H, int64_t W,
                                         int64_t Ho, int64_t Wo, Windows windows) {
  const int64_t step = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const int64_t w = i % W, h = (i / W) % H, p = i / (W * H);
    const T* g = gy + p * Ho * Wo;
    int64_t oh0, oh1, ow0, ow1;
    windows.candidates_h(h, oh0, oh1);
    windows.candidates_w(w, ow0, ow1);
    oh0 = std::max<int64_t>(oh0, 0), ow0 = std::max<int64_t>(ow0, 0);
    oh1 = std::min<int64_t>(oh1, Ho), ow1 = std::min<int64_t>(ow1, Wo);
    T sum = 0;
    for (int64_t oh = oh0; oh < oh1; ++oh) {
      for (int64_t ow = ow0; ow < ow1; ++ow) {
        const Window win = windows(oh, ow);
        if (h >= win.h0 && h < win.h1 && w >= win.w0 && w < win.w1) {
          sum += g[oh * Wo + ow] / static_cast<T>(win.divisor);
        }
      }
    }
    gx[i] = sum;
  }
}

// ---- launchers ----

// The checks every pooling launcher shares: 4-D contiguous views of one float dtype, the same
// planes (N, C) in both.
void check_planes(const View& in, const View& out, const char* op) {
  check_nn_dtype(in.dtype, op);
  KILN_CHECK(in.ndim() == 4 && out.ndim() == 4 && in.sizes[0] == out.sizes[0] &&
                 in.sizes[1] == out.sizes[1],
             "{}: expected (N, C, H, W) views with the same N and C, got {} and {}", op,
             in.sizes.str(), out.sizes.str());
  KILN_CHECK(in.is_contiguous() && out.is_contiguous(),
             "{}: the CUDA kernel expects contiguous views", op);
  KILN_CHECK(out.dtype == in.dtype, "{}: expected one dtype, got {} and {}", op,
             dtype_name(in.dtype), dtype_name(out.dtype));
}

template <typename Windows>
void avg_forward(const View& in, const View& out, const Windows& windows, const char* op,
                 const Stream& s) {
  const int64_t n = out.numel();
  if (n == 0) return;
  KILN_DISPATCH_F32_F64(in.dtype, op, [&] {
    avg_pool_kernel<scalar_t><<<blocks_for(n), kThreads, 0, stream_of(s)>>>(
        in.ptr<scalar_t>(), out.ptr<scalar_t>(), n, in.sizes[2], in.sizes[3], out.sizes[2],
        out.sizes[3], windows);
    KILN_CUDA_CHECK(cudaGetLastError());
  });
}

template <typename Windows>
void avg_backward(const View& grad_out, const View& grad_in, const Windows& windows,
                  const char* op, const Stream& s) {
  const int64_t n = grad_in.numel();
  if (n == 0) return;
  KILN_DISPATCH_F32_F64(grad_in.dtype, op, [&] {
    avg_pool_backward_kernel<scalar_t><<<blocks_for(n), kThreads, 0, stream_of(s)>>>(
        grad_out.ptr<scalar_t>(), grad_in.ptr<scalar_t>(), n, grad_in.sizes[2], grad_in.sizes[3],
        grad_out.sizes[2], grad_out.sizes[3], windows);
    KILN_CUDA_CHECK(cudaGetLastError());
  });
}

}  // namespace

void max_pool2d_launch(const View& in, const View& out, const View& indices,
                       const Pool2dArgs& args, const Stream& s) {
  check_planes(in, out, "max_pool2d");
  KILN_CHECK(indices.dtype == kInt64 && indices.sizes == out.sizes && indices.is_contiguous(),
             "max_pool2d: indices must be contiguous int64 of the output's shape {}, got {} {}",
             out.sizes.str(), dtype_name(indices.dtype), indices.sizes.str());
  const int64_t n = out.numel();
  if (n == 0) return;
  KILN_DISPATCH_F32_F64(in.dtype, "max_pool2d", [&] {
    max_pool2d_kernel<scalar_t><<<blocks_for(n), kThreads, 0, stream_of(s)>>>(
        in.ptr<scalar_t>(), out.ptr<scalar_t>(), indices.ptr<int64_t>(), n, in.sizes[2],
        in.sizes[3], out.sizes[2], out.sizes[3], args);
    KILN_CUDA_CHECK(cudaGetLastError());
  });
}

void max_pool2d_backward_launch(const View& grad_out, const View& indices, const View& grad_in,
                                const Stream& s) {
  check_planes(grad_in, grad_out, "max_pool2d_backward");
  KILN_CHECK(indices.dtype == kInt64 && indices.sizes == grad_out.sizes && indices.is_contiguous(),
             "max_pool2d_backward: indices must be contiguous int64 of grad_out's shape {}, got {} {}",
             grad_out.sizes.str(), dtype_name(indices.dtype), indices.sizes.str());
  if (grad_in.numel() == 0) return;
  KILN_CUDA_CHECK(cudaMemsetAsync(grad_in.data, 0,
                                  static_cast<size_t>(grad_in.numel() * itemsize(grad_in.dtype)),
                                  stream_of(s)));
  const int64_t n = grad_out.numel();
  if (n == 0) return;
  const int64_t out_hw = grad_out.sizes[2] * grad_out.sizes[3], hw = grad_in.sizes[2] * grad_in.sizes[3];
  const bool deterministic = are_deterministic_algorithms_enabled();
  KILN_DISPATCH_F32_F64(grad_in.dtype, "max_pool2d_backward", [&] {
    if (deterministic) {
      const int64_t planes = grad_out.sizes[0] * grad_out.sizes[1];
      max_pool2d_backward_planes_kernel<scalar_t><<<blocks_for(planes), kThreads, 0, stream_of(s)>>>(
          grad_out.ptr<scalar_t>(), indices.ptr<int64_t>(), grad_in.ptr<scalar_t>(), planes, out_hw, hw);
    } else {
      max_pool2d_backward_kernel<scalar_t><<<blocks_for(n), kThreads, 0, stream_of(s)>>>(
          grad_out.ptr<scalar_t>(), indices.ptr<int64_t>(), grad_in.ptr<scalar_t>(), n, out_hw, hw);
    }
    KILN_CUDA_CHECK(cudaGetLastError());
  });
}

void avg_pool2d_launch(const View& in, const View& out, const Pool2dArgs& args, const Stream& s) {
  check_planes(in, out, "avg_pool2d");
  avg_forward(in, out, AvgWindows{in.sizes[2], in.sizes[3], args}, "avg_pool2d", s);
}

void avg_pool2d_backward_launch(const View& grad_out, const View& grad_in, const Pool2dArgs& args,
                                const Stream& s) {
  check_planes(grad_in, grad_out, "avg_pool2d_backward");
  avg_backward(grad_out, grad_in, AvgWindows{grad_in.sizes[2], grad_in.sizes[3], args},
               "avg_pool2d_backward", s);
}

void adaptive_avg_pool2d_launch(const View& in, const View& out, const Stream& s) {
  check_planes(in, out, "adaptive_avg_pool2d");
  avg_forward(in, out, AdaptiveWindows{in.sizes[2], in.sizes[3], out.sizes[2], out.sizes[3]},
              "adaptive_avg_pool2d", s);
}

void adaptive_avg_pool2d_backward_launch(const View& grad_out, const View& grad_in,
                                         const Stream& s) {
  check_planes(grad_in, grad_out, "adaptive_avg_pool2d_backward");
  const AdaptiveWindows windows{grad_in.sizes[2], grad_in.sizes[3], grad_out.sizes[2],
                                grad_out.sizes[3]};
  if (windows.Ho == 0 || windows.Wo == 0) {  // no outputs: nothing flows back
    if (grad_in.numel() == 0) return;
    KILN_CUDA_CHECK(cudaMemsetAsync(
        grad_in.data, 0, static_cast<size_t>(grad_in.numel() * itemsize(grad_in.dtype)),
        stream_of(s)));
    return;
  }
  avg_backward(grad_out, grad_in, windows, "adaptive_avg_pool2d_backward", s);
}

void adaptive_max_pool2d_launch(const View& in, const View& out, const View& indices, const Stream& s) {
  check_planes(in, out, "adaptive_max_pool2d");
  KILN_CHECK(indices.dtype == kInt64 && indices.sizes == out.sizes && indices.is_contiguous(),
             "adaptive_max_pool2d: indices must be contiguous int64 of the output's shape {}, got {} {}",
             out.sizes.str(), dtype_name(indices.dtype), indices.sizes.str());
  const int64_t n = out.numel();
  if (n == 0) return;
  const AdaptiveWindows windows{in.sizes[2], in.sizes[3], out.sizes[2], out.sizes[3]};
  KILN_DISPATCH_F32_F64(in.dtype, "adaptive_max_pool2d", [&] {
    adaptive_max_pool2d_kernel<scalar_t><<<blocks_for(n), kThreads, 0, stream_of(s)>>>(
        in.ptr<scalar_t>(), out.ptr<scalar_t>(), indices.ptr<int64_t>(), n, windows);
    KILN_CUDA_CHECK(cudaGetLastError());
  });
}

}  // namespace kiln::cuda
