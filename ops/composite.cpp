// ops/composite.cpp: PyTorch's functions that are arrangements or products of other ops: diag,
// trace, outer, dot, inner, mv, addmv, addr, baddbmm, tensordot, kron, linalg::cross,
// linalg::matrix_power, linalg::matrix_exp, linalg::multi_dot, linalg::vecdot, linalg::vander,
// linalg::householder_product, linalg::tensorinv, linalg::tensorsolve, linalg::diagonal, cdist;
// roll, tile, repeat_interleave, movedim, swapaxes, rot90, fliplr, flipud, meshgrid, cartesian_prod,
// take_along_dim, tril_indices and triu_indices.
//
// Each is written in terms of ops that already differentiate (views, cat, mul, sum, matmul, gather,
// index_select...), as PyTorch's CompositeImplicitAutograd functions are, so each has a gradient of
// any order and runs on every device without a kernel of its own.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "ops/ops.h"

namespace kiln {
inline namespace ops {

namespace {

void check_dim(const Tensor& t, int want, const char* what, const char* op) {
  KILN_CHECK(t.dim() == want, "{}: {} must be {}-D, got shape {}", op, what, want, t.sizes().str());
}

}  // namespace

// ---- diagonals ----

Tensor diag(const Tensor& x, int64_t diagonal) {
  KILN_CHECK(x.dim() == 1 || x.dim() == 2,
             "diag: takes a 1-D tensor (to a matrix) or a 2-D one (to its diagonal), got shape {}", x.sizes().str());
  if (x.dim() == 1) return diag_embed(x, diagonal, 0, 1);
  return ops::diagonal(x, diagonal, 0, 1).clone();
}

Tensor trace(const Tensor& x) {
  check_dim(x, 2, "the input", "trace");
  return ops::diagonal(x, 0, 0, 1).sum();
}

// ---- products ----

Tensor outer(const Tensor& a, const Tensor& b) {
  check_dim(a, 1, "the first vector", "outer");
  check_dim(b, 1, "the second vector", "outer");
  return a.unsqueeze(1) * b.unsqueeze(0);
}

Tensor dot(const Tensor& a, const Tensor& b) {
  const char* op = "dot";
  check_dim(a, 1, "the first vector", op);
  check_dim(b, 1, "the second vector", op);
  KILN_CHECK(a.size(0) == b.size(0), "{}: the vectors must have one length, got {} and {}", op, a.size(0), b.size(0));
  KILN_CHECK(a.dtype() == b.dtype(), "{}: the vectors must have one dtype, got {} and {}; convert one with .to()", op,
             dtype_name(a.dtype()), dtype_name(b.dtype()));
  return matmul(a, b);
}

Tensor inner(const Tensor& a, const Tensor& b) {
  if (a.dim() == 0 || b.dim() == 0) return a * b;
  KILN_CHECK(a.size(-1) == b.size(-1), "inner: the last dims must match, got shapes {} and {}", a.sizes().str(),
             b.sizes().str());
  return tensordot(a, b, {a.dim() - 1}, {b.dim() - 1});
}

Tensor mv(const Tensor& m, const Tensor& v) {
  check_dim(m, 2, "the matrix", "mv");
  check_dim(v, 1, "the vector", "mv");
  KILN_CHECK(m.size(1) == v.size(0), "mv: a {} matrix times a vector of {}: the sizes must match", m.sizes().str(),
             v.size(0));
  return matmul(m, v);
}

// beta input + alpha (product); beta = 0 ignores input (NaN included), as PyTorch's.
static Tensor scaled_sum(const Tensor& input, const Tensor& product, const Scalar& beta, const Scalar& alpha) {
  const Tensor p = alpha.to_double() == 1 ? product : product * alpha;
  if (beta.to_double() == 0) return p + zeros_like(input);
  return (beta.to_double() == 1 ? input : input * beta) + p;
}
Tensor addmv(const Tensor& input, const Tensor& mat, const Tensor& vec, const Scalar& beta, const Scalar& alpha) {
  return scaled_sum(input, mv(mat, vec), beta, alpha);
}
Tensor addr(const Tensor& input, const Tensor& vec1, const Tensor& vec2, const Scalar& beta, const Scalar& alpha) {
  return scaled_sum(input, outer(vec1, vec2), beta, alpha);
}
Tensor baddbmm(const Tensor& input, const Tensor& batch1, const Tensor& batch2, const Scalar& beta,
               const Scalar& alpha) {
  return scaled_sum(input, bmm(batch1, batch2), beta, alpha);
}

Tensor tensordot(const Tensor& a, const Tensor& b, const Shape& dims_a, const Shape& dims_b) {
  const char* op = "tensordot";
  KILN_CHECK(dims_a.size() == dims_b.size(), "{}: dims_a {} and dims_b {} must name as many dims", op, dims_a.str(),
             dims_b.str());
  std::vector<bool> contracted_a(a.dim(), false), contracted_b(b.dim(), false);
  Shape order_a, order_b, contracted_a_dims, contracted_b_dims;
  // The sizes of the two matrices, multiplied out in 128 bits: an empty tensor may have other dims whose
  // product passes 2^63 ([0, 2^62, 3]), so the running products may too before the 0 comes.
  __int128 k = 1, m = 1, n = 1;
  for (int i = 0; i < dims_a.size(); ++i) {
    const int da = wrap_dim(dims_a[i], a.dim(), op), db = wrap_dim(dims_b[i], b.dim(), op);
    KILN_CHECK(!contracted_a[da] && !contracted_b[db], "{}: a dim is named twice in dims_a {} or dims_b {}", op,
               dims_a.str(), dims_b.str());
    KILN_CHECK(a.size(da) == b.size(db), "{}: contracted dims must match: dim {} of a is {}, dim {} of b is {}", op, da,
               a.size(da), db, b.size(db));
    contracted_a[da] = contracted_b[db] = true;
    contracted_a_dims.push_back(da), contracted_b_dims.push_back(db);
    k *= a.size(da);
  }
  // a as (free_a, k), b as (k, free_b): one matmul.
  Shape out_shape;
  for (int d = 0; d < a.dim(); ++d) {
    if (contracted_a[d]) continue;
    order_a.push_back(d), out_shape.push_back(a.size(d));
    m *= a.size(d);
  }
  for (int64_t d : contracted_a_dims) order_a.push_back(d);
  for (int64_t d : contracted_b_dims) order_b.push_back(d);
  for (int d = 0; d < b.dim(); ++d) {
    if (contracted_b[d]) continue;
    order_b.push_back(d), out_shape.push_back(b.size(d));
    n *= b.size(d);
  }
  for (__int128 size : {m, k, n}) {
    KILN_CHECK(size <= INT64_MAX, "{}: {} and {} make a product of more than 2^63 rows or columns", op,
               a.sizes().str(), b.sizes().str());
  }
  const Tensor am = a.permute(order_a).reshape({static_cast<int64_t>(m), static_cast<int64_t>(k)});
  const Tensor bm = b.permute(order_b).reshape({static_cast<int64_t>(k), static_cast<int64_t>(n)});
  return matmul(am, bm).reshape(out_shape);
}
Tensor tensordot(const Tensor& a, const Tensor& b, int64_t dims) {
  KILN_CHECK(dims >= 0 && dims <= std::min(a.dim(), b.dim()),
             "tensordot: dims ({}) must be between 0 and the smaller rank ({}, {})", dims, a.dim(), b.dim());
  Shape da, db;
  for (int64_t i = 0; i < dims; ++i) da.push_back(a.dim() - dims + i), db.push_back(i);
  return tensordot(a, b, da, db);
}

Tensor kron(const Tensor& a, const Tensor& b) {
  // Both padded to one rank with leading 1s; a as (a0, 1, a1, 1, ...) times b as (1, b0, 1, b1, ...),
  // then each pair of dims merged: element (i, j) of a pair is a_i b_j at i * size_b + j.
  const int nd = std::max(a.dim(), b.dim());
  Shape sa, sb, out;
  for (int d = 0; d < nd; ++d) {
    const int64_t x = d < nd - a.dim() ? 1 : a.size(d - (nd - a.dim()));
    const int64_t y = d < nd - b.dim() ? 1 : b.size(d - (nd - b.dim()));
    sa.push_back(x), sa.push_back(1);
    sb.push_back(1), sb.push_back(y);
    int64_t size = 0;
    KILN_CHECK(!__builtin_mul_overflow(x, y, &size), "kron: dim {} of the result ({} x {}) is past 2^63", d, x, y);
    out.push_back(size);
  }
  KILN_CHECK(2 * nd <= kMaxDims, "kron: at most {} dims are supported, got {}", kMaxDims / 2, nd);
  return (a.reshape(sa) * b.reshape(sb)).reshape(out);
}

namespace linalg {

Tensor cross(const Tensor& a, const Tensor& b, int64_t dim) {
  const char* op = "linalg.cross";
  const Shape shape = broadcast_shapes(a.sizes(), b.sizes(), op);
  const int d = wrap_dim(dim, shape.size(), op);
  KILN_CHECK(shape[d] == 3, "{}: dim {} must have size 3 (the vectors' components), got shape {}", op, d, shape.str());
  const Tensor x = a.expand(shape), y = b.expand(shape);
  auto c = [&](const Tensor& t, int64_t i) { return t.narrow(d, i, 1); };
  return cat({c(x, 1) * c(y, 2) - c(x, 2) * c(y, 1), c(x, 2) * c(y, 0) - c(x, 0) * c(y, 2),
              c(x, 0) * c(y, 1) - c(x, 1) * c(y, 0)},
             d);
}

Tensor matrix_power(const Tensor& a, int64_t n) {
  const char* op = "linalg.matrix_power";
  KILN_CHECK(a.dim() >= 2 && a.size(-1) == a.size(-2), "{}: A must be a batch of square matrices, got shape {}", op,
             a.sizes().str());
  if (n == 0) return eye(a.size(-1), {}, a.options()).expand(a.sizes()).clone();
  Tensor base = n < 0 ? inv(a) : a;
  uint64_t e = n < 0 ? 0 - static_cast<uint64_t>(n) : static_cast<uint64_t>(n);
  // Squaring: A^13 = A^8 A^4 A, with the product built from the lowest bit up.
  Tensor result;
  for (; e > 0; e >>= 1) {
    if (e & 1) result = result.defined() ? matmul(result, base) : base;
    if (e > 1) base = matmul(base, base);
  }
  return result;
}

// Note [matrix_exp by scaling, Pade and squaring]
// exp(A) = exp(A / 2^s)^(2^s): with s chosen so that |A / 2^s|_1 <= theta_13 = 5.37 (Higham, 2005),
// the [13/13] Pade approximant r(X) = q(X)^-1 p(X), p(X) = sum_j c_j X^j, q(X) = p(-X), c_j =
// (26 - j)! 13! / (26! j! (13 - j)!), is exp(X) to float64's rounding, and s squarings undo the
// scaling. p's odd and even parts U and V take six products (X^2, X^4, X^6 and three more), then
// r = (V - U)^-1 (V + U) one solve. All in float64 (a float32 A is converted and the result rounded
// once), with one s for the whole batch (that of the largest norm). Each step is a differentiable op,
// so the gradient is that of the approximant, which is exp's to the same accuracy, of any order.
Tensor matrix_exp(const Tensor& a) {
  const char* op = "linalg.matrix_exp";
  KILN_CHECK(a.dim() >= 2 && a.size(-1) == a.size(-2), "{}: A must be a batch of square matrices, got shape {}", op,
             a.sizes().str());
  KILN_CHECK(a.dtype() == kFloat32 || a.dtype() == kFloat64, "{}: takes float32 or float64 matrices, got {}", op,
             dtype_name(a.dtype()));
  const int64_t n = a.size(-1);
  if (a.numel() == 0) return a.clone();
  const Tensor x = a.to(kFloat64);
  double norm;
  {
    NoGradGuard no_grad;
    norm = amax(x.abs().sum({-2}), {}).item<double>();  // the largest 1-norm in the batch
  }
  constexpr double kTheta13 = 5.371920351148152;
  const int squarings =
      std::isfinite(norm) && norm > kTheta13 ? static_cast<int>(std::ceil(std::log2(norm / kTheta13))) : 0;
  const Tensor xs = squarings > 0 ? x * std::ldexp(1.0, -squarings) : x;
  double c[14];
  c[0] = 1;
  for (int j = 1; j <= 13; ++j) c[j] = c[j - 1] * double(13 - j + 1) / double(j * (26 - j + 1));
  const Tensor identity = eye(n, {}, x.options());
  const Tensor x2 = matmul(xs, xs), x4 = matmul(x2, x2), x6 = matmul(x4, x2);
  const Tensor u =
      matmul(xs, matmul(x6, x6 * c[13] + x4 * c[11] + x2 * c[9]) + x6 * c[7] + x4 * c[5] + x2 * c[3] + identity * c[1]);
  const Tensor v =
      matmul(x6, x6 * c[12] + x4 * c[10] + x2 * c[8]) + x6 * c[6] + x4 * c[4] + x2 * c[2] + identity * c[0];
  Tensor r = solve(v - u, v + u);
  for (int i = 0; i < squarings; ++i) r = matmul(r, r);
  return r.to(a.dtype());
}

Tensor multi_dot(const std::vector<Tensor>& tensors) {
  const char* op = "linalg.multi_dot";
  const size_t count = tensors.size();
  KILN_CHECK(count >= 2, "{}: expected at least 2 tensors, got {}", op, count);
  for (size_t i = 0; i < count; ++i) {
    const bool end = i == 0 || i + 1 == count;
    KILN_CHECK(tensors[i].dim() == 2 || (end && tensors[i].dim() == 1), "{}: tensor {} must be 2-D{}, got shape {}", op,
               i, end ? " (or 1-D: the first and last may be vectors)" : "", tensors[i].sizes().str());
    KILN_CHECK(tensors[i].dtype() == tensors[0].dtype(), "{}: all tensors must have one dtype, got {} and {}", op,
               dtype_name(tensors[0].dtype()), dtype_name(tensors[i].dtype()));
  }
  // A first vector is a row (1, n), a last one a column (n, 1); squeezed off again at the end.
  std::vector<Tensor> m(tensors);
  if (m.front().dim() == 1) m.front() = m.front().unsqueeze(0);
  if (m.back().dim() == 1) m.back() = m.back().unsqueeze(1);
  std::vector<int64_t> dims{m[0].size(0)};
  for (size_t i = 0; i < count; ++i) {
    KILN_CHECK(m[i].size(0) == dims.back(), "{}: tensor {} has {} rows where the product so far has {} columns", op, i,
               m[i].size(0), dims.back());
    dims.push_back(m[i].size(1));
  }
  // The cheapest order (the matrix-chain recurrence): cost[i][j] the fewest multiplications for the
  // product of matrices i..j, split[i][j] where its last product splits them.
  std::vector<std::vector<double>> cost(count, std::vector<double>(count, 0.0));
  std::vector<std::vector<size_t>> split(count, std::vector<size_t>(count, 0));
  for (size_t len = 2; len <= count; ++len) {
    for (size_t i = 0; i + len <= count; ++i) {
      const size_t j = i + len - 1;
      cost[i][j] = -1;
      for (size_t k = i; k < j; ++k) {
        const double c = cost[i][k] + cost[k + 1][j] + double(dims[i]) * double(dims[k + 1]) * double(dims[j + 1]);
        if (cost[i][j] < 0 || c < cost[i][j]) cost[i][j] = c, split[i][j] = k;
      }
    }
  }
  std::function<Tensor(size_t, size_t)> product = [&](size_t i, size_t j) -> Tensor {
    if (i == j) return m[i];
    return mm(product(i, split[i][j]), product(split[i][j] + 1, j));
  };
  Tensor r = product(0, count - 1);
  if (tensors.back().dim() == 1) r = r.squeeze(1);
  if (tensors.front().dim() == 1) r = r.squeeze(0);
  return r;
}

Tensor vecdot(const Tensor& x, const Tensor& y, int64_t dim) {
  KILN_CHECK(is_floating(x.dtype()) && is_floating(y.dtype()),
             "linalg.vecdot: takes floating-point tensors (as PyTorch's), got {} and {}; convert them",
             dtype_name(x.dtype()), dtype_name(y.dtype()));
  return sum(x * y, {dim});
}

Tensor vander(const Tensor& x, std::optional<int64_t> n) {
  const char* op = "linalg.vander";
  KILN_CHECK(x.dim() >= 1, "{}: x must have at least 1 dimension, got a 0-d tensor", op);
  const int64_t cols = n.value_or(x.size(-1));
  KILN_CHECK(cols > 1, "{}: N (the number of columns, by default x.size(-1)) must be greater than 1, got {}", op, cols);
  // 1, x, x^2, ...: a cumulative product (whose gradient is exact at x = 0, where pow's is not).
  Shape rest = x.sizes();
  rest.push_back(cols - 1);
  return cat({ones_like(x).unsqueeze(-1), x.unsqueeze(-1).expand(rest)}, -1).cumprod(-1);
}

// Q's first n columns, Q = H_0 H_1 ... H_{k-1}, H_i = I - tau_i v_i v_i^T with v_i column i of A below
// its diagonal, a 1 on it and 0 above: what geqrf's output and tau stand for. The reflections are
// applied to the first n columns of I from the last one back, one rank-1 update each.
Tensor householder_product(const Tensor& a, const Tensor& tau) {
  const char* op = "linalg.householder_product";
  KILN_CHECK(a.dim() >= 2, "{}: A must have at least 2 dimensions, got shape {}", op, a.sizes().str());
  KILN_CHECK(tau.dim() == a.dim() - 1, "{}: tau must have one dimension fewer than A {}, got shape {}", op,
             a.sizes().str(), tau.sizes().str());
  const int64_t m = a.size(-2), n = a.size(-1), k = tau.size(-1);
  KILN_CHECK(m >= n, "{}: A must have at least as many rows as columns, got {} by {}", op, m, n);
  KILN_CHECK(n >= k, "{}: tau may have at most A's {} columns of reflections, got {}", op, n, k);
  Shape batch(std::span<const int64_t>(a.sizes().begin(), a.sizes().end() - 2));
  KILN_CHECK(Shape(std::span<const int64_t>(tau.sizes().begin(), tau.sizes().end() - 1)) == batch,
             "{}: A {} and tau {} must have the same batch dimensions", op, a.sizes().str(), tau.sizes().str());
  KILN_CHECK(is_floating(a.dtype()) && a.dtype() == tau.dtype(),
             "{}: A and tau must be of one floating dtype, got {} and {}", op, dtype_name(a.dtype()),
             dtype_name(tau.dtype()));
  Tensor q = eye(m, n, a.options()).expand(a.sizes());
  Shape lead = batch;
  for (int64_t i = k - 1; i >= 0; --i) {
    Shape above = lead;
    above.push_back(i);
    const Tensor v = cat({zeros(above, a.options()), ones_like(a.select(-1, i).narrow(-1, 0, 1)),
                          a.select(-1, i).narrow(-1, i + 1, m - i - 1)},
                         -1)
                         .unsqueeze(-1);  // (*, m, 1)
    q = q - tau.select(-1, i).unsqueeze(-1).unsqueeze(-1) * matmul(v, matmul(v.mT(), q));
  }
  return q.contiguous();
}

Tensor tensorinv(const Tensor& a, int64_t ind) {
  const char* op = "linalg.tensorinv";
  KILN_CHECK(ind > 0 && ind < a.dim(), "{}: ind must be between 1 and A's rank - 1 ({}), got {}", op, a.dim() - 1, ind);
  const Shape out(std::span<const int64_t>(a.sizes().begin() + ind, a.sizes().end()));
  const Shape in(std::span<const int64_t>(a.sizes().begin(), a.sizes().begin() + ind));
  KILN_CHECK(in.numel() == out.numel(),
             "{}: the product of A's first {} dims ({}) must equal that of the rest ({}) for A {} to be invertible", op,
             ind, in.numel(), out.numel(), a.sizes().str());
  Shape result = out;
  for (int64_t d : in) result.push_back(d);
  return inv(a.reshape({in.numel(), out.numel()})).reshape(result);
}

Tensor tensorsolve(const Tensor& a, const Tensor& b, std::optional<Shape> dims) {
  const char* op = "linalg.tensorsolve";
  Tensor x = a;
  if (dims) {  // those dims of A moved to the end, in order
    Shape to;
    const int64_t count = static_cast<int64_t>(dims->size());
    for (int64_t i = 0; i < count; ++i) to.push_back(a.dim() - count + i);
    x = a.movedim(*dims, to);
  }
  KILN_CHECK(x.dim() >= b.dim(), "{}: B {} may not have more dims than A {}", op, b.sizes().str(), x.sizes().str());
  const Shape rows(std::span<const int64_t>(x.sizes().begin(), x.sizes().begin() + b.dim()));
  const Shape cols(std::span<const int64_t>(x.sizes().begin() + b.dim(), x.sizes().end()));
  KILN_CHECK(rows == b.sizes(), "{}: A's first {} dims {} must be B's shape {}", op, b.dim(), rows.str(),
             b.sizes().str());
  KILN_CHECK(rows.numel() == cols.numel(),
             "{}: the product of A's first {} dims ({}) must equal that of the rest ({}): the system must be square",
             op, b.dim(), rows.numel(), cols.numel());
  return solve(x.reshape({rows.numel(), cols.numel()}), b.reshape({-1})).reshape(cols);
}

Tensor diagonal(const Tensor& a, int64_t offset, int64_t dim1, int64_t dim2) {
  return ops::diagonal(a, offset, dim1, dim2);
}

}  // namespace linalg

Tensor cdist(const Tensor& x1, const Tensor& x2, double p) {
  const char* op = "cdist";
  KILN_CHECK(x1.dim() >= 2 && x2.dim() >= 2,
             "{}: x1 and x2 must have at least 2 dims (points by coordinates), got shapes {} and {}", op,
             x1.sizes().str(), x2.sizes().str());
  KILN_CHECK(x1.size(-1) == x2.size(-1), "{}: x1 and x2 must have the same number of coordinates, got {} and {}", op,
             x1.size(-1), x2.size(-1));
  KILN_CHECK(p >= 0, "{}: p must be non-negative, got {}", op, p);
  KILN_CHECK(x1.is_floating_point() && x2.is_floating_point(), "{}: takes floating tensors, got {} and {}", op,
             dtype_name(x1.dtype()), dtype_name(x2.dtype()));
  // (..., P, 1, M) - (..., 1, R, M): every pair's difference, then its p-norm over the coordinates.
  return norm(x1.unsqueeze(-2) - x2.unsqueeze(-3), p, {-1});
}

// ---- arrangements ----

Tensor roll(const Tensor& x, const Shape& shifts, const Shape& dims) {
  const char* op = "roll";
  if (dims.size() == 0) {
    KILN_CHECK(shifts.size() == 1, "{}: without dims, give one shift (the flattened tensor's), got {}", op,
               shifts.str());
    return roll(x.flatten(), shifts, {0}).view(x.sizes());
  }
  KILN_CHECK(shifts.size() == dims.size(), "{}: shifts {} and dims {} must have the same length", op, shifts.str(),
             dims.str());
  Tensor r = x;
  bool rolled = false;
  for (int i = 0; i < dims.size(); ++i) {
    const int d = wrap_dim(dims[i], x.dim(), op);
    const int64_t n = x.size(d);
    if (n == 0) continue;
    const int64_t s = ((shifts[i] % n) + n) % n;  // the element at 0 moves to s
    if (s == 0) continue;
    r = cat({r.narrow(d, n - s, s), r.narrow(d, 0, n - s)}, d);
    rolled = true;
  }
  return rolled ? r : x.clone();
}

Tensor tile(const Tensor& x, const Shape& reps) {
  Shape full = Shape::filled(std::max<int>(0, x.dim() - reps.size()), 1);
  for (int64_t r : reps) full.push_back(r);
  return repeat(x, full);
}

Tensor repeat_interleave(const Tensor& x, int64_t repeats, std::optional<int64_t> dim) {
  const char* op = "repeat_interleave";
  KILN_CHECK(repeats >= 0, "{}: repeats must be non-negative, got {}", op, repeats);
  if (!dim) return repeat_interleave(x.flatten(), repeats, 0);
  const int d = wrap_dim(*dim, x.dim(), op);
  if (x.dim() == 0) return x.reshape({1}).expand({repeats}).contiguous();
  // (..., n, ...) -> (..., n, 1, ...) -> expand (..., n, r, ...) -> (..., n r, ...).
  Shape expanded = x.sizes();
  expanded.insert(d + 1, repeats);
  return x.unsqueeze(d + 1).expand(expanded).contiguous().flatten(d, d + 1);
}

Tensor repeat_interleave(const Tensor& repeats) {
  const char* op = "repeat_interleave";
  KILN_CHECK(repeats.dim() <= 1 && !repeats.is_floating_point() && repeats.dtype() != kBool,
             "{}: repeats must be a 0-d or 1-D integer tensor, got {} of shape {}", op, dtype_name(repeats.dtype()),
             repeats.sizes().str());
  const Tensor counts = repeats.reshape({-1}).to(kInt64).cpu().contiguous();
  const int64_t* c = counts.data_ptr<int64_t>();
  std::vector<int64_t> index;
  for (int64_t i = 0; i < counts.numel(); ++i) {
    KILN_CHECK(c[i] >= 0, "{}: repeats must be non-negative, got {} at {}", op, c[i], i);
    index.insert(index.end(), static_cast<size_t>(c[i]), i);
  }
  return from_vector<int64_t>(index, {static_cast<int64_t>(index.size())}).to(repeats.device());
}

Tensor repeat_interleave(const Tensor& x, const Tensor& repeats, std::optional<int64_t> dim) {
  const char* op = "repeat_interleave";
  const Tensor flat = dim ? x : x.flatten();
  const int d = dim ? wrap_dim(*dim, x.dim(), op) : 0;
  const int64_t n = flat.dim() == 0 ? 1 : flat.size(d);
  KILN_CHECK(repeats.numel() == 1 || (repeats.dim() == 1 && repeats.numel() == n),
             "{}: repeats must have one element or one per slice of dim {} ({}), got shape {}", op, d, n,
             repeats.sizes().str());
  if (repeats.numel() == 1) return repeat_interleave(x, repeats.reshape({}).to(kInt64).item<int64_t>(), dim);
  return index_select(flat, d, repeat_interleave(repeats));
}

Tensor movedim(const Tensor& x, const Shape& source, const Shape& destination) {
  const char* op = "movedim";
  KILN_CHECK(source.size() == destination.size(), "{}: source {} and destination {} must have the same length", op,
             source.str(), destination.str());
  const int nd = x.dim();
  if (nd == 0) {  // dims 0 and -1 name a 0-d tensor's only place, as PyTorch's
    for (int i = 0; i < source.size(); ++i) wrap_dim(source[i], 0, op), wrap_dim(destination[i], 0, op);
    return x.permute(Shape{});
  }
  std::vector<int64_t> order(nd, -1);
  std::vector<bool> moved(nd, false), taken(nd, false);
  for (int i = 0; i < source.size(); ++i) {
    const int s = wrap_dim(source[i], nd, op), t = wrap_dim(destination[i], nd, op);
    KILN_CHECK(!moved[s] && !taken[t], "{}: repeated dim in source {} or destination {}", op, source.str(),
               destination.str());
    moved[s] = taken[t] = true;
    order[t] = s;
  }
  // The dims not moved fill the free places in their order.
  int next = 0;
  for (int t = 0; t < nd; ++t) {
    if (order[t] >= 0) continue;
    while (moved[next]) ++next;
    order[t] = next++;
  }
  return x.permute(Shape(order));
}
Tensor movedim(const Tensor& x, int64_t source, int64_t destination) {
  return movedim(x, Shape{source}, Shape{destination});
}

Tensor swapaxes(const Tensor& x, int64_t axis0, int64_t axis1) { return x.transpose(axis0, axis1); }

Tensor rot90(const Tensor& x, int64_t k, const Shape& dims) {
  const char* op = "rot90";
  KILN_CHECK(dims.size() == 2, "{}: dims must name 2 dims, got {}", op, dims.str());
  KILN_CHECK(x.dim() >= 2, "{}: needs at least 2 dims, got shape {}", op, x.sizes().str());
  const int d0 = wrap_dim(dims[0], x.dim(), op), d1 = wrap_dim(dims[1], x.dim(), op);
  KILN_CHECK(d0 != d1, "{}: the two dims must differ, got {}", op, dims.str());
  switch (((k % 4) + 4) % 4) {
    case 1: return x.flip({d1}).transpose(d0, d1);
    case 2: return x.flip({d0, d1});
    case 3: return x.flip({d0}).transpose(d0, d1);
    default: return x.clone();
  }
}

Tensor fliplr(const Tensor& x) {
  KILN_CHECK(x.dim() >= 2, "fliplr: needs at least 2 dims, got shape {}", x.sizes().str());
  return x.flip({1});
}
Tensor flipud(const Tensor& x) {
  KILN_CHECK(x.dim() >= 1, "flipud: needs at least 1 dim, got a 0-d tensor");
  return x.flip({0});
}

std::vector<Tensor> meshgrid(const std::vector<Tensor>& tensors, std::string_view indexing) {
  const char* op = "meshgrid";
  KILN_CHECK(indexing == "ij" || indexing == "xy", "{}: indexing must be 'ij' or 'xy', got '{}'", op, indexing);
  KILN_CHECK(!tensors.empty(), "{}: needs at least one tensor", op);
  Shape shape;
  for (const Tensor& t : tensors) {
    KILN_CHECK(t.dim() <= 1, "{}: takes 0-d or 1-D tensors, got shape {}", op, t.sizes().str());
    KILN_CHECK(t.dtype() == tensors[0].dtype() && t.device() == tensors[0].device(),
               "{}: the tensors must have one dtype and device, got {} on {} and {} on {}", op,
               dtype_name(tensors[0].dtype()), tensors[0].device().str(), dtype_name(t.dtype()), t.device().str());
    shape.push_back(t.numel());
  }
  // "xy" (Cartesian) indexing swaps the first two output dims.
  const bool xy = indexing == "xy" && tensors.size() >= 2;
  if (xy) std::swap(shape[0], shape[1]);
  std::vector<Tensor> out;
  for (int i = 0; i < static_cast<int>(tensors.size()); ++i) {
    const int at = xy && i < 2 ? 1 - i : i;
    Shape view = Shape::filled(shape.size(), 1);
    view[at] = shape[at];
    out.push_back(tensors[i].reshape(view).expand(shape));
  }
  return out;
}

Tensor cartesian_prod(const std::vector<Tensor>& tensors) {
  for (const Tensor& t : tensors) {
    KILN_CHECK(t.dim() == 1, "cartesian_prod: takes 1-D tensors, got shape {}", t.sizes().str());
  }
  if (tensors.size() == 1) return tensors[0].clone();
  std::vector<Tensor> columns;
  for (const Tensor& g : meshgrid(tensors, "ij")) columns.push_back(g.reshape({-1}));
  return stack(columns, 1);
}

Tensor take_along_dim(const Tensor& x, const Tensor& indices, std::optional<int64_t> dim) {
  const char* op = "take_along_dim";
  KILN_CHECK(indices.dtype() == kInt64, "{}: indices must be int64, got {}", op, dtype_name(indices.dtype()));
  if (!dim) return gather(x.reshape({-1}), 0, indices.reshape({-1}));
  KILN_CHECK(x.dim() == indices.dim(), "{}: x ({}) and indices ({}) must have the same number of dims", op,
             x.sizes().str(), indices.sizes().str());
  const int d = wrap_dim(*dim, x.dim(), op);
  // Broadcast every dim but d; along d each keeps its own size.
  Shape sx = x.sizes(), si = indices.sizes();
  sx[d] = si[d] = 1;
  const Shape batch = broadcast_shapes(sx, si, op);
  Shape ex = batch, ei = batch;
  ex[d] = x.size(d), ei[d] = indices.size(d);
  return gather(x.expand(ex), d, indices.expand(ei));
}

static Tensor triangle_indices(int64_t row, int64_t col, int64_t offset, bool upper, DType dtype, Device device) {
  const char* op = upper ? "triu_indices" : "tril_indices";
  KILN_CHECK(row >= 0 && col >= 0, "{}: row ({}) and col ({}) must be non-negative", op, row, col);
  KILN_CHECK(dtype == kInt64 || dtype == kInt32, "{}: dtype must be int64 or int32, got {}", op, dtype_name(dtype));
  std::vector<int64_t> rows, cols;
  for (int64_t i = 0; i < row; ++i) {
    for (int64_t j = 0; j < col; ++j) {
      if (upper ? j - i >= offset : j - i <= offset) rows.push_back(i), cols.push_back(j);
    }
  }
  const int64_t n = static_cast<int64_t>(rows.size());
  rows.insert(rows.end(), cols.begin(), cols.end());
  return from_vector<int64_t>(rows, {2, n}).to(dtype).to(device);
}
Tensor tril_indices(int64_t row, int64_t col, int64_t offset, DType dtype, Device device) {
  return triangle_indices(row, col, offset, false, dtype, device);
}
Tensor triu_indices(int64_t row, int64_t col, int64_t offset, DType dtype, Device device) {
  return triangle_indices(row, col, offset, true, dtype, device);
}

}  // namespace ops
}  // namespace kiln
