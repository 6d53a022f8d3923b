// ops/decompose.cpp: linalg::cholesky, linalg::cholesky_ex, linalg::solve_triangular, cholesky_solve,
// linalg::eigh, linalg::eigvalsh and linalg::qr, PyTorch's functions of those names, with their gradients.
//
// As ops/solve.cpp, each matrix is worked on the host, one after another (CUDA tensors are copied
// there and back), with the textbook algorithms, for the small matrices of coursework, Gaussian
// processes and parametrizations, not for n in the thousands. All of them compute in float64 and round
// the result once to A's dtype (LAPACK's float32 routines compute in float32: float32 results agree
// with PyTorch's to float32's accuracy, not bit for bit).
//   - cholesky: A = L L^T column by column (L_jj = sqrt(A_jj - sum_k L_jk^2), then the column below
//     it), reading A's lower triangle as LAPACK's potrf does. A matrix that is not
//     positive-definite (a pivot <= 0 or NaN) is an Error naming the order of the failing minor.
//   - solve_triangular: forward or back substitution, reading only A's triangle (its diagonal taken
//     as 1 with unitriangular); X A = B is solved as A^T X^T = B^T.
//   - eigh: the symmetric matrix read from A's lower (or upper) triangle made tridiagonal by
//     Householder reflections, then the QL algorithm with implicit shifts (Note [eigh by tridiagonal
//     QL]); eigenvalues in ascending order, eigenvectors as columns, each only up to its sign (as
//     LAPACK's, whose signs may differ from these).
//   - qr: Householder reflections with LAPACK's signs (Note [qr by Householder reflections]).
//
// Gradients, all ops (so differentiable again): solve_triangular's dB = A^-T dX (a solve_triangular),
// dA = -dB X^T on A's triangle; cholesky's dA = sym(L^-T Phi(L^T dL) L^-1), Phi the lower triangle
// with its diagonal halved, sym(S) = (S + S^T) / 2; eigh's dA = V (diag(dw) + F o skew(V^T dV)) V^T,
// F_ij = 1 / (w_j - w_i) off the diagonal, skew(M) = (M - M^T) / 2; qr's in qr_tall_backward. cholesky's
// and eigh's dA are symmetric, as PyTorch's: they treat A as symmetric, though only one triangle is read.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
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
using host_linalg::check_square;
using host_linalg::host_copy;
using host_linalg::leading;

namespace {

// ---- the host kernels: one n x n matrix (row-major) at a time ----

// L with A = L L^T in place of a (its upper triangle zeroed); returns 0, or the order (1-based) of the
// first leading minor that is not positive-definite.
int64_t cholesky_lower(double* a, int64_t n) {
  using T = double;
  for (int64_t j = 0; j < n; ++j) {
    T d = a[j * n + j];
    for (int64_t k = 0; k < j; ++k) d -= a[j * n + k] * a[j * n + k];
    if (!(d > T(0))) return j + 1;
    d = std::sqrt(d);
    a[j * n + j] = d;
    for (int64_t i = j + 1; i < n; ++i) {
      T s = a[i * n + j];
      for (int64_t k = 0; k < j; ++k) s -= a[i * n + k] * a[j * n + k];
      a[i * n + j] = s / d;
    }
    for (int64_t c = j + 1; c < n; ++c) a[j * n + c] = T(0);
  }
  return 0;
}

// x (n x k) := A^-1 x for triangular A (n x n), reading only its lower or upper triangle, its
// diagonal as 1 when unit.
void triangular_solve(const double* a, double* x, int64_t n, int64_t k, bool upper, bool unit) {
  using T = double;
  for (int64_t step = 0; step < n; ++step) {
    const int64_t i = upper ? n - 1 - step : step;  // rows solved in order: from the bottom for upper
    for (int64_t c = 0; c < k; ++c) {
      T s = x[i * k + c];
      if (upper) {
        for (int64_t q = i + 1; q < n; ++q) s -= a[i * n + q] * x[q * k + c];
      } else {
        for (int64_t q = 0; q < i; ++q) s -= a[i * n + q] * x[q * k + c];
      }
      x[i * k + c] = unit ? s : s / a[i * n + i];
    }
  }
}

// Note [eigh by tridiagonal QL]
// Eigenvalues w (ascending) and eigenvectors v (columns, n x n) of the symmetric matrix s (n x n,
// float64, overwritten), in two steps, about 9 n^3 flops:
//   1. Householder reflections H_k = I - 2 u u^T (k = 0 .. n - 3), each zeroing column k below its
//      subdiagonal, make s tridiagonal: T = Q^T S Q with Q = H_0 H_1 ... kept in v. With p = S u and
//      q = p - (u^T p) u, H S H = S - 2 (u q^T + q u^T): one matrix-vector product and a rank-2
//      update of the trailing block per reflection. Q is kept transposed, its rows contiguous.
//   2. The QL algorithm with implicit Wilkinson shifts on T's diagonal d and subdiagonal e: while some
//      e_m coupling a block [l, m] is not negligible against its neighbours on the diagonal, one sweep
//      of Givens rotations from m up to l chases the shift's bulge out, and each rotation is applied
//      to v's columns too. An e_m that vanishes splits the matrix; each eigenvalue takes a few sweeps.
// (Cyclic Jacobi rotations, the first version, took 73 ms for one 128 x 128 matrix against LAPACK's
// 1.6 through PyTorch: about 8 sweeps of 3 n^3 flops each, half of them down columns.)
bool symmetric_eigen(double* s, double* w, double* v, int64_t n) {
  std::vector<double> u(static_cast<size_t>(n)), p(static_cast<size_t>(n));
  // Q^T, whose rows end as the eigenvectors: the rotations then update two contiguous rows.
  std::vector<double> qt(static_cast<size_t>(n * n), 0.0);
  for (int64_t i = 0; i < n; ++i) qt[i * n + i] = 1;
  for (int64_t k = 0; k + 2 < n; ++k) {
    // u: the reflection taking s[k+1.., k] to (alpha, 0, ..., 0), alpha of the sign opposite to s[k+1][k].
    double norm = 0;
    for (int64_t i = k + 1; i < n; ++i) norm += s[i * n + k] * s[i * n + k];
    norm = std::sqrt(norm);
    if (norm == 0) continue;
    const double alpha = s[(k + 1) * n + k] > 0 ? -norm : norm;
    double unorm = 0;
    for (int64_t i = k + 1; i < n; ++i) {
      u[i] = s[i * n + k] - (i == k + 1 ? alpha : 0);
      unorm += u[i] * u[i];
    }
    unorm = std::sqrt(unorm);
    if (unorm == 0) continue;
    for (int64_t i = k + 1; i < n; ++i) u[i] /= unorm;
    // The trailing block (rows and columns k + 1 ..): p = S u, q = p - (u^T p) u, S -= 2 (u q^T + q u^T).
    double up = 0;
    for (int64_t i = k + 1; i < n; ++i) {
      double acc = 0;
      for (int64_t j = k + 1; j < n; ++j) acc += s[i * n + j] * u[j];
      p[i] = acc;
      up += u[i] * acc;
    }
    for (int64_t i = k + 1; i < n; ++i) p[i] -= up * u[i];
    for (int64_t i = k + 1; i < n; ++i) {
      for (int64_t j = k + 1; j < n; ++j) s[i * n + j] -= 2 * (u[i] * p[j] + p[i] * u[j]);
    }
    // Column k and row k: alpha below the diagonal, zeros under it.
    s[(k + 1) * n + k] = s[k * n + k + 1] = alpha;
    for (int64_t i = k + 2; i < n; ++i) s[i * n + k] = s[k * n + i] = 0;
    // Q^T := H_k Q^T: rows k + 1 .. of Q^T lose twice their combination along u.
    std::fill(p.begin(), p.end(), 0.0);
    for (int64_t i = k + 1; i < n; ++i) {
      for (int64_t c = 0; c < n; ++c) p[c] += u[i] * qt[i * n + c];
    }
    for (int64_t i = k + 1; i < n; ++i) {
      for (int64_t c = 0; c < n; ++c) qt[i * n + c] -= 2 * u[i] * p[c];
    }
  }
  std::vector<double> d(static_cast<size_t>(n)), e(static_cast<size_t>(n), 0.0);
  for (int64_t i = 0; i < n; ++i) d[i] = s[i * n + i];
  for (int64_t i = 0; i + 1 < n; ++i) e[i] = s[(i + 1) * n + i];  // e_i couples i and i + 1
  constexpr double kEps = 2.220446049250313e-16;
  for (int64_t l = 0; l < n; ++l) {
    for (int iteration = 0;; ++iteration) {
      int64_t m = l;  // the end of the unreduced block that starts at l
      while (m + 1 < n && std::abs(e[m]) > kEps * (std::abs(d[m]) + std::abs(d[m + 1]))) ++m;
      if (m == l) break;
      if (iteration == 60) return false;  // LAPACK gives up after 30 n sweeps in all; a few is the rule
      // The Wilkinson shift from the block's top 2 x 2, folded into the first rotation's g.
      double g = (d[l + 1] - d[l]) / (2 * e[l]);
      double r = std::hypot(g, 1.0);
      g = d[m] - d[l] + e[l] / (g + (g >= 0 ? r : -r));
      double sn = 1, c = 1, shift = 0;
      int64_t i = m - 1;
      for (; i >= l; --i) {
        const double f = sn * e[i], b = c * e[i];
        r = std::hypot(f, g);
        e[i + 1] = r;
        if (r == 0) {  // the block splits at i + 1: undo the shift there and start again
          d[i + 1] -= shift;
          e[m] = 0;
          break;
        }
        sn = f / r;
        c = g / r;
        g = d[i + 1] - shift;
        r = (d[i] - g) * sn + 2 * c * b;
        shift = sn * r;
        d[i + 1] = g + shift;
        g = c * r - b;
        double* qi = qt.data() + i * n;  // the same rotation of eigenvectors i and i + 1 (rows of Q^T)
        double* qj = qi + n;
        for (int64_t k = 0; k < n; ++k) {
          const double a = qi[k], b2 = qj[k];
          qj[k] = sn * a + c * b2;
          qi[k] = c * a - sn * b2;
        }
      }
      if (r == 0 && i >= l) continue;
      d[l] -= shift;
      e[l] = g;
      e[m] = 0;
    }
  }
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return d[a] < d[b]; });
  for (int64_t j = 0; j < n; ++j) {
    w[j] = d[order[j]];
    for (int64_t k = 0; k < n; ++k) v[k * n + j] = qt[order[j] * n + k];
  }
  return true;
}

// Note [qr by Householder reflections]
// A (m x n, float64, overwritten) = Q R, Q (m x m, row-major) orthogonal, R upper triangular (A's
// first min(m, n) rows on return). Column k's reflection H = I - tau v v^T (v_0 = 1) takes A[k.., k]
// to (beta, 0, ..., 0) with beta = -sign(A_kk) |A[k.., k]|, LAPACK's geqrf convention (a column
// already zero below its diagonal is left as it is, tau = 0), so Q and R are LAPACK's, signs included.
void householder_qr(double* a, double* q, int64_t m, int64_t n) {
  for (int64_t i = 0; i < m * m; ++i) q[i] = 0;
  for (int64_t i = 0; i < m; ++i) q[i * m + i] = 1;
  std::vector<double> v(static_cast<size_t>(m)), t(static_cast<size_t>(std::max(m, n)));
  for (int64_t k = 0; k < std::min(m, n); ++k) {
    const double alpha = a[k * n + k];
    double below = 0;
    for (int64_t i = k + 1; i < m; ++i) below += a[i * n + k] * a[i * n + k];
    if (below == 0) continue;
    const double beta = -std::copysign(std::sqrt(alpha * alpha + below), alpha);
    const double tau = (beta - alpha) / beta;
    v[k] = 1;
    for (int64_t i = k + 1; i < m; ++i) v[i] = a[i * n + k] / (alpha - beta);
    // A[k.., k..] -= tau v (v^T A[k.., k..]), a row at a time.
    std::fill(t.begin(), t.end(), 0.0);
    for (int64_t i = k; i < m; ++i) {
      for (int64_t j = k; j < n; ++j) t[j] += v[i] * a[i * n + j];
    }
    for (int64_t i = k; i < m; ++i) {
      for (int64_t j = k; j < n; ++j) a[i * n + j] -= tau * v[i] * t[j];
    }
    for (int64_t i = k + 1; i < m; ++i) a[i * n + k] = 0;
    // Q := Q H: each row of Q loses tau (row . v) v.
    for (int64_t r = 0; r < m; ++r) {
      double dot = 0;
      for (int64_t i = k; i < m; ++i) dot += q[r * m + i] * v[i];
      for (int64_t i = k; i < m; ++i) q[r * m + i] -= tau * dot * v[i];
    }
  }
}

// ---- the recorded ops ----

// X = A^-1 B for triangular A (*, n, n) and B (*, n, k) of one batch shape, recorded; the gradient
// is this function again, for A^T.
Tensor triangular_left(const Tensor& a, const Tensor& b, bool upper, bool unit) {
  const int64_t n = a.size(-1), k = b.size(-1);
  const int64_t batch = n == 0 || k == 0 ? 0 : b.numel() / (n * k);
  const Tensor t = host_copy(a).to(kFloat64);
  Tensor x = host_copy(b).to(kFloat64);
  for (int64_t m = 0; m < batch; ++m) {
    triangular_solve(t.data_ptr<double>() + m * n * n, x.data_ptr<double>() + m * n * k, n, k, upper, unit);
  }
  x = x.to(a.dtype()).to(a.device());
  if (should_record(a, b)) {
    record("LinalgSolveTriangularBackward", {a, b}, {x},
           [as = SavedTensor(a, false), xs = SavedTensor(a.requires_grad() ? x : Tensor(), true), upper,
            unit](const Grads& g) -> TensorList {
             const Tensor a = as.unpack("LinalgSolveTriangularBackward");
             const Tensor db = triangular_left(a.mT(), g[0], !upper, unit);
             Tensor da;
             if (g.needs_grad(0)) {
               const Tensor full = -matmul(db, xs.unpack("LinalgSolveTriangularBackward").mT());
               da = upper ? full.triu(unit ? 1 : 0) : full.tril(unit ? -1 : 0);
             }
             return {da, g.needs_grad(1) ? db : Tensor()};
           });
  }
  return x;
}

// The lower triangle with its diagonal halved (cholesky's backward).
Tensor phi(const Tensor& x) { return x.tril() - x * eye(x.size(-1), {}, x.options()) * 0.5; }

// L for each matrix of A; with info (int32, A's batch shape), a matrix that is not positive-definite
// gets NaN in L and the order of its failing minor in info (linalg.cholesky_ex) instead of an Error.
Tensor cholesky_impl(const Tensor& a, Tensor* info = nullptr) {
  const char* op = info ? "linalg.cholesky_ex" : "linalg.cholesky";
  const int64_t n = a.size(-1);
  const int64_t batch = n == 0 ? 0 : a.numel() / (n * n);
  Tensor l = host_copy(a).to(kFloat64);
  if (info) *info = zeros(leading(a, 2), TensorOptions(kInt32));
  int64_t failed = 0, at = 0;
  for (int64_t m = 0; m < batch && (info || failed == 0); ++m) {
    at = m;
    double* lm = l.data_ptr<double>() + m * n * n;
    failed = cholesky_lower(lm, n);
    if (info && failed != 0) {
      info->data_ptr<int32_t>()[m] = static_cast<int32_t>(failed);
      std::fill_n(lm, n * n, std::nan(""));
    }
  }
  KILN_CHECK(info || failed == 0,
             "{}: the factorization could not be completed because the input{} is not positive-definite (the "
             "leading minor of order {} is not positive-definite); check that the matrix is symmetric "
             "positive-definite, or add a small multiple of the identity",
             op, a.dim() > 2 ? fmt::format(" (batch element {})", at) : std::string(), failed);
  if (info) *info = info->to(a.device());
  l = l.to(a.dtype()).to(a.device());
  if (should_record(a)) {
    record("LinalgCholeskyBackward", {a}, {l}, [ls = SavedTensor(l, true)](const Grads& g) -> TensorList {
      const Tensor l = ls.unpack("LinalgCholeskyBackward");
      // S = L^-T Phi(L^T dL) L^-1: L^-T P by a solve with the upper L^T, then (L^-T P) L^-1 as
      // L^-T (L^-T P)^T transposed.
      const Tensor p = phi(matmul(l.mT(), g[0].tril()));
      const Tensor left = triangular_left(l.mT(), p, true, false);
      const Tensor s = triangular_left(l.mT(), left.mT(), true, false).mT();
      return {(s + s.mT()) * 0.5};
    });
  }
  return l;
}

std::tuple<Tensor, Tensor> eigh_impl(const Tensor& a, std::string_view uplo, const char* op) {
  check_square(a, op);
  KILN_CHECK(uplo == "L" || uplo == "U", "{}: UPLO must be 'L' or 'U', got '{}'", op, uplo);
  const int64_t n = a.size(-1);
  const int64_t batch = n == 0 ? 0 : a.numel() / (n * n);
  const Tensor h = host_copy(a).to(kFloat64);
  Shape w_shape = leading(a, 1);
  Tensor w = empty(w_shape, TensorOptions(kFloat64)), v = empty(a.sizes(), TensorOptions(kFloat64));
  std::vector<double> s(static_cast<size_t>(n * n));
  for (int64_t m = 0; m < batch; ++m) {
    const double* src = h.data_ptr<double>() + m * n * n;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        const bool lower_ij = i >= j;  // read (i, j) from the named triangle
        s[i * n + j] = (uplo == "L") == lower_ij ? src[i * n + j] : src[j * n + i];
      }
    }
    if (!std::all_of(s.begin(), s.end(), [](double x) { return std::isfinite(x); })) {
      // NaN or infinite entries: NaN eigenvalues and eigenvectors, as PyTorch's (LAPACK's) are.
      std::fill_n(w.data_ptr<double>() + m * n, n, std::nan(""));
      std::fill_n(v.data_ptr<double>() + m * n * n, n * n, std::nan(""));
      continue;
    }
    KILN_CHECK(symmetric_eigen(s.data(), w.data_ptr<double>() + m * n, v.data_ptr<double>() + m * n * n, n),
               "{}: the QL iteration did not converge for the matrix{} in 60 sweeps on one eigenvalue; its "
               "entries may span too many orders of magnitude: scale it",
               op, a.dim() > 2 ? fmt::format(" of batch element {}", m) : std::string());
  }
  w = w.to(a.dtype()).to(a.device());
  v = v.to(a.dtype()).to(a.device());
  if (should_record(a)) {
    record("LinalgEighBackward", {a}, {w, v},
           [ws = SavedTensor(w, true, 0), vs = SavedTensor(v, true, 1)](const Grads& g) -> TensorList {
             const Tensor w = ws.unpack("LinalgEighBackward"), v = vs.unpack("LinalgEighBackward");
             const Tensor identity = eye(w.size(-1), {}, w.options());
             Tensor inner = zeros_like(v);
             if (g[0].defined()) inner = identity * g[0].unsqueeze(-2);
             if (g[1].defined()) {
               const Tensor m = matmul(v.mT(), g[1]);
               const Tensor gap = w.unsqueeze(-2) - w.unsqueeze(-1);  // w_j - w_i
               const Tensor f = where(identity.to(kBool), zeros({}, w.options()), reciprocal(gap + identity));
               inner = inner + f * (m - m.mT()) * 0.5;
             }
             return {matmul(matmul(v, inner), v.mT())};
           });
  }
  return {w, v};
}

// The gradient of A = Q R (reduced, m >= n) from those of Q and R, either undefined:
// dA = (dQ + Q copyltu(M)) R^-T, M = R dR^T - dQ^T Q, copyltu(M) M's lower triangle mirrored above
// its diagonal (PyTorch's formula, from Q^T Q = I and R upper triangular).
Tensor qr_tall_backward(const Tensor& gq_in, const Tensor& gr_in, const Tensor& q, const Tensor& r) {
  const Tensor gq = gq_in.defined() ? gq_in : zeros_like(q), gr = gr_in.defined() ? gr_in : zeros_like(r);
  const Tensor m = matmul(r, gr.mT()) - matmul(gq.mT(), q);
  const Tensor lower = m.tril(-1);
  const Tensor copyltu = lower + lower.mT() + m * eye(m.size(-1), {}, m.options());
  return linalg::solve_triangular(r.mT(), gq + matmul(q, copyltu), false, false);
}

std::tuple<Tensor, Tensor> qr_impl(const Tensor& a, std::string_view mode) {
  const char* op = "linalg.qr";
  check_float_matrices(a, "A", op);
  KILN_CHECK(mode == "reduced" || mode == "complete" || mode == "r",
             "{}: mode must be 'reduced', 'complete' or 'r', got '{}'", op, mode);
  const int64_t m = a.size(-2), n = a.size(-1), k = std::min(m, n);
  const int64_t batch = m == 0 || n == 0 ? 0 : a.numel() / (m * n);
  const bool complete = mode == "complete";
  const int64_t q_cols = complete ? m : k, r_rows = complete ? m : k;
  Tensor work = host_copy(a).to(kFloat64);
  Shape q_shape = leading(a, 2), r_shape = leading(a, 2);
  q_shape.push_back(m), q_shape.push_back(m);
  r_shape.push_back(m), r_shape.push_back(n);
  Tensor q_full = zeros(q_shape, TensorOptions(kFloat64));
  for (int64_t b = 0; b < batch; ++b) {
    householder_qr(work.data_ptr<double>() + b * m * n, q_full.data_ptr<double>() + b * m * m, m, n);
  }
  if (batch == 0 && m > 0) q_full = eye(m, {}, TensorOptions(kFloat64)).expand(q_shape).contiguous();
  Tensor q = mode == "r" ? empty({0}, TensorOptions(a.dtype())) : q_full.narrow(-1, 0, q_cols);
  Tensor r = work.reshape(r_shape).narrow(-2, 0, r_rows);
  q = q.to(a.dtype()).to(a.device()).contiguous();
  r = r.to(a.dtype()).to(a.device()).contiguous();
  if (should_record(a)) {
    record("LinalgQrBackward", {a}, {q, r},
           [qs = SavedTensor(q, true, 0), rs = SavedTensor(r, true, 1), as = SavedTensor(m < n ? a : Tensor(), false),
            m, n, mode = std::string(mode)](const Grads& g) -> TensorList {
             // As PyTorch's: the forward runs, the backward refuses.
             KILN_CHECK(mode == "reduced" || (mode == "complete" && m <= n),
                        "linalg.qr: its derivative is not defined for mode '{}'{}; use mode 'reduced' if you "
                        "differentiate through linalg.qr",
                        mode, mode == "r" ? ", which computes no Q" : " with more rows than columns");
             const Tensor q = qs.unpack("LinalgQrBackward"), r = rs.unpack("LinalgQrBackward");
             if (m >= n) return {qr_tall_backward(g[0], g[1], q, r)};
             // A = [X | Y] with X square: X = Q U, Y = Q V (R = [U | V]). Y's gradient is Q dV; X's is
             // the square case's with dQ + Y dV^T in place of dQ.
             const Tensor y = as.unpack("LinalgQrBackward").narrow(-1, m, n - m);
             const Tensor gr = g[1].defined() ? g[1] : zeros_like(r);
             const Tensor gu = gr.narrow(-1, 0, m), gv = gr.narrow(-1, m, n - m);
             const Tensor gq = (g[0].defined() ? g[0] : zeros_like(q)) + matmul(y, gv.mT());
             return {cat({qr_tall_backward(gq, gu, q, r.narrow(-1, 0, m)), matmul(q, gv)}, -1)};
           });
  }
  return {q, r};
}

}  // namespace

inline namespace ops {
namespace linalg {

Tensor cholesky(const Tensor& a, bool upper) {
  check_square(a, "linalg.cholesky");
  const Tensor l = cholesky_impl(a);
  return upper ? l.mT() : l;
}

std::tuple<Tensor, Tensor> cholesky_ex(const Tensor& a, bool upper, bool check_errors) {
  check_square(a, "linalg.cholesky_ex");
  if (check_errors) return {cholesky(a, upper), zeros(leading(a, 2), TensorOptions(kInt32).device(a.device()))};
  Tensor info;
  const Tensor l = cholesky_impl(a, &info);
  return {upper ? l.mT() : l, info};
}

Tensor solve_triangular(const Tensor& a, const Tensor& b, bool upper, bool left, bool unitriangular) {
  const char* op = "linalg.solve_triangular";
  check_square(a, op);
  check_float_matrices(b, "B", op);
  check_same_device(op, a, b);
  KILN_CHECK(a.dtype() == b.dtype(), "{}: A and B must have the same dtype, got {} and {}", op, dtype_name(a.dtype()),
             dtype_name(b.dtype()));
  // X A = B is A^T X^T = B^T, A^T triangular the other way.
  const Tensor lhs = left ? a : a.mT(), rhs = left ? b : b.mT();
  const int64_t n = a.size(-1);
  KILN_CHECK(rhs.size(-2) == n, "{}: incompatible shapes of A {} and B {} for {}: B has {} {} where A has {}", op,
             a.sizes().str(), b.sizes().str(), left ? "A X = B" : "X A = B", rhs.size(-2), left ? "rows" : "columns",
             n);
  Shape batch = broadcast_shapes(leading(lhs, 2), leading(rhs, 2), op);
  Shape a_shape = batch, b_shape = batch;
  a_shape.push_back(n), a_shape.push_back(n);
  b_shape.push_back(n), b_shape.push_back(rhs.size(-1));
  const Tensor x = triangular_left(lhs.expand(a_shape), rhs.expand(b_shape), left ? upper : !upper, unitriangular);
  return left ? x : x.mT();
}

std::tuple<Tensor, Tensor> eigh(const Tensor& a, std::string_view uplo) { return eigh_impl(a, uplo, "linalg.eigh"); }

Tensor eigvalsh(const Tensor& a, std::string_view uplo) { return std::get<0>(eigh_impl(a, uplo, "linalg.eigvalsh")); }

std::tuple<Tensor, Tensor> qr(const Tensor& a, std::string_view mode) { return qr_impl(a, mode); }

}  // namespace linalg

Tensor cholesky_solve(const Tensor& b, const Tensor& l, bool upper) {
  // A = L L^T (or U^T U): X = L^-T (L^-1 B), two triangular solves, whose gradients give this one's.
  const Tensor lower = upper ? l.mT() : l;
  const Tensor y = linalg::solve_triangular(lower, b, false);
  return linalg::solve_triangular(lower.mT(), y, true);
}

}  // namespace ops
}  // namespace kiln
