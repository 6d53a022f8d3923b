// cpu/pool.cpp: max, average, adaptive average and adaptive max pooling over the (H, W) planes of
// contiguous (N, C, H, W) views, forward and backward, split over the N * C planes by the pool of
// cpu/parallel.h. Adaptive max pooling's backward is max pooling's (both scatter to the indices).
// Max pooling with a 2x2 window, stride 2, no padding and no dilation (the common CNN case) has its own
// loop: two input rows per output row, no window bookkeeping.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "cpu/kernels.h"
#include "cpu/parallel.h"

namespace kiln::cpu {
namespace {


// Runs fn(plane) for every plane of a (N, C, ...) view, in parallel; `work` is the cost of one plane.
template <typename F>
void for_planes(int64_t planes, int64_t work, const F& fn) {
  parallel_for(0, planes, std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(work, 1)),
               [&](int64_t p0, int64_t p1) {
                 for (int64_t p = p0; p < p1; ++p) fn(p);
               });
}

// A max-pooling step: NaN wins, and so does a larger value (PyTorch's rule).
template <typename T>
inline void take_max(T v, int64_t index, T& best, int64_t& best_index) {
  if (v > best || std::isnan(v)) {
    best = v;
    best_index = index;
  }
}

// One plane of 2x2, stride-2 max pooling: branch-free selects in PyTorch's scan order (a later value
// wins when larger or NaN) on restrict pointers, so the compiler vectorizes the row.
template <typename T>
void max_pool_2x2_plane(const T* __restrict x, T* __restrict y, int64_t* __restrict idx, int64_t W, int64_t Ho,
                        int64_t Wo) {
  for (int64_t oh = 0; oh < Ho; ++oh) {
    const T* r0 = x + 2 * oh * W;
    const T* r1 = r0 + W;
    const int64_t base = 2 * oh * W;
    T* yr = y + oh * Wo;
    int64_t* ir = idx + oh * Wo;
    for (int64_t ow = 0; ow < Wo; ++ow) {
      const int64_t c = 2 * ow;
      const T v0 = r0[c], v1 = r0[c + 1], v2 = r1[c], v3 = r1[c + 1];
      T best = v0;
      int64_t off = 0;
      const bool t1 = v1 > best || v1 != v1;
      best = t1 ? v1 : best;
      off = t1 ? 1 : off;
      const bool t2 = v2 > best || v2 != v2;
      best = t2 ? v2 : best;
      off = t2 ? W : off;
      const bool t3 = v3 > best || v3 != v3;
      best = t3 ? v3 : best;
      off = t3 ? W + 1 : off;
      yr[ow] = best;
      ir[ow] = base + c + off;
    }
  }
}

template <typename T>
void max_pool2d_typed(const View& in, const View& out, const View& indices, const Pool2dArgs& a) {
  const int64_t H = in.sizes[2], W = in.sizes[3], Ho = out.sizes[2], Wo = out.sizes[3];
  const int64_t planes = in.sizes[0] * in.sizes[1];
  const T* x = in.ptr<T>();
  T* y = out.ptr<T>();
  int64_t* idx = indices.ptr<int64_t>();
  const bool two_by_two = a.kernel_h == 2 && a.kernel_w == 2 && a.stride_h == 2 && a.stride_w == 2 &&
                          a.pad_h == 0 && a.pad_w == 0 && a.dilation_h == 1 && a.dilation_w == 1 &&
                          Ho * 2 <= H && Wo * 2 <= W;  // not ceil_mode's partial windows
  for_planes(planes, H * W, [&](int64_t p) {
    const T* xp = x + p * H * W;
    T* yp = y + p * Ho * Wo;
    int64_t* ip = idx + p * Ho * Wo;
    if (two_by_two) {
      max_pool_2x2_plane(xp, yp, ip, W, Ho, Wo);
      return;
    }
    for (int64_t oh = 0; oh < Ho; ++oh) {
      int64_t h0 = oh * a.stride_h - a.pad_h;
      const int64_t h1 = std::min(h0 + (a.kernel_h - 1) * a.dilation_h + 1, H);
      while (h0 < 0) h0 += a.dilation_h;
      for (int64_t ow = 0; ow < Wo; ++ow) {
        int64_t w0 = ow * a.stride_w - a.pad_w;
        const int64_t w1 = std::min(w0 + (a.kernel_w - 1) * a.dilation_w + 1, W);
        while (w0 < 0) w0 += a.dilation_w;
        T best = -std::numeric_limits<T>::infinity();
        int64_t bi = h0 * W + w0;
        for (int64_t h = h0; h < h1; h += a.dilation_h) {
          for (int64_t w = w0; w < w1; w += a.dilation_w) take_max(xp[h * W + w], h * W + w, best, bi);
        }
        yp[oh * Wo + ow] = best;
        ip[oh * Wo + ow] = bi;
      }
    }
  });
}

template <typename T>
void max_pool2d_backward_typed(const View& grad_out, const View& indices, const View& grad_in) {
  const int64_t HW = grad_in.sizes[2] * grad_in.sizes[3];
  const int64_t out_hw = grad_out.sizes[2] * grad_out.sizes[3];
  const int64_t planes = grad_in.sizes[0] * grad_in.sizes[1];
  const T* gy = grad_out.ptr<T>();
  const int64_t* idx = indices.ptr<int64_t>();
  T* gx = grad_in.ptr<T>();
  for_planes(planes, HW, [&](int64_t p) {
    T* gp = gx + p * HW;
    std::memset(gp, 0, sizeof(T) * HW);
    const T* g = gy + p * out_hw;
    const int64_t* ip = idx + p * out_hw;
    for (int64_t i = 0; i < out_hw; ++i) {
      if (ip[i] < 0 || ip[i] >= HW) [[unlikely]] {
        KILN_FAIL("max_pool2d_backward: index {} is out of bounds for an input plane of {} elements", ip[i], HW);
      }
      gp[ip[i]] += g[i];
    }
  });
}

// The window of avg pooling output (oh, ow), clipped to the input, and its divisor (PyTorch's rule).
struct AvgWindow {
  int64_t h0, h1, w0, w1;
  double divisor;
};
inline AvgWindow avg_window(int64_t oh, int64_t ow, int64_t H, int64_t W, const Pool2dArgs& a) {
  int64_t h0 = oh * a.stride_h - a.pad_h, w0 = ow * a.stride_w - a.pad_w;
  int64_t h1 = std::min(h0 + a.kernel_h, H + a.pad_h), w1 = std::min(w0 + a.kernel_w, W + a.pad_w);
  const int64_t padded_size = (h1 - h0) * (w1 - w0);
  h0 = std::max<int64_t>(h0, 0), w0 = std::max<int64_t>(w0, 0);
  h1 = std::min(h1, H), w1 = std::min(w1, W);
  double divisor = a.divisor != 0            ? static_cast<double>(a.divisor)
                   : a.count_include_pad ? static_cast<double>(padded_size)
                                         : static_cast<double>((h1 - h0) * (w1 - w0));
  return {h0, h1, w0, w1, divisor};
}

// Average pooling over windows: window(oh, ow) gives output (oh, ow)'s window, clipped to the input,
// and its divisor. Plain and adaptive average pooling differ only in that function.
template <typename T, typename Window>
void avg_windows_forward(const View& in, const View& out, const Window& window) {
  const int64_t H = in.sizes[2], W = in.sizes[3], Ho = out.sizes[2], Wo = out.sizes[3];
  const T* x = in.ptr<T>();
  T* y = out.ptr<T>();
  for_planes(in.sizes[0] * in.sizes[1], H * W, [&](int64_t p) {
    const T* xp = x + p * H * W;
    T* yp = y + p * Ho * Wo;
    for (int64_t oh = 0; oh < Ho; ++oh) {
      for (int64_t ow = 0; ow < Wo; ++ow) {
        const AvgWindow win = window(oh, ow);
        T sum = 0;  // an empty window (all padding) averages to 0
        for (int64_t h = win.h0; h < win.h1; ++h)
          for (int64_t w = win.w0; w < win.w1; ++w) sum += xp[h * W + w];
        yp[oh * Wo + ow] = win.h0 < win.h1 && win.w0 < win.w1 ? sum / static_cast<T>(win.divisor) : T(0);
      }
    }
  });
}

// Each output's gradient, divided by its divisor, is added to every input of its window.
template <typename T, typename Window>
void avg_windows_backward(const View& grad_out, const View& grad_in, const Window& window) {
  const int64_t H = grad_in.sizes[2], W = grad_in.sizes[3], Ho = grad_out.sizes[2], Wo = grad_out.sizes[3];
  const T* gy = grad_out.ptr<T>();
  T* gx = grad_in.ptr<T>();
  for_planes(grad_in.sizes[0] * grad_in.sizes[1], H * W, [&](int64_t p) {
    T* gp = gx + p * H * W;
    std::memset(gp, 0, sizeof(T) * H * W);
    const T* g = gy + p * Ho * Wo;
    for (int64_t oh = 0; oh < Ho; ++oh) {
      for (int64_t ow = 0; ow < Wo; ++ow) {
        const AvgWindow win = window(oh, ow);
        const T share = g[oh * Wo + ow] / static_cast<T>(win.divisor);
        for (int64_t h = win.h0; h < win.h1; ++h)
          for (int64_t w = win.w0; w < win.w1; ++w) gp[h * W + w] += share;
      }
    }
  });
}

// Adaptive windows: [floor(i * in / out), ceil((i + 1) * in / out)) in each dim; the average divides by
// their size.
struct AdaptiveWindows {
  int64_t H, W, Ho, Wo;
  AvgWindow operator()(int64_t oh, int64_t ow) const {
    const int64_t h0 = oh * H / Ho, h1 = ((oh + 1) * H + Ho - 1) / Ho;
    const int64_t w0 = ow * W / Wo, w1 = ((ow + 1) * W + Wo - 1) / Wo;
    return {h0, h1, w0, w1, static_cast<double>((h1 - h0) * (w1 - w0))};
  }
};

// Adaptive max pooling: the max of each adaptive window, scanned row by row (take_max's rule), with
// its position h * W + w in the plane; the window's first element when all of it is -inf.
template <typename T>
void adaptive_max_pool2d_typed(const View& in, const View& out, const View& indices) {
  const int64_t H = in.sizes[2], W = in.sizes[3], Ho = out.sizes[2], Wo = out.sizes[3];
  const AdaptiveWindows windows{H, W, Ho, Wo};
  const T* x = in.ptr<T>();
  T* y = out.ptr<T>();
  int64_t* idx = indices.ptr<int64_t>();
  for_planes(in.sizes[0] * in.sizes[1], H * W, [&](int64_t p) {
    const T* xp = x + p * H * W;
    T* yp = y + p * Ho * Wo;
    int64_t* ip = idx + p * Ho * Wo;
    for (int64_t oh = 0; oh < Ho; ++oh) {
      for (int64_t ow = 0; ow < Wo; ++ow) {
        const AvgWindow win = windows(oh, ow);
        T best = -std::numeric_limits<T>::infinity();
        int64_t bi = win.h0 * W + win.w0;
        for (int64_t h = win.h0; h < win.h1; ++h)
          for (int64_t w = win.w0; w < win.w1; ++w) take_max(xp[h * W + w], h * W + w, best, bi);
        yp[oh * Wo + ow] = best;
        ip[oh * Wo + ow] = bi;
      }
    }
  });
}

}  // namespace

void max_pool2d_kernel(const View& in, const View& out, const View& indices, const Pool2dArgs& args) {
  KILN_DISPATCH_F32_F64(out.dtype, "max_pool2d", [&] { max_pool2d_typed<scalar_t>(in, out, indices, args); });
}
void max_pool2d_backward_kernel(const View& grad_out, const View& indices, const View& grad_in) {
  KILN_DISPATCH_F32_F64(grad_in.dtype, "max_pool2d_backward",
                        [&] { max_pool2d_backward_typed<scalar_t>(grad_out, indices, grad_in); });
}
void avg_pool2d_kernel(const View& in, const View& out, const Pool2dArgs& args) {
  const int64_t H = in.sizes[2], W = in.sizes[3];
  KILN_DISPATCH_F32_F64(out.dtype, "avg_pool2d", [&] {
    avg_windows_forward<scalar_t>(in, out, [&](int64_t oh, int64_t ow) { return avg_window(oh, ow, H, W, args); });
  });
}
void avg_pool2d_backward_kernel(const View& grad_out, const View& grad_in, const Pool2dArgs& args) {
  const int64_t H = grad_in.sizes[2], W = grad_in.sizes[3];
  KILN_DISPATCH_F32_F64(grad_in.dtype, "avg_pool2d_backward", [&] {
    avg_windows_backward<scalar_t>(grad_out, grad_in,
                                   [&](int64_t oh, int64_t ow) { return avg_window(oh, ow, H, W, args); });
  });
}
void adaptive_avg_pool2d_kernel(const View& in, const View& out) {
  const AdaptiveWindows windows{in.sizes[2], in.sizes[3], out.sizes[2], out.sizes[3]};
  KILN_DISPATCH_F32_F64(out.dtype, "adaptive_avg_pool2d", [&] { avg_windows_forward<scalar_t>(in, out, windows); });
}
void adaptive_avg_pool2d_backward_kernel(const View& grad_out, const View& grad_in) {
  const AdaptiveWindows windows{grad_in.sizes[2], grad_in.sizes[3], grad_out.sizes[2], grad_out.sizes[3]};
  KILN_DISPATCH_F32_F64(grad_in.dtype, "adaptive_avg_pool2d_backward",
                        [&] { avg_windows_backward<scalar_t>(grad_out, grad_in, windows); });
}

void adaptive_max_pool2d_kernel(const View& in, const View& out, const View& indices) {
  KILN_DISPATCH_F32_F64(out.dtype, "adaptive_max_pool2d",
                        [&] { adaptive_max_pool2d_typed<scalar_t>(in, out, indices); });
}

}  // namespace kiln::cpu
