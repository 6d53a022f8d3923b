// cuda/ctc.cu: CTC's recursions (Graves et al., 2006) in log space on the GPU, as cpu/ctc.cpp does
// them (Backend::ctc_loss in core/backend.h has the formulas). The forward and the beta pass give a
// block to a sample (grid-stride over samples): its threads share the states of one frame, and a
// barrier separates frames, whose rows of log_alpha (log_beta) live in global memory. The gradient
// gives a block to a (frame, sample) row: its first thread adds alpha beta into the classes of the
// row's states one state after the other (two states may share a class), and then all threads turn
// the row into the gradient.
//
// A kernel cannot throw: ops/ctc.cpp checks the lengths and targets of CUDA tensors before the launch.
#include <cmath>

#include "cuda/context.h"
#include "cuda/kernels.h"
#include "cuda/loops.cuh"

namespace kiln::cuda {
namespace {

constexpr int kCtcThreads = 128;

__device__ __forceinline__ float exp_of(float x) { return expf(x); }
__device__ __forceinline__ double exp_of(double x) { return exp(x); }
__device__ __forceinline__ float log_of(float x) { return logf(x); }
__device__ __forceinline__ double log_of(double x) { return log(x); }
__device__ __forceinline__ float log1p_of(float x) { return log1pf(x); }
__device__ __forceinline__ double log1p_of(double x) { return log1p(x); }

template <typename T>
__device__ __forceinline__ T neg_inf() {
  return -INFINITY;
}

template <typename T>
__device__ __forceinline__ T log_add(T a, T b) {
  if (a < b) {
    const T c = a;
    a = b;
    b = c;
  }
  return b == neg_inf<T>() ? a : a + log1p_of(exp_of(b - a));
}
template <typename T>
__device__ __forceinline__ T log_add(T a, T b, T c) {
  const T m = fmax(a, fmax(b, c));
  if (m == neg_inf<T>()) return m;
  return m + log_of(exp_of(a - m) + exp_of(b - m) + exp_of(c - m));
}

struct CtcGeometry {
  int64_t frames, samples, classes, longest, blank;
  const int64_t* targets;
  const int64_t* input_lengths;
  const int64_t* target_lengths;
  __device__ int64_t row() const { return 2 * longest + 1; }
  // State s of sample n's extended target (blank, l_1, blank, ..., blank).
  __device__ int64_t label(int64_t n, int64_t s) const { return s % 2 == 0 ? blank : targets[n * longest + s / 2]; }
  // Whether state s may be entered from s - 2 (a label unlike the one before it).
  __device__ bool skips(int64_t n, int64_t s) const {
    if (s % 2 == 0 || s < 3) return false;
    const int64_t l = targets[n * longest + s / 2];
    return l != blank && l != targets[n * longest + s / 2 - 1];
  }
};

template <typename T>
__global__ void ctc_alpha_kernel(CtcGeometry g, const T* lp, T* nll, T* log_alpha) {
  const int64_t frame_stride = g.samples * g.classes, row = g.row();
  for (int64_t n = blockIdx.x; n < g.samples; n += gridDim.x) {
    const int64_t frames = g.input_lengths[n], states = 2 * g.target_lengths[n] + 1;
    if (frames == 0) {
      if (threadIdx.x == 0) nll[n] = states == 1 ? T(0) : T(INFINITY);
      continue;
    }
    const T* x = lp + n * g.classes;
    T* alpha = log_alpha + n * g.frames * row;
    for (int64_t s = threadIdx.x; s < states; s += blockDim.x) alpha[s] = s < 2 ? x[g.label(n, s)] : neg_inf<T>();
    for (int64_t t = 1; t < frames; ++t) {
      __syncthreads();
      const T* prev = alpha + (t - 1) * row;
      T* cur = alpha + t * row;
      const T* xt = x + t * frame_stride;
      for (int64_t s = threadIdx.x; s < states; s += blockDim.x) {
        const T one = s >= 1 ? prev[s - 1] : neg_inf<T>();
        const T two = g.skips(n, s) ? prev[s - 2] : neg_inf<T>();
        cur[s] = log_add(prev[s], one, two) + xt[g.label(n, s)];
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      const T* last = alpha + (frames - 1) * row;
      nll[n] = -log_add(last[states - 1], states > 1 ? last[states - 2] : neg_inf<T>());
    }
    __syncthreads();  // the next sample's block-wide writes start after this one's reads
  }
}

template <typename T>
__global__ void ctc_beta_kernel(CtcGeometry g, const T* lp, const T* nll, T* log_beta) {
  const int64_t frame_stride = g.samples * g.classes, row = g.row();
  for (int64_t n = blockIdx.x; n < g.samples; n += gridDim.x) {
    const int64_t frames = g.input_lengths[n], states = 2 * g.target_lengths[n] + 1;
    if (frames == 0 || !isfinite(nll[n])) continue;  // no gradient there: beta is not read
    const T* x = lp + n * g.classes;
    T* beta = log_beta + n * g.frames * row;
    {
      T* b = beta + (frames - 1) * row;
      const T* xt = x + (frames - 1) * frame_stride;
      for (int64_t s = threadIdx.x; s < states; s += blockDim.x) {
        b[s] = s >= states - 2 ? xt[g.label(n, s)] : neg_inf<T>();
      }
    }
    for (int64_t t = frames - 2; t >= 0; --t) {
      __syncthreads();
      const T* next = beta + (t + 1) * row;
      T* cur = beta + t * row;
      const T* xt = x + t * frame_stride;
      for (int64_t s = threadIdx.x; s < states; s += blockDim.x) {
        const T one = s + 1 < states ? next[s + 1] : neg_inf<T>();
        const T two = s + 2 < states && g.skips(n, s + 2) ? next[s + 2] : neg_inf<T>();
        cur[s] = log_add(next[s], one, two) + xt[g.label(n, s)];
      }
    }
    __syncthreads();
  }
}

template <typename T>
__global__ void ctc_grad_kernel(CtcGeometry g, const T* grad_nll, const T* lp, const T* nll, const T* log_alpha,
                                const T* log_beta, T* grad) {
  const int64_t rows = g.frames * g.samples, row = g.row();
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t t = r / g.samples, n = r % g.samples;  // grad's row r is (t, n): (T, N, C) is contiguous
    T* gr = grad + r * g.classes;
    const bool used = t < g.input_lengths[n] && isfinite(nll[n]);
    if (!used) {
      for (int64_t c = threadIdx.x; c < g.classes; c += blockDim.x) gr[c] = T(0);
      continue;
    }
    for (int64_t c = threadIdx.x; c < g.classes; c += blockDim.x) gr[c] = neg_inf<T>();
    __syncthreads();
    if (threadIdx.x == 0) {
      const int64_t states = 2 * g.target_lengths[n] + 1;
      const T* a = log_alpha + (n * g.frames + t) * row;
      const T* b = log_beta + (n * g.frames + t) * row;
      for (int64_t s = 0; s < states; ++s) {
        const int64_t c = g.label(n, s);
        gr[c] = log_add(gr[c], a[s] + b[s]);
      }
    }
    __syncthreads();
    const T* xr = lp + r * g.classes;
    const T scale = grad_nll[n], nl = nll[n];
    for (int64_t c = threadIdx.x; c < g.classes; c += blockDim.x) {
      gr[c] = gr[c] == neg_inf<T>() ? T(0) : -scale * exp_of(gr[c] + nl - xr[c]);
    }
    __syncthreads();
  }
}

CtcGeometry geometry(const View& log_probs, const View& targets, const View& input_lengths, const View& target_lengths,
                     int64_t blank) {
  return CtcGeometry{
      log_probs.sizes[0],     log_probs.sizes[1],           log_probs.sizes[2],           targets.sizes[1], blank,
      targets.ptr<int64_t>(), input_lengths.ptr<int64_t>(), target_lengths.ptr<int64_t>()};
}

template <typename F>
void float_or_double(DType dtype, const char* op, const F& f) {
  if (dtype == kFloat32) {
    f(float{});
  } else {
    KILN_CHECK(dtype == kFloat64, "{}: the CUDA kernel takes float32 or float64 log_probs, got {}", op,
               dtype_name(dtype));
    f(double{});
  }
}

}  // namespace

void ctc_loss_launch(const View& log_probs, const View& targets, const View& input_lengths, const View& target_lengths,
                     const View& nll, const View& log_alpha, int64_t blank, const Stream& s) {
  const CtcGeometry g = geometry(log_probs, targets, input_lengths, target_lengths, blank);
  if (g.samples == 0) return;
  float_or_double(log_probs.dtype, "ctc_loss", [&](auto zero) {
    using T = decltype(zero);
    ctc_alpha_kernel<T><<<blocks_for(g.samples, 1), kCtcThreads, 0, stream_of(s)>>>(g, log_probs.ptr<T>(), nll.ptr<T>(),
                                                                                    log_alpha.ptr<T>());
    KILN_CUDA_CHECK(cudaGetLastError());
  });
}

void ctc_loss_backward_launch(const View& grad_nll, const View& log_probs, const View& targets,
                              const View& input_lengths, const View& target_lengths, const View& nll,
                              const View& log_alpha, const View& log_beta, const View& grad_log_probs, int64_t blank,
                              const Stream& s) {
  const CtcGeometry g = geometry(log_probs, targets, input_lengths, target_lengths, blank);
  if (g.samples == 0 || g.frames == 0 || g.classes == 0) return;
  float_or_double(log_probs.dtype, "ctc_loss backward", [&](auto zero) {
    using T = decltype(zero);
    ctc_beta_kernel<T><<<blocks_for(g.samples, 1), kCtcThreads, 0, stream_of(s)>>>(g, log_probs.ptr<T>(), nll.ptr<T>(),
                                                                                   log_beta.ptr<T>());
    KILN_CUDA_CHECK(cudaGetLastError());
    ctc_grad_kernel<T><<<blocks_for(g.frames * g.samples, 1), kCtcThreads, 0, stream_of(s)>>>(
        g, grad_nll.ptr<T>(), log_probs.ptr<T>(), nll.ptr<T>(), log_alpha.ptr<T>(), log_beta.ptr<T>(),
        grad_log_probs.ptr<T>());
    KILN_CUDA_CHECK(cudaGetLastError());
  });
}

}  // namespace kiln::cuda
