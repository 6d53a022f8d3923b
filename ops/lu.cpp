// ops/lu.cpp: the LU factorization as PyTorch's torch.linalg exposes it: linalg::lu_factor,
// linalg::lu_factor_ex, linalg::lu, lu_unpack and linalg::lu_solve, with their gradients.
//
// P A = L U by Gaussian elimination with partial pivoting (ops/solve.cpp's, here for any m x n and
// keeping the pivots), on the host in float64, one matrix after another, the result rounded once to
// A's dtype. The factors are returned packed as LAPACK's getrf leaves them: L's multipliers below the
// diagonal (its unit diagonal implied), U on and above it, and pivots, int32 and 1-based, where row j
// was exchanged with row pivots[j] - 1 at step j. A zero pivot does not stop the elimination (getrf's
// rule); info names the first one (0 if none), and lu_factor makes it an Error, as PyTorch's does.
//
// lu_unpack, lu and lu_solve are compositions (tril, triu, a permutation matrix, solve_triangular), so
// their gradients come from lu_factor's, which is PyTorch's (Note [the gradient of A = P L U]).
#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "ops/dispatch.h"
#include "ops/host_linalg.h"
#include "ops/ops.h"
#include "ops/record.h"

namespace kiln {

using autograd::Grads;
using autograd::record;
using autograd::SavedTensor;
using autograd::should_record;
using autograd::TensorList;
using host_linalg::check_float_matrices;
using host_linalg::host_copy;
using host_linalg::leading;

namespace {

// P A = L U in place of a (m x n, row-major), k = min(m, n) steps; pivots (k, 1-based). Without
// pivoting, pivots[j] = j + 1. Returns 0, or the first (1-based) j whose pivot U_jj is 0.
int32_t lu_rectangular(double* a, int64_t m, int64_t n, int32_t* pivots, bool pivot) {
  int32_t info = 0;
  for (int64_t j = 0; j < std::min(m, n); ++j) {
    int64_t p = j;  // the first row of the largest |a[i][j]|, i >= j
    if (pivot) {
      for (int64_t i = j + 1; i < m; ++i)
        if (std::abs(a[i * n + j]) > std::abs(a[p * n + j])) p = i;
    }
    pivots[j] = static_cast<int32_t>(p + 1);
    if (p != j) std::swap_ranges(a + j * n, a + (j + 1) * n, a + p * n);
    const double d = a[j * n + j];
    if (d == 0) {  // with pivoting the column below is 0 too: nothing to eliminate
      if (info == 0) info = static_cast<int32_t>(j + 1);
      continue;
    }
    for (int64_t i = j + 1; i < m; ++i) {
      const double f = a[i * n + j] / d;
      a[i * n + j] = f;
      for (int64_t c = j + 1; c < n; ++c) a[i * n + c] -= f * a[j * n + c];
    }
  }
  return info;
}

void check_pivots(const Tensor& lu, const Tensor& pivots, const char* op) {
  const int64_t k = std::min(lu.size(-2), lu.size(-1));
  KILN_CHECK(pivots.dtype() == kInt32, "{}: pivots must be int32 (as lu_factor returns them), got {}", op,
             dtype_name(pivots.dtype()));
  Shape expected = leading(lu, 2);
  expected.push_back(k);
  KILN_CHECK(pivots.sizes() == expected, "{}: pivots must have shape {} for LU {}, got {}", op, expected.str(),
             lu.sizes().str(), pivots.sizes().str());
}

// Each pivot (host, contiguous, int32, (*, k)) a 1-based row at or below its step j and at most m.
void check_pivot_range(const Tensor& pivots, int64_t m, const char* op) {
  const int64_t k = pivots.size(-1);
  const int32_t* pv = pivots.data_ptr<int32_t>();
  for (int64_t i = 0; i < pivots.numel(); ++i) {
    const int64_t j = i % k;
    KILN_CHECK(pv[i] >= j + 1 && pv[i] <= m,
               "{}: pivots[{}] is {}, outside [{}, {}]: pivots must be 1-based rows at or below their step, as "
               "lu_factor returns them",
               op, j, pv[i], j + 1, m);
  }
}

// The m x m permutation matrices P (A = P L U) of a batch of pivots (*, k), in `options`; P[idx_i][i] =
// 1 where idx is 0 .. m - 1 with each exchange j <-> pivots[j] - 1 applied in turn.
Tensor permutation_from_pivots(const Tensor& pivots, int64_t m, TensorOptions options, const char* op) {
  const int64_t k = pivots.size(-1);
  Shape shape = leading(pivots, 1);
  const int64_t batch = shape.numel();
  shape.push_back(m), shape.push_back(m);
  Tensor p = zeros(shape, TensorOptions(kFloat64));
  const Tensor piv = host_copy(pivots);
  check_pivot_range(piv, m, op);
  std::vector<int64_t> idx(static_cast<size_t>(m));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < m; ++i) idx[i] = i;
    const int32_t* pv = piv.data_ptr<int32_t>() + b * k;
    for (int64_t j = 0; j < k; ++j) std::swap(idx[j], idx[pv[j] - 1]);
    double* pb = p.data_ptr<double>() + b * m * m;
    for (int64_t i = 0; i < m; ++i) pb[idx[i] * m + i] = 1;
  }
  return p.to(options.dtype()).to(options.device());
}

// L (*, m, k) with its unit diagonal and U (*, k, n) from packed factors (*, m, n): compositions of
// tril and triu, so the gradients of L and U reach LU.
std::tuple<Tensor, Tensor> unpack_factors(const Tensor& lu) {
  const int64_t m = lu.size(-2), n = lu.size(-1), k = std::min(m, n);
  const Tensor l = lu.narrow(-1, 0, k).tril(-1) + eye(m, k, lu.options());
  const Tensor u = lu.narrow(-2, 0, k).triu();
  return {l, u};
}

// Note [the gradient of A = P L U]
// Square: P^T dA = dL U + L dU, so L^-1 P^T dA U^-1 = L^-1 dL + dU U^-1, the first strictly lower,
// the second upper triangular. Hence dA's gradient P L^-T Phi U^-T with Phi = tril(L^T gL, -1) +
// triu(gU U^T). Wide (m < n), U = [U1 | U2]: U2 = L^-1 P^T A2, so A2's gradient is P L^-T gU2 and
// L's gradient gains -L^-T gU2 U2^T; then the square case for [L, U1]. Tall (m > n), L = [L1; L2]:
// L2 = A2 U^-1 (rows of P^T A), so A2's gradient is gL2 U^-T and U's gains -L2^T gL2 U^-T; then the
// square case for [L1, U]. (PyTorch's linalg_lu_backward, the same algebra.)
Tensor lu_square_backward(const Tensor& gl, const Tensor& gu, const Tensor& l, const Tensor& u) {
  const Tensor phi = matmul(l.mT(), gl).tril(-1) + matmul(gu, u.mT()).triu();
  const Tensor left = linalg::solve_triangular(l.mT(), phi, true, true, true);  // L^-T Phi
  return linalg::solve_triangular(u.mT(), left, false, false);                  // (L^-T Phi) U^-T
}

// dA from the gradient of packed LU (P, L, U unpacked from it).
Tensor lu_factor_backward(const Tensor& g, const Tensor& p, const Tensor& l, const Tensor& u) {
  const int64_t m = l.size(-2), n = u.size(-1), k = std::min(m, n);
  const Tensor gl = g.narrow(-1, 0, k).tril(-1), gu = g.narrow(-2, 0, k).triu();  // L's unit diagonal: none
  if (m == n) return matmul(p, lu_square_backward(gl, gu, l, u));
  if (m < n) {
    const Tensor u1 = u.narrow(-1, 0, m), u2 = u.narrow(-1, m, n - m);
    const Tensor gu1 = gu.narrow(-1, 0, m), gu2 = gu.narrow(-1, m, n - m);
    const Tensor lt_gu2 = linalg::solve_triangular(l.mT(), gu2, true, true, true);  // L^-T gU2
    const Tensor ga1 = lu_square_backward(gl - matmul(lt_gu2, u2.mT()), gu1, l, u1);
    return matmul(p, cat({ga1, lt_gu2}, -1));
  }
  const Tensor l1 = l.narrow(-2, 0, n), l2 = l.narrow(-2, n, m - n);
  const Tensor gl1 = gl.narrow(-2, 0, n), gl2 = gl.narrow(-2, n, m - n);
  const Tensor ga2 = linalg::solve_triangular(u.mT(), gl2, false, false);  // gL2 U^-T
  const Tensor ga1 = lu_square_backward(gl1, gu - matmul(l2.mT(), ga2), l1, u);
  return matmul(p, cat({ga1, ga2}, -2));
}

// X for each of the batch's packed factors lu (batch, n, n) and right-hand sides x (batch, n, k; solved
// in place), both contiguous float64 on the host: the row exchanges and two substitutions on the packed
// factors, without forming P, L or U (lu_solve when no gradient is recorded).
void lu_solve_packed(const double* lu, const int32_t* pivots, double* x, int64_t batch, int64_t n, int64_t k,
                     bool adjoint) {
  for (int64_t b = 0; b < batch; ++b) {
    const double* f = lu + b * n * n;
    const int32_t* pv = pivots + b * n;
    double* r = x + b * n * k;
    auto swap_rows = [&](int64_t j) {
      if (pv[j] - 1 != j) std::swap_ranges(r + j * k, r + (j + 1) * k, r + (pv[j] - 1) * k);
    };
    if (!adjoint) {  // P^T B, then L y = P^T B (unit diagonal), then U x = y
      for (int64_t j = 0; j < n; ++j) swap_rows(j);
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t q = 0; q < i; ++q) {
          for (int64_t c = 0; c < k; ++c) r[i * k + c] -= f[i * n + q] * r[q * k + c];
        }
      }
      for (int64_t i = n - 1; i >= 0; --i) {
        for (int64_t q = i + 1; q < n; ++q) {
          for (int64_t c = 0; c < k; ++c) r[i * k + c] -= f[i * n + q] * r[q * k + c];
        }
        for (int64_t c = 0; c < k; ++c) r[i * k + c] /= f[i * n + i];
      }
    } else {  // U^T y = B, then L^T z = y (unit diagonal), then x = P z (the exchanges in reverse)
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t q = 0; q < i; ++q) {
          for (int64_t c = 0; c < k; ++c) r[i * k + c] -= f[q * n + i] * r[q * k + c];
        }
        for (int64_t c = 0; c < k; ++c) r[i * k + c] /= f[i * n + i];
      }
      for (int64_t i = n - 1; i >= 0; --i) {
        for (int64_t q = i + 1; q < n; ++q) {
          for (int64_t c = 0; c < k; ++c) r[i * k + c] -= f[q * n + i] * r[q * k + c];
        }
      }
      for (int64_t j = n - 1; j >= 0; --j) swap_rows(j);
    }
  }
}

}  // namespace

inline namespace ops {
namespace linalg {

std::tuple<Tensor, Tensor, Tensor> lu_factor_ex(const Tensor& a, bool pivot, bool check_errors) {
  const char* op = "linalg.lu_factor_ex";
  check_float_matrices(a, "A", op);
  const int64_t m = a.size(-2), n = a.size(-1), k = std::min(m, n);
  Shape piv_shape = leading(a, 2);
  const int64_t batch = piv_shape.numel();
  piv_shape.push_back(k);
  Tensor lu = host_copy(a).to(kFloat64);
  Tensor pivots = empty(piv_shape, TensorOptions(kInt32)), info = zeros(leading(a, 2), TensorOptions(kInt32));
  for (int64_t b = 0; b < batch && m * n > 0; ++b) {
    info.data_ptr<int32_t>()[b] =
        lu_rectangular(lu.data_ptr<double>() + b * m * n, m, n, pivots.data_ptr<int32_t>() + b * k, pivot);
  }
  if (check_errors) {
    for (int64_t b = 0; b < batch; ++b) {
      const int32_t i = info.data_ptr<int32_t>()[b];
      KILN_CHECK(i == 0,
                 "{}: U[{}, {}] is zero{}: the matrix is singular, and solving with these factors would divide by "
                 "zero; check the matrix, or call it with check_errors false and read info",
                 op, i, i, a.dim() > 2 ? fmt::format(" in batch element {}", b) : std::string());
    }
  }
  lu = lu.to(a.dtype()).to(a.device());
  pivots = pivots.to(a.device());
  info = info.to(a.device());
  if (should_record(a)) {
    const Tensor perm = permutation_from_pivots(pivots, m, a.options(), op);
    record("LinalgLuFactorExBackward", {a}, {lu},
           [lus = SavedTensor(lu, true), ps = SavedTensor(perm, false)](const Grads& g) -> TensorList {
             auto [l, u] = unpack_factors(lus.unpack("LinalgLuFactorExBackward"));
             return {lu_factor_backward(g[0], ps.unpack("LinalgLuFactorExBackward"), l, u)};
           });
  }
  return {lu, pivots, info};
}

std::tuple<Tensor, Tensor> lu_factor(const Tensor& a, bool pivot) {
  auto [lu, pivots, info] = lu_factor_ex(a, pivot, false);
  const Tensor host = host_copy(info);
  for (int64_t b = 0; b < host.numel(); ++b) {
    const int32_t i = host.data_ptr<int32_t>()[b];
    KILN_CHECK(i == 0,
               "linalg.lu_factor: U[{}, {}] is zero{}, and using it in lu_solve would divide by zero; to factor "
               "the matrix anyway, call linalg::lu or linalg::lu_factor_ex",
               i, i, a.dim() > 2 ? fmt::format(" in batch element {}", b) : std::string());
  }
  return {lu, pivots};
}

std::tuple<Tensor, Tensor, Tensor> lu(const Tensor& a, bool pivot) {
  auto [factors, pivots, info] = lu_factor_ex(a, pivot, false);
  return kiln::lu_unpack(factors, pivots);
}

Tensor lu_solve(const Tensor& lu, const Tensor& pivots, const Tensor& b, bool left, bool adjoint) {
  const char* op = "linalg.lu_solve";
  check_float_matrices(lu, "LU", op);
  check_float_matrices(b, "B", op);
  check_pivots(lu, pivots, op);
  check_same_device(op, lu, b);
  KILN_CHECK(lu.size(-1) == lu.size(-2), "{}: LU must be a batch of square matrices, but they are {} by {}", op,
             lu.size(-2), lu.size(-1));
  KILN_CHECK(lu.dtype() == b.dtype(), "{}: LU and B must have the same dtype, got {} and {}", op,
             dtype_name(lu.dtype()), dtype_name(b.dtype()));
  const int64_t n = lu.size(-1);
  KILN_CHECK((left ? b.size(-2) : b.size(-1)) == n, "{}: B {} does not fit LU {}: B needs {} {} for {}", op,
             b.sizes().str(), lu.sizes().str(), n, left ? "rows" : "columns",
             left ? (adjoint ? "A^T X = B" : "A X = B") : (adjoint ? "X A^T = B" : "X A = B"));
  // X A = B is A^T X^T = B^T, and X A^T = B is A X^T = B^T: every case is a left solve.
  if (!left) return lu_solve(lu, pivots, b.mT(), true, !adjoint).mT();
  if (!should_record(lu, b)) {
    Shape batch = broadcast_shapes(leading(lu, 2), leading(b, 2), op);
    Shape lu_shape = batch, b_shape = batch, piv_shape = batch;
    lu_shape.push_back(n), lu_shape.push_back(n);
    b_shape.push_back(n), b_shape.push_back(b.size(-1));
    piv_shape.push_back(n);
    const Tensor f = host_copy(lu.expand(lu_shape)).to(kFloat64), pv = host_copy(pivots.expand(piv_shape));
    Tensor x = host_copy(b.expand(b_shape)).to(kFloat64);
    check_pivot_range(pv, n, op);
    lu_solve_packed(f.data_ptr<double>(), pv.data_ptr<int32_t>(), x.data_ptr<double>(), batch.numel(), n, b.size(-1),
                    adjoint);
    return x.to(b.dtype()).to(b.device());
  }
  auto [l, u] = unpack_factors(lu);
  const Tensor p = permutation_from_pivots(pivots, n, lu.options(), op);
  if (!adjoint) {  // P L U X = B: X = U^-1 L^-1 P^T B
    const Tensor y = solve_triangular(l, matmul(p.mT(), b), false, true, true);
    return solve_triangular(u, y, true);
  }
  // U^T L^T P^T X = B: X = P L^-T U^-T B
  const Tensor y = solve_triangular(u.mT(), b, false);
  return matmul(p, solve_triangular(l.mT(), y, true, true, true));
}

}  // namespace linalg

std::tuple<Tensor, Tensor, Tensor> lu_unpack(const Tensor& lu, const Tensor& pivots, bool unpack_data,
                                             bool unpack_pivots) {
  const char* op = "lu_unpack";
  check_float_matrices(lu, "LU", op);
  check_pivots(lu, pivots, op);
  Tensor p, l, u;
  if (unpack_pivots) p = permutation_from_pivots(pivots, lu.size(-2), lu.options(), op);
  if (unpack_data) std::tie(l, u) = unpack_factors(lu);
  // As PyTorch's: what was not asked for comes back empty.
  const TensorOptions options = lu.options();
  return {p.defined() ? p : empty({0}, options), l.defined() ? l : empty({0}, options),
          u.defined() ? u : empty({0}, options)};
}

}  // namespace ops
}  // namespace kiln
