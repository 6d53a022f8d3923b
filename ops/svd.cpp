// ops/svd.cpp: the singular value decomposition and what is built on it, PyTorch's functions of these
// names with their gradients: linalg::svd, linalg::svdvals, svd (torch.svd's older form), linalg::pinv,
// linalg::matrix_rank, linalg::lstsq, linalg::matrix_norm, linalg::vector_norm, linalg::norm and
// linalg::cond.
//
// As ops/decompose.cpp, each matrix is worked on the host, one after another (CUDA tensors are copied
// there and back), in float64 whatever A's dtype, the result rounded once to it: the textbook
// algorithm (Note [svd by bidiagonalization and implicit QR]) for the small and medium matrices of
// coursework, low-rank approximation and least squares, not for n in the thousands. A matrix with a NaN
// or an infinite entry has NaN singular values; asking for its singular vectors is an Error, as
// PyTorch's (LAPACK's) is.
//
// Gradients, all written with ops (so differentiable again):
//   - svd (A = U diag(S) Vh, k = min(m, n), F_ij = 1 / (s_j^2 - s_i^2) off the diagonal, 0 on it):
//       dA = U [(F o (U^T dU - dU^T U)) S + diag(dS) + S (F o (V^T dV - dV^T V))] Vh
//            + (I - U U^T) dU S^-1 Vh + U S^-1 dV^T (I - V V^T),
//     the last two terms only where m > k or n > k. It is finite while the singular values are
//     distinct and (for the vectors) nonzero; the vectors' signs are arbitrary, so only a loss that
//     does not depend on them has a meaningful gradient, as PyTorch warns. With full_matrices, the
//     columns of U and rows of Vh past k take no gradient (they are any basis of the complement).
//     svdvals' gradient is U diag(dS) Vh.
//   - pinv (P = A^+): dA = -P^T dP P^T + (I - A P) dP^T P P^T + P^T P dP^T (I - P A), the derivative of
//     the pseudo-inverse where the rank is constant (Golub and Pereyra).
//   - lstsq: the solution is pinv(A) B, and takes its gradient from there (its other outputs take none).
//   - the norms and cond are compositions of svdvals, sums, maxima and inv.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
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
using host_linalg::host_copy;
using host_linalg::leading;

namespace {

// x := c x - s y and y := s x + c y over len elements: one plane rotation of two rows.
void rotate(double* x, double* y, int64_t len, double c, double s) {
  for (int64_t i = 0; i < len; ++i) {
    const double a = x[i], b = y[i];
    x[i] = c * a - s * b;
    y[i] = s * a + c * b;
  }
}

// hypot(y, z): sqrt(y^2 + z^2) where neither square can overflow or underflow, which is the rule in
// the scaled matrices here (std::hypot, careful everywhere, took a sixth of the time of an 8 x 8 svd).
double fast_hypot(double y, double z) {
  const double a = std::max(std::abs(y), std::abs(z));
  return a > 1e-150 && a < 1e150 ? std::sqrt(y * y + z * z) : std::hypot(y, z);
}

// (c, s) with c y - s z = r = hypot(y, z) and s y + c z = 0.
void givens(double y, double z, double* c, double* s, double* r) {
  *r = fast_hypot(y, z);
  if (*r == 0) {
    *c = 1, *s = 0;
  } else {
    *c = y / *r, *s = -z / *r;
  }
}

// A Householder reflection H = I - 2 w w^T (|w| = 1) that takes the len values x[0], x[stride], ...
// to (beta, 0, ..., 0), beta = -sign(x_0) |x|, written into w (len values). Returns false (and beta
// = x_0) where x is zero after its first value: nothing to reflect.
bool reflection(const double* x, int64_t stride, int64_t len, double* w, double* beta) {
  double below = 0;
  for (int64_t i = 1; i < len; ++i) below += x[i * stride] * x[i * stride];
  const double alpha = x[0];
  if (below == 0) {
    *beta = alpha;
    return false;
  }
  *beta = -std::copysign(std::sqrt(alpha * alpha + below), alpha);
  w[0] = alpha - *beta;
  double norm = w[0] * w[0];
  for (int64_t i = 1; i < len; ++i) {
    w[i] = x[i * stride];
    norm += w[i] * w[i];
  }
  norm = std::sqrt(norm);
  for (int64_t i = 0; i < len; ++i) w[i] /= norm;
  return true;
}

// The left reflections of a Householder QR or bidiagonalization of a (m x n, row-major): the vector
// of column k's (rows k ..) in row k of w (n x m), made[k] saying whether there was one.
struct LeftReflections {
  std::vector<double> w;
  std::vector<char> made;
};

// Column k's reflection (kept in left when it holds vectors, else in its row 0), applied to a[k..,
// k + 1 ..] a row at a time; beta, the value left on the diagonal, goes to *diagonal. t: n scratch.
void reflect_column(double* a, int64_t m, int64_t n, int64_t k, LeftReflections& left, bool keep, double* t,
                    double* diagonal) {
  double* w = left.w.data() + (keep ? k * m : 0);
  if (!reflection(a + k * n + k, n, m - k, w + k, diagonal)) return;
  left.made[static_cast<size_t>(k)] = 1;
  std::fill(t, t + n, 0.0);
  for (int64_t i = k; i < m; ++i) {
    for (int64_t j = k + 1; j < n; ++j) t[j] += w[i] * a[i * n + j];
  }
  for (int64_t i = k; i < m; ++i) {
    for (int64_t j = k + 1; j < n; ++j) a[i * n + j] -= 2 * w[i] * t[j];
  }
}

// The first p rows of (H_0 H_1 ... H_{n-1})^T = E_p^T H_{n-1} ... H_0 (p x m) into ut: the reflections
// applied from the right, the last first (a row r < k is still e_r when H_k comes, and H_k leaves it so).
void form_left(const LeftReflections& left, int64_t m, int64_t n, double* ut, int64_t p) {
  std::fill(ut, ut + p * m, 0.0);
  for (int64_t r = 0; r < p; ++r) ut[r * m + r] = 1;
  for (int64_t k = n - 1; k >= 0; --k) {
    if (!left.made[static_cast<size_t>(k)]) continue;
    const double* w = left.w.data() + k * m;
    for (int64_t r = k; r < p; ++r) {
      double* row = ut + r * m;
      double dot = 0;
      for (int64_t i = k; i < m; ++i) dot += row[i] * w[i];
      for (int64_t i = k; i < m; ++i) row[i] -= 2 * dot * w[i];
    }
  }
}

bool svd_tall(double* a, int64_t m, int64_t n, double* s, double* ut, int64_t p, double* vt);

// Note [svd of a tall matrix through its QR]
// For m >= 2 n, A = Q R first (n Householder reflections, 2 m n^2 flops), then R = U_R S V^T (n x n),
// and U = Q U_R: the bidiagonalization and every rotation of step 2 then work on n-long rows instead of
// m-long ones (LAPACK's gesvd switches at about 1.6 n). For 1024 x 64 it took svd from 5.4 to 4.5 ms,
// still 2.2x LAPACK's through PyTorch: the reflections here are applied one vector at a time, LAPACK's
// in blocks through matrix products.
bool svd_by_qr(double* a, int64_t m, int64_t n, double* s, double* ut, int64_t p, double* vt) {
  const bool vectors = ut != nullptr;
  LeftReflections left{std::vector<double>(vectors ? static_cast<size_t>(n * m) : static_cast<size_t>(m)),
                       std::vector<char>(static_cast<size_t>(n), 0)};
  std::vector<double> t(static_cast<size_t>(n)), r(static_cast<size_t>(n * n), 0.0);
  for (int64_t k = 0; k < n; ++k) {
    reflect_column(a, m, n, k, left, vectors, t.data(), &r[k * n + k]);
    for (int64_t j = k + 1; j < n; ++j) r[k * n + j] = a[k * n + j];
  }
  std::vector<double> ur(vectors ? static_cast<size_t>(n * n) : 0);
  if (!svd_tall(r.data(), n, n, s, vectors ? ur.data() : nullptr, n, vt)) return false;
  if (!vectors) return true;
  form_left(left, m, n, ut, p);  // Q^T's first p rows; U's first n columns are Q's times U_R
  std::vector<double> q(ut, ut + n * m);
  std::fill(ut, ut + n * m, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t l = 0; l < n; ++l) {
      const double c = ur[i * n + l];
      const double* src = q.data() + l * m;
      double* dst = ut + i * m;
      for (int64_t j = 0; j < m; ++j) dst[j] += c * src[j];
    }
  }
  return true;
}

// Note [svd by bidiagonalization and implicit QR]
// The singular values s (descending) of one m x n matrix a (row-major float64, m >= n, overwritten)
// and, when ut and vt are given, U's first p columns as the rows of ut (p x m, p = n or m) and V's
// columns as the rows of vt (n x n), in two steps (Golub and Kahan; Golub and Reinsch):
//   1. Householder reflections from the left (zeroing column k below the diagonal) and from the right
//      (zeroing row k past its superdiagonal), alternately, make A upper bidiagonal:
//      B = U_b^T A V_b, with diagonal d and superdiagonal e. U_b = H_0 H_1 ... and V_b = G_0 G_1 ...
//      are formed afterwards, from the last reflection back, as LAPACK's orgbr does.
//   2. Implicitly shifted QR steps on B, which never form B^T B: the shift mu is the eigenvalue of the
//      trailing 2 x 2 of B^T B nearer its last entry; a rotation of columns 0 and 1 makes the first
//      column of B^T B - mu I a multiple of e_0, and the bulge it creates below the diagonal is chased
//      down by alternating row and column rotations, each applied to U or V too. An e_i that becomes
//      negligible against its two diagonal neighbours is zeroed and splits B; a d_i that becomes
//      negligible against |B| is zeroed, and rotations chase its row's (or column's) other entry out
//      so that B splits there too. Each singular value takes two or three steps.
//   A negative d_i's sign goes into V's column i; the values are then sorted, with their vectors.
// About 4 m n^2 flops for step 1 (8 m n^2 with U and V), and 12 n^2 (m + n) for step 2's rotations.
// Returns false if the steps did not converge (a rule that LAPACK's dbdsqr also has).
bool svd_tall(double* a, int64_t m, int64_t n, double* s, double* ut, int64_t p, double* vt) {
  if (m >= 2 * n && n > 1) return svd_by_qr(a, m, n, s, ut, p, vt);
  const bool vectors = ut != nullptr;
  std::vector<double> d(static_cast<size_t>(n)), e(static_cast<size_t>(n), 0.0);
  // The reflections' vectors: left ones in `left`; right ones (row k, columns k + 1 ..) in row k of
  // hr, has_r saying which were made.
  LeftReflections left{std::vector<double>(vectors ? static_cast<size_t>(n * m) : static_cast<size_t>(m)),
                       std::vector<char>(static_cast<size_t>(n), 0)};
  std::vector<double> hr(vectors ? static_cast<size_t>(n * n) : static_cast<size_t>(n));
  std::vector<char> has_r(static_cast<size_t>(n), 0);
  std::vector<double> t(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) {
    reflect_column(a, m, n, k, left, vectors, t.data(), &d[k]);
    if (k + 1 >= n) continue;
    double* v = hr.data() + (vectors ? k * n : 0);
    if (reflection(a + k * n + k + 1, 1, n - k - 1, v + k + 1, &e[k])) {
      has_r[k] = 1;
      for (int64_t i = k + 1; i < m; ++i) {  // each row below loses twice its component along v
        double dot = 0;
        for (int64_t j = k + 1; j < n; ++j) dot += a[i * n + j] * v[j];
        for (int64_t j = k + 1; j < n; ++j) a[i * n + j] -= 2 * dot * v[j];
      }
    }
  }
  if (vectors) {
    // U_b^T's first p rows, then V_b^T = G_{n-3} ... G_0 the same way.
    form_left(left, m, n, ut, p);
    for (int64_t i = 0; i < n * n; ++i) vt[i] = 0;
    for (int64_t r = 0; r < n; ++r) vt[r * n + r] = 1;
    for (int64_t k = n - 2; k >= 0; --k) {
      if (!has_r[k]) continue;
      const double* v = hr.data() + k * n;
      for (int64_t r = k + 1; r < n; ++r) {
        double* row = vt + r * n;
        double dot = 0;
        for (int64_t j = k + 1; j < n; ++j) dot += row[j] * v[j];
        for (int64_t j = k + 1; j < n; ++j) row[j] -= 2 * dot * v[j];
      }
    }
  }
  // Step 2 on (d, e): e_i couples d_i and d_{i+1}. Rotating rows i, j of B rotates U's columns i, j
  // (rows of ut) the same way; columns of B, V's (rows of vt).
  auto rotate_u = [&](int64_t i, int64_t j, double c, double sn) {
    if (vectors) rotate(ut + i * m, ut + j * m, m, c, sn);
  };
  auto rotate_v = [&](int64_t i, int64_t j, double c, double sn) {
    if (vectors) rotate(vt + i * n, vt + j * n, n, c, sn);
  };
  constexpr double kEps = std::numeric_limits<double>::epsilon();
  double bnorm = 0;
  for (int64_t i = 0; i < n; ++i) bnorm = std::max(bnorm, std::abs(d[i]) + std::abs(e[i]));
  const double small = kEps * bnorm;  // a diagonal entry below this is taken as 0
  int64_t steps = 0;
  for (int64_t h = n - 1; h > 0;) {
    for (int64_t i = 0; i < h; ++i) {
      if (std::abs(e[i]) <= kEps * (std::abs(d[i]) + std::abs(d[i + 1]))) e[i] = 0;
    }
    if (e[h - 1] == 0) {  // d_h is a singular value (up to its sign)
      --h;
      continue;
    }
    int64_t l = h - 1;  // the unreduced block [l, h]
    while (l > 0 && e[l - 1] != 0) --l;
    int64_t zero = -1;
    for (int64_t i = l; i <= h && zero < 0; ++i) {
      if (std::abs(d[i]) <= small) zero = i;
    }
    if (zero >= 0) {
      d[zero] = 0;
      double c, sn, r;
      if (zero < h) {
        // Row `zero` holds only f = e_zero: rotations of rows (zero, j), j = zero + 1 .., move f along
        // the row and out past h.
        double f = e[zero];
        e[zero] = 0;
        for (int64_t j = zero + 1; j <= h && f != 0; ++j) {
          givens(d[j], -f, &c, &sn, &r);  // c d_j + sn f = r, c f - sn d_j = 0
          d[j] = r;
          rotate_u(zero, j, c, sn);  // row_zero := c row_zero - sn row_j, row_j := sn row_zero + c row_j
          if (j < h) {
            f = -sn * e[j];
            e[j] = c * e[j];
          }
        }
      } else {
        // Column h holds only f = e_{h-1} above it: rotations of columns (j, h), j = h - 1 .. l, move
        // it up and out past l.
        double f = e[h - 1];
        e[h - 1] = 0;
        for (int64_t j = h - 1; j >= l && f != 0; --j) {
          givens(d[j], -f, &c, &sn, &r);
          d[j] = r;
          rotate_v(h, j, c, sn);  // column h := c col_h - sn col_j, column j := sn col_h + c col_j
          if (j > l) {
            f = -sn * e[j - 1];
            e[j - 1] = c * e[j - 1];
          }
        }
      }
      continue;
    }
    if (++steps > 75 * n) return false;
    // The shift, from the block's entries scaled to at most 1 (the squares neither overflow nor
    // underflow); only the ratio y : z it gives matters.
    double scale = 0;
    for (int64_t i = l; i <= h; ++i) scale = std::max({scale, std::abs(d[i]), i < h ? std::abs(e[i]) : 0.0});
    const double dh1 = d[h - 1] / scale, dh = d[h] / scale, eh1 = e[h - 1] / scale;
    const double eh2 = h - 1 > l ? e[h - 2] / scale : 0.0;
    const double t11 = dh1 * dh1 + eh2 * eh2, t12 = dh1 * eh1, t22 = dh * dh + eh1 * eh1;
    const double delta = (t11 - t22) / 2;
    const double mu = t12 == 0 ? t22 : t22 - t12 * t12 / (delta + std::copysign(fast_hypot(delta, t12), delta));
    const double dl = d[l] / scale;
    double y = dl * dl - mu, z = dl * (e[l] / scale);
    for (int64_t k = l; k < h; ++k) {
      double c, sn, r;
      // Columns k, k + 1: (y, z) in row k - 1 (the shift's pair when k = l) to (r, 0).
      givens(y, z, &c, &sn, &r);
      if (k > l) e[k - 1] = r;
      const double dk = d[k], ek = e[k], dk1 = d[k + 1];
      d[k] = c * dk - sn * ek;
      e[k] = sn * dk + c * ek;
      double bulge = -sn * dk1;  // B[k + 1][k]
      d[k + 1] = c * dk1;
      rotate_v(k, k + 1, c, sn);
      // Rows k, k + 1: the bulge below the diagonal to 0, making one at B[k][k + 2].
      givens(d[k], bulge, &c, &sn, &r);
      d[k] = r;
      const double ek2 = e[k], dk12 = d[k + 1];
      e[k] = c * ek2 - sn * dk12;
      d[k + 1] = sn * ek2 + c * dk12;
      rotate_u(k, k + 1, c, sn);
      if (k + 1 < h) {
        bulge = -sn * e[k + 1];
        e[k + 1] = c * e[k + 1];
        y = e[k];
        z = bulge;
      }
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    if (d[i] < 0) {
      d[i] = -d[i];
      if (vectors) {
        for (int64_t j = 0; j < n; ++j) vt[i * n + j] = -vt[i * n + j];
      }
    }
  }
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return d[x] > d[y]; });
  for (int64_t i = 0; i < n; ++i) s[i] = d[order[i]];
  if (vectors) {
    std::vector<double> copy(ut, ut + n * m);  // rows past n (the full U's) are not permuted
    for (int64_t i = 0; i < n; ++i) std::copy_n(copy.data() + order[i] * m, m, ut + i * m);
    copy.assign(vt, vt + n * n);
    for (int64_t i = 0; i < n; ++i) std::copy_n(copy.data() + order[i] * n, n, vt + i * n);
  }
  return true;
}

void check_svd_input(const Tensor& a, const char* op) { host_linalg::check_float_matrices(a, "A", op); }

// pinv's and matrix_rank's check that a hermitian A is square.
void check_hermitian_square(const Tensor& a, bool hermitian, const char* op) {
  KILN_CHECK(!hermitian || a.size(-1) == a.size(-2),
             "{}: with hermitian, A must be a batch of square matrices, but they are {} by {}", op, a.size(-2),
             a.size(-1));
}

double dtype_eps(DType t) {
  return t == kFloat32 ? double(std::numeric_limits<float>::epsilon()) : std::numeric_limits<double>::epsilon();
}

// The reduced gradient (U (*, m, k), S (*, k), Vh (*, k, n)); see the header.
Tensor svd_backward(const Tensor& gu, const Tensor& gs, const Tensor& gvh, const Tensor& u, const Tensor& s,
                    const Tensor& vh) {
  const int64_t m = u.size(-2), n = vh.size(-1), k = s.size(-1);
  if (!gu.defined() && !gvh.defined()) {
    return gs.defined() ? matmul(u * gs.unsqueeze(-2), vh) : Tensor();
  }
  const Tensor identity = eye(k, {}, s.options());
  const Tensor s2 = s * s;
  const Tensor f = where(identity.to(kBool), zeros({}, s.options()),
                         reciprocal(s2.unsqueeze(-2) - s2.unsqueeze(-1) + identity));  // 1 / (s_j^2 - s_i^2)
  // The k x k middle factor, summed from the terms whose gradients arrived (gu or gvh is defined).
  Tensor inner = gs.defined() ? identity * gs.unsqueeze(-2) : Tensor();
  auto add = [](const Tensor& sum, const Tensor& term) { return sum.defined() ? sum + term : term; };
  Tensor extra;
  if (gu.defined()) {
    const Tensor utgu = matmul(u.mT(), gu);
    inner = add(inner, f * (utgu - utgu.mT()) * s.unsqueeze(-2));
    if (m > k) extra = matmul((gu - matmul(u, utgu)) / s.unsqueeze(-2), vh);
  }
  if (gvh.defined()) {
    const Tensor vtgv = matmul(vh, gvh.mT());  // V^T dV
    inner = add(inner, s.unsqueeze(-1) * (f * (vtgv - vtgv.mT())));
    // U S^-1 dV^T (I - V V^T), dV^T = gvh
    if (n > k) extra = add(extra, matmul(u / s.unsqueeze(-2), gvh - matmul(vtgv.mT(), vh)));
  }
  const Tensor ga = matmul(matmul(u, inner), vh);
  return extra.defined() ? ga + extra : ga;
}

// U, S, Vh of every matrix of a (checked), U and Vh empty without compute_uv; recorded.
std::tuple<Tensor, Tensor, Tensor> svd_impl(const Tensor& a, bool full_matrices, bool compute_uv, const char* op) {
  check_svd_input(a, op);
  const int64_t m = a.size(-2), n = a.size(-1), k = std::min(m, n);
  const int64_t batch = k == 0 ? 0 : a.numel() / (m * n);
  const bool tall = m >= n;
  const int64_t rows = tall ? m : n, cols = tall ? n : m;  // of the matrix the kernel factors
  const int64_t p = full_matrices ? rows : cols;           // the kernel's ut rows
  const bool record_it = should_record(a);
  const bool vectors = compute_uv || record_it;
  const Tensor h = host_copy(a).to(kFloat64);
  Shape s_shape = leading(a, 2), ut_shape = leading(a, 2), vt_shape = leading(a, 2);
  s_shape.push_back(k);
  ut_shape.push_back(p), ut_shape.push_back(rows);
  vt_shape.push_back(cols), vt_shape.push_back(cols);
  const TensorOptions f64(kFloat64);
  Tensor s = empty(s_shape, f64);
  Tensor ut = vectors ? empty(ut_shape, f64) : Tensor(), vt = vectors ? empty(vt_shape, f64) : Tensor();
  std::vector<double> work(static_cast<size_t>(m * n));
  for (int64_t b = 0; b < batch; ++b) {
    const double* src = h.data_ptr<double>() + b * m * n;
    if (tall) {
      std::copy_n(src, m * n, work.data());
    } else {
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) work[j * m + i] = src[i * n + j];
      }
    }
    double* sb = s.data_ptr<double>() + b * k;
    if (!std::all_of(work.begin(), work.end(), [](double x) { return std::isfinite(x); })) {
      KILN_CHECK(!vectors,
                 "{}: the algorithm failed to converge because the input matrix{} contained non-finite values (NaN "
                 "or infinity); check the input, or use linalg::svdvals without a gradient, which gives NaN "
                 "singular values",
                 op, a.dim() > 2 ? fmt::format(" (batch element {})", b) : std::string());
      std::fill_n(sb, k, std::nan(""));
      continue;
    }
    // Scaled by a power of 2 (exactly) to a largest |entry| in [1, 2): no square in the reflections or
    // rotations overflows or underflows, whatever the matrix's magnitude (LAPACK's gesdd scales too).
    double amax = 0;
    for (double x : work) amax = std::max(amax, std::abs(x));
    const int exponent = amax > 0 ? std::ilogb(amax) : 0;
    if (exponent != 0) {
      for (double& x : work) x = std::ldexp(x, -exponent);
    }
    const bool converged =
        svd_tall(work.data(), rows, cols, sb, vectors ? ut.data_ptr<double>() + b * p * rows : nullptr, p,
                 vectors ? vt.data_ptr<double>() + b * cols * cols : nullptr);
    KILN_CHECK(converged,
               "{}: the QR iteration did not converge for the matrix{} in {} steps; its entries may span too many "
               "orders of magnitude: scale it",
               op, a.dim() > 2 ? fmt::format(" of batch element {}", b) : std::string(), 75 * cols);
    if (exponent != 0) {
      for (int64_t i = 0; i < k; ++i) sb[i] = std::ldexp(sb[i], exponent);
    }
  }
  // tall: U = ut^T, Vh = vt; wide (A^T factored): U = vt^T, Vh = ut.
  Tensor u, vh;
  if (vectors) {
    if (batch == 0) {  // no matrix factored: the identity where a side is not empty, as PyTorch's
      ut = zeros(ut_shape, f64) + eye(p, rows, f64);
      vt = zeros(vt_shape, f64) + eye(cols, {}, f64);
    }
    u = (tall ? ut.mT() : vt.mT()).to(a.dtype()).to(a.device()).contiguous();
    vh = (tall ? vt : ut).to(a.dtype()).to(a.device()).contiguous();
  }
  s = s.to(a.dtype()).to(a.device());
  if (record_it) {
    record("LinalgSvdBackward", {a}, {u, s, vh},
           [us = SavedTensor(u, true, 0), ss = SavedTensor(s, true, 1), vs = SavedTensor(vh, true, 2),
            k](const Grads& g) -> TensorList {
             Tensor u = us.unpack("LinalgSvdBackward"), vh = vs.unpack("LinalgSvdBackward");
             Tensor gu = g[0], gvh = g[2];
             // With full_matrices, only the first k columns of U (rows of Vh) take a gradient.
             if (u.size(-1) > k) {
               u = u.narrow(-1, 0, k);
               if (gu.defined()) gu = gu.narrow(-1, 0, k);
             }
             if (vh.size(-2) > k) {
               vh = vh.narrow(-2, 0, k);
               if (gvh.defined()) gvh = gvh.narrow(-2, 0, k);
             }
             return {svd_backward(gu, g[1], gvh, u, ss.unpack("LinalgSvdBackward"), vh)};
           });
  }
  if (!compute_uv) {
    u = empty({0}, TensorOptions(a.dtype()).device(a.device()));
    vh = empty({0}, TensorOptions(a.dtype()).device(a.device()));
  }
  return {u, s, vh};
}

// The tolerance of pinv and matrix_rank below which a singular value counts as 0, as PyTorch's:
// max(atol, rtol * the largest one), rtol by default eps * max(m, n) where no positive atol is given
// and 0 where one is.
Tensor rank_tolerance(const Tensor& a, const Tensor& smax, std::optional<double> atol, std::optional<double> rtol) {
  const double r = rtol                ? *rtol
                   : atol && *atol > 0 ? 0.0
                                       : dtype_eps(a.dtype()) * double(std::max(a.size(-2), a.size(-1)));
  return maximum(smax * r, full({}, atol.value_or(0.0), smax.options()));
}

// S^+: 1 / s where s is above rank_tolerance(), else 0.
Tensor pseudo_reciprocal(const Tensor& a, const Tensor& s, std::optional<double> atol, std::optional<double> rtol) {
  if (s.size(-1) == 0) return s;
  const Tensor keep = gt(s, rank_tolerance(a, s.narrow(-1, 0, 1), atol, rtol));
  return where(keep, reciprocal(s), zeros({}, s.options()));
}

// V S^+ U^T from A's reduced SVD.
Tensor pinv_from_svd(const Tensor& a, const Tensor& u, const Tensor& s, const Tensor& vh, std::optional<double> atol,
                     std::optional<double> rtol) {
  if (s.size(-1) == 0) return zeros_like(a.mT()).contiguous();
  return matmul(vh.mT() * pseudo_reciprocal(a, s, atol, rtol).unsqueeze(-2), u.mT());
}

// pinv(A) from its SVD (or, for hermitian, eigh), computed without a gradient.
Tensor pinv_value(const Tensor& a, std::optional<double> atol, std::optional<double> rtol, bool hermitian,
                  const char* op) {
  NoGradGuard no_grad;
  if (hermitian) {
    auto [w, v] = linalg::eigh(a);
    const Tensor smax = amax(w.abs(), {-1}, true);
    const Tensor keep = gt(w.abs(), rank_tolerance(a, smax, atol, rtol));
    const Tensor winv = where(keep, reciprocal(w), zeros({}, w.options()));
    return matmul(v * winv.unsqueeze(-2), v.mT());
  }
  auto [u, s, vh] = svd_impl(a, false, true, op);
  return pinv_from_svd(a, u, s, vh, atol, rtol);
}

// The gradient of P = pinv(A) with respect to A, from dP (see the header).
Tensor pinv_backward(const Tensor& g, const Tensor& p, const Tensor& a) {
  const Tensor pt = p.mT(), gt_ = g.mT();
  const Tensor first = -matmul(matmul(pt, g), pt);
  const Tensor second = matmul(gt_ - matmul(a, matmul(p, gt_)), matmul(p, pt));
  const Tensor third = matmul(matmul(pt, p), gt_ - matmul(matmul(gt_, p), a));
  return first + second + third;
}

// A's pseudo-inverse P recorded with its gradient (see the header).
Tensor record_pinv(const Tensor& a, const Tensor& p) {
  if (should_record(a)) {
    record("LinalgPinvBackward", {a}, {p},
           [ps = SavedTensor(p, true), as = SavedTensor(a, false)](const Grads& g) -> TensorList {
             return {pinv_backward(g[0], ps.unpack("LinalgPinvBackward"), as.unpack("LinalgPinvBackward"))};
           });
  }
  return p;
}

// dims of a matrix norm: two distinct dims of x, wrapped.
std::pair<int, int> matrix_dims(const Tensor& x, const Shape& dim, const char* op) {
  KILN_CHECK(dim.size() == 2, "{}: dim must be a 2-tuple of ints (the matrix's two dims), got {}", op, dim.str());
  const int d0 = wrap_dim(dim[0], x.dim(), op), d1 = wrap_dim(dim[1], x.dim(), op);
  KILN_CHECK(d0 != d1, "{}: dims must be different, got ({}, {})", op, dim[0], dim[1]);
  return {d0, d1};
}

// The singular values of x's matrices along dims (d0, d1), with keepdim's size-1 dims put back.
Tensor svdvals_along(const Tensor& x, int d0, int d1) {
  return linalg::svdvals(x.movedim({d0, d1}, {x.dim() - 2, x.dim() - 1}));
}

Tensor keep_dims(Tensor r, int d0, int d1, bool keepdim) {
  if (!keepdim) return r;
  return r.unsqueeze(std::min(d0, d1)).unsqueeze(std::max(d0, d1));
}

}  // namespace

inline namespace ops {
namespace linalg {

std::tuple<Tensor, Tensor, Tensor> svd(const Tensor& a, bool full_matrices) {
  return svd_impl(a, full_matrices, true, "linalg.svd");
}

Tensor svdvals(const Tensor& a) {
  const char* op = "linalg.svdvals";
  if (!should_record(a)) return std::get<1>(svd_impl(a, false, false, op));
  // The gradient needs the vectors; with them, a non-finite matrix is an Error, as PyTorch's.
  return std::get<1>(svd_impl(a, false, true, op));
}

Tensor pinv(const Tensor& a, std::optional<double> atol, std::optional<double> rtol, bool hermitian) {
  const char* op = "linalg.pinv";
  check_svd_input(a, op);
  check_hermitian_square(a, hermitian, op);
  KILN_CHECK(atol.value_or(0) >= 0 && rtol.value_or(0) >= 0, "{}: atol and rtol must be non-negative, got {} and {}",
             op, atol.value_or(0), rtol.value_or(0));
  return record_pinv(a, pinv_value(a, atol, rtol, hermitian, op));
}

Tensor matrix_rank(const Tensor& a, std::optional<double> atol, std::optional<double> rtol, bool hermitian) {
  const char* op = "linalg.matrix_rank";
  check_svd_input(a, op);
  check_hermitian_square(a, hermitian, op);
  NoGradGuard no_grad;
  const Tensor s = hermitian ? eigvalsh(a).abs() : std::get<1>(svd_impl(a, false, false, op));
  if (s.size(-1) == 0) return zeros(leading(a, 2), TensorOptions(kInt64).device(a.device()));
  const Tensor smax = hermitian ? amax(s, {-1}, true) : s.narrow(-1, 0, 1);
  return count_nonzero(gt(s, rank_tolerance(a, smax, atol, rtol)), {-1});
}

LstsqResult lstsq(const Tensor& a, const Tensor& b, std::optional<double> rcond, std::optional<std::string> driver) {
  const char* op = "linalg.lstsq";
  check_svd_input(a, op);
  KILN_CHECK(b.dim() >= 1, "{}: B must have at least 1 dimension, got a 0-d tensor", op);
  KILN_CHECK(b.dim() == a.dim() || b.dim() == a.dim() - 1,
             "{}: B {} must have as many dims as A {} (a batch of matrices) or one fewer (a batch of vectors); "
             "unsqueeze it to A's batch dims",
             op, b.sizes().str(), a.sizes().str());
  KILN_CHECK(a.dtype() == b.dtype(), "{}: A and B must have the same dtype, got {} and {}", op, dtype_name(a.dtype()),
             dtype_name(b.dtype()));
  check_same_device(op, a, b);
  const std::string drv = driver.value_or("gelsy");
  KILN_CHECK(drv == "gels" || drv == "gelsy" || drv == "gelsd" || drv == "gelss",
             "{}: driver must be one of gels, gelsy, gelsd, gelss, got '{}'", op, drv);
  // B with one dim fewer than A is a batch of vectors, as PyTorch's.
  const bool vector_case = b.dim() == a.dim() - 1;
  const Tensor bm = vector_case ? b.unsqueeze(-1) : b;
  const int64_t m = a.size(-2), n = a.size(-1), k = bm.size(-1);
  KILN_CHECK(bm.dim() >= 2 && bm.size(-2) == m,
             "{}: A {} and B {} do not match: B must have A's {} rows in its {} dim (A X = B with A m x n and B "
             "m x k, or a vector of m)",
             op, a.sizes().str(), b.sizes().str(), m, vector_case ? "last" : "second-to-last");
  const Shape batch = broadcast_shapes(leading(a, 2), leading(bm, 2), op);
  Shape a_shape = batch, b_shape = batch;
  a_shape.push_back(m), a_shape.push_back(n);
  b_shape.push_back(m), b_shape.push_back(k);
  const Tensor ab = a.expand(a_shape), bb = bm.expand(b_shape);
  double rc = rcond.value_or(-1);
  if (rc < 0) rc = dtype_eps(a.dtype()) * double(std::max(m, n));  // LAPACK's rule for a negative rcond
  // The minimum-norm least-squares solution pinv(A) B (the same, for a matrix of full rank, as LAPACK's
  // drivers give), from one SVD that also gives the rank and the singular values.
  Tensor u, s, vh, p, sinv;
  const bool grad_a = should_record(ab);  // asked before the guard below turns grad mode off
  {
    NoGradGuard no_grad;
    std::tie(u, s, vh) = svd_impl(ab, false, true, op);
    if (grad_a) {
      p = pinv_from_svd(ab, u, s, vh, 0.0, rc);
    } else {
      sinv = pseudo_reciprocal(ab, s, 0.0, rc);
    }
  }
  // With A's gradient, through pinv's; without it, V (S^+ (U^T B)), which forms no n x m matrix.
  const Tensor x =
      p.defined() ? matmul(record_pinv(ab, p), bb) : matmul(vh.mT(), sinv.unsqueeze(-1) * matmul(u.mT(), bb));
  LstsqResult result;
  const TensorOptions opts = TensorOptions(a.dtype()).device(a.device());
  result.residuals = empty({0}, opts);
  result.rank = empty({0}, TensorOptions(kInt64).device(a.device()));
  result.singular_values = empty({0}, opts);
  NoGradGuard no_grad;
  if (drv != "gels") {
    result.rank = s.size(-1) == 0 ? zeros(batch, TensorOptions(kInt64).device(a.device()))
                                  : count_nonzero(gt(s, s.narrow(-1, 0, 1) * rc), {-1});
    if (drv == "gelsd" || drv == "gelss") result.singular_values = s;
  }
  // The squared residuals, where every matrix has full rank n < m (PyTorch's gelsy leaves them out).
  const bool full_rank = drv == "gels" || result.rank.numel() == 0 || result.rank.eq(n).all().item<bool>();
  if (drv != "gelsy" && m > n && full_rank) {
    const Tensor wide = matmul(ab.to(kFloat64), x.to(kFloat64)) - bb.to(kFloat64);
    result.residuals = (wide * wide).sum({-2}).to(a.dtype());
  }
  result.solution = vector_case ? x.squeeze(-1) : x;
  return result;
}

Tensor vector_norm(const Tensor& x, double ord, const Shape& dim, bool keepdim) {
  KILN_CHECK(is_floating(x.dtype()), "linalg.vector_norm: expected a floating-point input, got {}; convert it",
             dtype_name(x.dtype()));
  return kiln::norm(x, ord, dim, keepdim);
}

Tensor matrix_norm(const Tensor& a, double ord, const Shape& dim, bool keepdim) {
  const char* op = "linalg.matrix_norm";
  KILN_CHECK(a.dim() >= 2, "{}: the input tensor A must have at least 2 dimensions, got shape {}", op, a.sizes().str());
  KILN_CHECK(is_floating(a.dtype()), "{}: expected a floating-point input, got {}", op, dtype_name(a.dtype()));
  const auto [d0, d1] = matrix_dims(a, dim, op);
  constexpr double kInf = std::numeric_limits<double>::infinity();
  if (ord == 2 || ord == -2) {
    const Tensor s = svdvals_along(a, d0, d1);
    return keep_dims(ord > 0 ? amax(s, {-1}) : amin(s, {-1}), d0, d1, keepdim);
  }
  KILN_CHECK(ord == 1 || ord == -1 || ord == kInf || ord == -kInf,
             "{}: order {} is not supported: use 'fro', 'nuc', inf, -inf, 1, -1, 2 or -2", op, ord);
  // 1: the largest column sum of |A| (summed along d0, the max along d1); inf: the largest row sum.
  const bool columns = std::abs(ord) == 1;
  const int summed = columns ? d0 : d1, extreme = columns ? d1 : d0;
  const Tensor sums = sum(a.abs(), {summed}, true);
  Tensor r = ord > 0 ? amax(sums, {extreme}, true) : amin(sums, {extreme}, true);
  if (!keepdim) r = r.squeeze(std::max(d0, d1)).squeeze(std::min(d0, d1));
  return r;
}

Tensor matrix_norm(const Tensor& a, std::string_view ord, const Shape& dim, bool keepdim) {
  const char* op = "linalg.matrix_norm";
  KILN_CHECK(a.dim() >= 2, "{}: the input tensor A must have at least 2 dimensions, got shape {}", op, a.sizes().str());
  KILN_CHECK(is_floating(a.dtype()), "{}: expected a floating-point input, got {}", op, dtype_name(a.dtype()));
  KILN_CHECK(ord == "fro" || ord == "nuc", "{}: order '{}' is not supported: use 'fro' or 'nuc' (or a number)", op,
             ord);
  const auto [d0, d1] = matrix_dims(a, dim, op);
  if (ord == "fro") return kiln::norm(a, 2, {d0, d1}, keepdim);
  return keep_dims(sum(svdvals_along(a, d0, d1), {-1}), d0, d1, keepdim);
}

Tensor norm(const Tensor& a, std::optional<double> ord, std::optional<Shape> dim, bool keepdim) {
  const char* op = "linalg.norm";
  if (dim) {
    KILN_CHECK(dim->size() == 1 || dim->size() == 2, "{}: dim must be 1 or 2 dims (a vector or a matrix norm), got {}",
               op, dim->str());
    if (dim->size() == 2) return ord ? matrix_norm(a, *ord, *dim, keepdim) : matrix_norm(a, "fro", *dim, keepdim);
    return vector_norm(a, ord.value_or(2), *dim, keepdim);
  }
  if (!ord) return vector_norm(a, 2, {}, keepdim);  // of all elements, flattened
  KILN_CHECK(a.dim() == 1 || a.dim() == 2,
             "{}: with ord and no dim, the input must be 1-D or 2-D, got shape {}; pass dim (or use vector_norm)", op,
             a.sizes().str());
  return a.dim() == 1 ? vector_norm(a, *ord, {0}, keepdim) : matrix_norm(a, *ord, {-2, -1}, keepdim);
}

Tensor norm(const Tensor& a, std::string_view ord, std::optional<Shape> dim, bool keepdim) {
  const char* op = "linalg.norm";
  KILN_CHECK(dim ? dim->size() == 2 : a.dim() == 2,
             "{}: the order '{}' is a matrix norm: it needs a 2-D input or two dims, got shape {}{}", op, ord,
             a.sizes().str(), dim ? fmt::format(" and dim {}", dim->str()) : std::string());
  return matrix_norm(a, ord, dim.value_or(Shape{-2, -1}), keepdim);
}

namespace {

// cond for the orders that need A^-1: norm(A) norm(A^-1), inf where A is singular.
Tensor cond_by_inverse(const Tensor& a, const std::function<Tensor(const Tensor&)>& matrix_norm_of) {
  const char* op = "linalg.cond";
  KILN_CHECK(a.size(-1) == a.size(-2), "{}: A must be a batch of square matrices for this order, but they are {} by {}",
             op, a.size(-2), a.size(-1));
  if (a.numel() == 0) return zeros(leading(a, 2), a.options());
  // A singular matrix (det 0) is replaced by I for inv, and its result by inf.
  Tensor singular;
  {
    NoGradGuard no_grad;
    singular = det(a).eq(0);
  }
  const Tensor identity = eye(a.size(-1), {}, a.options());
  const Tensor safe = where(singular.unsqueeze(-1).unsqueeze(-1), identity, a);
  const Tensor value = matrix_norm_of(safe) * matrix_norm_of(inv(safe));
  return where(singular, full({}, std::numeric_limits<double>::infinity(), value.options()), value);
}

}  // namespace

Tensor cond(const Tensor& a, std::optional<double> p) {
  const char* op = "linalg.cond";
  check_svd_input(a, op);
  const double ord = p.value_or(2);
  if (ord == 2 || ord == -2) {
    const Tensor s = svdvals(a);
    if (s.size(-1) == 0) return zeros(leading(a, 2), a.options());
    const Tensor big = s.narrow(-1, 0, 1).squeeze(-1), least = s.narrow(-1, s.size(-1) - 1, 1).squeeze(-1);
    return ord > 0 ? big / least : least / big;
  }
  return cond_by_inverse(a, [ord](const Tensor& x) { return matrix_norm(x, ord); });
}

Tensor cond(const Tensor& a, std::string_view p) {
  check_svd_input(a, "linalg.cond");
  KILN_CHECK(p == "fro" || p == "nuc", "linalg.cond: order '{}' is not supported: use 'fro' or 'nuc' (or a number)", p);
  const std::string ord(p);
  return cond_by_inverse(a, [ord](const Tensor& x) { return matrix_norm(x, ord); });
}

}  // namespace linalg

std::tuple<Tensor, Tensor, Tensor> svd(const Tensor& a, bool some, bool compute_uv) {
  auto [u, s, vh] = svd_impl(a, !some, compute_uv, "svd");
  if (compute_uv) return {u, s, vh.mT()};
  // torch.svd without the vectors: zero-filled U (m x m) and V (n x n).
  Shape u_shape = leading(a, 2), v_shape = leading(a, 2);
  u_shape.push_back(a.size(-2)), u_shape.push_back(a.size(-2));
  v_shape.push_back(a.size(-1)), v_shape.push_back(a.size(-1));
  return {zeros(u_shape, a.options()), s, zeros(v_shape, a.options())};
}

}  // namespace ops
}  // namespace kiln
