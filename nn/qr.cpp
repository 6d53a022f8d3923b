// nn/qr.cpp: see nn/qr.h.
#include "nn/qr.h"

#include <cmath>

namespace kiln::nn::detail {

std::vector<double> geqrf(std::vector<double>& a, int64_t m, int64_t n) {
  std::vector<double> tau(static_cast<size_t>(n), 0.0);
  auto at = [&](int64_t i, int64_t j) -> double& { return a[static_cast<size_t>(i * n + j)]; };
  for (int64_t j = 0; j < n; ++j) {
    double below = 0;
    for (int64_t i = j + 1; i < m; ++i) below += at(i, j) * at(i, j);
    if (below == 0) continue;
    const double alpha = at(j, j), beta = -std::copysign(std::sqrt(alpha * alpha + below), alpha);
    tau[j] = (beta - alpha) / beta;
    for (int64_t i = j + 1; i < m; ++i) at(i, j) /= alpha - beta;
    at(j, j) = beta;
    for (int64_t c = j + 1; c < n; ++c) {  // H_j applied to the columns right of j
      double s = at(j, c);
      for (int64_t i = j + 1; i < m; ++i) s += at(i, j) * at(i, c);
      s *= tau[j];
      at(j, c) -= s;
      for (int64_t i = j + 1; i < m; ++i) at(i, c) -= s * at(i, j);
    }
  }
  return tau;
}

std::vector<double> q_factor(std::vector<double> a, int64_t m, int64_t n) {
  const std::vector<double> tau = geqrf(a, m, n);
  auto v = [&](int64_t i, int64_t j) { return a[static_cast<size_t>(i * n + j)]; };
  // LAPACK's orgqr: H_{n-1}, ..., H_0 applied in turn to the identity's first n columns.
  std::vector<double> q(static_cast<size_t>(m * n), 0.0);
  auto at = [&](int64_t i, int64_t j) -> double& { return q[static_cast<size_t>(i * n + j)]; };
  for (int64_t j = 0; j < n; ++j) at(j, j) = 1;
  for (int64_t j = n - 1; j >= 0; --j) {
    for (int64_t c = j; c < n; ++c) {  // H_j leaves the columns c < j of the partial product alone
      double s = at(j, c);
      for (int64_t i = j + 1; i < m; ++i) s += v(i, j) * at(i, c);
      s *= tau[j];
      at(j, c) -= s;
      for (int64_t i = j + 1; i < m; ++i) at(i, c) -= s * v(i, j);
    }
  }
  for (int64_t c = 0; c < n; ++c) {
    const double r = v(c, c), sign = r > 0 ? 1.0 : r < 0 ? -1.0 : 0.0;
    for (int64_t i = 0; i < m; ++i) at(i, c) *= sign;
  }
  return q;
}

}  // namespace kiln::nn::detail
