// cpu/fused.cpp: the fused kernels that ops use while fusion is on (set_fusion, ops/ops.h). Each does
// in one pass over memory what its composition does in several, and keeps fewer tensors for backward:
//
//   layer_norm           [x + residual], the row statistics, normalisation and affine (the composition:
//                        an add, norm_rows, a multiply and an add, each reading and writing (R, M))
//   layer_norm_backward  grad_in, grad_weight and grad_bias from h, mean and rstd (the composition:
//                        about ten (R, M) ops, and the affine's two column sums)
//   bias_gelu(_backward) gelu(in + bias) and its gradient with the bias's column sum (three passes)
//   cross_entropy(_backward)  log-softmax, the pick of the target and label smoothing per row, and a
//                        backward that writes softmax - target straight from lse, never storing the
//                        (R, C) log-probabilities; float16 and bfloat16 rows are read into float32
//                        (their loss and lse are float32) and their gradient rounded once
//
// Rows are split over the pool of cpu/parallel.h. The column sums (grad_weight, grad_bias) go through
// fixed chunks of kChunk rows: each chunk's partial sums (in double) are written apart and then added
// in chunk order, so the result depends only on the shape, never on the thread count.
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "cpu/exact_math.h"
#include "cpu/kernels.h"
#include "cpu/parallel.h"
#include "cpu/row_sums.h"

namespace kiln::cpu {
namespace {

constexpr int64_t kChunk = 32;

template <typename T>
using ConstRow = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;

// Rows per parallel piece so that a piece has at least ~16 K elements.
int64_t row_grain(int64_t cols) { return std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(cols, 1)); }

// Column sums of an (R, N) matrix computed chunk by chunk: row_fn(r, acc0, acc1, scratch) adds row r's
// contributions to the chunk's accumulators (acc1 null when only one sum is wanted), with `scratch`
// rows of N elements of T its own for the piece; the chunks are then added in order into out0 / out1
// (N, may be null).
template <typename T, typename RowFn>
void chunked_column_sums(int64_t R, int64_t N, int scratch_rows, T* out0, T* out1, const RowFn& row_fn) {
  const int64_t chunks = (R + kChunk - 1) / kChunk;
  const int sums = out1 ? 2 : 1;
  std::vector<double> partial(static_cast<size_t>(chunks * N * sums), 0.0);
  parallel_for(0, chunks, std::max<int64_t>(1, row_grain(N) / kChunk), [&](int64_t c0, int64_t c1) {
    std::vector<T> scratch(static_cast<size_t>(scratch_rows * N));
    for (int64_t c = c0; c < c1; ++c) {
      double* acc0 = partial.data() + c * N * sums;
      double* acc1 = sums == 2 ? acc0 + N : nullptr;
      for (int64_t r = c * kChunk; r < std::min(R, (c + 1) * kChunk); ++r) row_fn(r, acc0, acc1, scratch.data());
    }
  });
  if (!out0 && !out1) return;
  parallel_for(0, N, 1024, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
      double s0 = 0, s1 = 0;
      for (int64_t c = 0; c < chunks; ++c) {
        s0 += partial[static_cast<size_t>(c * N * sums + j)];
        if (sums == 2) s1 += partial[static_cast<size_t>(c * N * sums + N + j)];
      }
      if (out0) out0[j] = static_cast<T>(s0);
      if (out1) out1[j] = static_cast<T>(s1);
    }
  });
}

// ======== layer_norm ========

template <typename T>
void layer_norm_typed(const View& xv, const View& resv, const View& wv, const View& bv, const View& outv,
                      const View& sumv, const View& meanv, const View& rstdv, double eps, bool rms) {
  const int64_t R = xv.sizes[0], M = xv.sizes[1];
  const T* x = xv.ptr<T>();
  const T* res = resv.ptr<T>();
  const T* w = wv.ptr<T>();
  const T* b = bv.ptr<T>();
  T* out = outv.ptr<T>();
  T* sum = sumv.ptr<T>();
  T* mean = meanv.ptr<T>();
  T* rstd = rstdv.ptr<T>();
  parallel_for(0, R, row_grain(M), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* h = x + r * M;
      if (res) {  // h = x + residual, kept: it is the residual stream that goes on past the norm
        T* s = sum + r * M;
        const T* rr = res + r * M;
        for (int64_t i = 0; i < M; ++i) s[i] = h[i] + rr[i];
        h = s;
      }
      // The statistics as norm_rows (cpu/norm.cpp) takes them: the same mean and rstd.
      double m = 0, inv = 0;
      row_statistics(h, M, rms, eps, m, inv);
      const T tm = static_cast<T>(m), ti = static_cast<T>(inv);
      mean[r] = tm;
      rstd[r] = ti;
      // Rounded as the composition rounds: ((h - mean) * rstd) * weight + bias.
      T* y = out + r * M;
      if (w && b) {
        for (int64_t i = 0; i < M; ++i) y[i] = (h[i] - tm) * ti * w[i] + b[i];
      } else if (w) {
        for (int64_t i = 0; i < M; ++i) y[i] = (h[i] - tm) * ti * w[i];
      } else if (b) {
        for (int64_t i = 0; i < M; ++i) y[i] = (h[i] - tm) * ti + b[i];
      } else {
        for (int64_t i = 0; i < M; ++i) y[i] = (h[i] - tm) * ti;
      }
    }
  });
}

// Per row, with xhat = (h - mean) * rstd and gx = grad_out * weight:
//   grad_in = rstd * (gx - mean(gx) - xhat * mean(gx * xhat)) + grad_sum     (rms: without mean(gx))
// and over rows grad_weight += grad_out * xhat, grad_bias += grad_out.
template <typename T>
void layer_norm_backward_typed(const View& gv, const View& gsv, const View& hv, const View& wv, const View& meanv,
                               const View& rstdv, const View& giv, const View& gwv, const View& gbv, bool rms) {
  const int64_t R = hv.sizes[0], M = hv.sizes[1];
  const T* g = gv.ptr<T>();
  const T* gs = gsv.ptr<T>();
  const T* h = hv.ptr<T>();
  const T* w = wv.ptr<T>();
  const T* mean = meanv.ptr<T>();
  const T* rstd = rstdv.ptr<T>();
  T* gi = giv.ptr<T>();
  T* gw = gwv.ptr<T>();
  T* gb = gbv.ptr<T>();
  const bool columns = gw || gb;
  auto row = [&](int64_t r, double* acc_w, double* acc_b, T* xhat, T* gx) {
    const T* gr = g + r * M;
    const T* hr = h + r * M;
    const T mu = mean[r], rs = rstd[r];
    if (w) {
      for (int64_t i = 0; i < M; ++i) {
        xhat[i] = (hr[i] - mu) * rs;
        gx[i] = gr[i] * w[i];
      }
    } else {
      for (int64_t i = 0; i < M; ++i) xhat[i] = (hr[i] - mu) * rs;
      std::copy(gr, gr + M, gx);
    }
    double sum_gx = 0, sum_gx_xhat = 0;
    shifted_sums(gx, xhat, 0.0, M, sum_gx, sum_gx_xhat);  // Note [lane sums] in cpu/row_sums.h
    const T a = rms ? T(0) : static_cast<T>(sum_gx / static_cast<double>(M));
    const T c = static_cast<T>(sum_gx_xhat / static_cast<double>(M));
    T* out = gi + r * M;
    if (gs) {
      const T* gsr = gs + r * M;
      for (int64_t i = 0; i < M; ++i) out[i] = rs * (gx[i] - a - xhat[i] * c) + gsr[i];
    } else {
      for (int64_t i = 0; i < M; ++i) out[i] = rs * (gx[i] - a - xhat[i] * c);
    }
    if (acc_w && acc_b) {
      for (int64_t i = 0; i < M; ++i) {
        acc_w[i] += static_cast<double>(gr[i]) * xhat[i];
        acc_b[i] += gr[i];
      }
    } else if (acc_w) {
      for (int64_t i = 0; i < M; ++i) acc_w[i] += static_cast<double>(gr[i]) * xhat[i];
    } else if (acc_b) {
      for (int64_t i = 0; i < M; ++i) acc_b[i] += gr[i];
    }
  };
  // Scratch: two rows (xhat, gx) per parallel piece.
  if (!columns) {
    parallel_for(0, R, row_grain(M), [&](int64_t r0, int64_t r1) {
      std::vector<T> scratch(static_cast<size_t>(2 * M));
      for (int64_t r = r0; r < r1; ++r) row(r, nullptr, nullptr, scratch.data(), scratch.data() + M);
    });
    return;
  }
  // Accumulators: (weight, bias) when both are wanted, else the one that is.
  T* out0 = gw ? gw : gb;
  T* out1 = gw && gb ? gb : nullptr;
  chunked_column_sums<T>(R, M, 2, out0, out1, [&](int64_t r, double* acc0, double* acc1, T* scratch) {
    row(r, gw ? acc0 : nullptr, gw ? acc1 : acc0, scratch, scratch + M);
  });
}

// ======== bias_gelu ========

template <typename T>
void bias_gelu_typed(const View& inv, const View& biasv, const View& outv, bool tanh) {
  const int64_t R = inv.sizes[0], N = inv.sizes[1];
  const T* in = inv.ptr<T>();
  const T* bias = biasv.ptr<T>();
  T* out = outv.ptr<T>();
  parallel_for(0, R, row_grain(N), [&](int64_t r0, int64_t r1) {
    std::vector<T> pre(static_cast<size_t>(N));
    for (int64_t r = r0; r < r1; ++r) {
      const T* x = in + r * N;
      for (int64_t i = 0; i < N; ++i) pre[i] = x[i] + bias[i];
      gelu_run<T>(pre.data(), out + r * N, N, tanh);
    }
  });
}

template <typename T>
void bias_gelu_backward_typed(const View& gv, const View& inv, const View& biasv, const View& giv,
                              const View& gbv, bool tanh) {
  const int64_t R = inv.sizes[0], N = inv.sizes[1];
  const T* g = gv.ptr<T>();
  const T* in = inv.ptr<T>();
  const T* bias = biasv.ptr<T>();
  T* gi = giv.ptr<T>();
  T* gb = gbv.ptr<T>();
  auto row = [&](int64_t r, double* acc, T* pre) {  // pre: a scratch row of N
    const T* x = in + r * N;
    for (int64_t i = 0; i < N; ++i) pre[i] = x[i] + bias[i];
    T* out = gi + r * N;
    gelu_backward_run<T>(g + r * N, pre, out, N, tanh);
    if (acc) {
      for (int64_t i = 0; i < N; ++i) acc[i] += out[i];
    }
  };
  if (!gb) {
    parallel_for(0, R, row_grain(N), [&](int64_t r0, int64_t r1) {
      std::vector<T> pre(static_cast<size_t>(N));
      for (int64_t r = r0; r < r1; ++r) row(r, nullptr, pre.data());
    });
    return;
  }
  chunked_column_sums<T>(R, N, 1, gb, nullptr, [&](int64_t r, double* acc, double*, T* pre) { row(r, acc, pre); });
}

// ======== cross_entropy ========

// The target of row r, checked: ignore_index, or a class in [0, C).
inline bool target_class(const int64_t* target, int64_t r, int64_t C, int64_t ignore_index, int64_t& t) {
  t = target[r];
  if (t == ignore_index) return false;
  KILN_CHECK(t >= 0 && t < C, "cross_entropy: target {} at position {} is out of range: it must be in [0, {}) or "
             "equal to ignore_index ({})", t, r, C, ignore_index);
  return true;
}

// Row r of the logits in T, the math type: the row itself, or for 16-bit logits (S != T) the row
// converted into `scratch` (exactly: float holds every float16 and bfloat16).
template <typename S, typename T>
const T* row_in(const S* logits, int64_t r, int64_t C, std::vector<T>& scratch) {
  if constexpr (std::is_same_v<S, T>) {
    return logits + r * C;
  } else {
    scratch.resize(static_cast<size_t>(C));
    for (int64_t c = 0; c < C; ++c) scratch[static_cast<size_t>(c)] = static_cast<T>(logits[r * C + c]);
    return scratch.data();
  }
}

// S: the logits' dtype; T: the math's, and the loss's and lse's (float for the 16-bit dtypes).
template <typename S, typename T>
void cross_entropy_typed(const View& logitsv, const View& targetv, const View& lossv, const View& lsev,
                         int64_t ignore_index, double eps) {
  const int64_t R = logitsv.sizes[0], C = logitsv.sizes[1];
  const S* logits = logitsv.ptr<S>();
  const int64_t* target = targetv.ptr<int64_t>();
  T* loss = lossv.ptr<T>();
  T* lse = lsev.ptr<T>();
  parallel_for(0, R, row_grain(C), [&](int64_t r0, int64_t r1) {
    std::vector<T> scratch;
    for (int64_t r = r0; r < r1; ++r) {
      ConstRow<T> x(row_in(logits, r, C, scratch), C);
      const T mx = x.maxCoeff();
      // Every logit -inf (a row fully masked): lse = -inf, as log_softmax gives.
      const double l = std::isinf(mx) && mx < 0 ? static_cast<double>(mx)
                                                : static_cast<double>(mx) + std::log(static_cast<double>(exact_exp(x - mx).sum()));
      lse[r] = static_cast<T>(l);
      int64_t t = 0;
      if (!target_class(target, r, C, ignore_index, t)) {
        loss[r] = T(0);
        continue;
      }
      double value = l - (1 - eps) * static_cast<double>(x[t]);
      if (eps > 0) value -= eps / static_cast<double>(C) * x.template cast<double>().sum();
      loss[r] = static_cast<T>(value);
    }
  });
}

template <typename S, typename T>
void cross_entropy_backward_typed(const View& logitsv, const View& targetv, const View& lsev, const View& glv,
                                  const View& gv, int64_t ignore_index, double eps) {
  const int64_t R = logitsv.sizes[0], C = logitsv.sizes[1];
  const S* logits = logitsv.ptr<S>();
  const int64_t* target = targetv.ptr<int64_t>();
  const T* lse = lsev.ptr<T>();
  const T* gl = glv.ptr<T>();
  S* grad = gv.ptr<S>();
  parallel_for(0, R, row_grain(C), [&](int64_t r0, int64_t r1) {
    std::vector<T> scratch, result(std::is_same_v<S, T> ? 0 : static_cast<size_t>(C));
    for (int64_t r = r0; r < r1; ++r) {
      T* dst = std::is_same_v<S, T> ? reinterpret_cast<T*>(grad + r * C) : result.data();
      Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>> out(dst, C);
      int64_t t = 0;
      if (!target_class(target, r, C, ignore_index, t)) {
        out.setZero();
      } else {
        const T scale = gl[r];
        const T smooth = static_cast<T>(eps / static_cast<double>(C));
        out = (exact_exp(ConstRow<T>(row_in(logits, r, C, scratch), C) - lse[r]) - smooth) * scale;
        out[t] -= static_cast<T>(1 - eps) * scale;
      }
      if constexpr (!std::is_same_v<S, T>) {
        for (int64_t c = 0; c < C; ++c) grad[r * C + c] = static_cast<S>(dst[c]);  // rounded once
      }
    }
  });
}

}  // namespace

void layer_norm_kernel(const View& x, const View& residual, const View& weight, const View& bias,
                       const View& out, const View& sum, const View& mean, const View& rstd, double eps,
                       bool rms) {
  KILN_DISPATCH_F32_F64(x.dtype, "layer_norm", [&] {
    layer_norm_typed<scalar_t>(x, residual, weight, bias, out, sum, mean, rstd, eps, rms);
  });
}

void layer_norm_backward_kernel(const View& grad_out, const View& grad_sum, const View& h, const View& weight,
                                const View& mean, const View& rstd, const View& grad_in,
                                const View& grad_weight, const View& grad_bias, bool rms) {
  KILN_DISPATCH_F32_F64(h.dtype, "layer_norm backward", [&] {
    layer_norm_backward_typed<scalar_t>(grad_out, grad_sum, h, weight, mean, rstd, grad_in, grad_weight, grad_bias,
                                        rms);
  });
}

void bias_gelu_kernel(const View& in, const View& bias, const View& out, bool tanh) {
  KILN_DISPATCH_F32_F64(in.dtype, "bias_gelu", [&] { bias_gelu_typed<scalar_t>(in, bias, out, tanh); });
}

void bias_gelu_backward_kernel(const View& grad_out, const View& in, const View& bias, const View& grad_in,
                               const View& grad_bias, bool tanh) {
  KILN_DISPATCH_F32_F64(in.dtype, "bias_gelu backward", [&] {
    bias_gelu_backward_typed<scalar_t>(grad_out, in, bias, grad_in, grad_bias, tanh);
  });
}

void cross_entropy_kernel(const View& logits, const View& target, const View& loss, const View& lse,
                          int64_t ignore_index, double label_smoothing) {
  KILN_DISPATCH_FLOAT_TYPES(logits.dtype, "cross_entropy", [&] {
    using T = opmath_t<scalar_t>;  // float32 loss and lse for the 16-bit dtypes
    KILN_CHECK(loss.dtype == dtype_of<T>() && lse.dtype == dtype_of<T>(),
               "cross_entropy: {} logits take {} loss and lse, got {} and {}", dtype_name(logits.dtype),
               dtype_name(dtype_of<T>()), dtype_name(loss.dtype), dtype_name(lse.dtype));
    cross_entropy_typed<scalar_t, T>(logits, target, loss, lse, ignore_index, label_smoothing);
  });
}

void cross_entropy_backward_kernel(const View& logits, const View& target, const View& lse,
                                   const View& grad_loss, const View& grad_logits, int64_t ignore_index,
                                   double label_smoothing) {
  KILN_DISPATCH_FLOAT_TYPES(logits.dtype, "cross_entropy backward", [&] {
    using T = opmath_t<scalar_t>;
    KILN_CHECK(lse.dtype == dtype_of<T>() && grad_loss.dtype == dtype_of<T>() && grad_logits.dtype == logits.dtype,
               "cross_entropy backward: {} logits take {} lse and loss gradient and a {} gradient, got {}, {} and {}",
               dtype_name(logits.dtype), dtype_name(dtype_of<T>()), dtype_name(logits.dtype), dtype_name(lse.dtype),
               dtype_name(grad_loss.dtype), dtype_name(grad_logits.dtype));
    cross_entropy_backward_typed<scalar_t, T>(logits, target, lse, grad_loss, grad_logits, ignore_index,
                                              label_smoothing);
  });
}

}  // namespace kiln::cpu
