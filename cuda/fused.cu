// cuda/fused.cu: the fused kernels of the contract (core/backend.h) on the GPU: layer_norm (residual
// add, statistics, normalisation and affine), its backward, bias_gelu and its backward, and the
// cross-entropy of rows. CPU sibling: cpu/fused.cpp, whose semantics and rounding these follow (row
// statistics in double; the output rounded as ((h - mean) * rstd) * weight + bias).
//
// One warp per row for the row kernels (grid-stride over rows, eight warps to a block): simple, and
// fast enough for the rows of a transformer (hundreds to a few thousand columns); float32 rows of up
// to 1024 stay in a warp's registers, and rows of up to 4096 in a block's (Note [layer_norm rows in
// registers]), sixteen bytes a load where they allow (Note [layer_norm rows sixteen bytes at a
// time]). The cross-entropy gives rows of more than 1024 classes (a vocabulary's) a block each
// and reads 16-bit logits as they are (Note [one pass over the logits]). Column sums (grad_weight,
// grad_bias) go through fixed chunks of rows, as on the CPU: a first kernel writes one partial sum in
// double per (chunk, column), a second adds each column's chunks in order, so the result does not
// depend on scheduling and no atomics are needed.
//
// A bad class index cannot throw from a thread: ops/softmax.cpp checks the targets of a CUDA tensor
// before the launch; the kernel still writes NaN for a row whose target is out of range.
#include <cmath>
#include <type_traits>

#include "core/scalar_math.h"
#include "cuda/context.h"
#include "cuda/kernels.h"
#include "cuda/loops.cuh"

namespace kiln::cuda {
namespace {

constexpr int kWarpsPerBlock = kThreads / 32;

unsigned row_blocks(int64_t rows) {
  return static_cast<unsigned>(std::clamp<int64_t>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock, 1, kMaxBlocks));
}

__device__ __forceinline__ int64_t first_warp_row() {
  return static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
}
__device__ __forceinline__ int64_t warp_row_stride() { return static_cast<int64_t>(gridDim.x) * kWarpsPerBlock; }
// A block per row, as many blocks as rows (up to kMaxBlocks; the kernels stride over the rest).
unsigned block_per_row(int64_t R) { return static_cast<unsigned>(std::clamp<int64_t>(R, 1, kMaxBlocks)); }

// ---- column sums in fixed chunks ----

// Rows per chunk: at least 32, and at most 1024 chunks (the grid's y dimension), fixed by R alone.
int64_t rows_per_chunk(int64_t R) { return std::max<int64_t>(32, (R + 1023) / 1024); }

// partial[(c * sums + k) * N + j] = sum over the chunk's rows r of f(r, j)[k], k < sums (1 or 2).
template <typename F>
__global__ void column_partials_kernel(F f, int64_t R, int64_t N, int64_t chunk, int sums, double* partial) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t c = blockIdx.y;
  if (j >= N) return;
  double a0 = 0, a1 = 0;
  const int64_t end = min(R, (c + 1) * chunk);
  for (int64_t r = c * chunk; r < end; ++r) f(r, j, a0, a1);
  partial[(c * sums) * N + j] = a0;
  if (sums == 2) partial[(c * sums + 1) * N + j] = a1;
}

template <typename T>
__global__ void column_merge_kernel(const double* partial, int64_t N, int64_t chunks, int sums, T* out0, T* out1) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= N) return;
  double s0 = 0, s1 = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    s0 += partial[(c * sums) * N + j];
    if (sums == 2) s1 += partial[(c * sums + 1) * N + j];
  }
  if (out0) out0[j] = static_cast<T>(s0);
  if (out1) out1[j] = static_cast<T>(s1);
}

// out0 (and out1 when sums == 2) (N) = the column sums of f over R rows.
template <typename T, typename F>
void column_sums(const F& f, int64_t R, int64_t N, int sums, T* out0, T* out1, int device, cudaStream_t stream) {
  const int64_t chunk = rows_per_chunk(R), chunks = (R + chunk - 1) / chunk;
  DeviceBuffer partial(device, static_cast<size_t>(chunks * sums * N) * sizeof(double));
  auto* p = static_cast<double*>(partial.data());
  const dim3 grid(static_cast<unsigned>((N + kThreads - 1) / kThreads), static_cast<unsigned>(chunks));
  column_partials_kernel<<<grid, kThreads, 0, stream>>>(f, R, N, chunk, sums, p);
  KILN_CUDA_CHECK(cudaGetLastError());
  column_merge_kernel<T><<<static_cast<unsigned>((N + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      p, N, chunks, sums, out0, out1);
  KILN_CUDA_CHECK(cudaGetLastError());
}

// ---- layer_norm ----

// Element i of a row's output: ((h - mean) * rstd) * weight + bias, each step rounded to T, as
// on the CPU; one definition for layer_norm_kernel and layer_norm_reg_kernel, so they agree to the bit.
template <typename T>
__device__ __forceinline__ T normalized(T h, T tm, T ti, const T* w, const T* b, int64_t i) {
  T v = (h - tm) * ti;
  if (w) v = v * w[i];
  if (b) v = v + b[i];
  return v;
}

template <typename T>
__global__ void layer_norm_kernel(const T* x, const T* res, const T* w, const T* b, T* out, T* sum, T* mean,
                                  T* rstd, int64_t R, int64_t M, double eps, bool rms) {
  const int lane = threadIdx.x & 31;
  for (int64_t r = first_warp_row(); r < R; r += warp_row_stride()) {
    const T* h = x + r * M;
    if (res) {
      T* s = sum + r * M;
      for (int64_t i = lane; i < M; i += 32) s[i] = h[i] + res[r * M + i];
      __syncwarp();
      h = s;
    }
    double m = 0;
    if (!rms) {
      double acc = 0;
      for (int64_t i = lane; i < M; i += 32) acc += static_cast<double>(h[i]);
      m = warp_sum(acc) / static_cast<double>(M);
    }
    double ss = 0;
    for (int64_t i = lane; i < M; i += 32) {
      const double d = static_cast<double>(h[i]) - m;
      ss += d * d;
    }
    ss = warp_sum(ss);
    const T tm = static_cast<T>(m), ti = static_cast<T>(1.0 / sqrt(ss / static_cast<double>(M) + eps));
    T* y = out + r * M;
    for (int64_t i = lane; i < M; i += 32) y[i] = normalized(h[i], tm, ti, w, b, i);
    if (lane == 0) {
      mean[r] = tm;
      rstd[r] = ti;
    }
  }
}

// Note [layer_norm rows in registers]: float32 rows of up to 4096 elements (GPT-2's 768, the
// 4096 of the benchmark) are read once: each thread keeps its elements of the row (h = x +
// residual, rounded to T) in registers for the two sums and the output, where layer_norm_kernel
// walks the row three times and its backward walks g and h twice. Rows of up to 32 * 32 (1024) get
// a warp each, as layer_norm_kernel gives them, and so the same elements in the same order: the
// same sums and the same bits. Longer rows get the whole block (kThreads * 16 elements at most),
// whose sums run in another order (still in double). float64 rows (twice the registers) and longer
// rows keep the walks.
//
// RowGroup<kWidth>: the threads that share a row, a warp (32) or the block (kThreads): the thread's
// lane among them, the group's first row and its step over the rows, and their sum.
template <int kWidth>
struct RowGroup {
  static_assert(kWidth == 32 || kWidth == kThreads);
  __device__ static int lane() { return kWidth == 32 ? static_cast<int>(threadIdx.x & 31) : static_cast<int>(threadIdx.x); }
  __device__ static int64_t first() { return kWidth == 32 ? first_warp_row() : static_cast<int64_t>(blockIdx.x); }
  __device__ static int64_t step() { return kWidth == 32 ? warp_row_stride() : static_cast<int64_t>(gridDim.x); }
  // Every thread of the group calls it with the same trip count (the rows are the group's).
  __device__ static double sum(double v, double* shared) { return kWidth == 32 ? warp_sum(v) : block_sum(v, shared); }
};
constexpr int kWarpRegPer = 32, kBlockRegPer = 16;  // elements a thread holds: a warp's rows, a block's

template <typename T, int kWidth, int kPer>
__global__ void __launch_bounds__(kThreads, 2) layer_norm_reg_kernel(const T* x, const T* res, const T* w, const T* b,
                                                                     T* out, T* sum, T* mean, T* rstd, int64_t R,
                                                                     int64_t M, double eps, bool rms) {
  using G = RowGroup<kWidth>;
  __shared__ double shared[32];
  const int lane = G::lane();
  const int n = static_cast<int>(M) - lane;  // element lane + kWidth u of a row exists when kWidth u < n
  // Lane-offset pointers: element u of a lane is at a constant offset kWidth u from them.
  const T* wl = w ? w + lane : nullptr;
  const T* bl = b ? b + lane : nullptr;
  for (int64_t r = G::first(); r < R; r += G::step()) {
    const int64_t row = r * M + lane;
    T v[kPer];
    KILN_CUDA_UNROLL
    for (int u = 0; u < kPer; ++u) {
      v[u] = T(0);
      if (kWidth * u < n) {
        v[u] = x[row + kWidth * u];
        if (res) {
          v[u] = v[u] + res[row + kWidth * u];
          sum[row + kWidth * u] = v[u];
        }
      }
    }
    double m = 0;
    if (!rms) {
      double acc = 0;
      KILN_CUDA_UNROLL
      for (int u = 0; u < kPer; ++u)
        if (kWidth * u < n) acc += static_cast<double>(v[u]);
      m = G::sum(acc, shared) / static_cast<double>(M);
    }
    double ss = 0;
    KILN_CUDA_UNROLL
    for (int u = 0; u < kPer; ++u) {
      if (kWidth * u >= n) continue;
      const double d = static_cast<double>(v[u]) - m;
      ss += d * d;
    }
    ss = G::sum(ss, shared);
    const T tm = static_cast<T>(m), ti = static_cast<T>(1.0 / sqrt(ss / static_cast<double>(M) + eps));
    KILN_CUDA_UNROLL
    for (int u = 0; u < kPer; ++u)
      if (kWidth * u < n) out[row + kWidth * u] = normalized(v[u], tm, ti, wl, bl, kWidth * u);
    if (lane == 0) {
      mean[r] = tm;
      rstd[r] = ti;
    }
  }
}

// Note [layer_norm rows sixteen bytes at a time]: a block's float32 rows (1025 to 4096 elements,
// Note [layer_norm rows in registers]) whose length is a multiple of four, with every pointer 16-byte
// aligned, are read and written as Vec16s (x, the residual, the weight and bias; out and the sum):
// a quarter of the load and store instructions. Each of the two sums takes one __syncthreads
// (block_all_reduce in loops.cuh: every thread adds the warps' partials itself, in the same order); their slots
// alternate between consecutive rows, so that a row's slots are not written again before every
// thread has read them, with or without the mean's sum (rms). The element values, the rounding of
// normalized() and the double sums are layer_norm_reg_kernel's; only the order of the sums differs.
struct Plus {
  __device__ double operator()(double a, double b) const { return a + b; }
};

template <int kPer>
__global__ void __launch_bounds__(kThreads) layer_norm_vec_kernel(const float* x, const float* res, const float* w,
                                                                  const float* b, float* out, float* sum,
                                                                  float* mean, float* rstd, int64_t R, int64_t M,
                                                                  double eps, bool rms) {
  using Vec = Vec16<float>;
  constexpr int V = Vec::kSize, kVecs = kPer / V;
  __shared__ double slots[2][2][32];  // [row parity][mean, squares][warp]
  const int64_t nvec = M / V;
  int parity = 0;
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x, parity ^= 1) {
    const auto* xr = reinterpret_cast<const Vec*>(x + r * M);
    float v[kPer];
    KILN_CUDA_UNROLL
    for (int u = 0; u < kVecs; ++u) {
      const int64_t j = threadIdx.x + static_cast<int64_t>(u) * blockDim.x;
      Vec a{};
      if (j < nvec) {
        a = xr[j];
        if (res) {
          const Vec c = reinterpret_cast<const Vec*>(res + r * M)[j];
          KILN_CUDA_UNROLL
          for (int e = 0; e < V; ++e) a.v[e] = a.v[e] + c.v[e];
          reinterpret_cast<Vec*>(sum + r * M)[j] = a;
        }
      }
      KILN_CUDA_UNROLL
      for (int e = 0; e < V; ++e) v[u * V + e] = a.v[e];
    }
    double m = 0;
    if (!rms) {
      double acc = 0;
      KILN_CUDA_UNROLL
      for (int i = 0; i < kPer; ++i) acc += static_cast<double>(v[i]);  // the padding is 0
      m = block_all_reduce(acc, Plus(), slots[parity][0]) / static_cast<double>(M);
    }
    double ss = 0;
    KILN_CUDA_UNROLL
    for (int u = 0; u < kVecs; ++u) {
      if (threadIdx.x + static_cast<int64_t>(u) * blockDim.x >= nvec) continue;
      KILN_CUDA_UNROLL
      for (int e = 0; e < V; ++e) {
        const double d = static_cast<double>(v[u * V + e]) - m;
        ss += d * d;
      }
    }
    ss = block_all_reduce(ss, Plus(), slots[parity][1]);
    const float tm = static_cast<float>(m), ti = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(M) + eps));
    KILN_CUDA_UNROLL
    for (int u = 0; u < kVecs; ++u) {
      const int64_t j = threadIdx.x + static_cast<int64_t>(u) * blockDim.x;
      if (j >= nvec) continue;
      Vec wv, bv, o;
      if (w) wv = reinterpret_cast<const Vec*>(w)[j];
      if (b) bv = reinterpret_cast<const Vec*>(b)[j];
      // normalized()'s steps written out: a pointer into wv or bv, taken conditionally, put them in
      // local memory (a stack slot and an STL.128 and four LDL a vector).
      KILN_CUDA_UNROLL
      for (int e = 0; e < V; ++e) {
        float y = (v[u * V + e] - tm) * ti;
        if (w) y = y * wv.v[e];
        if (b) y = y + bv.v[e];
        o.v[e] = y;
      }
      reinterpret_cast<Vec*>(out + r * M)[j] = o;
    }
    if (threadIdx.x == 0) {
      mean[r] = tm;
      rstd[r] = ti;
    }
  }
}

// grad_out * weight rounded to T on its own. Written as a plain product, nvcc contracts
// `g * w - mean(gx)` into one fma, which skips that rounding: the difference is no longer exactly 0
// where it should be (a row of one element, whose gradient is 0), and rstd (up to 1/sqrt(eps)) magnifies
// the leftover. The CPU kernel rounds the product, so the two devices agree.
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }

// The backward's terms of element i of a row: xhat = (h - mean) * rstd and gx = grad_out * weight;
// one definition for both backward kernels.
template <typename T>
__device__ __forceinline__ void backward_terms(T g, T h, const T* w, int64_t i, T mu, T rs, T& xhat, T& gx) {
  xhat = (h - mu) * rs;
  gx = w ? mul_rn(g, w[i]) : g;
}

// grad_in = rstd * (gx - mean(gx) - xhat * mean(gx * xhat)) + grad_sum, gx = grad_out * weight.
template <typename T>
__global__ void layer_norm_backward_kernel(const T* g, const T* gs, const T* h, const T* w, const T* mean,
                                           const T* rstd, T* gi, int64_t R, int64_t M, bool rms) {
  const int lane = threadIdx.x & 31;
  for (int64_t r = first_warp_row(); r < R; r += warp_row_stride()) {
    const T mu = mean[r], rs = rstd[r];
    const T* gr = g + r * M;
    const T* hr = h + r * M;
    double s_gx = 0, s_gx_xhat = 0;
    for (int64_t i = lane; i < M; i += 32) {
      T xhat, gx;
      backward_terms(gr[i], hr[i], w, i, mu, rs, xhat, gx);
      s_gx += static_cast<double>(gx);
      s_gx_xhat += static_cast<double>(gx) * static_cast<double>(xhat);
    }
    const T a = rms ? T(0) : static_cast<T>(warp_sum(s_gx) / static_cast<double>(M));
    const T c = static_cast<T>(warp_sum(s_gx_xhat) / static_cast<double>(M));
    for (int64_t i = lane; i < M; i += 32) {
      T xhat, gx;
      backward_terms(gr[i], hr[i], w, i, mu, rs, xhat, gx);
      T v = rs * (gx - a - xhat * c);
      if (gs) v = v + gs[r * M + i];
      gi[r * M + i] = v;
    }
  }
}

// layer_norm_backward_kernel with g * w and xhat held in registers (Note [layer_norm rows in
// registers]): g, h and w read once.
template <typename T, int kWidth, int kPer>
__global__ void __launch_bounds__(kThreads, 2)
    layer_norm_backward_reg_kernel(const T* g, const T* gs, const T* h, const T* w, const T* mean, const T* rstd,
                                   T* gi, int64_t R, int64_t M, bool rms) {
  using G = RowGroup<kWidth>;
  __shared__ double shared[32];
  const int lane = G::lane();
  const int n = static_cast<int>(M) - lane;  // as in layer_norm_reg_kernel
  const T* wl = w ? w + lane : nullptr;
  for (int64_t r = G::first(); r < R; r += G::step()) {
    const int64_t row = r * M + lane;
    const T mu = mean[r], rs = rstd[r];
    T xhat[kPer], gx[kPer];
    double s_gx = 0, s_gx_xhat = 0;
    KILN_CUDA_UNROLL
    for (int u = 0; u < kPer; ++u) {
      xhat[u] = gx[u] = T(0);
      if (kWidth * u >= n) continue;
      backward_terms(g[row + kWidth * u], h[row + kWidth * u], wl, kWidth * u, mu, rs, xhat[u], gx[u]);
      s_gx += static_cast<double>(gx[u]);
      s_gx_xhat += static_cast<double>(gx[u]) * static_cast<double>(xhat[u]);
    }
    // rms is the same in every thread, so a block's threads all take the first sum or all skip it.
    const T a = rms ? T(0) : static_cast<T>(G::sum(s_gx, shared) / static_cast<double>(M));
    const T c = static_cast<T>(G::sum(s_gx_xhat, shared) / static_cast<double>(M));
    KILN_CUDA_UNROLL
    for (int u = 0; u < kPer; ++u) {
      if (kWidth * u >= n) continue;
      T v = rs * (gx[u] - a - xhat[u] * c);
      if (gs) v = v + gs[row + kWidth * u];
      gi[row + kWidth * u] = v;
    }
  }
}

// The affine's column sums: (grad_out * xhat, grad_out) of row r, column j.
template <typename T>
struct NormAffineTerms {
  const T *g, *h, *mean, *rstd;
  int64_t M;
  bool weight_first;  // a0 takes grad_out * xhat (grad_weight wanted), else grad_out
  __device__ void operator()(int64_t r, int64_t j, double& a0, double& a1) const {
    const T gv = g[r * M + j];
    const T xhat = (h[r * M + j] - mean[r]) * rstd[r];
    if (weight_first) {
      a0 += static_cast<double>(gv) * static_cast<double>(xhat);
      a1 += static_cast<double>(gv);
    } else {
      a0 += static_cast<double>(gv);
    }
  }
};

// ---- bias_gelu ----

template <typename T>
__global__ void bias_gelu_kernel(const T* in, const T* bias, T* out, int64_t n, int64_t N, bool tanh) {
  using M = opmath_t<T>;
  const UnaryOp op = tanh ? UnaryOp::GeluTanh : UnaryOp::GeluErf;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const T pre = in[i] + bias[i % N];  // rounded to T first, as the composition's add
    out[i] = static_cast<T>(math::unary<M>(op, static_cast<M>(pre), 0, 0));
  }
}

template <typename T>
__global__ void bias_gelu_backward_kernel(const T* g, const T* in, const T* bias, T* gi, int64_t n, int64_t N,
                                          bool tanh) {
  using M = opmath_t<T>;
  const BinaryOp op = tanh ? BinaryOp::GeluTanhBackward : BinaryOp::GeluErfBackward;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const T pre = in[i] + bias[i % N];
    gi[i] = static_cast<T>(math::binary<M>(op, static_cast<M>(g[i]), static_cast<M>(pre), M(1)));
  }
}

template <typename T>
struct ColumnOf {
  const T* a;
  int64_t N;
  __device__ void operator()(int64_t r, int64_t j, double& a0, double&) const { a0 += static_cast<double>(a[r * N + j]); }
};

// ---- cross_entropy ----

// Note [one pass over the logits]: a row's log-sum-exp in one read, as an online softmax does: each
// thread keeps the largest logit m it has seen and s = the sum of exp(x - m) over its logits,
// rescaling s by exp(m_old - m_new) when m grows; the threads' (m, s) pairs merge the same way. Three
// passes (max, then the sums, then the target) read each row of GPT-2's 50304 logits three times, and
// such a row (197 KiB in float32) has left the caches by the next pass. The pair is kept in A, the
// logits' opmath type: float for float32, float16 and bfloat16 (whose loss and lse are float32, so a
// 16-bit row is read as it is, with no float32 copy of it made first), double for float64. The
// special rows keep the three-pass results: a row of -inf gives -inf, a NaN among finite logits NaN,
// a +inf NaN (exp(inf - inf)).
//
// Rows of more than 1024 classes get a block each (a warp's 32 loads in flight cannot keep up with
// the memory), shorter ones a warp; a row whose elements are 16-byte aligned is read sixteen bytes a
// load, four loads issued before their values are used. The backward is elementwise over (R, C),
// sixteen bytes at a time where aligned, each element (exp(x - lse) - eps / C - (1 - eps) [c == t])
// times the row's gradient, in A, rounded once to T.
//
// Note [the logits a chunk at a time]: the running pair is updated once for each chunk of a thread's
// loads (up to 4 x 16 bytes: 32 bfloat16 logits), not once for each logit: the chunk's maximum first,
// then one rescale of s, then exp(x - m) summed. Per logit that is a maximum, a subtraction, a
// multiplication, an exp2 and an add, where a branch on x > m (with its reconvergence) and an
// accurate exp took about 25 instructions (SASS, sm_90), more than a multiprocessor can issue while
// the memory delivers 16-bit logits (about 16 an element at 4.2 TB/s). Rows read element by element
// (unaligned, or a length whose bytes 16 does not divide) go in chunks of 8, 8 loads in flight. The
// exponential is math::fast_exp(x - m) (Note [exp2 on the GPU]: the hardware's exp2 in float, exp in
// double): the difference first, so that the largest term is exactly 1 and a large m's rounding (as
// in x log2 e - m log2 e) does not scale every term.
template <typename A>
struct RunningLse {
  A m = -INFINITY, s = 0;  // s == 0 until a logit above -inf arrives

  // s rescaled to the larger maximum m_new (0 stays 0, where m may be -inf; NaN stays NaN).
  __device__ static A rescale(A s, A m, A m_new) { return s == 0 ? A(0) : s * exp(m - m_new); }
  // A chunk of n logits (Note [the logits a chunk at a time]); fmax passes over NaN, so a NaN logit
  // reaches s through its exp instead, as in a whole row of NaN (m stays -inf there).
  template <int n>
  __device__ void add_chunk(const A (&x)[n]) {
    A mx = m;
    KILN_CUDA_UNROLL
    for (int i = 0; i < n; ++i) mx = fmax(mx, x[i]);
    s = rescale(s, m, mx);
    m = mx;
    const A base = m == -INFINITY ? A(0) : m;  // all -inf so far: each exp is of -inf, 0
    KILN_CUDA_UNROLL
    for (int i = 0; i < n; ++i) s += math::fast_exp(x[i] - base);
  }
  __device__ void merge(A m2, A s2) {
    const A mm = fmax(m, m2);  // m is never NaN: add_chunk's fmax passes over NaN
    s = rescale(s, m, mm) + rescale(s2, m2, mm);
    m = mm;
  }
  // In double whatever A is (once a row): a confident row's loss is lse - x[t], a small difference of
  // two numbers near 20. A row of NaN (and -inf) keeps m = -inf with s NaN: NaN, as on the CPU.
  __device__ double lse() const {
    if (m == -INFINITY && s == 0) return -INFINITY;
    return m == INFINITY ? NAN : static_cast<double>(m) + log(static_cast<double>(s));
  }
};

// The group's merged pair, in every thread of the group: the warp's by shuffles, then for a block
// the warps' through shared memory (every thread merging them in the same order).
template <int kWidth, typename A>
__device__ RunningLse<A> group_lse(RunningLse<A> run, A* shared_m, A* shared_s) {
  for (int delta = 16; delta > 0; delta >>= 1) {
    const A m2 = __shfl_xor_sync(0xffffffffu, run.m, delta), s2 = __shfl_xor_sync(0xffffffffu, run.s, delta);
    run.merge(m2, s2);
  }
  if constexpr (kWidth == 32) {
    return run;
  } else {
    const int warp = static_cast<int>(threadIdx.x >> 5);
    __syncthreads();  // the previous row's use of the arrays is over
    if ((threadIdx.x & 31) == 0) {
      shared_m[warp] = run.m;
      shared_s[warp] = run.s;
    }
    __syncthreads();
    RunningLse<A> all;
    for (int w = 0; w < kWidth / 32; ++w) all.merge(shared_m[w], shared_s[w]);
    return all;
  }
}

// Four blocks a multiprocessor (two in double): left to itself, ptxas gave the 16-bit block-per-row
// kernels 48 registers and spilled.
template <typename T, typename A, int kWidth>
__global__ void __launch_bounds__(kThreads, std::is_same_v<A, double> ? 2 : 4)
    cross_entropy_kernel(const T* logits, const int64_t* target, A* loss, A* lse, int64_t R, int64_t C,
                         int64_t ignore_index, double eps, bool vectorized) {
  using G = RowGroup<kWidth>;
  constexpr int V = Vec16<T>::kSize, kUnroll = 4;
  __shared__ A shared_m[kThreads / 32], shared_s[kThreads / 32];
  __shared__ double shared[32];
  const int lane = G::lane();
  for (int64_t r = G::first(); r < R; r += G::step()) {
    const T* x = logits + r * C;
    RunningLse<A> run;  // See Note [one pass over the logits]
    A sx = 0;
    // A chunk of loaded logits into the running pair (Note [the logits a chunk at a time]) and sx.
    auto take = [&](const auto& values) {
      constexpr int n = sizeof(values) / sizeof(values[0]);
      A v[n];
      KILN_CUDA_UNROLL
      for (int e = 0; e < n; ++e) {
        v[e] = static_cast<A>(values[e]);
        sx += v[e];
      }
      run.add_chunk(v);
    };
    if (vectorized) {
      const auto* xv = reinterpret_cast<const Vec16<T>*>(x);
      const int64_t n = C / V;
      int64_t i = lane;
      for (; i + (kUnroll - 1) * kWidth < n; i += kUnroll * kWidth) {
        T u[kUnroll * V];
        KILN_CUDA_UNROLL
        for (int k = 0; k < kUnroll; ++k) {
          const Vec16<T> w = xv[i + k * kWidth];
          KILN_CUDA_UNROLL
          for (int e = 0; e < V; ++e) u[k * V + e] = w.v[e];
        }
        take(u);
      }
      for (; i < n; i += kWidth) take(xv[i].v);
    } else {
      constexpr int kChunk = 8;
      int64_t i = lane;
      for (; i + (kChunk - 1) * kWidth < C; i += kChunk * kWidth) {
        T u[kChunk];
        KILN_CUDA_UNROLL
        for (int k = 0; k < kChunk; ++k) u[k] = x[i + k * kWidth];
        take(u);
      }
      for (; i < C; i += kWidth) {
        const T one[1] = {x[i]};
        take(one);
      }
    }
    run = group_lse<kWidth>(run, shared_m, shared_s);
    const double sum_x = eps > 0 ? G::sum(static_cast<double>(sx), shared) : 0.0;  // eps is the grid's
    if (lane != 0) continue;
    const double l = run.lse();
    lse[r] = static_cast<A>(l);
    const int64_t t = target[r];
    if (t == ignore_index) {
      loss[r] = A(0);
    } else if (t < 0 || t >= C) {
      loss[r] = A(NAN);
    } else {
      double v = l - (1 - eps) * static_cast<double>(static_cast<A>(x[t]));
      if (eps > 0) v -= eps / static_cast<double>(C) * sum_x;
      loss[r] = static_cast<A>(v);
    }
  }
}

// One element's gradient (Note [one pass over the logits]), in A.
template <typename A>
__device__ __forceinline__ A cross_entropy_grad(A x, A l, A scale, A smooth, A hit, bool is_target) {
  A v = (math::fast_exp(x - l) - smooth) * scale;  // Note [the logits a chunk at a time]
  if (is_target) v -= hit * scale;
  return v;
}

template <typename T, typename A>
__global__ void cross_entropy_backward_kernel(const T* logits, const int64_t* target, const A* lse, const A* gl,
                                              T* grad, int64_t R, int64_t C, int64_t ignore_index, double eps,
                                              bool vectorized) {
  constexpr int V = Vec16<T>::kSize;
  const A smooth = static_cast<A>(eps / static_cast<double>(C)), hit = static_cast<A>(1 - eps);
  const int64_t step = static_cast<int64_t>(blockDim.x) * gridDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (vectorized) {
    // Vector i is (row r, vector c of the row); the stride's (rows, vectors) are added instead of
    // dividing i each time (a 64-bit division took about a fifth of this loop's instructions).
    const int64_t per_row = C / V, n = R * per_row;
    const int64_t step_rows = step / per_row, step_cols = step % per_row;
    int64_t r = first / per_row, c = first % per_row;
    for (int64_t i = first; i < n; i += step) {
      const int64_t c0 = c * V, t = target[r];
      const bool ignored = t == ignore_index || t < 0 || t >= C;
      const A l = lse[r], scale = gl[r];
      const int te = t >= c0 && t < c0 + V ? static_cast<int>(t - c0) : -1;  // the target's place here
      const Vec16<T> u = reinterpret_cast<const Vec16<T>*>(logits)[i];
      Vec16<T> o;
      KILN_CUDA_UNROLL
      for (int e = 0; e < V; ++e) {
        const A g = cross_entropy_grad(static_cast<A>(u.v[e]), l, scale, smooth, hit, e == te);
        o.v[e] = static_cast<T>(ignored ? A(0) : g);
      }
      reinterpret_cast<Vec16<T>*>(grad)[i] = o;
      r += step_rows;
      c += step_cols;
      if (c >= per_row) {
        c -= per_row;
        ++r;
      }
    }
  } else {
    const int64_t n = R * C;
    const bool index32 = n <= static_cast<int64_t>(UINT32_MAX);  // a 32-bit division per element, not 64
    for (int64_t i = first; i < n; i += step) {
      const int64_t r = index32 ? static_cast<uint32_t>(i) / static_cast<uint32_t>(C) : i / C;
      const int64_t c = i - r * C, t = target[r];
      const bool ignored = t == ignore_index || t < 0 || t >= C;
      const A v = ignored ? A(0) : cross_entropy_grad(static_cast<A>(logits[i]), lse[r], gl[r], smooth, hit, c == t);
      grad[i] = static_cast<T>(v);
    }
  }
}

// The kernel for R rows of M elements and its grid (Note [layer_norm rows in registers]): float32
// rows of up to 1024 a warp each, in registers; up to 4096 a block each, in registers; else a warp
// each, walked. One function chooses both, so the grid always fits the kernel.
template <typename K>
struct RowLaunch {
  K kernel;
  unsigned blocks;
};

template <typename T>
auto layer_norm_kernel_for(int64_t R, int64_t M) {
  using K = decltype(&layer_norm_kernel<T>);
  if constexpr (std::is_same_v<T, float>) {
    if (M <= 32 * kWarpRegPer) return RowLaunch<K>{layer_norm_reg_kernel<T, 32, kWarpRegPer>, row_blocks(R)};
    if (M <= kThreads * kBlockRegPer) {
      return RowLaunch<K>{layer_norm_reg_kernel<T, kThreads, kBlockRegPer>, block_per_row(R)};
    }
  }
  return RowLaunch<K>{layer_norm_kernel<T>, row_blocks(R)};
}
template <typename T>
auto layer_norm_backward_kernel_for(int64_t R, int64_t M) {
  using K = decltype(&layer_norm_backward_kernel<T>);
  if constexpr (std::is_same_v<T, float>) {
    if (M <= 32 * kWarpRegPer) return RowLaunch<K>{layer_norm_backward_reg_kernel<T, 32, kWarpRegPer>, row_blocks(R)};
    if (M <= kThreads * kBlockRegPer) {
      return RowLaunch<K>{layer_norm_backward_reg_kernel<T, kThreads, kBlockRegPer>, block_per_row(R)};
    }
  }
  return RowLaunch<K>{layer_norm_backward_kernel<T>, row_blocks(R)};
}

template <typename T>
const T* ptr_or_null(const View& v) {
  return v.data ? v.ptr<T>() : nullptr;
}
template <typename T>
T* mut_or_null(const View& v) {
  return v.data ? v.ptr<T>() : nullptr;
}

}  // namespace

// ---- launchers ----

void layer_norm_launch(const View& x, const View& residual, const View& weight, const View& bias, const View& out,
                       const View& sum, const View& mean, const View& rstd, double eps, bool rms, const Stream& s) {
  check_nn_dtype(x.dtype, "layer_norm");
  const int64_t R = x.sizes[0], M = x.sizes[1];
  if (R == 0 || M == 0) return;
  // See Note [layer_norm rows sixteen bytes at a time].
  const auto aligned = [](const View& v) { return !v.data || aligned16(v.data); };
  if (x.dtype == kFloat32 && M > 32 * kWarpRegPer && M <= kThreads * kBlockRegPer && M % 4 == 0 && aligned(x) &&
      aligned(residual) && aligned(weight) && aligned(bias) && aligned(out) && aligned(sum)) {
    layer_norm_vec_kernel<kBlockRegPer><<<block_per_row(R), kThreads, 0, stream_of(s)>>>(
        x.ptr<float>(), ptr_or_null<float>(residual), ptr_or_null<float>(weight), ptr_or_null<float>(bias),
        out.ptr<float>(), mut_or_null<float>(sum), mean.ptr<float>(), rstd.ptr<float>(), R, M, eps, rms);
    KILN_CUDA_CHECK(cudaGetLastError());
    return;
  }
  KILN_DISPATCH_F32_F64(x.dtype, "layer_norm", [&] {
    using T = scalar_t;
    const auto launch = layer_norm_kernel_for<T>(R, M);
    launch.kernel<<<launch.blocks, kThreads, 0, stream_of(s)>>>(
        x.ptr<T>(), ptr_or_null<T>(residual), ptr_or_null<T>(weight), ptr_or_null<T>(bias), out.ptr<T>(),
        mut_or_null<T>(sum), mean.ptr<T>(), rstd.ptr<T>(), R, M, eps, rms);
    KILN_CUDA_CHECK(cudaGetLastError());
  });
}

void layer_norm_backward_launch(const View& grad_out, const View& grad_sum, const View& h, const View& weight,
                                const View& mean, const View& rstd, const View& grad_in, const View& grad_weight,
                                const View& grad_bias, bool rms, const Stream& s) {
  check_nn_dtype(h.dtype, "layer_norm backward");
  const int64_t R = h.sizes[0], M = h.sizes[1];
  if (R == 0 || M == 0) return;
  cudaStream_t stream = stream_of(s);
  KILN_DISPATCH_F32_F64(h.dtype, "layer_norm backward", [&] {
    using T = scalar_t;
    const auto launch = layer_norm_backward_kernel_for<T>(R, M);
    launch.kernel<<<launch.blocks, kThreads, 0, stream>>>(
        grad_out.ptr<T>(), ptr_or_null<T>(grad_sum), h.ptr<T>(), ptr_or_null<T>(weight), mean.ptr<T>(),
        rstd.ptr<T>(), grad_in.ptr<T>(), R, M, rms);
    KILN_CUDA_CHECK(cudaGetLastError());
    T* gw = mut_or_null<T>(grad_weight);
    T* gb = mut_or_null<T>(grad_bias);
    if (!gw && !gb) return;
    NormAffineTerms<T> f{grad_out.ptr<T>(), h.ptr<T>(), mean.ptr<T>(), rstd.ptr<T>(), M, gw != nullptr};
    if (gw) {
      column_sums<T>(f, R, M, gb ? 2 : 1, gw, gb, s.device.index, stream);
    } else {
      column_sums<T>(f, R, M, 1, gb, static_cast<T*>(nullptr), s.device.index, stream);
    }
  });
}

void bias_gelu_launch(const View& in, const View& bias, const View& out, bool tanh, const Stream& s) {
  check_nn_dtype(in.dtype, "bias_gelu");
  const int64_t n = in.numel(), N = in.sizes[1];
  if (n == 0) return;
  KILN_DISPATCH_F32_F64(in.dtype, "bias_gelu", [&] {
    using T = scalar_t;
    bias_gelu_kernel<T><<<blocks_for(n), kThreads, 0, stream_of(s)>>>(in.ptr<T>(), bias.ptr<T>(), out.ptr<T>(), n,
                                                                        N, tanh);
    KILN_CUDA_CHECK(cudaGetLastError());
  });
}

void bias_gelu_backward_launch(const View& grad_out, const View& in, const View& bias, const View& grad_in,
                               const View& grad_bias, bool tanh, const Stream& s) {
  check_nn_dtype(in.dtype, "bias_gelu backward");
  const int64_t n = in.numel(), R = in.sizes[0], N = in.sizes[1];
  if (n == 0) return;
  cudaStream_t stream = stream_of(s);
  KILN_DISPATCH_F32_F64(in.dtype, "bias_gelu backward", [&] {
    using T = scalar_t;
    bias_gelu_backward_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(grad_out.ptr<T>(), in.ptr<T>(),
                                                                           bias.ptr<T>(), grad_in.ptr<T>(), n, N, tanh);
    KILN_CUDA_CHECK(cudaGetLastError());
    if (T* gb = mut_or_null<T>(grad_bias)) {
      column_sums<T>(ColumnOf<T>{grad_in.ptr<T>(), N}, R, N, 1, gb, static_cast<T*>(nullptr), s.device.index,
                     stream);
    }
  });
}

void cross_entropy_launch(const View& logits, const View& target, const View& loss, const View& lse,
                          int64_t ignore_index, double label_smoothing, const Stream& s) {
  const int64_t R = logits.sizes[0], C = logits.sizes[1];
  if (R == 0 || C == 0) return;
  KILN_DISPATCH_FLOAT_TYPES(logits.dtype, "cross_entropy", [&] {
    using T = scalar_t;
    using A = opmath_t<T>;  // float32 loss and lse for the 16-bit dtypes (ops/softmax.cpp allocates them so)
    KILN_CHECK(loss.dtype == dtype_of<A>() && lse.dtype == dtype_of<A>(),
               "cross_entropy: {} logits take {} loss and lse, got {} and {}", dtype_name(logits.dtype),
               dtype_name(dtype_of<A>()), dtype_name(loss.dtype), dtype_name(lse.dtype));
    const bool vectorized = aligned16(logits.data) && (C * static_cast<int64_t>(sizeof(T))) % 16 == 0;
    if (C > 1024) {
      cross_entropy_kernel<T, A, kThreads><<<block_per_row(R), kThreads, 0, stream_of(s)>>>(
          logits.ptr<T>(), target.ptr<int64_t>(), loss.ptr<A>(), lse.ptr<A>(), R, C, ignore_index, label_smoothing,
          vectorized);
    } else {
      cross_entropy_kernel<T, A, 32><<<row_blocks(R), kThreads, 0, stream_of(s)>>>(
          logits.ptr<T>(), target.ptr<int64_t>(), loss.ptr<A>(), lse.ptr<A>(), R, C, ignore_index, label_smoothing,
          vectorized);
    }
    KILN_CUDA_CHECK(cudaGetLastError());
  });
}

void cross_entropy_backward_launch(const View& logits, const View& target, const View& lse, const View& grad_loss,
                                   const View& grad_logits, int64_t ignore_index, double label_smoothing,
                                   const Stream& s) {
  const int64_t R = logits.sizes[0], C = logits.sizes[1];
  if (R == 0 || C == 0) return;
  KILN_DISPATCH_FLOAT_TYPES(logits.dtype, "cross_entropy backward", [&] {
    using T = scalar_t;
    using A = opmath_t<T>;
    KILN_CHECK(lse.dtype == dtype_of<A>() && grad_loss.dtype == dtype_of<A>() && grad_logits.dtype == logits.dtype,
               "cross_entropy backward: {} logits take {} lse and loss gradient and a {} gradient, got {}, {} "
               "and {}",
               dtype_name(logits.dtype), dtype_name(dtype_of<A>()), dtype_name(logits.dtype), dtype_name(lse.dtype),
               dtype_name(grad_loss.dtype), dtype_name(grad_logits.dtype));
    const bool vectorized = aligned16(logits.data) && aligned16(grad_logits.data) &&
                            (C * static_cast<int64_t>(sizeof(T))) % 16 == 0;
    const int64_t n = vectorized ? R * C / Vec16<T>::kSize : R * C;
    cross_entropy_backward_kernel<T, A><<<blocks_for(n), kThreads, 0, stream_of(s)>>>(
        logits.ptr<T>(), target.ptr<int64_t>(), lse.ptr<A>(), grad_loss.ptr<A>(), grad_logits.ptr<T>(), R, C,
        ignore_index, label_smoothing, vectorized);
    KILN_CUDA_CHECK(cudaGetLastError());
  });
}

}  // namespace kiln::cuda
