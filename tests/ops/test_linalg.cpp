// tests/ops/test_linalg.cpp: linalg::solve, inv, det and slogdet (ops/solve.cpp) against float64
// compositions: A X - B (or X A - B) and A A^-1 - I near zero, det(A B) = det A det B, PyTorch's values
// on fixed matrices and its vector and broadcasting rules for B, partial pivoting (a zero leading
// entry), singular and empty matrices, gradients and second derivatives by finite differences, and
// the Errors.
#include <cmath>
#include <limits>

#include "support.h"

using namespace kiln;

namespace {

// A well-conditioned batch: random entries plus n on the diagonal.
Tensor well_conditioned(const Shape& shape, double seed) {
  const int64_t n = shape[shape.size() - 1];
  return test::sample(shape, kFloat64, seed) + eye(n, {}, TensorOptions(kFloat64)) * static_cast<double>(n);
}

double largest(const Tensor& t) { return t.abs().max().item<double>(); }

}  // namespace

TEST_CASE("linalg::solve: A X = B and X A = B, vectors, broadcast batches, float32 and float64", "[ops][linalg]") {
  const Tensor a = well_conditioned({2, 3, 4, 4}, 0.3);
  // Matrices, both sides.
  const Tensor b = test::sample({2, 3, 4, 5}, kFloat64, 0.7);
  const Tensor x = linalg::solve(a, b);
  REQUIRE(x.sizes() == Shape{2, 3, 4, 5});
  CHECK(largest(a.matmul(x) - b) < 1e-12);
  const Tensor bt = test::sample({2, 3, 5, 4}, kFloat64, 0.9);
  const Tensor xt = linalg::solve(a, bt, /*left=*/false);
  REQUIRE(xt.sizes() == Shape{2, 3, 5, 4});
  CHECK(largest(xt.matmul(a) - bt) < 1e-12);
  // B of A's shape without its last dim is a batch of vectors; a 1-D B one vector for every matrix.
  const Tensor v = test::sample({2, 3, 4}, kFloat64, 1.1);
  const Tensor xv = linalg::solve(a, v);
  REQUIRE(xv.sizes() == Shape{2, 3, 4});
  CHECK(largest(a.matmul(xv.unsqueeze(-1)).squeeze(-1) - v) < 1e-12);
  const Tensor one = test::sample({4}, kFloat64, 1.3);
  const Tensor x1 = linalg::solve(a, one);
  REQUIRE(x1.sizes() == Shape{2, 3, 4});
  CHECK(largest(a.matmul(x1.unsqueeze(-1)).squeeze(-1) - one) < 1e-12);
  // Batch dims broadcast: one A for three right-hand sides, and (3, 1) against (2,).
  const Tensor a2 = well_conditioned({4, 4}, 1.5);
  const Tensor b3 = test::sample({3, 4, 2}, kFloat64, 1.7);
  CHECK(largest(a2.matmul(linalg::solve(a2, b3)) - b3) < 1e-12);
  const Tensor a31 = well_conditioned({3, 1, 4, 4}, 1.9), b2 = test::sample({2, 4, 2}, kFloat64, 2.1);
  const Tensor x32 = linalg::solve(a31, b2);
  REQUIRE(x32.sizes() == Shape{3, 2, 4, 2});
  CHECK(largest(a31.matmul(x32) - b2) < 1e-12);
  // float32: the same system in float32, within float32's rounding of a well-conditioned solve.
  const Tensor x32f = linalg::solve(a.to(kFloat32), b.to(kFloat32));
  CHECK(x32f.dtype() == kFloat32);
  test::check_close(x32f, x, test::Tolerance{1e-5, 1e-6});
  // Strided inputs (a transposed A) and empty batches.
  CHECK(largest(a.mT().matmul(linalg::solve(a.mT(), b)) - b) < 1e-12);
  CHECK(linalg::solve(zeros({0, 3, 3}, kFloat64), zeros({0, 3, 2}, kFloat64)).sizes() == Shape{0, 3, 2});
  CHECK(linalg::solve(zeros({2, 0, 0}, kFloat64), zeros({2, 0, 5}, kFloat64)).sizes() == Shape{2, 0, 5});
}

TEST_CASE("linalg::solve pivots: a zero or tiny leading entry, and PyTorch's values on a fixed system",
          "[ops][linalg]") {
  // Without row exchanges the first system divides by 0 and the second loses every digit.
  const Tensor a = from_vector(std::vector<double>{0, 1, 1, 1}, {2, 2});
  const Tensor x = linalg::solve(a, from_vector(std::vector<double>{2, 3}, {2}));
  test::check_close(x, from_vector(std::vector<double>{1, 2}, {2}), test::Tolerance{0, 0});
  const Tensor tiny = from_vector(std::vector<float>{1e-20f, 1, 1, 1}, {2, 2});
  test::check_close(linalg::solve(tiny, from_vector(std::vector<float>{1, 2}, {2})),
                    from_vector(std::vector<float>{1, 1}, {2}), test::Tolerance{1e-6, 1e-6});
  // torch.linalg.solve(A, B) for this A and B (torch 1.13, float64).
  const Tensor a3 = from_vector(std::vector<double>{2, -1, 0, -1, 2, -1, 0, -1, 2}, {3, 3});
  const Tensor b3 = from_vector(std::vector<double>{1, 0, 0, 1, 0, 0}, {3, 2});
  const Tensor want = from_vector(std::vector<double>{0.75, 0.5, 0.5, 1.0, 0.25, 0.5}, {3, 2});
  test::check_close(linalg::solve(a3, b3), want, test::Tolerance{1e-15, 1e-15});
}

TEST_CASE("linalg::inv: A A^-1 = I over a batch, and inv of inv is A", "[ops][linalg]") {
  const Tensor a = well_conditioned({3, 5, 5}, 0.4);
  const Tensor ai = linalg::inv(a);
  const Tensor id = eye(5, {}, TensorOptions(kFloat64)).expand({3, 5, 5});
  CHECK(largest(a.matmul(ai) - id) < 1e-12);
  CHECK(largest(ai.matmul(a) - id) < 1e-12);
  test::check_close(linalg::inv(ai), a, test::Tolerance{1e-12, 1e-12});
  test::check_close(linalg::inv(a.to(kFloat32)), ai.to(kFloat32), test::Tolerance{1e-5, 1e-6});
}

TEST_CASE("linalg::solve and inv: gradients and second derivatives against finite differences", "[ops][linalg]") {
  using autograd::TensorList;
  auto var = [](const Tensor& t) { return t.clone().requires_grad_(true); };
  const Tensor a = well_conditioned({2, 3, 3}, 0.5), b = test::sample({2, 3, 2}, kFloat64, 0.6);
  const Tensor v = test::sample({3}, kFloat64, 0.8), a1 = well_conditioned({3, 3}, 0.2);
  auto solve_ab = [](const TensorList& in) { return TensorList{linalg::solve(in[0], in[1])}; };
  auto solve_right = [](const TensorList& in) { return TensorList{linalg::solve(in[0], in[1].mT(), false)}; };
  auto inv_a = [](const TensorList& in) { return TensorList{linalg::inv(in[0])}; };
  CHECK(autograd::gradcheck(solve_ab, {var(a), var(b)}));
  CHECK(autograd::gradgradcheck(solve_ab, {var(a), var(b)}));
  CHECK(autograd::gradcheck(solve_right, {var(a), var(b)}));
  CHECK(autograd::gradcheck(solve_ab, {var(a), var(v)}));   // a vector for every matrix: its gradient summed
  CHECK(autograd::gradcheck(solve_ab, {var(a1), var(b)}));  // one matrix for the batch: likewise
  CHECK(autograd::gradcheck(inv_a, {var(a)}));
  CHECK(autograd::gradgradcheck(inv_a, {var(a)}));
}

TEST_CASE("linalg::det and slogdet: PyTorch's values, row exchanges' signs, singular and empty matrices",
          "[ops][linalg]") {
  // torch.linalg.det / slogdet (torch 1.13, float64): det -5 (the zero leading entry pivots, row
  // exchanges' signs), and a batch of -2 and a singular matrix (PyTorch's -0 there is 0 here).
  const Tensor a = from_vector(std::vector<double>{0, 2, 1, 1, 1, 0, 3, 0, 1}, {3, 3});
  CHECK(linalg::det(a).item<double>() == Approx(-5.0).epsilon(1e-15));
  auto [s1, l1] = linalg::slogdet(a);
  CHECK(s1.item<double>() == -1.0);
  CHECK(l1.item<double>() == Approx(std::log(5.0)).epsilon(1e-15));
  const Tensor b = from_vector(std::vector<double>{1, 2, 3, 4, 1, 2, 2, 4}, {2, 2, 2});
  test::check_close(linalg::det(b), from_vector(std::vector<double>{-2, 0}, {2}), test::Tolerance{1e-15, 1e-15});
  auto [sign, logabs] = linalg::slogdet(b);
  test::check_close(sign, from_vector(std::vector<double>{-1, 0}, {2}), test::Tolerance{0, 0});
  CHECK(logabs[0].item<double>() == Approx(std::log(2.0)).epsilon(1e-15));
  CHECK(logabs[1].item<double>() == -std::numeric_limits<double>::infinity());
  // Against the product of eigen-free facts: det(A B) = det A det B, det(A^T) = det A, float32 too.
  const Tensor p = well_conditioned({3, 4, 4}, 0.2), q = well_conditioned({3, 4, 4}, 0.7);
  test::check_close(linalg::det(p.matmul(q)), linalg::det(p) * linalg::det(q), test::Tolerance{1e-12, 1e-12});
  test::check_close(linalg::det(p.mT()), linalg::det(p), test::Tolerance{1e-12, 1e-12});
  test::check_close(linalg::det(p.to(kFloat32)), linalg::det(p).to(kFloat32), test::Tolerance{1e-5, 1e-6});
  test::check_close(std::get<1>(linalg::slogdet(p)), linalg::det(p).abs().log(), test::Tolerance{1e-12, 1e-12});
  // No rows: det 1, as PyTorch's.
  test::check_close(linalg::det(zeros({2, 0, 0}, kFloat64)), ones({2}, kFloat64), test::Tolerance{0, 0});
}

TEST_CASE(
    "linalg::det and slogdet: gradients against finite differences, det's at singular matrices, and slogdet's "
    "Error there",
    "[ops][linalg]") {
  using autograd::TensorList;
  const Tensor a = well_conditioned({2, 3, 3}, 0.5).clone().requires_grad_(true);
  auto det_fn = [](const TensorList& in) { return TensorList{linalg::det(in[0])}; };
  auto logabs_fn = [](const TensorList& in) { return TensorList{std::get<1>(linalg::slogdet(in[0]))}; };
  CHECK(autograd::gradcheck(det_fn, {a}));
  CHECK(autograd::gradgradcheck(det_fn, {a}));
  CHECK(autograd::gradcheck(logabs_fn, {a}));
  // A negative determinant: log |det| still differentiates to A^-T.
  const Tensor neg = (well_conditioned({3, 3}, 0.9) * from_vector(std::vector<double>{-1, 1, 1}, {3, 1}))
                         .requires_grad_(true);
  REQUIRE(linalg::det(neg).item<double>() < 0);
  CHECK(autograd::gradcheck(logabs_fn, {neg}));
  // det's gradient is the cofactor matrix, singular or not: [[a, b], [c, d]] -> [[d, -c], [-b, a]].
  Tensor singular = from_vector(std::vector<double>{1, 2, 2, 4}, {2, 2}).requires_grad_(true);
  Tensor d = linalg::det(singular);
  CHECK(d.item<double>() == 0.0);
  d.backward();
  test::check_close(singular.grad(), from_vector(std::vector<double>{4, -2, -2, 1}, {2, 2}),
                    test::Tolerance{1e-14, 1e-14});
  // Rank 2 of 3 (row 1 = 2 row 0): the minors by hand; rank 1: 0. In a batch with an invertible matrix.
  const Tensor rank2 = from_vector(std::vector<double>{1, 2, 3, 2, 4, 6, 1, 0, 1}, {3, 3});
  const Tensor cof2 = from_vector(std::vector<double>{4, 4, -4, -2, -2, 2, 0, 0, 0}, {3, 3});
  const Tensor batch = stack({rank2, ones({3, 3}, kFloat64), well_conditioned({3, 3}, 0.4)}).requires_grad_(true);
  linalg::det(batch).sum().backward();
  test::check_close(batch.grad()[0], cof2, test::Tolerance{1e-13, 1e-13});
  test::check_close(batch.grad()[1], zeros({3, 3}, kFloat64), test::Tolerance{0, 1e-13});
  const Tensor invertible = batch.detach()[2];
  test::check_close(batch.grad()[2], linalg::inv(invertible).mT() * linalg::det(invertible),
                    test::Tolerance{1e-12, 1e-12});
  CHECK(autograd::gradcheck(det_fn, {rank2.clone().requires_grad_(true)}));
  // Rows and columns exchanged, negated, transposed: each singular, each a cofactor matrix by its minors
  // (the SVD's signs differ among them, so a sign rule that holds for one only fails).
  auto minors = [](const Tensor& m) {
    std::vector<double> c(9);
    for (int i = 0; i < 3; ++i) {
      for (int j = 0; j < 3; ++j) {
        const int r0 = i == 0 ? 1 : 0, r1 = i == 2 ? 1 : 2, c0 = j == 0 ? 1 : 0, c1 = j == 2 ? 1 : 2;
        const double minor =
            m[r0][c0].item<double>() * m[r1][c1].item<double>() - m[r0][c1].item<double>() * m[r1][c0].item<double>();
        c[i * 3 + j] = ((i + j) % 2 == 0 ? 1 : -1) * minor;
      }
    }
    return from_vector(c, {3, 3});
  };
  const Tensor swap = tensor({2L, 0L, 1L}, TensorOptions(kInt64));
  for (const Tensor& m : {rank2.index_select(0, swap), rank2.index_select(1, swap), -rank2, rank2.mT().contiguous(),
                          rank2.index_select(0, swap).index_select(1, swap) * -2.0}) {
    const Tensor x = m.clone().requires_grad_(true);
    linalg::det(x).backward();
    test::check_close(x.grad(), minors(m), test::Tolerance{1e-13, 1e-13});
  }
  CHECK(autograd::gradcheck(det_fn, {singular.detach().clone().requires_grad_(true)}));
  // log |det| has none there.
  Tensor logabs = std::get<1>(linalg::slogdet(singular));
  test::check_error([&] { logabs.backward(); }, {"gradient of linalg.slogdet", "singular"});
}

TEST_CASE("linalg::solve and inv: Errors name the problem", "[ops][linalg][errors]") {
  const Tensor a = well_conditioned({3, 3}, 0.1);
  test::check_error([&] { linalg::solve(ones({3, 4}, kFloat64), ones({3}, kFloat64)); },
                    {"linalg.solve", "square", "3 by 4"});
  test::check_error([&] { linalg::solve(ones({3}, kFloat64), ones({3}, kFloat64)); },
                    {"linalg.solve", "at least 2 dimensions", "[3]"});
  test::check_error([&] { linalg::solve(a, ones({4, 2}, kFloat64)); },
                    {"linalg.solve", "incompatible shapes", "[4, 2]", "A X = B"});
  test::check_error([&] { linalg::solve(a, ones({2, 4}, kFloat64), false); }, {"linalg.solve", "X A = B", "4 columns"});
  test::check_error([&] { linalg::solve(a, ones({3}, kFloat32)); }, {"linalg.solve", "same dtype", "float32"});
  test::check_error([&] { linalg::solve(a.to(kFloat16), ones({3}, kFloat16)); },
                    {"linalg.solve", "float32 or float64", "float16"});
  test::check_error([&] { linalg::inv(ones({3, 3}, kInt64)); }, {"linalg.inv", "float32 or float64", "int64"});
  // An exactly singular matrix, alone and as batch element 1.
  const Tensor singular = from_vector(std::vector<double>{1, 2, 2, 4}, {2, 2});
  test::check_error([&] { linalg::inv(singular); }, {"linalg.inv", "singular", "column 1", "regularize"});
  test::check_error([&] { linalg::solve(stack({eye(2, {}, TensorOptions(kFloat64)), singular}), ones({2}, kFloat64)); },
                    {"linalg.solve", "batch element 1", "singular"});
}
