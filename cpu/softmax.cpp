// cpu/softmax.cpp: softmax and log_softmax along one dim, one row at a time: max, sum of exp(x - max),
// then the output. Rows are split across threads. Contiguous float32/float64 rows use Eigen's
// vectorized exp; other rows are gathered into a float/double buffer first.
#include <Eigen/Core>
#include <cmath>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/loops.h"

namespace kiln::cpu {
namespace {

template <typename M>
void softmax_row(Eigen::Ref<Eigen::Array<M, Eigen::Dynamic, 1>> x, bool log) {
  if (x.size() == 0) return;
  M mx = x.maxCoeff();
  if (std::isinf(mx) && mx < 0) mx = 0;  // a row of -inf: exp(-inf - 0) = 0, as PyTorch gives nan
  if (log) {
    M lse = std::log((x - mx).exp().sum()) + mx;
    x -= lse;
  } else {
    x = (x - mx).exp();
    x /= x.sum();
  }
}

template <typename T>
void softmax_typed(const View& in, const View& out, int dim, bool log) {
  using M = opmath_t<T>;
  const int64_t len = in.sizes[dim], in_step = in.strides[dim], out_step = out.strides[dim];
  View rows_in = in, rows_out = out;  // every index but `dim`
  rows_in.sizes[dim] = rows_out.sizes[dim] = 1;
  const int64_t rows = rows_in.numel();
  const int nd = in.ndim();
  parallel_for(0, rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(len, 1)), [&](int64_t b, int64_t e) {
    Eigen::Array<M, Eigen::Dynamic, 1> buf(len);
    for (int64_t r = b; r < e; ++r) {
      int64_t rem = r, oi = 0, oo = 0;
      for (int d = nd - 1; d >= 0; --d) {
        int64_t i = rem % rows_in.sizes[d];
        rem /= rows_in.sizes[d];
        oi += i * in.strides[d];
        oo += i * out.strides[d];
      }
      const T* x = in.ptr<T>() + oi;
      T* y = out.ptr<T>() + oo;
      if constexpr (std::is_same_v<T, M>) {
        if (out_step == 1) {  // compute in place in the output row
          Eigen::Map<Eigen::Array<M, Eigen::Dynamic, 1>> row(y, len);
          if (in_step == 1) row = Eigen::Map<const Eigen::Array<M, Eigen::Dynamic, 1>>(x, len);
          else for (int64_t i = 0; i < len; ++i) row[i] = x[i * in_step];
          softmax_row<M>(row, log);
          continue;
        }
      }
      for (int64_t i = 0; i < len; ++i) buf[i] = static_cast<M>(x[i * in_step]);
      softmax_row<M>(buf, log);
      for (int64_t i = 0; i < len; ++i) y[i * out_step] = static_cast<T>(buf[i]);
    }
  });
}

}  // namespace

void softmax_kernel(const View& in, const View& out, int dim, bool log) {
  KILN_DISPATCH_FLOAT_TYPES(in.dtype, "softmax", [&] { softmax_typed<scalar_t>(in, out, dim, log); });
}

}  // namespace kiln::cpu
