// cuda/reduce.cu: reductions (sum, prod, max, min, argmax, argmin, all, any) over any set of dims,
// and softmax / log_softmax along one dim: the row-wise kernels of the CUDA backend. CPU sibling:
// cpu/reduce.cpp (softmax included), whose semantics these follow: floating sums and products
// accumulate in double and integer ones in int64; max/min let NaN win; argmax/argmin give the first
// index of the extreme (NaN counting as the largest); a softmax row of -inf gives nan.
// Siblings: backend.cu, copy.cu, random.cu, elementwise.cu, matmul.cu, index.cu; helpers in
// loops.cuh.
//
// Reduce: each output is reduced by a group of `group` threads (a power of two up to a block);
// thread t of a group takes elements t, t + group, ... of the output's slice, then the group merges
// its partials in shared memory. Short slices get small groups, so a block serves many outputs.
// Few outputs with long slices: each slice is split over several blocks that write partial
// accumulators, and a second kernel merges them (reduce_split_kernel, reduce_merge_kernel); a
// contiguous slice is then read 16 bytes at a time (update_contiguous).
// Outputs side by side in memory (sums over rows): threads take neighbouring outputs, so that a warp
// reads along a row, with the rows split over row lanes and blocks (reduce_columns_kernel).
// Softmax: one block per row; the row max and the sum of exp(x - max) are block reductions.
// Contiguous rows of up to 4096 elements stay in registers between the passes (softmax_rows_kernel),
// read sixteen bytes a load where their length allows (softmax_rows_vec_kernel).
#include <atomic>
#include <cmath>
#include <limits>
#include <optional>
#include <type_traits>

#include "core/scalar_math.h"
#include "cuda/context.h"
#include "cuda/kernels.h"
#include "cuda/loops.cuh"

namespace kiln::cuda {
namespace {

// ---- reducers: init / update / merge / result, as in cpu/reduce.cpp ----

template <typename T>
using wide_t = std::conditional_t<std::is_floating_point_v<opmath_t<T>>, double, int64_t>;

template <typename T> struct SumR {
  using acc_t = wide_t<T>;
  using out_t = T;
  __device__ static acc_t init() { return 0; }
  __device__ static void update(acc_t& a, T x, int64_t) { merge(a, static_cast<acc_t>(static_cast<opmath_t<T>>(x))); }
  // An integer sum wraps as two's complement, as the CPU's and PyTorch's (math::wrap_add: signed
  // overflow is undefined behaviour in CUDA C++ as in C++).
  __device__ static void merge(acc_t& a, const acc_t& b) {
    if constexpr (std::is_integral_v<acc_t>) a = math::wrap_add(a, b);
    else a += b;
  }
  __device__ static out_t result(acc_t a) { return static_cast<T>(static_cast<opmath_t<T>>(a)); }
};
template <typename T> struct ProdR {
  using acc_t = wide_t<T>;
  using out_t = T;
  __device__ static acc_t init() { return 1; }
  __device__ static void update(acc_t& a, T x, int64_t) { merge(a, static_cast<acc_t>(static_cast<opmath_t<T>>(x))); }
  __device__ static void merge(acc_t& a, const acc_t& b) {  // wraps, as SumR
    if constexpr (std::is_integral_v<acc_t>) a = math::wrap_mul(a, b);
    else a *= b;
  }
  __device__ static out_t result(acc_t a) { return static_cast<T>(static_cast<opmath_t<T>>(a)); }
};
// Max (kMax true) or min; NaN wins, as in PyTorch.
template <typename T, bool kMax> struct ExtremeR {
  using M = opmath_t<T>;
  using acc_t = M;
  using out_t = T;
  __device__ static acc_t init() {
    if constexpr (std::is_floating_point_v<M>) {
      return kMax ? -std::numeric_limits<M>::infinity() : std::numeric_limits<M>::infinity();
    } else {
      return kMax ? std::numeric_limits<M>::lowest() : std::numeric_limits<M>::max();
    }
  }
  __device__ static bool better(M x, M a) {
    if (x != x) return a == a;  // x is NaN and a is not yet
    return kMax ? x > a : x < a;
  }
  __device__ static void update(acc_t& a, T x, int64_t) {
    M v = static_cast<M>(x);
    if (better(v, a)) a = v;
  }
  __device__ static void merge(acc_t& a, const acc_t& b) {
    if (better(b, a)) a = b;
  }
  __device__ static out_t result(acc_t a) { return static_cast<T>(a); }
};
// The index of the first max (or min). Partials cover interleaved elements, so merge breaks a tie
// (equal values, or both NaN) by the smaller index: the result is the CPU's sequential first index.
template <typename T, bool kMax> struct ArgR {
  using M = opmath_t<T>;
  using E = ExtremeR<T, kMax>;
  struct acc_t {
    M value;
    int64_t index;
  };
  using out_t = int64_t;
  __device__ static acc_t init() { return {E::init(), -1}; }
  __device__ static void update(acc_t& a, T x, int64_t i) {
    M v = static_cast<M>(x);
    if (a.index < 0 || E::better(v, a.value)) a = {v, i};
  }
  __device__ static void merge(acc_t& a, const acc_t& b) {
    if (b.index < 0) return;
    if (a.index < 0 || E::better(b.value, a.value) ||
        (!E::better(a.value, b.value) && b.index < a.index)) {
      a = b;
    }
  }
  __device__ static out_t result(acc_t a) { return a.index < 0 ? 0 : a.index; }
};
template <bool kAll> struct LogicalR {
  using acc_t = bool;
  using out_t = bool;
  __device__ static acc_t init() { return kAll; }
  __device__ static void update(acc_t& a, bool x, int64_t) { a = kAll ? (a && x) : (a || x); }
  __device__ static void merge(acc_t& a, const acc_t& b) { a = kAll ? (a && b) : (a || b); }
  __device__ static out_t result(acc_t a) { return a; }
};

// NaN-propagating max and plain sum, the two block reductions of softmax.
struct MaxOp {
  template <typename M> __device__ M operator()(M a, M b) const {
    if (a != a) return a;
    if (b != b) return b;
    return a > b ? a : b;
  }
};
struct SumOp {
  template <typename M> __device__ M operator()(M a, M b) const { return a + b; }
};

// The reduction of v over the block (blockDim.x a multiple of 32), returned to every thread.
// `shared` holds one M per warp.
template <typename M, typename Op>
__device__ M block_reduce(M v, Op op, M* shared) {
  for (int delta = 16; delta > 0; delta >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, delta));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads();  // the previous use of `shared` is over
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    M r = shared[0];
    for (int w = 1; w < warps; ++w) r = op(r, shared[w]);
    shared[0] = r;
  }
  __syncthreads();
  return shared[0];
}

// ---- kernels ----

// The offset of element j of a slice: j * flat when the reduced dims collapse into one stride
// (flat >= 0; no division), else through `reduced`.
__device__ __forceinline__ int64_t slice_offset(int64_t j, int64_t flat, const OffsetCalc<1>& reduced) {
  if (flat >= 0) return j * flat;
  int64_t ro[1];
  reduced.get(j, ro);
  return ro[0];
}

// The merge of the block's `acc` values in shared memory (`partial`, blockDim.x of them) by groups
// of `group` threads; lane 0 of each group gets its group's result.
template <typename R>
__device__ void merge_groups(typename R::acc_t* partial, typename R::acc_t acc, int group) {
  const int lane = threadIdx.x % group;
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int half = group / 2; half > 0; half /= 2) {
    if (lane < half) R::merge(partial[threadIdx.x], partial[threadIdx.x + half]);
    __syncthreads();
  }
}

// Output k (of `outputs`): kept.get(k) gives its slice's start in `in` and its offset in `out`;
// reduced.get(j) the offset of the slice's j-th element (row-major over the reduced dims).
template <typename R, typename T>
__global__ void reduce_kernel(const T* in, typename R::out_t* out, int64_t outputs, int64_t len,
                              OffsetCalc<2> kept, OffsetCalc<1> reduced, int64_t flat, int group) {
  using acc_t = typename R::acc_t;
  extern __shared__ __align__(16) unsigned char reduce_shared[];
  acc_t* partial = reinterpret_cast<acc_t*>(reduce_shared);
  const int lane = threadIdx.x % group;
  const int per_block = blockDim.x / group;
  // Every thread of the block runs the same number of iterations: __syncthreads() is safe.
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * per_block; first < outputs;
       first += static_cast<int64_t>(gridDim.x) * per_block) {
    const int64_t k = first + threadIdx.x / group;
    int64_t ko[2] = {0, 0};
    acc_t acc = R::init();
    if (k < outputs) {
      kept.get(k, ko);
      for (int64_t j = lane; j < len; j += group) R::update(acc, in[ko[0] + slice_offset(j, flat, reduced)], j);
    }
    merge_groups<R>(partial, acc, group);
    if (lane == 0 && k < outputs) out[ko[1]] = R::result(partial[threadIdx.x]);
    __syncthreads();
  }
}

// Elements [begin, end) of a contiguous slice x into acc, the block's threads taking 16 bytes at a
// time: a head of fewer than Vec16<T>::kSize elements up to the first 16-byte boundary, the whole
// vectors (thread t takes vectors t, t + blockDim.x, ...), then the tail. One 4-byte load per
// element kept too few bytes in flight for the copy bandwidth. Each thread still sees its indices
// in increasing order, which the first-index rule of ArgR needs.
template <typename R, typename T>
__device__ void update_contiguous(typename R::acc_t& acc, const T* x, int64_t begin, int64_t end) {
  using V = Vec16<T>;
  constexpr int kV = V::kSize;
  // Elements are aligned to sizeof(T), which divides 16: the boundary is a whole number of them away.
  const int misaligned = static_cast<int>(reinterpret_cast<uintptr_t>(x + begin) % 16 / sizeof(T));
  const int64_t vbegin = min(end, begin + (kV - misaligned) % kV);
  const int64_t vectors = (end - vbegin) / kV, vend = vbegin + vectors * kV;
  if (begin + threadIdx.x < vbegin) R::update(acc, x[begin + threadIdx.x], begin + threadIdx.x);
  const V* xv = reinterpret_cast<const V*>(x + vbegin);
  KILN_CUDA_UNROLL_N(4)
  for (int64_t i = threadIdx.x; i < vectors; i += blockDim.x) {
    const V v = xv[i];
    KILN_CUDA_UNROLL
    for (int e = 0; e < kV; ++e) R::update(acc, v.v[e], vbegin + i * kV + e);
  }
  for (int64_t j = vend + threadIdx.x; j < end; j += blockDim.x) R::update(acc, x[j], j);
}

// Long slices, few outputs: block b reduces part b % splits (elements [part * chunk, part * chunk +
// chunk) of its slice) of output b / splits into partials[b].
template <typename R, typename T>
__global__ void reduce_split_kernel(const T* in, typename R::acc_t* partials, int64_t len, int64_t chunk,
                                    int splits, OffsetCalc<2> kept, OffsetCalc<1> reduced, int64_t flat) {
  using acc_t = typename R::acc_t;
  extern __shared__ __align__(16) unsigned char reduce_shared[];
  acc_t* partial = reinterpret_cast<acc_t*>(reduce_shared);
  const int64_t k = blockIdx.x / splits;
  const int64_t begin = (blockIdx.x % splits) * chunk, end = min(len, begin + chunk);
  int64_t ko[2];
  kept.get(k, ko);
  acc_t acc = R::init();
  if (flat == 1) {
    update_contiguous<R>(acc, in + ko[0], begin, end);
  } else {
    for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) {
      R::update(acc, in[ko[0] + slice_offset(j, flat, reduced)], j);
    }
  }
  merge_groups<R>(partial, acc, blockDim.x);
  if (threadIdx.x == 0) partials[blockIdx.x] = partial[0];
}

// Outputs side by side in `in` (the innermost kept dim has stride 1: a sum over rows, such as a
// bias's gradient). Thread t of the block takes output first + t % 32 and row lane t / 32 of
// kRowLanes: a warp reads 32 neighbouring elements of one row at a time, where reduce_kernel's
// group would read 32 rows of one column. Block row blockIdx.y reduces elements [y * chunk,
// y * chunk + chunk) of each slice; the row lanes take every kRowLanes-th of them and are merged in
// lane order. With one chunk the block writes the result, else the chunk's partial accumulator, at
// partials[y * outputs + k], for reduce_columns_merge_kernel.
constexpr int kColumns = 32, kRowLanes = kThreads / kColumns;

template <typename R, typename T>
__global__ void reduce_columns_kernel(const T* in, typename R::out_t* out, typename R::acc_t* partials,
                                      int64_t outputs, int64_t len, int64_t chunk, OffsetCalc<2> kept,
                                      OffsetCalc<1> reduced, int64_t flat) {
  using acc_t = typename R::acc_t;
  extern __shared__ __align__(16) unsigned char reduce_shared[];
  acc_t* partial = reinterpret_cast<acc_t*>(reduce_shared);
  const int column = threadIdx.x % kColumns, lane = threadIdx.x / kColumns;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * chunk, end = min(len, begin + chunk);
  // Every thread of the block runs the same number of iterations: __syncthreads() is safe.
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * kColumns; first < outputs;
       first += static_cast<int64_t>(gridDim.x) * kColumns) {
    const int64_t k = first + column;
    int64_t ko[2] = {0, 0};
    acc_t acc = R::init();
    if (k < outputs) {
      kept.get(k, ko);
      for (int64_t j = begin + lane; j < end; j += kRowLanes) R::update(acc, in[ko[0] + slice_offset(j, flat, reduced)], j);
    }
    partial[threadIdx.x] = acc;
    __syncthreads();
    if (lane == 0 && k < outputs) {
      for (int l = 1; l < kRowLanes; ++l) R::merge(acc, partial[l * kColumns + column]);
      if (partials != nullptr) partials[blockIdx.y * outputs + k] = acc;
      else out[ko[1]] = R::result(acc);
    }
    __syncthreads();
  }
}

// ... then output k merges its chunks' partials, in chunk order.
template <typename R>
__global__ void reduce_columns_merge_kernel(const typename R::acc_t* partials, typename R::out_t* out,
                                            int64_t outputs, int64_t chunks, OffsetCalc<2> kept) {
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < outputs;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    typename R::acc_t acc = partials[k];
    for (int64_t c = 1; c < chunks; ++c) R::merge(acc, partials[c * outputs + k]);
    int64_t ko[2];
    kept.get(k, ko);
    out[ko[1]] = R::result(acc);
  }
}

// ... then block k merges output k's `splits` partials, in order.
template <typename R>
__global__ void reduce_merge_kernel(const typename R::acc_t* partials, typename R::out_t* out, int splits,
                                    OffsetCalc<2> kept) {
  using acc_t = typename R::acc_t;
  extern __shared__ __align__(16) unsigned char reduce_shared[];
  acc_t* partial = reinterpret_cast<acc_t*>(reduce_shared);
  const int64_t k = blockIdx.x;
  acc_t acc = R::init();
  for (int i = threadIdx.x; i < splits; i += blockDim.x) R::merge(acc, partials[k * splits + i]);
  merge_groups<R>(partial, acc, blockDim.x);
  if (threadIdx.x == 0) {
    int64_t ko[2];
    kept.get(k, ko);
    out[ko[1]] = R::result(partial[0]);
  }
}

// One row per block (grid-stride over rows): rows.get(r) gives row r's start in `in` and `out`.
template <typename T>
__global__ void softmax_kernel(const T* in, T* out, int64_t n_rows, int64_t len, int64_t in_step,
                               int64_t out_step, OffsetCalc<2> rows, bool log_softmax) {
  using M = opmath_t<T>;
  __shared__ M shared[32];
  for (int64_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
    int64_t o[2];
    rows.get(r, o);
    const T* x = in + o[0];
    T* y = out + o[1];
    M mx = -std::numeric_limits<M>::infinity();
    for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
      mx = MaxOp()(mx, static_cast<M>(x[j * in_step]));
    }
    mx = block_reduce(mx, MaxOp(), shared);
    if (isinf(mx) && mx < 0) mx = 0;  // a row of -inf: exp(-inf - 0) = 0, and 0 / 0 gives nan
    M sum = 0;
    for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
      sum += exp(static_cast<M>(x[j * in_step]) - mx);
    }
    sum = block_reduce(sum, SumOp(), shared);
    if (log_softmax) {  // (x - max) - log(sum): keeps the low bits of large inputs (as the CPU)
      const M log_sum = log(sum);
      for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
        y[j * out_step] = static_cast<T>((static_cast<M>(x[j * in_step]) - mx) - log_sum);
      }
    } else {
      for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
        y[j * out_step] = static_cast<T>(exp(static_cast<M>(x[j * in_step]) - mx) / sum);
      }
    }
  }
}

// Note [softmax rows in few instructions]: the register kernels below (the rows of GPT-style
// attention scores, bench_cuda_ops's 8192 x 4096) spent about 50 instructions an element in the
// forward (SASS, sm_90, float32): an accurate expf (about 10) and an IEEE division (a check, a
// reciprocal, four fmas and a slow path) among them, against the 60 or so that a multiprocessor can
// issue while the memory moves a float32 element in and out at 4.2 TB/s. In float (and for the
// 16-bit types, computed in float) the exponential is now math::fast_exp, the hardware's exp2 of
// (x - max) log2 e (Note [exp2 on the GPU]), and the outputs are multiplied by 1 / sum, computed
// once a row: a few ulp from the CPU's exp and division, within float32's tolerance. double keeps
// exp and the division. The strided softmax_kernel above is unchanged.

// The register kernels' middle step on a thread's elements, given the row's max: v becomes
// exp(x - max) for softmax (one exp an element), x - max for log_softmax; returns the thread's sum of
// the exponentials (the padding's exp(-inf) is 0). A row of -inf takes max 0: exp(-inf - 0) = 0, and
// the output's 0 * (1 / 0) gives nan, as the CPU's 0 / 0 does.
template <typename M, int kPer>
__device__ __forceinline__ M shift_and_exp(M (&v)[kPer], M mx, bool log_softmax) {
  if (isinf(mx) && mx < 0) mx = 0;
  M sum = 0;
  KILN_CUDA_UNROLL
  for (int u = 0; u < kPer; ++u) {
    v[u] -= mx;
    const M e = math::fast_exp(v[u]);  // See Note [softmax rows in few instructions]
    sum += e;
    if (!log_softmax) v[u] = e;
  }
  return sum;
}

// An output element from shift_and_exp's value a: a - log(sum) for log_softmax; a / sum for softmax,
// which float computes as a times recip = 1 / sum (Note [softmax rows in few instructions]).
template <typename T, typename M>
__device__ __forceinline__ T softmax_value(M a, M sum, M recip, M log_sum, bool log_softmax) {
  if (log_softmax) return static_cast<T>(a - log_sum);
  if constexpr (std::is_same_v<M, float>) {
    return static_cast<T>(a * recip);
  } else {
    return static_cast<T>(a / sum);
  }
}

// Contiguous rows of at most kPer * blockDim.x elements: each thread keeps its elements of the row
// in registers, so the row is read from memory once and written once.
template <typename T, int kPer>
__global__ void softmax_rows_kernel(const T* in, T* out, int64_t n_rows, int64_t len, bool log_softmax) {
  using M = opmath_t<T>;
  __shared__ M shared[32];
  for (int64_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
    const T* x = in + r * len;
    T* y = out + r * len;
    M v[kPer];
    M mx = -std::numeric_limits<M>::infinity();
    KILN_CUDA_UNROLL
    for (int u = 0; u < kPer; ++u) {
      const int64_t j = threadIdx.x + static_cast<int64_t>(u) * blockDim.x;
      v[u] = j < len ? static_cast<M>(x[j]) : -std::numeric_limits<M>::infinity();
      mx = MaxOp()(mx, v[u]);
    }
    mx = block_reduce(mx, MaxOp(), shared);
    const M sum = block_reduce(shift_and_exp(v, mx, log_softmax), SumOp(), shared);
    const M log_sum = log(sum), recip = M(1) / sum;
    KILN_CUDA_UNROLL
    for (int u = 0; u < kPer; ++u) {
      const int64_t j = threadIdx.x + static_cast<int64_t>(u) * blockDim.x;
      if (j < len) y[j] = softmax_value<T>(v[u], sum, recip, log_sum, log_softmax);
    }
  }
}

// Note [softmax rows sixteen bytes at a time]: the rows of softmax_rows_kernel whose length is a
// multiple of sixteen bytes (and whose start is aligned) are read and written as Vec16s: a quarter of
// the load instructions for float32, an eighth for the 16-bit types, each warp moving 512 bytes per
// instruction. The two block reductions take one __syncthreads each (block_all_reduce, in
// loops.cuh): every thread reduces the warps' partials itself, in the same order, instead of one
// thread doing it between two more barriers; the max and the sum have separate slots, so a row's max slots are free
// again once every thread has passed that row's sum barrier. Same exponentials and divisions as
// softmax_rows_kernel (shift_and_exp, softmax_value), element for element.

template <typename T, int kPer>
__global__ void __launch_bounds__(kThreads) softmax_rows_vec_kernel(const T* in, T* out, int64_t n_rows, int64_t len,
                                                                    bool log_softmax) {
  using M = opmath_t<T>;
  constexpr int V = Vec16<T>::kSize, kVecs = kPer / V;
  static_assert(kPer % V == 0, "a thread's elements are whole vectors");
  __shared__ M max_slots[32], sum_slots[32];
  const int64_t nvec = len / V;
  for (int64_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
    const auto* x = reinterpret_cast<const Vec16<T>*>(in + r * len);
    auto* y = reinterpret_cast<Vec16<T>*>(out + r * len);
    M v[kPer];
    M mx = -std::numeric_limits<M>::infinity();
    KILN_CUDA_UNROLL
    for (int u = 0; u < kVecs; ++u) {
      const int64_t j = threadIdx.x + static_cast<int64_t>(u) * blockDim.x;
      Vec16<T> w;
      if (j < nvec) w = x[j];
      KILN_CUDA_UNROLL
      for (int e = 0; e < V; ++e) {
        v[u * V + e] = j < nvec ? static_cast<M>(w.v[e]) : -std::numeric_limits<M>::infinity();
        mx = MaxOp()(mx, v[u * V + e]);
      }
    }
    mx = block_all_reduce(mx, MaxOp(), max_slots);
    const M sum = block_all_reduce(shift_and_exp(v, mx, log_softmax), SumOp(), sum_slots);
    const M log_sum = log(sum), recip = M(1) / sum;
    KILN_CUDA_UNROLL
    for (int u = 0; u < kVecs; ++u) {
      const int64_t j = threadIdx.x + static_cast<int64_t>(u) * blockDim.x;
      if (j >= nvec) continue;
      Vec16<T> w;
      KILN_CUDA_UNROLL
      for (int e = 0; e < V; ++e) w.v[e] = softmax_value<T>(v[u * V + e], sum, recip, log_sum, log_softmax);
      y[j] = w;
    }
  }
}

// ---- softmax backward ----
// Note [softmax backward in one pass]: dx = y * (g - sum(g * y)) (log_softmax: g - exp(y) * sum(g))
// composed of ops is four kernels: a product, a row sum, a difference and a product, with two
// temporaries the size of the input. Here it is one block per row: each thread sums its elements'
// terms, one block reduction, and each thread writes its elements' gradients. softmax_backward_kernel
// takes any strides (g may be broadcast) and reads the row twice; contiguous rows of up to 4096 whose
// length is a multiple of sixteen bytes are read once, a Vec16 of y and of g at a time, into
// registers (softmax_backward_rows_vec_kernel), as the forward's rows are (Note [softmax rows
// sixteen bytes at a time]); its one reduction a row takes one barrier, with two sets of slots
// used by alternate rows.

template <typename T>
__global__ void softmax_backward_kernel(const T* y, const T* g, T* out, int64_t n_rows, int64_t len, int64_t y_step,
                                        int64_t g_step, int64_t out_step, OffsetCalc<3> rows, bool log_softmax) {
  using M = opmath_t<T>;
  __shared__ M shared[32];
  for (int64_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
    int64_t o[3];
    rows.get(r, o);
    const T* yr = y + o[0];
    const T* gr = g + o[1];
    T* dr = out + o[2];
    M sum = 0;
    for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
      const M gv = static_cast<M>(gr[j * g_step]);
      sum += log_softmax ? gv : gv * static_cast<M>(yr[j * y_step]);
    }
    sum = block_reduce(sum, SumOp(), shared);
    for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
      const M gv = static_cast<M>(gr[j * g_step]), yv = static_cast<M>(yr[j * y_step]);
      dr[j * out_step] = static_cast<T>(log_softmax ? gv - exp(yv) * sum : yv * (gv - sum));
    }
  }
}

template <typename T, int kPer>
__global__ void __launch_bounds__(kThreads) softmax_backward_rows_vec_kernel(const T* y, const T* g, T* out,
                                                                             int64_t n_rows, int64_t len,
                                                                             bool log_softmax) {
  using M = opmath_t<T>;
  constexpr int V = Vec16<T>::kSize, kVecs = kPer / V;
  static_assert(kPer % V == 0, "a thread's elements are whole vectors");
  __shared__ M slots[2][32];
  const int64_t nvec = len / V;
  int parity = 0;
  for (int64_t r = blockIdx.x; r < n_rows; r += gridDim.x, parity ^= 1) {
    const auto* yv = reinterpret_cast<const Vec16<T>*>(y + r * len);
    const auto* gv = reinterpret_cast<const Vec16<T>*>(g + r * len);
    auto* ov = reinterpret_cast<Vec16<T>*>(out + r * len);
    M a[kPer], b[kPer];  // this thread's elements of y and of g (0 past the row's end)
    M sum = 0;
    KILN_CUDA_UNROLL
    for (int u = 0; u < kVecs; ++u) {
      const int64_t j = threadIdx.x + static_cast<int64_t>(u) * blockDim.x;
      Vec16<T> wy, wg;
      if (j < nvec) {
        wy = yv[j];
        wg = gv[j];
      }
      KILN_CUDA_UNROLL
      for (int e = 0; e < V; ++e) {
        a[u * V + e] = j < nvec ? static_cast<M>(wy.v[e]) : M(0);
        b[u * V + e] = j < nvec ? static_cast<M>(wg.v[e]) : M(0);
        sum += log_softmax ? b[u * V + e] : a[u * V + e] * b[u * V + e];
      }
    }
    sum = block_all_reduce(sum, SumOp(), slots[parity]);
    KILN_CUDA_UNROLL
    for (int u = 0; u < kVecs; ++u) {
      const int64_t j = threadIdx.x + static_cast<int64_t>(u) * blockDim.x;
      if (j >= nvec) continue;
      Vec16<T> w;
      KILN_CUDA_UNROLL
      for (int e = 0; e < V; ++e) {
        const M ya = a[u * V + e], gb = b[u * V + e];
        w.v[e] = static_cast<T>(log_softmax ? gb - exp(ya) * sum : ya * (gb - sum));
      }
      ov[j] = w;
    }
  }
}

// ---- launchers ----

// Which dims a reduction keeps and which it reduces (size-1 dims are in neither), as in
// cpu/reduce.cpp's make_plan.
struct Plan {
  Shape kept_sizes, kept_in_strides, kept_out_strides;
  Shape reduced_sizes, reduced_strides;
  int64_t flat = 0;  // the one stride of the reduced dims when they collapse into one, else -1
};

Plan make_plan(const View& in, const View& out) {
  Plan p;
  for (int d = 0; d < in.ndim(); ++d) {
    if (in.sizes[d] == 1) continue;
    if (out.sizes[d] == 1) {
      p.reduced_sizes.push_back(in.sizes[d]);
      p.reduced_strides.push_back(in.strides[d]);
    } else {
      p.kept_sizes.push_back(in.sizes[d]);
      p.kept_in_strides.push_back(in.strides[d]);
      p.kept_out_strides.push_back(out.strides[d]);
    }
  }
  const int nr = p.reduced_sizes.size();
  p.flat = nr == 0 ? 0 : p.reduced_strides[nr - 1];
  for (int d = 0; d + 1 < nr; ++d) {
    if (p.reduced_strides[d] != p.reduced_strides[d + 1] * p.reduced_sizes[d + 1]) p.flat = -1;
  }
  return p;
}

// The device's SM count, asked once per device (threads may race to ask; they store the same value).
int multiprocessors(int device) {
  static std::atomic<int> count[64];
  int n = device >= 0 && device < 64 ? count[device].load(std::memory_order_relaxed) : 0;
  if (n == 0) {
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
    if (device >= 0 && device < 64) count[device].store(n, std::memory_order_relaxed);
  }
  return n;
}

template <typename R, typename T>
void reduce_with(const View& in, const View& out, int device, cudaStream_t stream) {
  using acc_t = typename R::acc_t;
  const Plan plan = make_plan(in, out);
  const int64_t outputs = out.numel();
  const int64_t len = plan.reduced_sizes.numel();
  if (outputs == 0) return;
  const auto kept =
      make_offset_calc<2>(plan.kept_sizes, {plan.kept_in_strides, plan.kept_out_strides});
  const auto reduced = make_offset_calc<1>(plan.reduced_sizes, {plan.reduced_strides});
  // Few outputs with long slices would leave most of the GPU idle: each slice is split over
  // `splits` blocks (at least 8192 elements each, about four blocks per multiprocessor in all),
  // whose partial accumulators a second kernel merges.
  const int64_t sms = multiprocessors(device);
  if (len >= 16384 && outputs < 2 * sms) {
    const int64_t splits = std::clamp<int64_t>(
        std::min<int64_t>((len + 8191) / 8192, (4 * sms + outputs - 1) / outputs), 1, 1024);
    if (splits > 1) {
      const int64_t chunk = (len + splits - 1) / splits;
      DeviceBuffer partials(device, static_cast<size_t>(outputs * splits) * sizeof(acc_t));
      auto* p = static_cast<acc_t*>(partials.data());
      reduce_split_kernel<R, T><<<static_cast<unsigned>(outputs * splits), kThreads, kThreads * sizeof(acc_t),
                                  stream>>>(in.ptr<T>(), p, len, chunk, static_cast<int>(splits), kept, reduced,
                                            plan.flat);
      KILN_CUDA_CHECK(cudaGetLastError());
      reduce_merge_kernel<R><<<static_cast<unsigned>(outputs), kThreads, kThreads * sizeof(acc_t), stream>>>(
          p, out.ptr<typename R::out_t>(), static_cast<int>(splits), kept);
      KILN_CUDA_CHECK(cudaGetLastError());
      return;
    }
  }
  if (!plan.kept_in_strides.empty() && plan.kept_in_strides.back() == 1 && len >= kRowLanes) {
    // Neighbouring outputs lie side by side: reduce_columns_kernel. The slices are cut into chunks
    // of at least 8 elements a row lane, enough of them for about four blocks per multiprocessor.
    const int64_t column_blocks = std::min<int64_t>((outputs + kColumns - 1) / kColumns, kMaxBlocks);
    int64_t chunks = std::clamp<int64_t>((4 * sms + column_blocks - 1) / column_blocks, 1,
                                         std::max<int64_t>(1, len / (8 * kRowLanes)));
    chunks = std::min<int64_t>(chunks, 65535);  // the grid's y dimension
    const int64_t chunk = (len + chunks - 1) / chunks;
    chunks = (len + chunk - 1) / chunk;  // none empty
    const dim3 grid(static_cast<unsigned>(column_blocks), static_cast<unsigned>(chunks));
    // One chunk writes the results; several write partials for reduce_columns_merge_kernel.
    std::optional<DeviceBuffer> partials;
    acc_t* p = nullptr;
    if (chunks > 1) {
      partials.emplace(device, static_cast<size_t>(outputs * chunks) * sizeof(acc_t));
      p = static_cast<acc_t*>(partials->data());
    }
    reduce_columns_kernel<R, T><<<grid, kThreads, kThreads * sizeof(acc_t), stream>>>(
        in.ptr<T>(), out.ptr<typename R::out_t>(), p, outputs, len, chunk, kept, reduced, plan.flat);
    KILN_CUDA_CHECK(cudaGetLastError());
    if (p != nullptr) {
      reduce_columns_merge_kernel<R><<<blocks_for(outputs), kThreads, 0, stream>>>(
          p, out.ptr<typename R::out_t>(), outputs, chunks, kept);
      KILN_CUDA_CHECK(cudaGetLastError());
    }
    return;
  }
  int group = 1;
  while (group < kThreads && group < len) group *= 2;
  const int per_block = kThreads / group;
  const auto blocks = static_cast<unsigned>(
      std::clamp<int64_t>((outputs + per_block - 1) / per_block, 1, kMaxBlocks));
  reduce_kernel<R, T><<<blocks, kThreads, kThreads * sizeof(acc_t), stream>>>(
      in.ptr<T>(), out.ptr<typename R::out_t>(), outputs, len, kept, reduced, plan.flat, group);
  KILN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void reduce_launch(ReduceKind op, const View& in, const View& out, const Stream& s) {
  if (out.numel() == 0) return;  // nothing to write (as the CPU's reduce_kernel)
  cudaStream_t stream = stream_of(s);
  const int device = s.device.index;
  if (op == ReduceKind::All || op == ReduceKind::Any) {
    KILN_CHECK(in.dtype == kBool, "all/any: the CUDA kernel expects bool input, got {}",
               dtype_name(in.dtype));
    if (op == ReduceKind::All) reduce_with<LogicalR<true>, bool>(in, out, device, stream);
    else reduce_with<LogicalR<false>, bool>(in, out, device, stream);
    return;
  }
  KILN_DISPATCH_NUMERIC_TYPES(in.dtype, "reduce", [&] {
    using T = scalar_t;
    switch (op) {
      case ReduceKind::Sum: return reduce_with<SumR<T>, T>(in, out, device, stream);
      case ReduceKind::Prod: return reduce_with<ProdR<T>, T>(in, out, device, stream);
      case ReduceKind::Max: return reduce_with<ExtremeR<T, true>, T>(in, out, device, stream);
      case ReduceKind::Min: return reduce_with<ExtremeR<T, false>, T>(in, out, device, stream);
      case ReduceKind::ArgMax: return reduce_with<ArgR<T, true>, T>(in, out, device, stream);
      case ReduceKind::ArgMin: return reduce_with<ArgR<T, false>, T>(in, out, device, stream);
      default: KILN_FAIL("reduce: unexpected op");
    }
  });
}

void softmax_launch(const View& in, const View& out, int dim, bool log, const Stream& s) {
  if (out.numel() == 0) return;
  const int64_t len = in.sizes[dim];
  Shape row_sizes = in.sizes;  // every index but `dim`
  row_sizes[dim] = 1;
  const int64_t n_rows = row_sizes.numel();
  const auto rows = make_offset_calc<2>(row_sizes, {in.strides, out.strides});
  const int threads = len <= 32 ? 32 : len <= 64 ? 64 : len <= 128 ? 128 : kThreads;
  const auto blocks = static_cast<unsigned>(std::clamp<int64_t>(n_rows, 1, kMaxBlocks));
  constexpr int kPer = 16;
  if (dim == in.ndim() - 1 && in.is_contiguous() && out.is_contiguous() && len > 128 && len <= kPer * kThreads) {
    KILN_DISPATCH_FLOAT_TYPES(in.dtype, "softmax", [&] {
      // See Note [softmax rows sixteen bytes at a time].
      if (len % Vec16<scalar_t>::kSize == 0 && aligned16(in.data) && aligned16(out.data)) {
        softmax_rows_vec_kernel<scalar_t, kPer><<<blocks, kThreads, 0, stream_of(s)>>>(
            in.ptr<scalar_t>(), out.ptr<scalar_t>(), n_rows, len, log);
        KILN_CUDA_CHECK(cudaGetLastError());
        return;
      }
      softmax_rows_kernel<scalar_t, kPer><<<blocks, kThreads, 0, stream_of(s)>>>(
          in.ptr<scalar_t>(), out.ptr<scalar_t>(), n_rows, len, log);
      KILN_CUDA_CHECK(cudaGetLastError());
    });
    return;
  }
  KILN_DISPATCH_FLOAT_TYPES(in.dtype, "softmax", [&] {
    softmax_kernel<scalar_t><<<blocks, threads, 0, stream_of(s)>>>(
        in.ptr<scalar_t>(), out.ptr<scalar_t>(), n_rows, len, in.strides[dim], out.strides[dim],
        rows, log);
    KILN_CUDA_CHECK(cudaGetLastError());
  });
}

void softmax_backward_launch(const View& y, const View& g, const View& out, int dim, bool log, const Stream& s) {
  if (out.numel() == 0) return;
  const int64_t len = out.sizes[dim];
  Shape row_sizes = out.sizes;  // every index but `dim`
  row_sizes[dim] = 1;
  const int64_t n_rows = row_sizes.numel();
  const auto blocks = static_cast<unsigned>(std::clamp<int64_t>(n_rows, 1, kMaxBlocks));
  constexpr int kPer = 16;
  // See Note [softmax backward in one pass].
  const bool rows_contiguous = dim == out.ndim() - 1 && y.is_contiguous() && g.is_contiguous() && out.is_contiguous();
  bool done = false;
  KILN_DISPATCH_FLOAT_TYPES(out.dtype, "softmax backward", [&] {
    if (rows_contiguous && len <= kPer * kThreads && len % Vec16<scalar_t>::kSize == 0 && aligned16(y.data) &&
        aligned16(g.data) && aligned16(out.data)) {
      softmax_backward_rows_vec_kernel<scalar_t, kPer><<<blocks, kThreads, 0, stream_of(s)>>>(
          y.ptr<scalar_t>(), g.ptr<scalar_t>(), out.ptr<scalar_t>(), n_rows, len, log);
      KILN_CUDA_CHECK(cudaGetLastError());
      done = true;
    }
  });
  if (done) return;
  const auto rows = make_offset_calc<3>(row_sizes, {y.strides, g.strides, out.strides});
  const int threads = len <= 32 ? 32 : len <= 64 ? 64 : len <= 128 ? 128 : kThreads;
  KILN_DISPATCH_FLOAT_TYPES(out.dtype, "softmax backward", [&] {
    softmax_backward_kernel<scalar_t><<<blocks, threads, 0, stream_of(s)>>>(
        y.ptr<scalar_t>(), g.ptr<scalar_t>(), out.ptr<scalar_t>(), n_rows, len, y.strides[dim], g.strides[dim],
        out.strides[dim], rows, log);
    KILN_CUDA_CHECK(cudaGetLastError());
  });
}

}  // namespace kiln::cuda
