// nn/orthogonal.cpp: nn::utils::parametrizations::orthogonal (torch.nn.utils.parametrizations'), with the
// matrix exponential and the Householder product it is made of.
//
// Note [orthogonal parametrization]
// PyTorch's orthogonal keeps an unconstrained `original` X (n x k with n >= k; a wide matrix is handled
// as its transpose) and gives an orthogonal Q from it:
//  - matrix_exp (the default for a square matrix): the skew-symmetric A = L - L^T of X's lower triangle
//    L (with zero columns up to n x n), and Q the first k columns of exp(A);
//  - householder (the default otherwise): X's strict lower triangle holds k Householder vectors v_i
//    (with an implicit 1 at row i), each reflection I - tau_i v_i v_i^T with tau_i = 2 / |v_i|^2, and Q
//    the first k columns of their product, each column's sign that of X's diagonal (truncated to an
//    integer, as PyTorch's .int(): no gradient reaches the diagonal);
//  - cayley: matrix_exp's A, and Q the first k columns of the Cayley retraction (I - A/2)^-1 (I + A/2)
//    (linalg::solve, ops/solve.cpp).
// With use_trivialization (the default), Q is base Q(X) for a buffer `base`: the orthogonal matrix the
// tensor was when registered (kept as it is if it is orthogonal, else its QR factor with a non-negative
// diagonal in R; for n > k, the factor of the tensor completed with random columns), and X starts at -I,
// where every map gives the identity: the layer starts from its orthogonalized weight and X moves in a
// flat space around it. Without trivialization only householder can take a value: X holds the
// Householder vectors of the weight's QR (LAPACK's geqrf), with the signs of R's diagonal on X's.
//
// The matrix exponential is the Taylor polynomial of degree 18 of A / 2^s, with s the smallest that
// brings the 1-norm to 1/2 (the truncation is then below 1e-21 of the value), squared s times; the
// Householder product a loop of rank-1 updates. Both are compositions of ops, which autograd
// differentiates, on any device. (PyTorch's matrix_exp evaluates other polynomials: the values agree
// within rounding.) The QR at registration runs on the host in float64 (nn/qr.h, shared with
// nn::init::orthogonal_).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/grad_mode.h"
#include "nn/parametrize.h"
#include "nn/qr.h"
#include "ops/ops.h"

namespace kiln::nn::utils::parametrizations {

namespace {

// ---- host linear algebra on one row-major m x n matrix (m >= n), in float64 (QR: nn/qr.h) ----

// PyTorch's _is_orthogonal: allclose(Q^T Q, I) with atol 10 n eps of the dtype and allclose's rtol 1e-5.
bool is_orthogonal(const std::vector<double>& q, int64_t m, int64_t n, DType dtype) {
  const double eps = dtype == kFloat64    ? std::numeric_limits<double>::epsilon()
                     : dtype == kFloat16  ? std::ldexp(1.0, -10)
                     : dtype == kBFloat16 ? std::ldexp(1.0, -7)
                                          : std::numeric_limits<float>::epsilon();  // torch.finfo(dtype).eps
  const double atol = 10.0 * static_cast<double>(m) * eps;
  for (int64_t a = 0; a < n; ++a) {
    for (int64_t b = 0; b < n; ++b) {
      double dot = 0;
      for (int64_t i = 0; i < m; ++i) dot += q[static_cast<size_t>(i * n + a)] * q[static_cast<size_t>(i * n + b)];
      const double id = a == b ? 1.0 : 0.0;
      if (!(std::abs(dot - id) <= atol + 1e-5 * id)) return false;
    }
  }
  return true;
}

// ---- the maps, as ops ----

// exp(a) of square matrices (..., n, n) (Note [orthogonal parametrization]).
Tensor matrix_exp(const Tensor& a) {
  const int64_t n = a.size(-1);
  double norm = 0;  // the largest 1-norm (column sums) over the batch
  if (a.numel() > 0) norm = a.detach().abs().sum(Shape{-2}).max().to(kFloat64).item<double>();
  int squarings = 0;
  while (norm > 0.5 && squarings < 1024) norm /= 2, ++squarings;
  const Tensor x = a / std::ldexp(1.0, squarings);
  const Tensor id = eye(n, {}, TensorOptions(a.dtype()).device(a.device()));
  Tensor p = id + x / 18.0;  // Horner: I + x/1 (I + x/2 (... (I + x/18)))
  for (int k = 17; k >= 1; --k) p = id + x.matmul(p) / static_cast<double>(k);
  for (int i = 0; i < squarings; ++i) p = p.matmul(p);
  return p;
}

// PyTorch's householder_product(a, tau): the first k columns of H_0 ... H_{k-1}, H_i = I - tau_i v_i v_i^T
// with v_i column i of a below its diagonal and 1 on it. a (..., m, k), tau (..., k).
Tensor householder_product(const Tensor& a, const Tensor& tau) {
  const int64_t m = a.size(-2), k = a.size(-1);
  const TensorOptions like = TensorOptions(a.dtype()).device(a.device());
  const Tensor rows = arange(m, kInt64, a.device());
  Shape batch = a.sizes();
  batch[batch.size() - 1] = m;
  Tensor q = eye(m, {}, like).expand(batch).contiguous();  // (..., m, m)
  for (int64_t i = 0; i < k; ++i) {
    const Tensor below = rows.gt(i).to(a.dtype()), unit = rows.eq(i).to(a.dtype());
    const Tensor v = (a.select(-1, i) * below + unit).unsqueeze(-1);  // (..., m, 1)
    q = q - q.matmul(v).matmul(v.mT()) * tau.select(-1, i).unsqueeze(-1).unsqueeze(-1);
  }
  return q.narrow(-1, 0, k);
}

enum class Map { kMatrixExp, kCayley, kHouseholder };

// PyTorch's _Orthogonal.
class Orthogonal final : public parametrize::Parametrization {
 public:
  Orthogonal(const Shape& shape, Map map, bool use_trivialization)
      : shape_(shape), map_(map), trivialization_(use_trivialization) {}
  std::string name() const override { return "_Orthogonal"; }

  Tensor forward(const Tensor& original) override {
    Tensor x = original;
    int64_t n = x.size(-2), k = x.size(-1);
    const bool transposed = n < k;
    if (transposed) x = x.mT(), std::swap(n, k);
    Tensor q;
    if (map_ != Map::kHouseholder) {
      Tensor l = x.tril();
      if (n != k) {
        Shape pad = l.sizes();
        pad[pad.size() - 1] = n - k;
        l = cat({l, zeros(pad, TensorOptions(l.dtype()).device(l.device()))}, -1);
      }
      const Tensor a = l - l.mT();
      if (map_ == Map::kMatrixExp) {
        q = matrix_exp(a);
      } else {  // the Cayley retraction (I - A/2)^-1 (I + A/2)
        const Tensor id = eye(n, {}, TensorOptions(a.dtype()).device(a.device()));
        q = linalg::solve(id - a * 0.5, id + a * 0.5);
      }
      if (n != k) q = q.narrow(-1, 0, k);
    } else {
      const Tensor a = x.tril(-1);
      const Tensor tau = 2.0 / (1.0 + (a * a).sum(Shape{-2}));
      const Tensor diagonal = (x.detach() * eye(n, k, TensorOptions(x.dtype()).device(x.device()))).sum(Shape{-2});
      q = householder_product(a, tau) * diagonal.to(kInt64).to(x.dtype()).unsqueeze(-2);  // PyTorch's .int()
    }
    if (base_.defined()) q = base_.matmul(q);
    return transposed ? q.mT() : q;
  }

  std::vector<Tensor> right_inverse(const Tensor& value) override {
    KILN_CHECK(value.sizes() == shape_,
               "parametrizations::orthogonal: expected a matrix or batch of matrices of "
               "shape {}, got a tensor of shape {}",
               shape_.str(), value.sizes().str());
    NoGradGuard no_grad;
    const bool transposed = value.size(-2) < value.size(-1);
    const Tensor q = transposed ? value.mT() : value;
    const int64_t n = q.size(-2), k = q.size(-1), count = q.numel() / std::max<int64_t>(n * k, 1);
    std::vector<double> all = q.contiguous().to(Device::cpu()).to_vector<double>();
    if (!trivialization_) {
      KILN_CHECK(map_ == Map::kHouseholder,
                 "parametrizations::orthogonal: it is not possible to assign to the matrix exponential or the Cayley "
                 "parametrizations when use_trivialization=false; use orthogonal_map \"householder\", or keep "
                 "use_trivialization");
      std::vector<double> out(all.size());
      for (int64_t b = 0; b < count; ++b) {
        std::vector<double> a(all.begin() + b * n * k, all.begin() + (b + 1) * n * k);
        const std::vector<double> tau = nn::detail::geqrf(a, n, k);
        for (int64_t j = 0; j < k; ++j) {  // PyTorch: the diagonal's signs, flipped where tau is 0
          double& d = a[static_cast<size_t>(j * k + j)];
          d = (d > 0 ? 1.0 : d < 0 ? -1.0 : 0.0) * (tau[j] == 0 ? -1.0 : 1.0);
        }
        std::copy(a.begin(), a.end(), out.begin() + b * n * k);
      }
      const Tensor x = from_vector(out, q.sizes()).to(value.dtype()).to(value.device());
      return {transposed ? x.mT().contiguous() : x};
    }
    // The base: the tensor itself if orthogonal, else its orthogonal factor; a tall one completed with
    // random columns first.
    Shape base_shape = q.sizes();
    base_shape[base_shape.size() - 1] = n;
    const std::vector<double> extra =
        n > k ? randn({count, n, n - k}, TensorOptions(kFloat64)).to_vector<double>() : std::vector<double>{};
    std::vector<double> base(static_cast<size_t>(count * n * n));
    for (int64_t b = 0; b < count; ++b) {
      std::vector<double> a(static_cast<size_t>(n * n));
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          a[static_cast<size_t>(i * n + j)] = j < k ? all[static_cast<size_t>((b * n + i) * k + j)]
                                                    : extra[static_cast<size_t>((b * n + i) * (n - k) + j - k)];
        }
      }
      if (n != k || !is_orthogonal(a, n, n, value.dtype())) a = nn::detail::q_factor(std::move(a), n, n);
      std::copy(a.begin(), a.end(), base.begin() + b * n * n);
    }
    const Tensor b = from_vector(base, base_shape).to(value.dtype()).to(value.device());
    if (base_.defined()) {
      base_.copy_(b);
    } else {
      base_ = register_buffer("base", b);
    }
    // -I: every map gives the identity there, so the parametrized tensor starts as base's first columns.
    return {-eye(value.size(-2), value.size(-1), TensorOptions(value.dtype()).device(value.device()))
                 .expand(value.sizes())
                 .contiguous()};
  }

 private:
  Shape shape_;
  Map map_;
  bool trivialization_;
  Tensor base_;
};

}  // namespace

Module& orthogonal(Module& module, const std::string& name, std::optional<std::string> orthogonal_map,
                   bool use_trivialization) {
  Tensor weight = detail::tensor_of(module, name, "parametrizations::orthogonal");
  KILN_CHECK(weight.dim() >= 2,
             "parametrizations::orthogonal: expected a matrix or batch of matrices, got a tensor of {} dimensions",
             weight.dim());
  KILN_CHECK(is_floating(weight.dtype()), "parametrizations::orthogonal: expected a floating tensor, got {}",
             dtype_name(weight.dtype()));
  const std::string map = orthogonal_map.value_or(weight.size(-2) == weight.size(-1) ? "matrix_exp" : "householder");
  KILN_CHECK(map == "matrix_exp" || map == "cayley" || map == "householder",
             "parametrizations::orthogonal: orthogonal_map has to be one of \"matrix_exp\", \"cayley\", "
             "\"householder\"; got \"{}\"",
             map);
  const Map kind = map == "matrix_exp" ? Map::kMatrixExp : map == "cayley" ? Map::kCayley : Map::kHouseholder;
  auto parametrization = std::make_shared<Orthogonal>(weight.sizes(), kind, use_trivialization);
  weight = Tensor();  // no handle of ours while register_parametrization counts them
  return parametrize::register_parametrization(module, name, std::move(parametrization), /*unsafe=*/true);
}

}  // namespace kiln::nn::utils::parametrizations
