// cpu/norm.cpp: normalisation of the rows of a contiguous (R, M) view (layer_norm, rms_norm and, through
// reshapes in ops/norm.cpp, group_norm and batch_norm): per row, mean and rstd = 1 / sqrt(var + eps)
// accumulated in double (two passes: a one-pass sum of squares loses digits when |mean| >> std), then
// out = (x - mean) * rstd. Rows are split over the pool of cpu/parallel.h.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "cpu/kernels.h"
#include "cpu/parallel.h"
#include "cpu/row_sums.h"

namespace kiln::cpu {
namespace {

template <typename T>
void norm_rows_typed(const View& in, const View& out, const View& mean, const View& rstd, double eps,
                     bool rms) {
  const int64_t R = in.sizes[0], M = in.sizes[1];
  const T* x = in.ptr<T>();
  T* y = out.ptr<T>();
  T* mu = mean.ptr<T>();
  T* rs = rstd.ptr<T>();
  parallel_for(0, R, std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(M, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * M;
      T* yr = y + r * M;
      double m = 0, inv = 0;
      row_statistics(xr, M, rms, eps, m, inv);
      const T tm = static_cast<T>(m), ti = static_cast<T>(inv);
      for (int64_t i = 0; i < M; ++i) yr[i] = (xr[i] - tm) * ti;
      mu[r] = tm;
      rs[r] = ti;
    }
  });
}

}  // namespace

void norm_rows_kernel(const View& in, const View& out, const View& mean, const View& rstd, double eps,
                      bool rms) {
  KILN_DISPATCH_F32_F64(out.dtype, "norm", [&] { norm_rows_typed<scalar_t>(in, out, mean, rstd, eps, rms); });
}

}  // namespace kiln::cpu
