// cpu/pool.cpp: max, average, adaptive average and adaptive max pooling over the (H, W) planes of
// contiguous (N, C, H, W) views, forward and backward, split over the N * C planes by the pool of
// cpu/parallel.h. Adaptive max pooling's backward is max pooling's (both scatter to the indices).
// Max pooling with a 2x2 window, stride 2, no padding and no dilation (the common CNN case) has its own
// loop: two input rows per output row, no window bookkeeping, runs of 16 outputs vectorized. The max
// poolings take float16 and bfloat16 as they are (ops/pool.cpp gives them float32 copies on CUDA
// only); the average poolings take float32 and float64 and sum each window's columns first (Note
// [average pooling is separable]).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "cpu/kernels.h"
#include "cpu/parallel.h"

namespace kiln::cpu {
namespace {

// How many planes a thread takes at least, when one plane costs `work`.
int64_t plane_grain(int64_t work) { return std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(work, 1)); }

// Runs fn(plane) for every plane of a (N, C, ...) view, in parallel; `work` is the cost of one plane.
template <typename F>
void for_planes(int64_t planes, int64_t work, const F& fn) {
  parallel_for(0, planes, plane_grain(work), [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) fn(p);
  });
}

// The same, by chunks of planes: fn(p0, p1, scratch) with an uninitialized scratch of `scratch_size`
// T (none when 0) for each chunk.
template <typename T, typename F>
void for_plane_chunks(int64_t planes, int64_t work, int64_t scratch_size, const F& fn) {
  parallel_for(0, planes, plane_grain(work), [&](int64_t p0, int64_t p1) {
    ScratchBuffer<T> scratch(static_cast<size_t>(scratch_size));
    fn(p0, p1, scratch.data());
  });
}

// Max pooling compares and copies; it does no arithmetic, so every dtype's kernel picks the value the
// float64 kernel would pick from the same values, and stores it unchanged. Its loops compare Lane<T>s:
// - float32 and float64: the values themselves;
// - bfloat16: the float32 whose high half is the value's bits (exactly the value, NaN's payload
//   included), made and undone by a shift, so the loops are float32's;
// - float16: a 32-bit integer whose high half is a key that orders the non-NaN values as float does
//   (-0 and +0 equal) and puts NaN above them all, and whose low half is the value's bits.
// These compare and move in 32-bit vector lanes. Selecting the 16-bit values themselves, or widening
// them to float through the conversion functions, vectorized poorly (3.8 and 4.3 ms for the CNN's first
// pooling against 1.2 for float32; 1.4 with the keyed lanes). On a Zen 4 (one thread, medians of 5
// alternating rounds) bfloat16 keyed lanes took the CNN's two poolings 1.30 and 1.57 ms, its shifted
// float lanes take them 0.96 and 0.92, and float32 1.07 and 0.81.
template <typename T>
constexpr bool kIs16 = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;
template <typename T>
using Lane = std::conditional_t<std::is_same_v<T, Half>, int32_t, std::conditional_t<kIs16<T>, float, T>>;
constexpr int32_t kNaNKey = 0x7fff;  // above +inf's key, the largest magnitude of float16

template <typename T>
inline Lane<T> to_lane(T v) {
  if constexpr (std::is_same_v<T, Half>) {
    constexpr int32_t inf = 0x7c00;  // the bits of +inf
    const int32_t mag = v.bits & 0x7fff;
    const int32_t key = mag > inf ? kNaNKey : (v.bits & 0x8000) ? -mag : mag;
    return static_cast<int32_t>(static_cast<uint32_t>(key) << 16 | v.bits);
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return std::bit_cast<float>(static_cast<uint32_t>(v.bits) << 16);
  } else {
    return v;
  }
}

template <typename T>
inline T from_lane(Lane<T> lane) {
  if constexpr (std::is_same_v<T, Half>) {
    return T::from_bits(static_cast<uint16_t>(lane & 0xffff));
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return T::from_bits(static_cast<uint16_t>(std::bit_cast<uint32_t>(lane) >> 16));
  } else {
    return lane;
  }
}

// Whether v wins over best in a max pooling's scan: NaN wins, and so does a larger value (PyTorch's
// rule). The tests are joined with | rather than ||, so that the compiler makes no branch of them: on
// random values such a branch mispredicts about half the time.
template <typename T>
inline bool larger_or_nan(Lane<T> v, Lane<T> best) {
  if constexpr (std::is_same_v<T, Half>) {
    const int32_t key = v >> 16;
    return (key > (best >> 16)) | (key == kNaNKey);
  } else {
    return (v > best) | (v != v);
  }
}

// A max-pooling step; both selects take values already computed, so they become conditional moves
// or vector blends.
template <typename T>
inline void take_max(Lane<T> v, int64_t index, Lane<T>& best, int64_t& best_index) {
  const bool wins = larger_or_nan<T>(v, best);
  best = wins ? v : best;
  best_index = wins ? index : best_index;
}

// -inf: where the scan of a window starts (a window of only -inf gives its first element's index).
template <typename T>
Lane<T> minus_infinity() {
  return to_lane(static_cast<T>(-std::numeric_limits<float>::infinity()));
}

// 2x2, stride-2 max pooling, in PyTorch's scan order, on runs of kPoolRun outputs of a row: the run's
// columns of both input rows go into local arrays of lanes (zero-padded after the run's last column),
// and a loop of a constant trip count, which the compiler vectorizes whole, pools them. Looping over
// a row as it lies, the compiler's vector loop left short rows (the CNN's rows of 14 and 7 outputs)
// to a scalar tail: single-threaded on 4,096 planes of 28 x 28, 8.9 ms against 1.3.
constexpr int64_t kPoolRun = 16;

// Outputs [0, n) of a run, n <= kPoolRun, from rows r0 and r1 (2n columns each, r1 W elements after
// r0 in the plane); their indices are base + the column in r0, + W in r1.
template <typename T>
inline void max_pool_2x2_run(const T* r0, const T* r1, int64_t n, int64_t W, int64_t base, T* y, int64_t* idx) {
  using L = Lane<T>;
  L a[2 * kPoolRun], b[2 * kPoolRun], best[kPoolRun];
  int64_t at[kPoolRun];
  for (int64_t i = 0; i < 2 * kPoolRun; ++i) {
    a[i] = i < 2 * n ? to_lane(r0[i]) : L(0);
    b[i] = i < 2 * n ? to_lane(r1[i]) : L(0);
  }
  for (int64_t o = 0; o < kPoolRun; ++o) {
    const int64_t c = 2 * o;
    best[o] = a[c];
    at[o] = base + c;
    take_max<T>(a[c + 1], base + c + 1, best[o], at[o]);
    take_max<T>(b[c], base + W + c, best[o], at[o]);
    take_max<T>(b[c + 1], base + W + c + 1, best[o], at[o]);
  }
  for (int64_t o = 0; o < n; ++o) {
    y[o] = from_lane<T>(best[o]);
    idx[o] = at[o];
  }
}

template <typename T>
void max_pool_2x2_plane(const T* x, T* y, int64_t* idx, int64_t W, int64_t Ho, int64_t Wo) {
  for (int64_t oh = 0; oh < Ho; ++oh) {
    const T* r0 = x + 2 * oh * W;
    for (int64_t ow = 0; ow < Wo; ow += kPoolRun) {
      max_pool_2x2_run(r0 + 2 * ow, r0 + W + 2 * ow, std::min(kPoolRun, Wo - ow), W, 2 * oh * W + 2 * ow,
                       y + oh * Wo + ow, idx + oh * Wo + ow);
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
        Lane<T> best = minus_infinity<T>();
        int64_t bi = h0 * W + w0;
        for (int64_t h = h0; h < h1; h += a.dilation_h) {
          for (int64_t w = w0; w < w1; w += a.dilation_w) take_max<T>(to_lane(xp[h * W + w]), h * W + w, best, bi);
        }
        yp[oh * Wo + ow] = from_lane<T>(best);
        ip[oh * Wo + ow] = bi;
      }
    }
  });
}

// Each output's gradient is added to the input its index names. Windows may overlap (a 3x3 window at
// stride 2), so a 16-bit gradient is summed in a float32 plane and rounded once, as the float32 kernel
// on float32 copies did before the 16-bit types had kernels here.
template <typename T>
void max_pool2d_backward_typed(const View& grad_out, const View& indices, const View& grad_in) {
  constexpr bool kNarrow = kIs16<T>;
  using C = std::conditional_t<kNarrow, float, T>;  // what the gradient is summed in
  const int64_t HW = grad_in.sizes[2] * grad_in.sizes[3];
  const int64_t out_hw = grad_out.sizes[2] * grad_out.sizes[3];
  const int64_t planes = grad_in.sizes[0] * grad_in.sizes[1];
  const T* gy = grad_out.ptr<T>();
  const int64_t* idx = indices.ptr<int64_t>();
  T* gx = grad_in.ptr<T>();
  for_plane_chunks<C>(planes, HW, kNarrow ? HW : 0, [&](int64_t p0, int64_t p1, C* sums) {
    for (int64_t p = p0; p < p1; ++p) {
      C* gp;  // where the plane's gradient is summed
      if constexpr (kNarrow) {
        gp = sums;
      } else {
        gp = gx + p * HW;
      }
      std::memset(gp, 0, sizeof(C) * HW);
      const T* g = gy + p * out_hw;
      const int64_t* ip = idx + p * out_hw;
      for (int64_t i = 0; i < out_hw; ++i) {
        if (ip[i] < 0 || ip[i] >= HW) [[unlikely]] {
          KILN_FAIL("max_pool2d_backward: index {} is out of bounds for an input plane of {} elements", ip[i], HW);
        }
        gp[ip[i]] += static_cast<C>(g[i]);
      }
      if constexpr (kNarrow) {
        T* out = gx + p * HW;
        for (int64_t i = 0; i < HW; ++i) out[i] = static_cast<T>(gp[i]);
      }
    }
  });
}

// Note [average pooling is separable]
// An average pooling window is a product of a row span [h0, h1) and a column span [w0, w1) (clipped
// to the input), each depending on one output coordinate; so is its divisor. The forward sums each
// output row's input rows into one row of column sums (a vectorized add of whole rows), then sums each
// window's span of it: Ho * (kh * W + Wo * kw) adds per plane instead of Ho * Wo * kh * kw, the kh * W
// of them in vector lanes. Backward runs the same steps in reverse: each output's share spread over
// its column span of one row, that row added to each input row of the span. A window is summed
// column by column rather than row by row, so float32 results differ from the row-major sum's in the
// last bits. On (64, 16, 32, 32), 3x3, stride 2, padding 1 (2 threads, a Zen 4, medians of 3
// alternating rounds) this took the forward from 1.45 ms to 0.53 and forward + backward from 2.96 to
// 1.01 (PyTorch 1.13: 1.10 and 2.35), and avg_pool3d's bench part from 2.04 to 0.76
// (benchmarks/results/cpu-2026-12-06-zen4-avg-pool.jsonl).

// One axis of an average pooling window: output i reads inputs [lo, hi), clipped to the input;
// `padded` counts the padding it covers too (PyTorch's count_include_pad divisor).
struct AvgSpan {
  int64_t lo, hi, padded;
  bool empty() const { return lo >= hi; }
};
inline AvgSpan avg_span(int64_t i, int64_t size, int64_t kernel, int64_t stride, int64_t pad) {
  const int64_t lo = i * stride - pad, hi = std::min(lo + kernel, size + pad);
  return {std::max<int64_t>(lo, 0), std::min(hi, size), hi - lo};
}

// avg_pool2d's windows and divisors (PyTorch's rule).
struct AvgPoolWindows {
  int64_t H, W;
  const Pool2dArgs& a;
  AvgSpan row(int64_t oh) const { return avg_span(oh, H, a.kernel_h, a.stride_h, a.pad_h); }
  AvgSpan col(int64_t ow) const { return avg_span(ow, W, a.kernel_w, a.stride_w, a.pad_w); }
  double divisor(const AvgSpan& r, const AvgSpan& c) const {
    return a.divisor != 0            ? static_cast<double>(a.divisor)
           : a.count_include_pad ? static_cast<double>(r.padded * c.padded)
                                 : static_cast<double>((r.hi - r.lo) * (c.hi - c.lo));
  }
};

// Adaptive windows: [floor(i * in / out), ceil((i + 1) * in / out)) in each dim; the average divides by
// their size.
struct AdaptiveWindows {
  int64_t H, W, Ho, Wo;
  static AvgSpan span(int64_t i, int64_t in, int64_t out) {
    const int64_t lo = i * in / out, hi = ((i + 1) * in + out - 1) / out;
    return {lo, hi, hi - lo};
  }
  AvgSpan row(int64_t oh) const { return span(oh, H, Ho); }
  AvgSpan col(int64_t ow) const { return span(ow, W, Wo); }
  double divisor(const AvgSpan& r, const AvgSpan& c) const { return static_cast<double>(r.padded * c.padded); }
};

// Average pooling over separable windows (Note [average pooling is separable]); plain and adaptive
// average pooling differ only in the Windows.
template <typename T, typename Windows>
void avg_windows_forward(const View& in, const View& out, const Windows& windows) {
  const int64_t H = in.sizes[2], W = in.sizes[3], Ho = out.sizes[2], Wo = out.sizes[3];
  const T* x = in.ptr<T>();
  T* y = out.ptr<T>();
  std::vector<AvgSpan> cols(static_cast<size_t>(Wo));
  for (int64_t ow = 0; ow < Wo; ++ow) cols[ow] = windows.col(ow);
  for_plane_chunks<T>(in.sizes[0] * in.sizes[1], H * W, W, [&](int64_t p0, int64_t p1, T* colsum) {
    for (int64_t p = p0; p < p1; ++p) {
      const T* xp = x + p * H * W;
      T* yp = y + p * Ho * Wo;
      for (int64_t oh = 0; oh < Ho; ++oh) {
        const AvgSpan r = windows.row(oh);
        T* yr = yp + oh * Wo;
        if (r.empty()) {  // a window of padding alone averages to 0
          std::fill(yr, yr + Wo, T(0));
          continue;
        }
        std::copy(xp + r.lo * W, xp + (r.lo + 1) * W, colsum);
        for (int64_t h = r.lo + 1; h < r.hi; ++h) {
          const T* xr = xp + h * W;
          for (int64_t w = 0; w < W; ++w) colsum[w] += xr[w];
        }
        for (int64_t ow = 0; ow < Wo; ++ow) {
          const AvgSpan& c = cols[ow];
          T sum = 0;
          for (int64_t w = c.lo; w < c.hi; ++w) sum += colsum[w];
          yr[ow] = c.empty() ? T(0) : sum / static_cast<T>(windows.divisor(r, c));
        }
      }
    }
  });
}

// Each output's gradient, divided by its divisor, is added to every input of its window: spread over
// the window's columns of one row, which is then added to each of the window's rows.
template <typename T, typename Windows>
void avg_windows_backward(const View& grad_out, const View& grad_in, const Windows& windows) {
  const int64_t H = grad_in.sizes[2], W = grad_in.sizes[3], Ho = grad_out.sizes[2], Wo = grad_out.sizes[3];
  const T* gy = grad_out.ptr<T>();
  T* gx = grad_in.ptr<T>();
  std::vector<AvgSpan> cols(static_cast<size_t>(Wo));
  for (int64_t ow = 0; ow < Wo; ++ow) cols[ow] = windows.col(ow);
  for_plane_chunks<T>(grad_in.sizes[0] * grad_in.sizes[1], H * W, W, [&](int64_t p0, int64_t p1, T* spread) {
    for (int64_t p = p0; p < p1; ++p) {
      T* gp = gx + p * H * W;
      std::memset(gp, 0, sizeof(T) * H * W);
      const T* g = gy + p * Ho * Wo;
      for (int64_t oh = 0; oh < Ho; ++oh) {
        const AvgSpan r = windows.row(oh);
        if (r.empty()) continue;
        std::fill(spread, spread + W, T(0));
        for (int64_t ow = 0; ow < Wo; ++ow) {
          const AvgSpan& c = cols[ow];
          const T share = g[oh * Wo + ow] / static_cast<T>(windows.divisor(r, c));
          for (int64_t w = c.lo; w < c.hi; ++w) spread[w] += share;
        }
        for (int64_t h = r.lo; h < r.hi; ++h) {
          T* gr = gp + h * W;
          for (int64_t w = 0; w < W; ++w) gr[w] += spread[w];
        }
      }
    }
  });
}

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
        const AvgSpan r = windows.row(oh), c = windows.col(ow);
        Lane<T> best = minus_infinity<T>();
        int64_t bi = r.lo * W + c.lo;
        for (int64_t h = r.lo; h < r.hi; ++h)
          for (int64_t w = c.lo; w < c.hi; ++w) take_max<T>(to_lane(xp[h * W + w]), h * W + w, best, bi);
        yp[oh * Wo + ow] = from_lane<T>(best);
        ip[oh * Wo + ow] = bi;
      }
    }
  });
}

}  // namespace

void max_pool2d_kernel(const View& in, const View& out, const View& indices, const Pool2dArgs& args) {
  KILN_DISPATCH_FLOAT_TYPES(out.dtype, "max_pool2d", [&] { max_pool2d_typed<scalar_t>(in, out, indices, args); });
}
void max_pool2d_backward_kernel(const View& grad_out, const View& indices, const View& grad_in) {
  KILN_DISPATCH_FLOAT_TYPES(grad_in.dtype, "max_pool2d_backward",
                            [&] { max_pool2d_backward_typed<scalar_t>(grad_out, indices, grad_in); });
}
void avg_pool2d_kernel(const View& in, const View& out, const Pool2dArgs& args) {
  const AvgPoolWindows windows{in.sizes[2], in.sizes[3], args};
  KILN_DISPATCH_F32_F64(out.dtype, "avg_pool2d", [&] { avg_windows_forward<scalar_t>(in, out, windows); });
}
void avg_pool2d_backward_kernel(const View& grad_out, const View& grad_in, const Pool2dArgs& args) {
  const AvgPoolWindows windows{grad_in.sizes[2], grad_in.sizes[3], args};
  KILN_DISPATCH_F32_F64(grad_in.dtype, "avg_pool2d_backward",
                        [&] { avg_windows_backward<scalar_t>(grad_out, grad_in, windows); });
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
  KILN_DISPATCH_FLOAT_TYPES(out.dtype, "adaptive_max_pool2d",
                            [&] { adaptive_max_pool2d_typed<scalar_t>(in, out, indices); });
}

}  // namespace kiln::cpu
