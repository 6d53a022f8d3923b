// cpu/binary.cpp: elementwise binary ops (with broadcasting already in the strides) and where().
// The contiguous and scalar-broadcast runs are plain loops the compiler vectorizes.
#include "core/scalar_math.h"
#include "cpu/convert.h"
#include "cpu/kernels.h"
#include "cpu/loops.h"

namespace kiln::cpu {
namespace {

// out[i] = f(a[i], b[i]) over one run, with the three common stride patterns specialized.
template <typename T, typename R, typename F>
inline void binary_run(char* const* p, const int64_t* s, int64_t n, const F& f) {
  constexpr int64_t kT = sizeof(T), kR = sizeof(R);
  R* out = reinterpret_cast<R*>(p[0]);
  const T* a = reinterpret_cast<const T*>(p[1]);
  const T* b = reinterpret_cast<const T*>(p[2]);
  if (s[0] == kR && s[1] == kT && s[2] == kT) {
    for (int64_t i = 0; i < n; ++i) out[i] = f(a[i], b[i]);
  } else if (s[0] == kR && s[1] == kT && s[2] == 0) {
    const T bv = *b;
    for (int64_t i = 0; i < n; ++i) out[i] = f(a[i], bv);
  } else if (s[0] == kR && s[1] == 0 && s[2] == kT) {
    const T av = *a;
    for (int64_t i = 0; i < n; ++i) out[i] = f(av, b[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) at<R>(p[0], i * s[0]) = f(at<T>(p[1], i * s[1]), at<T>(p[2], i * s[2]));
  }
}

template <typename T>
void arithmetic(BinaryOp op, const StridedLoop<3>& loop, double alpha_d) {
  using M = opmath_t<T>;
  const M alpha = static_cast<M>(alpha_d);
  auto run = [&](auto f) {
    loop.parallel_run([&](char* const* p, const int64_t* s, int64_t n) { binary_run<T, T>(p, s, n, f); });
  };
  auto cvt = [](M v) { return static_cast<T>(v); };
  // The four hot ops get their own loops so the compiler sees straight-line arithmetic.
  switch (op) {
    case BinaryOp::Add:
      if (alpha == M(1)) return run([&](T x, T y) { return cvt(M(x) + M(y)); });
      return run([&](T x, T y) { return cvt(M(x) + alpha * M(y)); });
    case BinaryOp::Sub:
      if (alpha == M(1)) return run([&](T x, T y) { return cvt(M(x) - M(y)); });
      return run([&](T x, T y) { return cvt(M(x) - alpha * M(y)); });
    case BinaryOp::Mul: return run([&](T x, T y) { return cvt(M(x) * M(y)); });
    case BinaryOp::Div: return run([&](T x, T y) { return cvt(M(x) / M(y)); });
    default: return run([&](T x, T y) { return cvt(math::binary<M>(op, M(x), M(y), alpha)); });
  }
}

}  // namespace

void binary_kernel(BinaryOp op, const View& a, const View& b, const View& out, double alpha) {
  StridedLoop<3> loop({&out, &a, &b});
  if (is_comparison(op)) {
    KILN_DISPATCH_ALL_TYPES(a.dtype, "comparison", [&] {
      using M = opmath_t<scalar_t>;
      loop.parallel_run([op](char* const* p, const int64_t* s, int64_t n) {
        binary_run<scalar_t, bool>(p, s, n, [op](scalar_t x, scalar_t y) {
          return math::compare<M>(op, static_cast<M>(x), static_cast<M>(y));
        });
      });
    });
    return;
  }
  KILN_DISPATCH_NUMERIC_TYPES(a.dtype, "binary op", [&] { arithmetic<scalar_t>(op, loop, alpha); });
}

void where_kernel(const View& cond, const View& a, const View& b, const View& out) {
  StridedLoop<4> loop({&out, &cond, &a, &b});
  KILN_DISPATCH_ALL_TYPES(out.dtype, "where", [&] {
    loop.parallel_run([](char* const* p, const int64_t* s, int64_t n) {
      for (int64_t i = 0; i < n; ++i) {
        at<scalar_t>(p[0], i * s[0]) =
            at<bool>(p[1], i * s[1]) ? at<scalar_t>(p[2], i * s[2]) : at<scalar_t>(p[3], i * s[3]);
      }
    });
  });
}

}  // namespace kiln::cpu
