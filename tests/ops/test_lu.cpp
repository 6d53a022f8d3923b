// tests/ops/test_lu.cpp: linalg::lu_factor, lu_factor_ex, lu, lu_solve and lu_unpack (ops/lu.cpp), the _ex
// forms of solve, inv and cholesky, matrix_exp, multi_dot, vecdot and vander beyond the op table's PyTorch
// goldens: the identities (P L U = A with |L| <= 1, lu_solve against solve in all four forms, e^A e^-A =
// I, e^A of a symmetric A through eigh, e^A's gradient against the block-matrix formula), PyTorch's info
// codes for singular and indefinite matrices, and the Errors.
#include <cmath>
#include <limits>
#include <vector>

#include "support.h"

using namespace kiln;

namespace {

const TensorOptions f64(kFloat64);

double largest(const Tensor& t) { return t.numel() == 0 ? 0.0 : t.abs().max().item<double>(); }

Tensor full_rank(int64_t m, int64_t n, double seed) {
  return test::sample({m, n}, kFloat64, seed) + eye(m, n, f64) * 3;
}

}  // namespace

TEST_CASE("lu: P L U = A with L unit lower, |L| <= 1, U upper, for square, tall, wide and batched A",
          "[ops][linalg][lu]") {
  // (The sample formula's matrices have rank 2: the factors of singular matrices are checked too.)
  for (const Tensor& a :
       {test::sample({6, 6}, kFloat64, 0.3), test::sample({7, 4}, kFloat64, 0.6), test::sample({3, 8}, kFloat64, 0.9),
        test::sample({2, 5, 5}, kFloat64, 1.2), full_rank(5, 5, 0.1)}) {
    INFO("shape " << a.sizes().str());
    auto [p, l, u] = linalg::lu(a);
    CHECK(largest(matmul(p, matmul(l, u)) - a) < 1e-14 * 10);
    const int64_t k = std::min(a.size(-2), a.size(-1));
    test::check_equal(l.diagonal(0, -2, -1), ones_like(l.diagonal(0, -2, -1)));
    CHECK(largest(l.triu(1)) == 0);
    CHECK(largest(u.tril(-1)) == 0);
    CHECK(largest(l) <= 1.0);  // partial pivoting: every multiplier at most 1 in size
    CHECK(l.size(-1) == k);
    CHECK(u.size(-2) == k);
    // lu_factor packs the same factors; lu_unpack undoes it.
    auto [packed, pivots] = linalg::lu_factor(a);
    CHECK(pivots.dtype() == kInt32);
    auto [p2, l2, u2] = lu_unpack(packed, pivots);
    test::check_equal(p2, p);
    test::check_equal(l2, l);
    test::check_equal(u2, u);
  }
  // Without pivoting: P = I; a diagonally dominant matrix needs no exchanges.
  const Tensor dominant = full_rank(4, 4, 0.2) + eye(4, {}, f64) * 5;
  auto [p, l, u] = linalg::lu(dominant, false);
  test::check_equal(p, eye(4, {}, f64));
  CHECK(largest(matmul(l, u) - dominant) < 1e-13);
  auto [packed, pivots, info] = linalg::lu_factor_ex(dominant, false);
  test::check_equal(pivots, tensor({1, 2, 3, 4}, TensorOptions(kInt32)));
}

TEST_CASE("lu_factor_ex: info names the first zero pivot as LAPACK's, and lu_factor makes it an Error",
          "[ops][linalg][lu]") {
  // PyTorch 1.13: LU [[2, 4, 6], [0.5, -2, -2], [0.5, 0, 0]], pivots [2, 3, 3], info 3.
  const Tensor singular = tensor({{1.0, 2.0, 3.0}, {2.0, 4.0, 6.0}, {1.0, 0.0, 1.0}}, f64);
  auto [packed, pivots, info] = linalg::lu_factor_ex(singular);
  test::check_close(packed, tensor({{2.0, 4.0, 6.0}, {0.5, -2.0, -2.0}, {0.5, 0.0, 0.0}}, f64),
                    test::Tolerance{1e-15, 1e-15});
  test::check_equal(pivots, tensor({2, 3, 3}, TensorOptions(kInt32)));
  CHECK(info.item<int32_t>() == 3);
  test::check_error([&] { linalg::lu_factor(singular); }, {"linalg.lu_factor", "U[3, 3] is zero", "lu_factor_ex"});
  test::check_error(
      [&] {
        linalg::lu_factor_ex(stack({eye(3, {}, f64), singular}), true, true);
      },
      {"linalg.lu_factor_ex", "U[3, 3] is zero", "batch element 1"});
  // A zero column: no exchange (the first of equal pivots), info 1; the batch's other matrix is unaffected.
  auto [p0, v0, i0] = linalg::lu_factor_ex(stack({zeros({2, 3}, f64), full_rank(2, 3, 0.4)}));
  test::check_equal(i0, tensor({1, 0}, TensorOptions(kInt32)));
  test::check_equal(v0[0], tensor({1, 2}, TensorOptions(kInt32)));
  // Empty matrices and batches.
  auto [pe, le, ue] = linalg::lu(zeros({2, 0, 3}, f64));
  CHECK(pe.sizes() == Shape{2, 0, 0});
  CHECK(le.sizes() == Shape{2, 0, 0});
  CHECK(ue.sizes() == Shape{2, 0, 3});
}

TEST_CASE("lu_solve: A X = B, A^T X = B, X A = B and X A^T = B against linalg::solve", "[ops][linalg][lu]") {
  const Tensor a = stack({full_rank(4, 4, 0.7), full_rank(4, 4, 1.9)});
  auto [packed, pivots] = linalg::lu_factor(a);
  const Tensor b = test::sample({2, 4, 3}, kFloat64, 0.2), bt = b.mT();
  const test::Tolerance tol{1e-11, 1e-11};
  test::check_close(linalg::lu_solve(packed, pivots, b), linalg::solve(a, b), tol);
  test::check_close(linalg::lu_solve(packed, pivots, b, true, true), linalg::solve(a.mT(), b), tol);
  test::check_close(linalg::lu_solve(packed, pivots, bt, false), linalg::solve(a, bt, false), tol);
  test::check_close(linalg::lu_solve(packed, pivots, bt, false, true), linalg::solve(a.mT(), bt, false), tol);
  // Rows in a cycle, so that P is no involution (P^T != P): an adjoint solve that applied P^T for P fails.
  const Tensor cyclic = full_rank(4, 4, 0.3).index_select(0, tensor({1L, 2L, 3L, 0L}, TensorOptions(kInt64))) * 1.0;
  auto [pc, lc, uc] = linalg::lu(cyclic);
  REQUIRE(largest(pc - pc.mT()) > 0);
  auto [cyclic_lu, cyclic_pivots] = linalg::lu_factor(cyclic);
  test::check_close(linalg::lu_solve(cyclic_lu, cyclic_pivots, b[0], true, true), linalg::solve(cyclic.mT(), b[0]),
                    tol);
  test::check_close(linalg::lu_solve(cyclic_lu, cyclic_pivots, b[0]), linalg::solve(cyclic, b[0]), tol);
  // With a gradient to record, lu_solve composes P, L, U and solve_triangular instead of substituting on
  // the packed factors: the same values.
  for (bool l : {true, false}) {
    for (bool adj : {false, true}) {
      INFO("left " << l << ", adjoint " << adj);
      const Tensor rhs = l ? b : bt;
      test::check_close(linalg::lu_solve(packed, pivots, rhs.detach().requires_grad_(), l, adj),
                        linalg::lu_solve(packed, pivots, rhs, l, adj), test::Tolerance{1e-13, 1e-13});
      test::check_close(linalg::lu_solve(cyclic_lu, cyclic_pivots, rhs[0].detach().requires_grad_(), l, adj),
                        linalg::lu_solve(cyclic_lu, cyclic_pivots, rhs[0], l, adj), test::Tolerance{1e-13, 1e-13});
    }
  }
  // One B for the batch of factors.
  test::check_close(linalg::lu_solve(packed, pivots, b[0]), linalg::solve(a, b[0].expand({2, 4, 3})), tol);
}

TEST_CASE("solve_ex, inv_ex and cholesky_ex: PyTorch's info, NaN for that matrix, the Error with check_errors",
          "[ops][linalg][lu]") {
  const Tensor good = full_rank(2, 2, 0.3), singular = tensor({{1.0, 2.0}, {2.0, 4.0}}, f64);
  const Tensor batch = stack({good, singular});
  auto [x, info] = linalg::solve_ex(batch, ones({2, 2, 1}, f64));
  test::check_equal(info, tensor({0, 2}, TensorOptions(kInt32)));  // PyTorch 1.13: info 2 for [[1, 2], [2, 4]]
  test::check_close(x[0], linalg::solve(good, ones({2, 1}, f64)));
  CHECK(x[1].isnan().all().item<bool>());
  auto [inverse, inv_info] = linalg::inv_ex(batch);
  test::check_equal(inv_info, tensor({0, 2}, TensorOptions(kInt32)));
  test::check_close(inverse[0], linalg::inv(good));
  CHECK(inverse[1].isnan().all().item<bool>());
  test::check_error([&] { linalg::inv_ex(batch, true); }, {"linalg.inv_ex", "batch element 1", "singular"});
  test::check_error([&] { linalg::solve_ex(singular, ones({2}, f64), true, true); }, {"linalg.solve_ex", "singular"});
  // PyTorch 1.13: cholesky_ex([[1, 2], [2, 1]]) has info 2 (the 2 x 2 minor).
  const Tensor spd = tensor({{4.0, 2.0}, {2.0, 3.0}}, f64), indefinite = tensor({{1.0, 2.0}, {2.0, 1.0}}, f64);
  auto [l, chol_info] = linalg::cholesky_ex(stack({spd, indefinite}));
  test::check_equal(chol_info, tensor({0, 2}, TensorOptions(kInt32)));
  test::check_close(l[0], linalg::cholesky(spd));
  CHECK(l[1].isnan().all().item<bool>());
  test::check_error([&] { linalg::cholesky_ex(indefinite, false, true); }, {"not positive-definite", "order 2"});
  auto [lu_, upper_info] = linalg::cholesky_ex(spd, true);
  test::check_close(lu_, linalg::cholesky(spd).mT());
  CHECK(upper_info.item<int32_t>() == 0);
}

TEST_CASE("matrix_exp: e^A e^-A = I, symmetric A through eigh, nilpotent and rotation generators, the gradient",
          "[ops][linalg][lu]") {
  const Tensor a = test::sample({2, 5, 5}, kFloat64, 0.4) * 2;
  CHECK(largest(matmul(linalg::matrix_exp(a), linalg::matrix_exp(-a)) - eye(5, {}, f64)) < 1e-12);
  // exp(S) = V e^w V^T for symmetric S; 8 S has a norm that takes squarings.
  const Tensor s = (test::sample({6, 6}, kFloat64, 0.8) + test::sample({6, 6}, kFloat64, 0.8).mT()) * 4;
  auto [w, v] = linalg::eigh(s);
  const Tensor expected = matmul(v * w.exp().unsqueeze(-2), v.mT());
  test::check_close(linalg::matrix_exp(s), expected, test::Tolerance{1e-12, 1e-12 * largest(expected)});
  // exp([[0, 1], [0, 0]]) = I + N; the rotation generator t [[0, 1], [-1, 0]] (t = 30: 3 squarings).
  test::check_close(linalg::matrix_exp(tensor({{0.0, 1.0}, {0.0, 0.0}}, f64)), tensor({{1.0, 1.0}, {0.0, 1.0}}, f64),
                    test::Tolerance{1e-15, 1e-15});
  const double t = 30;
  test::check_close(linalg::matrix_exp(tensor({{0.0, t}, {-t, 0.0}}, f64)),
                    tensor({{std::cos(t), std::sin(t)}, {-std::sin(t), std::cos(t)}}, f64),
                    test::Tolerance{1e-13, 1e-13});
  // float32: the float64 result rounded.
  const Tensor a32 = test::sample({3, 3}, kFloat32, 0.5);
  test::check_close(linalg::matrix_exp(a32), linalg::matrix_exp(a32.to(kFloat64)).to(kFloat32));
  // d <G, e^A> / dA is the upper-right block of exp([[A^T, G], [0, A^T]]) (Mathias's formula).
  const Tensor x = (test::sample({4, 4}, kFloat64, 0.6) * 3).requires_grad_();
  const Tensor g = test::sample({4, 4}, kFloat64, 1.4);
  (linalg::matrix_exp(x) * g).sum().backward();
  const Tensor xt = x.detach().mT();
  const Tensor block = cat({cat({xt, g}, 1), cat({zeros({4, 4}, f64), xt}, 1)}, 0);
  test::check_close(x.grad(), linalg::matrix_exp(block).narrow(0, 0, 4).narrow(1, 4, 4),
                    test::Tolerance{1e-11, 1e-11 * largest(x.grad())});
}

TEST_CASE("multi_dot, vecdot and vander against their definitions", "[ops][linalg][lu]") {
  const Tensor a = test::sample({3, 40}, kFloat64, 0.1), b = test::sample({40, 2}, kFloat64, 0.2),
               c = test::sample({2, 50}, kFloat64, 0.3), d = test::sample({50}, kFloat64, 0.4);
  test::check_close(linalg::multi_dot({a, b, c, d}), matmul(matmul(matmul(a, b), c), d), test::Tolerance{1e-12, 1e-12});
  test::check_close(linalg::multi_dot({a.narrow(0, 0, 1).squeeze(0), b, c}), matmul(matmul(a[0], b), c),
                    test::Tolerance{1e-12, 1e-12});
  test::check_close(linalg::vecdot(a, a.narrow(0, 0, 1), 1), (a * a[0]).sum({1}));
  const Tensor x = tensor({2.0, -1.0, 0.0}, f64);
  test::check_equal(linalg::vander(x, 4),
                    tensor({{1.0, 2.0, 4.0, 8.0}, {1.0, -1.0, 1.0, -1.0}, {1.0, 0.0, 0.0, 0.0}}, f64));
  CHECK(linalg::vander(test::sample({2, 5}, kFloat64, 0.1)).sizes() == Shape{2, 5, 5});
}

TEST_CASE("householder_product, tensorinv and tensorsolve against their definitions", "[ops][linalg][lu]") {
  // tau_i = 2 / |v_i|^2 makes each reflection orthogonal, so Q's columns are orthonormal; with one
  // reflection, Q = (I - tau v v^T) applied to I's first columns, by hand.
  const Tensor a = test::sample({2, 6, 4}, kFloat64, 0.3);
  std::vector<Tensor> taus;
  for (int64_t i = 0; i < 4; ++i) {
    const Tensor below = a.select(-1, i).narrow(-1, i + 1, 6 - i - 1);
    taus.push_back(2.0 / (1.0 + (below * below).sum({-1})));
  }
  const Tensor tau = stack(taus, -1);
  const Tensor q = linalg::householder_product(a, tau);
  CHECK(q.sizes() == Shape{2, 6, 4});
  CHECK(largest(matmul(q.mT(), q) - eye(4, {}, f64)) < 1e-14);
  const Tensor one = linalg::householder_product(a[0], tau[0].narrow(0, 0, 1));
  const Tensor v = cat({ones({1}, kFloat64), a[0].select(-1, 0).narrow(0, 1, 5)}).unsqueeze(1);
  test::check_close(one, (eye(6, {}, f64) - tau[0][0] * matmul(v, v.mT())).narrow(1, 0, 4),
                    test::Tolerance{1e-15, 1e-15});
  // tensorinv: tensordot(tensorinv(A), A, 2) is the identity over A's last two dims; tensorsolve solves.
  const Tensor t = full_rank(12, 12, 0.4).reshape({3, 4, 2, 6});
  const Tensor ti = linalg::tensorinv(t, 2);
  CHECK(ti.sizes() == Shape{2, 6, 3, 4});
  test::check_close(tensordot(ti, t, 2), eye(12, {}, f64).reshape({2, 6, 2, 6}), test::Tolerance{1e-13, 1e-13});
  const Tensor rhs = test::sample({3, 4}, kFloat64, 0.9);
  const Tensor x = linalg::tensorsolve(t, rhs);
  CHECK(x.sizes() == Shape{2, 6});
  test::check_close(tensordot(t, x, 2), rhs, test::Tolerance{1e-13, 1e-13});
}

TEST_CASE("lu, matrix_exp, multi_dot, vecdot and vander: bad arguments are Errors naming them", "[ops][linalg][lu]") {
  const Tensor a = full_rank(3, 3, 0.2);
  auto [packed, pivots] = linalg::lu_factor(a);
  test::check_error([&] { linalg::lu_factor(zeros({3}, f64)); }, {"linalg.lu_factor_ex", "at least 2 dimensions"});
  test::check_error([&] { linalg::lu(zeros({3, 3}, kInt64)); }, {"linalg.lu_factor_ex", "int64"});
  test::check_error(
      [&] {
        linalg::lu_solve(packed, pivots.to(kInt64), ones({3, 1}, f64));
      },
      {"linalg.lu_solve", "pivots must be int32"});
  test::check_error(
      [&] {
        linalg::lu_solve(packed, pivots.narrow(0, 0, 2), ones({3, 1}, f64));
      },
      {"linalg.lu_solve", "pivots must have shape [3]"});
  test::check_error([&] { linalg::lu_solve(packed, pivots, ones({4, 1}, f64)); }, {"linalg.lu_solve", "3 rows"});
  test::check_error([&] { linalg::lu_solve(packed, pivots, ones({3, 1})); }, {"linalg.lu_solve", "same dtype"});
  test::check_error(
      [&] {
        linalg::lu_solve(packed, tensor({4, 2, 3}, TensorOptions(kInt32)), ones({3, 1}, f64));
      },
      {"linalg.lu_solve", "pivots[0] is 4"});
  test::check_error([&] { lu_unpack(packed.narrow(0, 0, 2), pivots); }, {"lu_unpack", "pivots must have shape [2]"});
  test::check_error([&] { linalg::matrix_exp(zeros({2, 3}, f64)); }, {"linalg.matrix_exp", "square"});
  test::check_error([&] { linalg::matrix_exp(zeros({2, 2}, kFloat16)); }, {"linalg.matrix_exp", "float16"});
  test::check_error([&] { linalg::multi_dot({a}); }, {"linalg.multi_dot", "at least 2"});
  test::check_error([&] { linalg::multi_dot({a, zeros({3}, f64), a}); }, {"linalg.multi_dot", "tensor 1 must be 2-D"});
  test::check_error([&] { linalg::multi_dot({a, zeros({4, 2}, f64)}); }, {"linalg.multi_dot", "tensor 1 has 4 rows"});
  test::check_error([&] { linalg::multi_dot({a, zeros({3, 3})}); }, {"linalg.multi_dot", "one dtype"});
  test::check_error([&] { linalg::vecdot(ones({3}, kInt64), ones({3}, kInt64)); }, {"linalg.vecdot", "floating"});
  test::check_error([&] { linalg::vander(ones({3}, f64), 1); }, {"linalg.vander", "greater than 1"});
  test::check_error([&] { linalg::vander(ones({}, f64)); }, {"linalg.vander", "0-d"});
  const Tensor tall = ones({5, 3}, f64), tau = ones({3}, f64);
  test::check_error([&] { linalg::householder_product(tall.mT(), tau); }, {"linalg.householder_product", "3 by 5"});
  test::check_error([&] { linalg::householder_product(tall, ones({4}, f64)); }, {"householder_product", "got 4"});
  test::check_error(
      [&] {
        linalg::householder_product(tall, ones({2, 3}, f64));
      },
      {"householder_product", "one dimension fewer"});
  test::check_error([&] { linalg::householder_product(tall, ones({3})); }, {"householder_product", "float32"});
  test::check_error([&] { linalg::tensorinv(ones({4, 6, 8, 2}, f64)); }, {"linalg.tensorinv", "24", "16"});
  test::check_error([&] { linalg::tensorinv(ones({4, 4}, f64), 2); }, {"linalg.tensorinv", "ind"});
  test::check_error(
      [&] {
        linalg::tensorsolve(ones({2, 3, 6}, f64), ones({3, 2}, f64));
      },
      {"linalg.tensorsolve", "[2, 3]", "[3, 2]"});
  test::check_error(
      [&] {
        linalg::tensorsolve(ones({2, 3, 5}, f64), ones({2, 3}, f64));
      },
      {"linalg.tensorsolve", "square"});
}
