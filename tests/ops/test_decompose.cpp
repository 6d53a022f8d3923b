// tests/ops/test_decompose.cpp: linalg::cholesky, solve_triangular, cholesky_solve, eigh, eigvalsh and
// qr (ops/decompose.cpp) beyond the op table's PyTorch goldens: their defining identities on larger
// matrices (L L^T = A, A V = V diag(w) with V orthonormal, A = Q R, triangular solves against
// linalg::solve of the triangle), the gradients with respect to A itself against PyTorch's symmetric ones (the op table
// differentiates through symmetric compositions, which cannot tell), CUDA-free device round trips,
// and the Errors.
#include <algorithm>
#include <cmath>
#include <vector>

#include "support.h"

using namespace kiln;

namespace {

Tensor spd(const Tensor& x) { return matmul(x, x.mT()) + eye(x.size(-2), {}, x.options()) * 0.5; }

double largest(const Tensor& t) { return t.abs().max().item<double>(); }

}  // namespace

TEST_CASE("cholesky and eigh: L L^T = A, A V = V diag(w), V orthonormal, on 30 x 30 and batches", "[ops][linalg]") {
  const Tensor a = spd(test::sample({30, 30}, kFloat64, 0.2));
  const Tensor l = linalg::cholesky(a);
  CHECK(largest(matmul(l, l.mT()) - a) < 1e-12 * largest(a));
  CHECK(largest(l.triu(1)) == 0);
  test::check_equal(linalg::cholesky(a, true), l.mT());
  auto [w, v] = linalg::eigh(a);
  CHECK(largest(matmul(a, v) - v * w.unsqueeze(-2)) < 1e-12 * largest(a));
  CHECK(largest(matmul(v.mT(), v) - eye(30, {}, TensorOptions(kFloat64))) < 1e-13);
  std::vector<double> values = w.to_vector<double>();
  for (size_t i = 1; i < values.size(); ++i) CHECK(values[i - 1] <= values[i]);
  // A float32 batch, against the float64 results of the same matrices.
  const Tensor batch = spd(test::sample({3, 6, 6}, kFloat32, 0.9));
  test::check_close(linalg::eigvalsh(batch), linalg::eigvalsh(batch.to(kFloat64)).to(kFloat32));
  test::check_close(linalg::cholesky(batch), linalg::cholesky(batch.to(kFloat64)).to(kFloat32));
}

TEST_CASE("solve_triangular and cholesky_solve: against linalg::solve of the triangle", "[ops][linalg]") {
  const Tensor full = test::sample({2, 5, 5}, kFloat64, 0.6) + eye(5, {}, TensorOptions(kFloat64)) * 4;
  const Tensor b = test::sample({2, 5, 3}, kFloat64, 1.3), bt = b.mT();
  for (bool upper : {false, true}) {
    for (bool unit : {false, true}) {
      INFO("upper " << upper << ", unitriangular " << unit);
      Tensor tri = upper ? full.triu(unit ? 1 : 0) : full.tril(unit ? -1 : 0);
      if (unit) tri = tri + eye(5, {}, TensorOptions(kFloat64));
      test::check_close(linalg::solve_triangular(full, b, upper, true, unit), linalg::solve(tri, b),
                        test::Tolerance{1e-12, 1e-12});
      test::check_close(linalg::solve_triangular(full, bt, upper, false, unit), linalg::solve(tri, bt, false),
                        test::Tolerance{1e-12, 1e-12});
    }
  }
  const Tensor a = spd(test::sample({2, 5, 5}, kFloat64, 0.4));
  test::check_close(cholesky_solve(b, linalg::cholesky(a)), linalg::solve(a, b), test::Tolerance{1e-11, 1e-11});
  test::check_close(cholesky_solve(b, linalg::cholesky(a, true), true), linalg::solve(a, b),
                    test::Tolerance{1e-11, 1e-11});
}

TEST_CASE("cholesky and eigh: the gradient with respect to A is PyTorch's symmetric one", "[ops][linalg]") {
  // PyTorch 1.13: a = x x^T + I/2 for x = sample((3, 3), seed 0.4); (L * c).sum().backward().
  const Tensor x = test::sample({3, 3}, kFloat64, 0.4), c = test::sample({3, 3}, kFloat64, 1.5);
  const Tensor a = spd(x).detach().requires_grad_();
  (linalg::cholesky(a) * c).sum().backward();
  const Tensor expected_cholesky = from_vector<double>(
      {-0.13858622203663679, -0.9251210736100605, -0.5940339970760509, -0.9251210736100604, -1.0017502189161007,
       -1.002886883883599, -0.5940339970760509, -1.002886883883599, -0.465698131983693},
      {3, 3});
  test::check_close(a.grad(), expected_cholesky, test::Tolerance{1e-12, 1e-12});
  // b = x + x^T; eigenvectors with the sign of their largest entry made positive; (V * c).sum().
  const Tensor b = (x + x.mT()).detach().requires_grad_();
  auto [w, v] = linalg::eigh(b);
  const Tensor signed_v = v * sign(v.gather(-2, argmax(v.abs(), -2, true)));
  (signed_v * c).sum().backward();
  const Tensor expected_eigh = from_vector<double>(
      {0.03387985606682618, 0.24764429053175413, -0.10098537218495969, 0.2476442905317541, 0.08913225255496865,
       0.025750556854759826, -0.10098537218495969, 0.025750556854759833, -0.12301210862179479},
      {3, 3});
  test::check_close(b.grad(), expected_eigh, test::Tolerance{1e-12, 1e-12});
}

TEST_CASE("eigh of a matrix holding NaN or infinity gives NaN, as PyTorch's", "[ops][linalg]") {
  for (double bad : {static_cast<double>(NAN), static_cast<double>(INFINITY)}) {
    const Tensor a =
        stack({tensor({{1.0, bad}, {bad, 2.0}}, TensorOptions(kFloat64)), eye(2, {}, TensorOptions(kFloat64))});
    auto [w, v] = linalg::eigh(a);
    CHECK(w[0].isnan().all().item<bool>());
    CHECK(v[0].isnan().all().item<bool>());
    test::check_equal(w[1], ones({2}, kFloat64));  // the next matrix of the batch is unaffected
  }
}

TEST_CASE("qr: A = Q R, Q orthonormal, R upper triangular, on 40 x 25 and 25 x 40", "[ops][linalg]") {
  // A matrix of full rank: the sample formula's rows span only two dims, so the product of two.
  const Tensor a = matmul(test::sample({40, 60}, kFloat64, 0.2).sin(), test::sample({60, 25}, kFloat64, 0.9).cos());
  for (const Tensor& m : {a, a.mT()}) {
    auto [q, r] = linalg::qr(m);
    const int64_t k = std::min(m.size(0), m.size(1));
    CHECK(largest(matmul(q, r) - m) < 1e-12 * largest(m));
    CHECK(largest(matmul(q.mT(), q) - eye(k, {}, TensorOptions(kFloat64))) < 1e-13);
    CHECK(largest(r.tril(-1)) == 0);
    auto [qc, rc] = linalg::qr(m, "complete");
    CHECK(largest(matmul(qc, rc) - m) < 1e-12 * largest(m));
    CHECK(largest(matmul(qc.mT(), qc) - eye(m.size(0), {}, TensorOptions(kFloat64))) < 1e-13);
    test::check_equal(std::get<1>(linalg::qr(m, "r")), r);
  }
}

TEST_CASE("qr: the backward refuses mode r and complete with more rows than columns, as PyTorch's", "[ops][linalg]") {
  const Tensor a = (test::sample({4, 3}, kFloat64, 0.2) + eye(4, 3, TensorOptions(kFloat64)) * 3).requires_grad_();
  auto [q, r] = linalg::qr(a, "r");  // the forward runs
  test::check_error([&] { r.sum().backward(); }, {"linalg.qr", "mode 'r'", "computes no Q"});
  auto [qc, rc] = linalg::qr(a, "complete");
  test::check_error([&] { (qc.sum() + rc.sum()).backward(); }, {"linalg.qr", "mode 'complete'", "more rows"});
}

TEST_CASE("decompositions: bad arguments are Errors naming them", "[ops][linalg]") {
  const Tensor a = spd(test::sample({3, 3}, kFloat64, 0.4));
  const Tensor not_pd = a - eye(3, {}, TensorOptions(kFloat64)) * 100;
  test::check_error([&] { linalg::cholesky(not_pd); }, {"linalg.cholesky", "not positive-definite", "order 1"});
  test::check_error([&] { linalg::cholesky(stack({a, not_pd})); }, {"linalg.cholesky", "batch element 1"});
  test::check_error([&] { linalg::cholesky(zeros({3, 4}, kFloat64)); }, {"linalg.cholesky", "square"});
  test::check_error([&] { linalg::cholesky(zeros({3, 3}, kInt64)); }, {"linalg.cholesky", "int64"});
  test::check_error([&] { linalg::eigh(a, "X"); }, {"linalg.eigh", "UPLO", "'X'"});
  test::check_error([&] { linalg::qr(a, "full"); }, {"linalg.qr", "mode", "'full'"});
  test::check_error([&] { linalg::qr(zeros({3}, kFloat64)); }, {"linalg.qr", "2 dimensions"});
  test::check_error([&] { linalg::eigvalsh(zeros({3})); }, {"linalg.eigvalsh", "2 dimensions"});
  test::check_error([&] { linalg::solve_triangular(a, zeros({4, 2}, kFloat64), false); },
                    {"linalg.solve_triangular", "B has 4 rows", "A has 3"});
  test::check_error([&] { linalg::solve_triangular(a, zeros({3, 2}), false); }, {"linalg.solve_triangular", "dtype"});
  test::check_error([&] { linalg::solve_triangular(a, zeros({3}, kFloat64), false); },
                    {"linalg.solve_triangular", "B must have at least 2 dimensions"});
  test::check_error([&] { linalg::solve_triangular(zeros({3, 2}, kFloat64), zeros({3, 2}, kFloat64), true); },
                    {"linalg.solve_triangular", "square"});
}
