// cuda/elementwise.cu: the elementwise kernels of the CUDA backend: unary and binary ops, where.
// CPU sibling: cpu/elementwise.cpp. The math is core/scalar_math.h's (shared with the CPU),
// computed in opmath_t; strided and broadcast (stride 0) views go through OffsetCalc
// (cuda/loops.cuh). One kernel per output dtype: the op is a runtime value every thread shares,
// which keeps the instantiations (and the build) small; a few long unary ops also have vectorized
// kernels of their own (Note [unary ops compiled one by one]). When the output and every input are
// contiguous views of one shape and dtype with 16-byte aligned data (most unary and binary ops in
// a network), the vectorized kernels below move 16 bytes per load and store; so do binary ops of a
// full operand and a row repeated over its leading dims (a bias).
#include <cmath>
#include <type_traits>

#include "core/scalar_math.h"
#include "cuda/context.h"
#include "cuda/kernels.h"
#include "cuda/loops.cuh"

namespace kiln::cuda {
namespace {

// ---- vectorized kernels (contiguous, one dtype, 16-byte aligned) ----

// y[i] = f(x[i]): thread t moves 16-byte vectors t, t + step, ...; the last n % kSize elements are
// done one by one.
template <typename T, typename F>
__global__ void unary_vec_kernel(int64_t n, const T* x, T* y, F f) {
  constexpr int V = Vec16<T>::kSize;
  const int64_t nv = n / V, step = static_cast<int64_t>(blockDim.x) * gridDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = tid; i < nv; i += step) {
    const Vec16<T> a = reinterpret_cast<const Vec16<T>*>(x)[i];
    Vec16<T> r;
    KILN_CUDA_UNROLL
    for (int e = 0; e < V; ++e) r.v[e] = f(a.v[e]);
    reinterpret_cast<Vec16<T>*>(y)[i] = r;
  }
  for (int64_t i = nv * V + tid; i < n; i += step) y[i] = f(x[i]);
}

// y[i] = f(x[i], z[i]), likewise.
template <typename T, typename F>
__global__ void binary_vec_kernel(int64_t n, const T* x, const T* z, T* y, F f) {
  constexpr int V = Vec16<T>::kSize;
  const int64_t nv = n / V, step = static_cast<int64_t>(blockDim.x) * gridDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = tid; i < nv; i += step) {
    const Vec16<T> a = reinterpret_cast<const Vec16<T>*>(x)[i];
    const Vec16<T> b = reinterpret_cast<const Vec16<T>*>(z)[i];
    Vec16<T> r;
    KILN_CUDA_UNROLL
    for (int e = 0; e < V; ++e) r.v[e] = f(a.v[e], b.v[e]);
    reinterpret_cast<Vec16<T>*>(y)[i] = r;
  }
  for (int64_t i = nv * V + tid; i < n; i += step) y[i] = f(x[i], z[i]);
}

// y[i] = f(x[i], z[i], w[i]), likewise (addcmul, addcdiv, lerp).
template <typename T, typename F>
__global__ void ternary_vec_kernel(int64_t n, const T* x, const T* z, const T* w, T* y, F f) {
  constexpr int V = Vec16<T>::kSize;
  const int64_t nv = n / V, step = static_cast<int64_t>(blockDim.x) * gridDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = tid; i < nv; i += step) {
    const Vec16<T> a = reinterpret_cast<const Vec16<T>*>(x)[i];
    const Vec16<T> b = reinterpret_cast<const Vec16<T>*>(z)[i];
    const Vec16<T> c = reinterpret_cast<const Vec16<T>*>(w)[i];
    Vec16<T> r;
    KILN_CUDA_UNROLL
    for (int e = 0; e < V; ++e) r.v[e] = f(a.v[e], b.v[e], c.v[e]);
    reinterpret_cast<Vec16<T>*>(y)[i] = r;
  }
  for (int64_t i = nv * V + tid; i < n; i += step) y[i] = f(x[i], z[i], w[i]);
}

// y = f(x, row) or f(row, x) (kRowFirst) where `row` is a block of L elements repeated over x's
// leading dims (a bias added to every row): vector i of x meets vector i mod (L / kSize) of the row.
// L is a multiple of kSize, so no vector straddles two rows and n has no tail.
template <typename T, bool kRowFirst, typename F>
__global__ void binary_row_vec_kernel(int64_t n, const T* x, const T* row, uint32_t row_vectors, T* y, F f) {
  constexpr int V = Vec16<T>::kSize;
  const int64_t nv = n / V, step = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < nv; i += step) {
    const Vec16<T> a = reinterpret_cast<const Vec16<T>*>(x)[i];
    const Vec16<T> b = reinterpret_cast<const Vec16<T>*>(row)[static_cast<uint32_t>(i) % row_vectors];
    Vec16<T> r;
    KILN_CUDA_UNROLL
    for (int e = 0; e < V; ++e) r.v[e] = kRowFirst ? f(b.v[e], a.v[e]) : f(a.v[e], b.v[e]);
    reinterpret_cast<Vec16<T>*>(y)[i] = r;
  }
}

// When `v` (of out's sizes) repeats one contiguous block over its leading dims (their strides 0),
// the block's length; else 0.
int64_t repeated_row(const View& v) {
  int64_t length = 1;
  int d = v.ndim() - 1;
  for (; d >= 0; --d) {
    if (v.sizes[d] == 1) continue;
    if (v.strides[d] != length) break;
    length *= v.sizes[d];
  }
  for (; d >= 0; --d) {
    if (v.sizes[d] != 1 && v.strides[d] != 0) return 0;
  }
  return length;
}

// Whether `v` is a contiguous view of out's shape and dtype, 16-byte aligned: the vectorized path.
bool vectorizable(const View& v, const View& out) {
  return v.dtype == out.dtype && v.sizes == out.sizes && v.is_contiguous() && aligned16(v.data);
}

// Note [unary ops compiled one by one]: the generic kernels take the op as a value every thread
// shares, so each element goes through math::unary's switch: about ten compares and branches, and
// the four elements of a vector computed one after the other, the branches standing between them.
// For the ops whose math is long (exp, tanh, erfc...) that leaves the memory waiting. Their
// vectorized kernel on float32, float16 and bfloat16 is therefore also compiled for each op on its
// own (FixedUnary), where the switch folds away and the compiler can interleave the four elements.
// The same function computes each element, so the values are those of the generic kernel.
template <typename T, UnaryOp kOp>
struct FixedUnary {
  double a, b;
  __device__ T operator()(T v) const {
    using M = opmath_t<T>;
    return static_cast<T>(math::unary<M>(kOp, static_cast<M>(v), a, b));
  }
};

template <typename T, UnaryOp kOp>
void launch_fixed_unary(int64_t n, const T* x, T* y, double a, double b, cudaStream_t stream) {
  unary_vec_kernel<<<blocks_for(n / Vec16<T>::kSize + 1), kThreads, 0, stream>>>(n, x, y, FixedUnary<T, kOp>{a, b});
  KILN_CUDA_CHECK(cudaGetLastError());
}

// The vectorized kernel of one of the ops of Note [unary ops compiled one by one]; false for the
// others.
template <typename T>
bool launch_fixed_unary(UnaryOp op, int64_t n, const T* x, T* y, double a, double b, cudaStream_t stream) {
  switch (op) {
    case UnaryOp::Exp: launch_fixed_unary<T, UnaryOp::Exp>(n, x, y, a, b, stream); return true;
    case UnaryOp::Log: launch_fixed_unary<T, UnaryOp::Log>(n, x, y, a, b, stream); return true;
    case UnaryOp::Tanh: launch_fixed_unary<T, UnaryOp::Tanh>(n, x, y, a, b, stream); return true;
    case UnaryOp::Sigmoid: launch_fixed_unary<T, UnaryOp::Sigmoid>(n, x, y, a, b, stream); return true;
    case UnaryOp::GeluErf: launch_fixed_unary<T, UnaryOp::GeluErf>(n, x, y, a, b, stream); return true;
    case UnaryOp::GeluTanh: launch_fixed_unary<T, UnaryOp::GeluTanh>(n, x, y, a, b, stream); return true;
    case UnaryOp::Silu: launch_fixed_unary<T, UnaryOp::Silu>(n, x, y, a, b, stream); return true;
    default: return false;
  }
}

// out = op(a, b, c, v) with the op fixed at compile time, so that math::ternary's switch folds away.
template <typename T, TernaryOp kOp>
void launch_ternary(const View& a, const View& b, const View& c, const View& out, double v, const Stream& s) {
  using M = opmath_t<T>;
  const int64_t n = out.numel();
  const M vm = static_cast<M>(v);
  const T* x = a.ptr<T>();
  const T* z = b.ptr<T>();
  const T* w = c.ptr<T>();
  T* y = out.ptr<T>();
  auto f = [=] __device__(T p, T q, T r) {
    return static_cast<T>(math::ternary<M>(kOp, static_cast<M>(p), static_cast<M>(q), static_cast<M>(r), vm));
  };
  if (vectorizable(out, out) && vectorizable(a, out) && vectorizable(b, out) && vectorizable(c, out)) {
    ternary_vec_kernel<<<blocks_for(n / Vec16<T>::kSize + 1), kThreads, 0, stream_of(s)>>>(n, x, z, w, y, f);
    KILN_CUDA_CHECK(cudaGetLastError());
    return;
  }
  launch_elementwise(n, make_offset_calc<4>({&out, &a, &b, &c}), stream_of(s),
                     [=] __device__(int64_t, const int64_t* o) { y[o[0]] = f(x[o[1]], z[o[2]], w[o[3]]); });
}

}  // namespace

// ---- launchers ----
// Every kernel here is elementwise_kernel (cuda/loops.cuh) with a per-element lambda below, or one
// of the vectorized kernels above.

void unary_launch(UnaryOp op, const View& in, const View& out, UnaryArgs args, const Stream& s) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const auto calc = make_offset_calc<2>({&out, &in});
  if (op == UnaryOp::LogicalNot) {  // any dtype in, bool out
    KILN_DISPATCH_ALL_TYPES(in.dtype, "logical_not", [&] {
      const scalar_t* x = in.ptr<scalar_t>();
      bool* y = out.ptr<bool>();
      launch_elementwise(n, calc, stream_of(s), [=] __device__(int64_t, const int64_t* o) {
        y[o[0]] = !convert<bool>(x[o[1]]);
      });
    });
    return;
  }
  const double a = args.a, b = args.b;
  KILN_DISPATCH_NUMERIC_TYPES(in.dtype, "unary op", [&] {
    using M = opmath_t<scalar_t>;
    const scalar_t* x = in.ptr<scalar_t>();
    scalar_t* y = out.ptr<scalar_t>();
    if (vectorizable(out, out) && vectorizable(in, out)) {
      if constexpr (std::is_same_v<M, float>) {
        if (launch_fixed_unary(op, n, x, y, a, b, stream_of(s))) return;
      }
      unary_vec_kernel<<<blocks_for(n / Vec16<scalar_t>::kSize + 1), kThreads, 0, stream_of(s)>>>(
          n, x, y, [=] __device__(scalar_t v) { return static_cast<scalar_t>(math::unary<M>(op, static_cast<M>(v), a, b)); });
      KILN_CUDA_CHECK(cudaGetLastError());
      return;
    }
    launch_elementwise(n, calc, stream_of(s), [=] __device__(int64_t, const int64_t* o) {
      y[o[0]] = static_cast<scalar_t>(math::unary<M>(op, static_cast<M>(x[o[1]]), a, b));
    });
  });
}

void binary_launch(BinaryOp op, const View& a, const View& b, const View& out, double alpha,
                   const Stream& s) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const auto calc = make_offset_calc<3>({&out, &a, &b});
  if (is_comparison(op)) {  // any dtype in, bool out
    KILN_DISPATCH_ALL_TYPES(a.dtype, "comparison", [&] {
      using M = opmath_t<scalar_t>;
      const scalar_t* x = a.ptr<scalar_t>();
      const scalar_t* z = b.ptr<scalar_t>();
      bool* y = out.ptr<bool>();
      launch_elementwise(n, calc, stream_of(s), [=] __device__(int64_t, const int64_t* o) {
        y[o[0]] = math::compare<M>(op, static_cast<M>(x[o[1]]), static_cast<M>(z[o[2]]));
      });
    });
    return;
  }
  KILN_DISPATCH_NUMERIC_TYPES(a.dtype, "binary op", [&] {
    using M = opmath_t<scalar_t>;
    const M alpha_m = static_cast<M>(alpha);
    const scalar_t* x = a.ptr<scalar_t>();
    const scalar_t* z = b.ptr<scalar_t>();
    scalar_t* y = out.ptr<scalar_t>();
    auto f = [=] __device__(scalar_t u, scalar_t v) {
      return static_cast<scalar_t>(math::binary<M>(op, static_cast<M>(u), static_cast<M>(v), alpha_m));
    };
    constexpr int V = Vec16<scalar_t>::kSize;
    if (vectorizable(out, out) && vectorizable(a, out) && vectorizable(b, out)) {
      binary_vec_kernel<<<blocks_for(n / V + 1), kThreads, 0, stream_of(s)>>>(n, x, z, y, f);
      KILN_CUDA_CHECK(cudaGetLastError());
      return;
    }
    // One operand full, the other a row repeated over the leading dims (x + bias).
    if (vectorizable(out, out) && n / V <= static_cast<int64_t>(UINT32_MAX)) {
      const bool a_full = vectorizable(a, out), b_full = vectorizable(b, out);
      const View& row = a_full ? b : a;
      const int64_t length = a_full != b_full && row.dtype == out.dtype && aligned16(row.data) ? repeated_row(row) : 0;
      if (length > 0 && length < n && length % V == 0) {
        const auto row_vectors = static_cast<uint32_t>(length / V);
        if (a_full) {
          binary_row_vec_kernel<scalar_t, false><<<blocks_for(n / V), kThreads, 0, stream_of(s)>>>(
              n, x, z, row_vectors, y, f);
        } else {
          binary_row_vec_kernel<scalar_t, true><<<blocks_for(n / V), kThreads, 0, stream_of(s)>>>(
              n, z, x, row_vectors, y, f);
        }
        KILN_CUDA_CHECK(cudaGetLastError());
        return;
      }
    }
    launch_elementwise(n, calc, stream_of(s), [=] __device__(int64_t, const int64_t* o) {
      y[o[0]] = static_cast<scalar_t>(
          math::binary<M>(op, static_cast<M>(x[o[1]]), static_cast<M>(z[o[2]]), alpha_m));
    });
  });
}

void where_launch(const View& cond, const View& a, const View& b, const View& out,
                  const Stream& s) {
  const int64_t n = out.numel();
  if (n == 0) return;
  KILN_CHECK(cond.dtype == kBool, "where: the condition must be bool, got {}",
             dtype_name(cond.dtype));
  const auto calc = make_offset_calc<4>({&out, &cond, &a, &b});
  const bool* c = cond.ptr<bool>();
  // where only moves elements: dispatch on the element size.
  KILN_DISPATCH_BY_SIZE(out.dtype, "where", [&] {
    const bits_t* x = a.ptr<bits_t>();
    const bits_t* z = b.ptr<bits_t>();
    bits_t* y = out.ptr<bits_t>();
    launch_elementwise(n, calc, stream_of(s), [=] __device__(int64_t, const int64_t* o) {
      y[o[0]] = c[o[1]] ? x[o[2]] : z[o[3]];
    });
  });
}

// Integers have addcmul only (math::ternary ignores the op for them: ops/ sends no other), so they
// are compiled once; the floating types once per op.
void ternary_launch(TernaryOp op, const View& a, const View& b, const View& c, const View& out, double v,
                    const Stream& s) {
  if (out.numel() == 0) return;
  KILN_DISPATCH_NUMERIC_TYPES(out.dtype, "ternary op", [&] {
    if constexpr (std::is_integral_v<scalar_t>) {
      KILN_CHECK(op == TernaryOp::Addcmul, "ternary op: integers take addcmul only");
      launch_ternary<scalar_t, TernaryOp::Addcmul>(a, b, c, out, v, s);
    } else {
      switch (op) {
        case TernaryOp::Addcmul: return launch_ternary<scalar_t, TernaryOp::Addcmul>(a, b, c, out, v, s);
        case TernaryOp::Addcdiv: return launch_ternary<scalar_t, TernaryOp::Addcdiv>(a, b, c, out, v, s);
        case TernaryOp::Lerp: return launch_ternary<scalar_t, TernaryOp::Lerp>(a, b, c, out, v, s);
        case TernaryOp::LerpScalar: return launch_ternary<scalar_t, TernaryOp::LerpScalar>(a, b, c, out, v, s);
      }
    }
  });
}

}  // namespace kiln::cuda
