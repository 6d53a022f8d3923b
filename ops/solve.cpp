// ops/solve.cpp: linalg::solve (A X = B, or X A = B), linalg::inv, linalg::det, linalg::slogdet,
// linalg::solve_ex and linalg::inv_ex, PyTorch's torch.linalg functions of those names, with their
// gradients.
//
// Each n x n matrix is factored P A = L U by Gaussian elimination with partial pivoting (the row of
// the largest |entry| of the column becomes the pivot, the first of equal ones), in A's dtype as
// LAPACK's getrf computes, and the right-hand sides are carried through the same row operations, then
// solved by back substitution. It runs on the host, one matrix after another: CUDA tensors are
// copied to it and back. That is O(n^3) per matrix without blocking, meant for the small systems of
// parametrizations (the Cayley map of nn::utils::parametrizations::orthogonal) and coursework, not
// for n in the thousands. A zero pivot (an exactly singular matrix) is an Error naming the batch
// element (in solve_ex and inv_ex: info, the 1-based column of the zero pivot, and NaN in that
// matrix's result); a nearly singular one gives large values, as LAPACK's. The gradient of a solve
// with a singular matrix is an Error in either form.
//
// The determinant is the product of U's diagonal and the permutation's sign: det and slogdet of a
// singular matrix are 0 and (0, -inf), as PyTorch's.
//
// Backward (X = A^-1 B): dB = A^-T dX, dA = -dB X^T, both written with solve and matmul, so they are
// differentiable again; inv(A) is solve(A, I) and takes its gradient from there; d det / dA =
// det A^-T and d log|det| / dA = A^-T, A^-T again a solve. d det / dA is A's cofactor matrix, which
// exists at a singular A too: there it comes from A's SVD (Note [det's gradient at a singular
// matrix]); log |det| has no gradient there (an Error).
#include <cmath>
#include <limits>
#include <string>
#include <tuple>

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

namespace {

using host_linalg::check_square;
using host_linalg::host_copy;
using host_linalg::leading;

// Factors one n x n matrix m in place, P m = L U (U on and above the diagonal, L's multipliers below
// it), applying the same row operations to the k right-hand sides in r (n x k, none when k is 0).
// Returns the first column without a nonzero pivot (then m is left part-way), else -1; *swaps counts
// the row exchanges (det P = (-1)^swaps).
template <typename T>
int64_t lu_factor(T* m, T* r, int64_t n, int64_t k, int64_t* swaps) {
  *swaps = 0;
  for (int64_t j = 0; j < n; ++j) {
    int64_t p = j;  // the pivot: the first row of the largest |m[i][j]|, i >= j
    for (int64_t i = j + 1; i < n; ++i)
      if (std::abs(m[i * n + j]) > std::abs(m[p * n + j])) p = i;
    if (m[p * n + j] == T(0)) return j;
    if (p != j) {
      for (int64_t c = 0; c < n; ++c) std::swap(m[j * n + c], m[p * n + c]);
      for (int64_t c = 0; c < k; ++c) std::swap(r[j * k + c], r[p * k + c]);
      ++*swaps;
    }
    const T pivot = m[j * n + j];
    for (int64_t i = j + 1; i < n; ++i) {
      const T f = m[i * n + j] / pivot;
      m[i * n + j] = f;  // L's entry
      for (int64_t c = j + 1; c < n; ++c) m[i * n + c] -= f * m[j * n + c];
      for (int64_t c = 0; c < k; ++c) r[i * k + c] -= f * r[j * k + c];
    }
  }
  return -1;
}

// r (n, k) := A^-1 r for one matrix m (n, n), both contiguous on the host; m is overwritten by its LU
// factors. Returns the column (0-based) of a zero pivot when A is singular (r then left part-way), or -1.
template <typename T>
int64_t lu_solve(T* m, T* r, int64_t n, int64_t k) {
  int64_t swaps = 0;
  const int64_t column = lu_factor(m, r, n, k, &swaps);
  if (column >= 0) return column;
  for (int64_t i = n - 1; i >= 0; --i) {  // U x = the eliminated right-hand sides
    for (int64_t c = 0; c < k; ++c) {
      T s = r[i * k + c];
      for (int64_t q = i + 1; q < n; ++q) s -= m[i * n + q] * r[q * k + c];
      r[i * k + c] = s / m[i * n + i];
    }
  }
  return -1;
}

// For each of the batch's matrices a (batch, n, n; overwritten): the sign of its determinant (0 for
// a singular one) and log |det|, the sum of log |U_ii| (-inf for a singular one), in A's dtype as
// PyTorch's; and the determinant itself, the product (-1)^swaps U_00 ... U_nn.
template <typename T>
void lu_det(T* a, int64_t batch, int64_t n, T* sign, T* logabs, T* det) {
  for (int64_t b = 0; b < batch; ++b) {
    T* m = a + b * n * n;
    int64_t swaps = 0;
    if (lu_factor(m, static_cast<T*>(nullptr), n, 0, &swaps) >= 0) {
      sign[b] = T(0), logabs[b] = -std::numeric_limits<T>::infinity(), det[b] = T(0);
      continue;
    }
    T s = swaps % 2 == 0 ? T(1) : T(-1), l = T(0), d = s;
    for (int64_t i = 0; i < n; ++i) {
      const T u = m[i * n + i];
      if (u < T(0)) s = -s;
      l += std::log(std::abs(u));
      d *= u;
    }
    sign[b] = s, logabs[b] = l, det[b] = d;
  }
}

// X = A^-1 B for A (*, n, n) and B (*, n, k) with the same batch dims, checked by the caller; op names
// the public op in a singular matrix's Error. With info (int32, the batch's shape; solve_ex and
// inv_ex), a singular matrix instead gets NaN in X and the 1-based column of its zero pivot in info.
Tensor solve_matrices(const Tensor& a, const Tensor& b, const char* op, Tensor* info = nullptr) {
  const int64_t n = a.size(-1), k = b.size(-1);
  const int64_t batch = n == 0 ? 0 : a.numel() / (n * n);
  Tensor lu = host_copy(a);  // factored in place
  Tensor x = host_copy(b);   // solved in place
  if (info) *info = zeros(leading(a, 2), TensorOptions(kInt32));
  for (int64_t i = 0; i < batch && k > 0; ++i) {
    const int64_t column = a.dtype() == kFloat64
                               ? lu_solve(lu.data_ptr<double>() + i * n * n, x.data_ptr<double>() + i * n * k, n, k)
                               : lu_solve(lu.data_ptr<float>() + i * n * n, x.data_ptr<float>() + i * n * k, n, k);
    if (column < 0) continue;
    KILN_CHECK(info != nullptr,
               "{}: the matrix {}is singular: column {} has no nonzero pivot in its LU factorization, so A X = B has "
               "no unique solution; check the matrix, or add a small multiple of the identity to regularize it",
               op, a.dim() > 2 ? fmt::format("of batch element {} ", i) : std::string(), column);
    info->data_ptr<int32_t>()[i] = static_cast<int32_t>(column + 1);
    if (a.dtype() == kFloat64) {
      std::fill_n(x.data_ptr<double>() + i * n * k, n * k, std::nan(""));
    } else {
      std::fill_n(x.data_ptr<float>() + i * n * k, n * k, std::nanf(""));
    }
  }
  if (info) *info = info->to(a.device());
  x = x.to(a.device());
  if (should_record(a, b)) {
    record("LinalgSolveBackward", {a, b}, {x},
           [as = SavedTensor(a, false), xs = SavedTensor(a.requires_grad() ? x : Tensor(), true),
            op](const Grads& g) -> TensorList {
             const Tensor a = as.unpack("LinalgSolveBackward");
             Tensor db = solve_matrices(a.mT(), g[0], op);
             Tensor da;
             if (g.needs_grad(0)) da = -matmul(db, xs.unpack("LinalgSolveBackward").mT());
             return {da, g.needs_grad(1) ? db : Tensor()};
           });
  }
  return x;
}

// A^-1 for A (*, n, n): solve_matrices with the identity, op naming the caller in its Error.
Tensor inverse(const Tensor& a, const char* op, Tensor* info = nullptr) {
  return solve_matrices(a, eye(a.size(-1), {}, a.options()).expand(a.sizes()), op, info);
}

// The sign, log |det| and det of each matrix of A (*, n, n), recording nothing.
std::tuple<Tensor, Tensor, Tensor> determinants(const Tensor& a, const char* op) {
  check_square(a, op);
  const int64_t n = a.size(-1);
  const Shape batch = leading(a, 2);
  const int64_t count = n == 0 ? batch.numel() : a.numel() / (n * n);
  Tensor lu = host_copy(a);
  Tensor sign = empty(batch, TensorOptions(a.dtype())), logabs = empty(batch, TensorOptions(a.dtype())),
         det = empty(batch, TensorOptions(a.dtype()));
  if (a.dtype() == kFloat64) {
    lu_det(lu.data_ptr<double>(), count, n, sign.data_ptr<double>(), logabs.data_ptr<double>(),
           det.data_ptr<double>());
  } else {
    lu_det(lu.data_ptr<float>(), count, n, sign.data_ptr<float>(), logabs.data_ptr<float>(), det.data_ptr<float>());
  }
  return {sign.to(a.device()), logabs.to(a.device()), det.to(a.device())};
}

// The op named in the Error of log |det|'s gradient at a singular matrix (A^-T does not exist there).
constexpr const char* kSingularGradient = "the gradient of linalg.slogdet";

// Note [det's gradient at a singular matrix]
// d det A / dA is the cofactor matrix C (adj(A)^T), det A A^-T where A is invertible. With A = U
// diag(s) Vh, adj(A) = adj(Vh) adj(diag(s)) adj(U), so C = det(U) det(Vh) U diag(c) Vh with c_i the
// product of the s_j, j != i (prefix times suffix products: no division by a zero s_i). That holds for
// a singular A as well: C is nonzero at rank n - 1 and 0 below it. (PyTorch 1.13 gives 0 at every
// singular matrix, which finite differences contradict at rank n - 1.)
Tensor cofactor(const Tensor& a) {
  const int64_t n = a.size(-1);
  if (n == 0) return zeros_like(a);
  auto [u, s, vh] = linalg::svd(a);
  const Tensor one = ones_like(s.narrow(-1, 0, 1));
  const Tensor prefix = cat({one, cumprod(s.narrow(-1, 0, n - 1), -1)}, -1);
  const Tensor suffix = cat({cumprod(s.flip({-1}).narrow(-1, 0, n - 1), -1).flip({-1}), one}, -1);
  const Tensor sign = linalg::det(u) * linalg::det(vh);  // +-1
  return matmul(u * (prefix * suffix).unsqueeze(-2), vh) * sign.unsqueeze(-1).unsqueeze(-1);
}

// The Error of solve_ex and inv_ex with check_errors: the first matrix whose info is not 0.
void check_info(const Tensor& info, const char* op) {
  const Tensor host = host_copy(info);
  for (int64_t i = 0; i < host.numel(); ++i) {
    const int32_t column = host.data_ptr<int32_t>()[i];
    KILN_CHECK(column == 0,
               "{}: the matrix {}is singular: U[{}, {}] of its LU factorization is zero (check_errors is true; "
               "with false, info says so and the result holds NaN)",
               op, info.dim() > 0 ? fmt::format("of batch element {} ", i) : std::string(), column, column);
  }
}

// linalg.solve and solve_ex (with info, see solve_matrices): PyTorch's shapes for B, batch dims
// broadcast, X A = B as A^T X^T = B^T.
Tensor solve_impl(const Tensor& a, const Tensor& b, bool left, const char* op, Tensor* info) {
  check_square(a, op);
  check_same_device(op, a, b);
  KILN_CHECK(a.dtype() == b.dtype(), "{}: A and B must have the same dtype, got {} and {}", op,
             dtype_name(a.dtype()), dtype_name(b.dtype()));
  // PyTorch's rule: B is a (batch of) vector(s) when it is 1-D, or has A's shape without its last dim.
  const Shape batch_a = leading(a, 2), a_rows = leading(a, 1);
  const bool vector = b.dim() == 1 || (b.dim() == a.dim() - 1 && b.sizes() == a_rows);
  KILN_CHECK(vector || b.dim() >= 2, "{}: B must be a vector or a batch of matrices, got shape {}", op,
             b.sizes().str());
  const int64_t n = a.size(-1);
  // X A = B is A^T X^T = B^T (a vector x A = b is A^T x = b).
  const Tensor lhs = left ? a : a.mT();
  const Tensor rhs = vector ? b.unsqueeze(-1) : (left ? b : b.mT());
  KILN_CHECK(rhs.size(-2) == n,
             "{}: incompatible shapes of A {} and B {} for the equation {}: B has {} {} where A has {}", op,
             a.sizes().str(), b.sizes().str(), left ? "A X = B" : "X A = B", rhs.size(-2),
             left ? "rows" : "columns", n);
  const Shape batch_b = leading(rhs, 2);
  Shape batch = broadcast_shapes(batch_a, batch_b, op);
  Shape a_shape = batch, b_shape = batch;
  a_shape.push_back(n), a_shape.push_back(n);
  b_shape.push_back(n), b_shape.push_back(rhs.size(-1));
  Tensor x = solve_matrices(lhs.expand(a_shape), rhs.expand(b_shape), op, info);
  if (vector) return x.squeeze(-1);
  return left ? x : x.mT();
}

}  // namespace

inline namespace ops {
namespace linalg {

Tensor solve(const Tensor& a, const Tensor& b, bool left) { return solve_impl(a, b, left, "linalg.solve", nullptr); }

std::tuple<Tensor, Tensor> solve_ex(const Tensor& a, const Tensor& b, bool left, bool check_errors) {
  const char* op = "linalg.solve_ex";
  Tensor info;
  const Tensor x = solve_impl(a, b, left, op, &info);
  if (check_errors) check_info(info, op);
  return {x, info};
}

Tensor inv(const Tensor& a) {
  const char* op = "linalg.inv";
  check_square(a, op);
  return inverse(a, op);
}

std::tuple<Tensor, Tensor> inv_ex(const Tensor& a, bool check_errors) {
  const char* op = "linalg.inv_ex";
  check_square(a, op);
  Tensor info;
  const Tensor x = inverse(a, op, &info);
  if (check_errors) check_info(info, op);
  return {x, info};
}

std::tuple<Tensor, Tensor> slogdet(const Tensor& a) {
  auto [sign, logabs, det] = determinants(a, "linalg.slogdet");
  if (should_record(a)) {  // d log|det A| / dA = A^-T; the sign has no gradient
    record("LinalgSlogdetBackward", {a}, {logabs}, [as = SavedTensor(a, false)](const Grads& g) -> TensorList {
      const Tensor a = as.unpack("LinalgSlogdetBackward");
      return {inverse(a.mT(), kSingularGradient) * g[0].unsqueeze(-1).unsqueeze(-1)};
    });
  }
  return {sign, logabs};
}

Tensor det(const Tensor& a) {
  auto [sign, logabs, det] = determinants(a, "linalg.det");
  if (should_record(a)) {  // d det A / dA = det A A^-T, the cofactor matrix
    record("LinalgDetBackward", {a}, {det},
           [as = SavedTensor(a, false), ds = SavedTensor(det, true)](const Grads& g) -> TensorList {
             const Tensor a = as.unpack("LinalgDetBackward"), det = ds.unpack("LinalgDetBackward");
             bool singular;
             {
               NoGradGuard no_grad;
               singular = det.numel() > 0 && det.eq(0).any().item<bool>();
             }
             const Tensor g_ = g[0].unsqueeze(-1).unsqueeze(-1);
             if (!singular) {
               // A^T's elimination may meet an exact zero pivot where A's met a rounded one: then too
               // the cofactors come from the SVD.
               Tensor info;
               const Tensor inv_t = inverse(a.mT(), "linalg.det", &info);
               {
                 NoGradGuard no_grad;
                 singular = info.numel() > 0 && info.ne(0).any().item<bool>();
               }
               if (!singular) return {inv_t * (det.unsqueeze(-1).unsqueeze(-1) * g_)};
             }
             return {cofactor(a) * g_};
           });
  }
  return det;
}

}  // namespace linalg
}  // namespace ops
}  // namespace kiln
