// cuda/loops.cuh: how CUDA kernels walk strided views (private to cuda/; the CUDA sibling of
// cpu/loops.h), and the dtype conversion every kernel shares.
//
// OffsetCalc<N> maps a linear (row-major) element index of one shape to an element offset in each
// of N views of that shape. make_offset_calc() builds it on the host the way cpu/loops.h's
// StridedLoop does: size-1 dims are dropped and neighbouring dims that are contiguous in every view
// are merged, so a contiguous tensor of any rank becomes one flat dim and an offset costs one
// multiply. launch_elementwise() runs f(i, offsets) for every i in [0, n) with a grid-stride loop.
// Strides are in elements of each view's own dtype and may be 0 (broadcast) or negative (flip).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>

#include "core/backend.h"
#include "core/convert.h"
#include "cuda/check.h"

// `#pragma unroll` (and `#pragma unroll n`) for device code only (the host compiler would warn
// about an unknown pragma).
#define KILN_CUDA_PRAGMA_(text) _Pragma(#text)
#if defined(__CUDA_ARCH__)
#define KILN_CUDA_UNROLL _Pragma("unroll")
#define KILN_CUDA_UNROLL_N(n) KILN_CUDA_PRAGMA_(unroll n)
#else
#define KILN_CUDA_UNROLL
#define KILN_CUDA_UNROLL_N(n)
#endif

namespace kiln::cuda {

inline constexpr int kThreads = 256;      // threads per block of the elementwise kernels
inline constexpr int64_t kMaxBlocks = 1 << 16;  // grid-stride loops cover the rest

// The sum of v over the calling warp (every lane taking part), returned to every lane; the row
// kernels of norm.cu and fused.cu accumulate in double.
__device__ __forceinline__ double warp_sum(double v) {
  for (int delta = 16; delta > 0; delta >>= 1) v += __shfl_xor_sync(0xffffffffu, v, delta);
  return v;
}

// The sum of v over the block (blockDim.x a multiple of 32), returned to every thread. `shared`
// holds one double per warp. Every thread of the block must call it.
__device__ __forceinline__ double block_sum(double v, double* shared) {
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads();  // the previous use of `shared` is over
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  double total = 0;
  for (int w = 0; w < warps; ++w) total += shared[w];  // same order in every thread
  return total;
}

// The reduction of v by op over the block, returned to every thread, with one __syncthreads instead
// of block_sum's two: `slots` holds one M per warp, and the caller must not let it be written again
// before every thread has read it (alternate two sets of slots between uses, or put a barrier
// between). Every thread reduces the warps' partials itself, in the same order.
template <typename M, typename Op>
__device__ __forceinline__ M block_all_reduce(M v, Op op, M* slots) {
  for (int delta = 16; delta > 0; delta >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, delta));
  if ((threadIdx.x & 31) == 0) slots[threadIdx.x >> 5] = v;
  __syncthreads();
  M r = slots[0];
  for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) r = op(r, slots[w]);
  return r;
}

template <int N>
struct OffsetCalc {
  int ndim = 0;                       // dims after merging; dim 0 is the innermost (fastest)
  int64_t sizes[kMaxDims] = {};
  int64_t strides[N][kMaxDims] = {};  // in elements

  __host__ __device__ __forceinline__ void get(int64_t linear, int64_t (&off)[N]) const {
    KILN_CUDA_UNROLL
    for (int k = 0; k < N; ++k) off[k] = 0;
    KILN_CUDA_UNROLL
    for (int d = 0; d < kMaxDims; ++d) {  // unrolled so the arrays stay in registers/params
      if (d == ndim) break;
      int64_t i = linear % sizes[d];
      linear /= sizes[d];
      KILN_CUDA_UNROLL
      for (int k = 0; k < N; ++k) off[k] += i * strides[k][d];
    }
  }

  // The same for a linear index under 2^32: 32-bit division is several times cheaper than 64-bit.
  __host__ __device__ __forceinline__ void get32(uint32_t linear, int64_t (&off)[N]) const {
    KILN_CUDA_UNROLL
    for (int k = 0; k < N; ++k) off[k] = 0;
    KILN_CUDA_UNROLL
    for (int d = 0; d < kMaxDims; ++d) {
      if (d == ndim) break;
      const auto size = static_cast<uint32_t>(sizes[d]);
      const uint32_t i = linear % size;
      linear /= size;
      KILN_CUDA_UNROLL
      for (int k = 0; k < N; ++k) off[k] += static_cast<int64_t>(i) * strides[k][d];
    }
  }
};

// An OffsetCalc over `sizes` with one stride list per view (each of sizes' rank).
template <int N>
OffsetCalc<N> make_offset_calc(const Shape& sizes, const std::array<Shape, N>& strides) {
  // Outermost first, as in the views; size-1 dims dropped.
  int n = 0;
  int64_t sz[kMaxDims];
  int64_t st[N][kMaxDims];
  for (int d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 1) continue;
    sz[n] = sizes[d];
    for (int k = 0; k < N; ++k) st[k][n] = strides[k][d];
    ++n;
  }
  // Merge dim d into the one before it when stepping the outer equals stepping d size times.
  int out = 0;
  for (int d = 1; d < n; ++d) {
    bool mergeable = true;
    for (int k = 0; k < N; ++k) mergeable &= st[k][out] == st[k][d] * sz[d];
    if (mergeable) {
      sz[out] *= sz[d];
      for (int k = 0; k < N; ++k) st[k][out] = st[k][d];
    } else {
      ++out;
      sz[out] = sz[d];
      for (int k = 0; k < N; ++k) st[k][out] = st[k][d];
    }
  }
  OffsetCalc<N> calc;
  calc.ndim = n == 0 ? 0 : out + 1;
  for (int d = 0; d < calc.ndim; ++d) {  // reversed: innermost first
    calc.sizes[d] = sz[calc.ndim - 1 - d];
    for (int k = 0; k < N; ++k) calc.strides[k][d] = st[k][calc.ndim - 1 - d];
  }
  return calc;
}

// The same over N views of one shape (the first view's sizes).
template <int N>
OffsetCalc<N> make_offset_calc(const std::array<const View*, N>& views) {
  std::array<Shape, N> strides;
  for (int k = 0; k < N; ++k) strides[k] = views[k]->strides;
  return make_offset_calc<N>(views[0]->sizes, strides);
}

// Sixteen bytes of T: the unit of the vectorized kernels' loads and stores (elementwise.cu, optim.cu).
template <typename T>
struct alignas(16) Vec16 {
  static constexpr int kSize = 16 / sizeof(T);
  T v[kSize];
};

__host__ __device__ inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

inline unsigned blocks_for(int64_t n, int threads = kThreads) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + threads - 1) / threads, 1, kMaxBlocks));
}

// ---- kernels ----

// f(i, off) for every linear index i in [0, n); off[k] is element i's offset in view k. kFlat: the
// calc has at most one dim, so an offset is i times a stride, with no division. kIndex32: n < 2^32,
// so the divisions of OffsetCalc::get32 suffice.
template <int N, bool kFlat, bool kIndex32, typename F>
__global__ void elementwise_kernel(int64_t n, OffsetCalc<N> calc, F f) {
  const int64_t step = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    int64_t off[N];
    if constexpr (kFlat) {
      KILN_CUDA_UNROLL
      for (int k = 0; k < N; ++k) off[k] = i * calc.strides[k][0];
    } else if constexpr (kIndex32) {
      calc.get32(static_cast<uint32_t>(i), off);
    } else {
      calc.get(i, off);
    }
    f(i, static_cast<const int64_t*>(off));
  }
}

// ---- launchers ----

template <int N, typename F>
void launch_elementwise(int64_t n, const OffsetCalc<N>& calc, cudaStream_t stream, const F& f) {
  if (n <= 0) return;
  if (calc.ndim <= 1) {
    elementwise_kernel<N, true, false><<<blocks_for(n), kThreads, 0, stream>>>(n, calc, f);
  } else if (n <= static_cast<int64_t>(UINT32_MAX)) {
    elementwise_kernel<N, false, true><<<blocks_for(n), kThreads, 0, stream>>>(n, calc, f);
  } else {
    elementwise_kernel<N, false, false><<<blocks_for(n), kThreads, 0, stream>>>(n, calc, f);
  }
  KILN_CUDA_CHECK(cudaGetLastError());
}

// ---- per-element helpers ----

// Element `off` of a buffer of dtype `t`, converted to To. `t` is the same for every thread, so the
// switch costs no divergence; it saves instantiating a kernel per (source, destination) pair.
template <typename To>
__host__ __device__ inline To load_as(const void* base, int64_t off, DType t) {
  switch (t) {
    case DType::Bool: return convert<To>(static_cast<const bool*>(base)[off]);
    case DType::UInt8: return convert<To>(static_cast<const uint8_t*>(base)[off]);
    case DType::Int8: return convert<To>(static_cast<const int8_t*>(base)[off]);
    case DType::Int32: return convert<To>(static_cast<const int32_t*>(base)[off]);
    case DType::Int64: return convert<To>(static_cast<const int64_t*>(base)[off]);
    case DType::Float16: return convert<To>(static_cast<const Half*>(base)[off]);
    case DType::BFloat16: return convert<To>(static_cast<const BFloat16*>(base)[off]);
    case DType::Float32: return convert<To>(static_cast<const float*>(base)[off]);
    case DType::Float64: return convert<To>(static_cast<const double*>(base)[off]);
  }
  return To();
}

// The unsigned integer type of an element size: kernels that only move elements (index_select,
// gather, scatter) dispatch on the size, not the dtype.
template <int kBytes> struct Bits;
template <> struct Bits<1> { using type = uint8_t; };
template <> struct Bits<2> { using type = uint16_t; };
template <> struct Bits<4> { using type = uint32_t; };
template <> struct Bits<8> { using type = uint64_t; };

}  // namespace kiln::cuda

// KILN_DISPATCH_BY_SIZE(dtype, "op", [&] { ... bits_t ... }): bits_t is an unsigned integer of the
// dtype's size.
#define KILN_CUDA_SIZE_CASE_(n, ...)                                   \
  case n: {                                                            \
    using bits_t = ::kiln::cuda::Bits<n>::type;                        \
    return __VA_ARGS__();                                              \
  }
#define KILN_DISPATCH_BY_SIZE(dtype, name, ...)                                                \
  [&] {                                                                                        \
    switch (::kiln::itemsize(dtype)) {                                                         \
      KILN_CUDA_SIZE_CASE_(1, __VA_ARGS__)                                                     \
      KILN_CUDA_SIZE_CASE_(2, __VA_ARGS__)                                                     \
      KILN_CUDA_SIZE_CASE_(4, __VA_ARGS__)                                                     \
      KILN_CUDA_SIZE_CASE_(8, __VA_ARGS__)                                                     \
      default: KILN_FAIL("{}: unexpected dtype {}", name, ::kiln::dtype_name(dtype));         \
    }                                                                                          \
  }()
