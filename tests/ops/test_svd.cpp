// tests/ops/test_svd.cpp: linalg::svd, svdvals, pinv, matrix_rank, lstsq, the norms and cond (ops/svd.cpp)
// beyond the op table's PyTorch goldens: the defining identities on larger and harder matrices (A = U
// diag(S) Vh with orthonormal U and V; rank-deficient, scaled to the ends of float64's range,
// zero diagonals in the bidiagonal form), the Moore-Penrose conditions, the normal equations of least
// squares, each norm against its definition, and the Errors.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "support.h"

using namespace kiln;

namespace {

const TensorOptions f64(kFloat64);

double largest(const Tensor& t) { return t.numel() == 0 ? 0.0 : t.abs().max().item<double>(); }

// A well-conditioned matrix of full rank (the sample formula's rows alone span two dims): 3 I plus them.
Tensor full_rank(int64_t m, int64_t n, double seed) {
  return test::sample({m, n}, kFloat64, seed) + eye(m, n, f64) * 3;
}

// The factorization's identities: A = U diag(S) Vh, U^T U = I, Vh Vh^T = I, S descending and >= 0.
void check_svd(const Tensor& a, bool full, double tol = 1e-13) {
  auto [u, s, vh] = linalg::svd(a, full);
  const int64_t m = a.size(-2), n = a.size(-1), k = std::min(m, n);
  CHECK(u.size(-1) == (full ? m : k));
  CHECK(vh.size(-2) == (full ? n : k));
  const Tensor uk = u.narrow(-1, 0, k), vhk = vh.narrow(-2, 0, k);
  const double scale = std::max(largest(a), std::numeric_limits<double>::min());
  CHECK(largest(matmul(uk * s.unsqueeze(-2), vhk) - a) <= tol * scale * double(std::max(m, n)));
  CHECK(largest(matmul(u.mT(), u) - eye(u.size(-1), {}, f64)) <= tol * double(m));
  CHECK(largest(matmul(vh, vh.mT()) - eye(vh.size(-2), {}, f64)) <= tol * double(n));
  const std::vector<double> values = s.contiguous().to_vector<double>();
  for (size_t i = 0; i < values.size(); ++i) {
    CHECK(values[i] >= 0);
    if (i % size_t(std::max<int64_t>(k, 1)) != 0) CHECK(values[i - 1] >= values[i]);
  }
}

}  // namespace

TEST_CASE("svd: A = U diag(S) Vh with orthonormal U and V, tall, wide, square, batched, full and reduced",
          "[ops][linalg][svd]") {
  for (const Tensor& a : {full_rank(40, 25, 0.2), full_rank(25, 40, 0.4), full_rank(30, 30, 0.9),
                          test::sample({3, 7, 5}, kFloat64, 1.3), test::sample({2, 1, 6}, kFloat64, 0.1),
                          test::sample({6, 1}, kFloat64, 0.8), test::sample({1, 1}, kFloat64, 0.3)}) {
    INFO("shape " << a.sizes().str());
    check_svd(a, false);
    check_svd(a, true);
  }
  // S^2 are the eigenvalues of A^T A (those of a 12 x 9 matrix, well conditioned).
  const Tensor a = full_rank(12, 9, 0.5);
  const Tensor s = linalg::svdvals(a);
  test::check_close((s * s).flip({0}), linalg::eigvalsh(matmul(a.mT(), a)), test::Tolerance{1e-12, 1e-12});
  test::check_equal(s, std::get<1>(linalg::svd(a)));
  // float32: the float64 values rounded.
  const Tensor a32 = test::sample({2, 9, 6}, kFloat32, 0.6);
  test::check_close(linalg::svdvals(a32), linalg::svdvals(a32.to(kFloat64)).to(kFloat32));
  // torch.svd's form: V, not Vh; reduced by default.
  auto [u, s2, v] = svd(a);
  test::check_equal(v, std::get<2>(linalg::svd(a, false)).mT());
  CHECK(u.size(-1) == 9);
  auto [u0, s0, v0] = svd(a, true, false);
  test::check_equal(u0, zeros({12, 12}, f64));
  test::check_equal(v0, zeros({9, 9}, f64));
  test::check_equal(s0, s);
}

TEST_CASE("svd: matrices that exercise the algorithm's rare paths", "[ops][linalg][svd]") {
  // Rank-deficient: rank 3 in 20 x 10; the other seven singular values vanish to rounding.
  const Tensor low = matmul(full_rank(20, 3, 0.3), full_rank(3, 10, 0.6));
  check_svd(low, true);
  const Tensor s = linalg::svdvals(low);
  CHECK(largest(s.narrow(0, 3, 7)) < 1e-14 * s[0].item<double>());
  CHECK(s[2].item<double>() > 1e-3 * s[0].item<double>());
  // Zero diagonal entries in the bidiagonal form: a shift matrix, zero rows and columns, the zero matrix.
  const Tensor shift = tensor({{0.0, 1.0, 0.0}, {0.0, 0.0, 2.0}, {0.0, 0.0, 0.0}}, f64);
  test::check_close(linalg::svdvals(shift), tensor({2.0, 1.0, 0.0}, f64), test::Tolerance{1e-15, 1e-15});
  check_svd(shift, true);
  const Tensor last_zero = tensor({{1.0, 1.0, 0.0}, {0.0, 1.0, 1.0}, {0.0, 0.0, 0.0}}, f64);
  test::check_close(linalg::svdvals(last_zero), tensor({std::sqrt(3.0), 1.0, 0.0}, f64), test::Tolerance{1e-15, 1e-15});
  check_svd(last_zero, true);
  Tensor holes = full_rank(8, 6, 0.1).clone();
  holes.narrow(0, 2, 1).zero_();
  holes.narrow(1, 4, 1).zero_();
  check_svd(holes, true);
  CHECK(largest(linalg::svdvals(holes).narrow(0, 5, 1)) < 1e-14);
  check_svd(zeros({5, 3}, f64), true);
  test::check_equal(linalg::svdvals(zeros({5, 3}, f64)), zeros({3}, f64));
  // A diagonal of mixed signs and sizes: |d| sorted, signs carried by V.
  const Tensor d = tensor({-3.0, 0.5, 7.0, -1e-8, 2.0}, f64);
  test::check_close(linalg::svdvals(diag(d)), tensor({7.0, 3.0, 2.0, 0.5, 1e-8}, f64), test::Tolerance{1e-15, 0});
  check_svd(diag(d), false);
  // Repeated singular values: an orthogonal matrix times 3 has only 3s.
  auto [q, r] = linalg::qr(full_rank(7, 7, 0.8));
  test::check_close(linalg::svdvals(q * 3), full({7}, 3.0, f64), test::Tolerance{1e-14, 1e-14});
  check_svd(q * 3, true);
  // The ends of float64's range: neither the rotations nor the shift overflow or underflow.
  const Tensor a = full_rank(9, 6, 0.4);
  const Tensor sa = linalg::svdvals(a);
  for (double scale : {1e-300, 1e300}) {
    INFO("scale " << scale);
    // Within eps times the largest value: a * scale rounds each entry (1e-300 is no power of 2).
    test::check_close(linalg::svdvals(a * scale) / scale, sa, test::Tolerance{1e-13, 1e-15 * sa[0].item<double>()});
    check_svd(a * scale, false);
  }
}

TEST_CASE("svd: empty matrices and batches, and non-finite entries, as PyTorch's", "[ops][linalg][svd]") {
  auto [u, s, vh] = linalg::svd(zeros({0, 3}, f64));
  CHECK(u.sizes() == Shape{0, 0});
  CHECK(s.sizes() == Shape{0});
  test::check_equal(vh, eye(3, {}, f64));
  auto [ur, sr, vhr] = linalg::svd(zeros({2, 4, 0}, f64), false);
  CHECK(ur.sizes() == Shape{2, 4, 0});
  CHECK(vhr.sizes() == Shape{2, 0, 0});
  auto [ub, sb, vhb] = linalg::svd(zeros({0, 3, 2}, f64));
  CHECK(ub.sizes() == Shape{0, 3, 3});
  CHECK(sb.sizes() == Shape{0, 2});
  const Tensor bad = stack({tensor({{1.0, NAN}, {0.0, 1.0}}, f64), eye(2, {}, f64)});
  test::check_error([&] { linalg::svd(bad); }, {"linalg.svd", "non-finite", "batch element 0"});
  const Tensor sv = linalg::svdvals(bad);
  CHECK(sv[0].isnan().all().item<bool>());
  test::check_equal(sv[1], ones({2}, f64));
  test::check_error(
      [&] {
        linalg::svdvals(tensor({{INFINITY, 0.0}, {0.0, 1.0}}, f64).requires_grad_());
      },
      {"linalg.svdvals", "non-finite", "svdvals"});
}

TEST_CASE("svd: the gradient through U, S and V together (U diag(S) Vh is A), and svdvals' is U Vh",
          "[ops][linalg][svd]") {
  for (bool full : {false, true}) {
    for (const Tensor& x : {full_rank(5, 3, 0.2), full_rank(3, 5, 0.6)}) {
      INFO("full " << full << ", shape " << x.sizes().str());
      const Tensor a = x.detach().requires_grad_();
      auto [u, s, vh] = linalg::svd(a, full);
      const int64_t k = s.size(-1);
      const Tensor c = test::sample(a.sizes(), kFloat64, 1.1);
      (matmul(u.narrow(-1, 0, k) * s.unsqueeze(-2), vh.narrow(-2, 0, k)) * c).sum().backward();
      test::check_close(a.grad(), c, test::Tolerance{1e-12, 1e-12});  // d <A, C> / dA = C
    }
  }
  const Tensor a = full_rank(6, 4, 0.3).requires_grad_();
  linalg::svdvals(a).sum().backward();  // the nuclear norm: its gradient is U Vh
  auto [u, s, vh] = linalg::svd(a.detach(), false);
  test::check_close(a.grad(), matmul(u, vh), test::Tolerance{1e-13, 1e-13});
}

TEST_CASE("pinv: the Moore-Penrose conditions, inv for invertible matrices, hermitian, tolerances",
          "[ops][linalg][svd]") {
  const Tensor low = matmul(full_rank(7, 2, 0.3), full_rank(2, 5, 0.6));  // rank 2
  for (const Tensor& a : {full_rank(6, 4, 0.2), full_rank(4, 6, 0.5), low, low.mT()}) {
    INFO("shape " << a.sizes().str());
    const Tensor p = linalg::pinv(a);
    CHECK(p.sizes() == a.mT().sizes());
    const double tol = 1e-12 * largest(a) * largest(p);
    CHECK(largest(matmul(matmul(a, p), a) - a) <= tol * largest(a));
    CHECK(largest(matmul(matmul(p, a), p) - p) <= tol * largest(p));
    const Tensor ap = matmul(a, p), pa = matmul(p, a);
    CHECK(largest(ap - ap.mT()) <= tol);
    CHECK(largest(pa - pa.mT()) <= tol);
  }
  const Tensor sq = full_rank(5, 5, 0.7);
  test::check_close(linalg::pinv(sq), linalg::inv(sq), test::Tolerance{1e-10, 1e-10});
  const Tensor sym = sq + sq.mT();
  test::check_close(linalg::pinv(sym, {}, {}, true), linalg::pinv(sym), test::Tolerance{1e-10, 1e-10});
  // diag(4, 1, 1e-6): rtol 1e-3 and atol 0.5 drop the small values.
  const Tensor d = diag(tensor({4.0, 1.0, 1e-6}, f64));
  test::check_close(linalg::pinv(d, {}, 1e-3), diag(tensor({0.25, 1.0, 0.0}, f64)), test::Tolerance{1e-15, 0});
  test::check_close(linalg::pinv(d, 2.0), diag(tensor({0.25, 0.0, 0.0}, f64)), test::Tolerance{1e-15, 0});
  test::check_close(linalg::pinv(d, 2.0, {}, true), diag(tensor({0.25, 0.0, 0.0}, f64)), test::Tolerance{1e-15, 0});
  test::check_close(linalg::pinv(d), diag(tensor({0.25, 1.0, 1e6}, f64)), test::Tolerance{1e-9, 0});
  test::check_equal(linalg::pinv(zeros({2, 3}, f64)), zeros({3, 2}, f64));
  // matrix_rank counts what pinv keeps.
  CHECK(linalg::matrix_rank(low).item<int64_t>() == 2);
  CHECK(linalg::matrix_rank(ones({3, 3}, f64)).item<int64_t>() == 1);
  CHECK(linalg::matrix_rank(d).item<int64_t>() == 3);
  CHECK(linalg::matrix_rank(d, {}, 1e-3).item<int64_t>() == 2);
  CHECK(linalg::matrix_rank(d, 2.0).item<int64_t>() == 1);
  CHECK(linalg::matrix_rank(-d, 2.0, {}, true).item<int64_t>() == 1);
  // A positive atol alone sets rtol to 0, as PyTorch's: 1e-9 counts against atol 1e-10, though the
  // default rtol (eps * 2) times 1e8 would drop it.
  const Tensor wide_range = diag(tensor({1e8, 1e-9}, f64));
  CHECK(linalg::matrix_rank(wide_range, 1e-10).item<int64_t>() == 2);
  CHECK(linalg::matrix_rank(wide_range).item<int64_t>() == 1);
  test::check_close(linalg::pinv(wide_range, 1e-10), diag(tensor({1e-8, 1e9}, f64)), test::Tolerance{1e-15, 0});
  test::check_equal(linalg::matrix_rank(stack({d, zeros({3, 3}, f64), eye(3, {}, f64)})),
                    tensor({3L, 0L, 3L}, TensorOptions(kInt64)));
}

TEST_CASE("lstsq: the normal equations, the least-norm solution, residuals, ranks and drivers", "[ops][linalg][svd]") {
  const Tensor a = full_rank(9, 4, 0.3), b = test::sample({9, 2}, kFloat64, 1.2);
  auto r = linalg::lstsq(a, b, {}, "gelsd");
  CHECK(largest(matmul(a.mT(), matmul(a, r.solution) - b)) < 1e-12);  // A^T (A X - B) = 0
  const Tensor err = matmul(a, r.solution) - b;
  test::check_close(r.residuals, (err * err).sum({0}), test::Tolerance{1e-12, 1e-12});
  CHECK(r.rank.item<int64_t>() == 4);
  test::check_close(r.singular_values, linalg::svdvals(a));
  // Which outputs each driver fills, as PyTorch's.
  auto gelsy = linalg::lstsq(a, b);
  test::check_close(gelsy.solution, r.solution, test::Tolerance{1e-12, 1e-12});
  CHECK(gelsy.residuals.numel() == 0);
  CHECK(gelsy.singular_values.numel() == 0);
  CHECK(gelsy.rank.item<int64_t>() == 4);
  auto gels = linalg::lstsq(a, b, {}, "gels");
  CHECK(gels.rank.numel() == 0);
  CHECK(gels.residuals.numel() == 2);
  // Wide: the least-norm solution A^T (A A^T)^-1 B.
  const Tensor w = full_rank(3, 6, 0.9), bw = test::sample({3, 2}, kFloat64, 0.4);
  test::check_close(linalg::lstsq(w, bw).solution, matmul(w.mT(), linalg::solve(matmul(w, w.mT()), bw)),
                    test::Tolerance{1e-11, 1e-11});
  CHECK(linalg::lstsq(w, bw, {}, "gelsd").residuals.numel() == 0);
  // Rank-deficient: the least-norm solution, no residuals; rcond decides the rank.
  const Tensor low = matmul(full_rank(6, 2, 0.3), full_rank(2, 4, 0.6));
  auto rl = linalg::lstsq(low, b.narrow(0, 0, 6), {}, "gelss");
  CHECK(rl.rank.item<int64_t>() == 2);
  CHECK(rl.residuals.numel() == 0);
  test::check_close(rl.solution, matmul(linalg::pinv(low), b.narrow(0, 0, 6)), test::Tolerance{1e-11, 1e-11});
  CHECK(linalg::lstsq(a, b, 0.9, "gelsd").rank.item<int64_t>() < 4);
  // A vector B, and batch dims broadcast.
  const Tensor v = test::sample({9}, kFloat64, 0.5);
  auto rv = linalg::lstsq(a, v, {}, "gelsd");
  CHECK(rv.solution.sizes() == Shape{4});
  CHECK(rv.residuals.sizes() == Shape{1});
  test::check_close(rv.solution, linalg::lstsq(a, v.unsqueeze(1)).solution.squeeze(1), test::Tolerance{1e-13, 1e-13});
  const Tensor batch = stack({a, a * 2});
  auto rb = linalg::lstsq(batch, b.unsqueeze(0));  // b alone, one dim fewer than A, would be a batch of vectors
  CHECK(rb.solution.sizes() == Shape{2, 4, 2});
  test::check_close(rb.solution[1], r.solution / 2, test::Tolerance{1e-12, 1e-12});
  CHECK(rb.rank.sizes() == Shape{2});
}

TEST_CASE("matrix_norm, norm and cond against their definitions", "[ops][linalg][svd]") {
  const Tensor a = test::sample({3, 4, 5}, kFloat64, 0.7);
  const Tensor s = linalg::svdvals(a);
  const double inf = std::numeric_limits<double>::infinity();
  test::check_close(linalg::matrix_norm(a), (a * a).sum({-2, -1}).sqrt());
  test::check_close(linalg::matrix_norm(a, "nuc"), s.sum({-1}));
  test::check_close(linalg::matrix_norm(a, 2), amax(s, {-1}));
  test::check_close(linalg::matrix_norm(a, -2), amin(s, {-1}));
  test::check_close(linalg::matrix_norm(a, 1), amax(a.abs().sum({-2}), {-1}));
  test::check_close(linalg::matrix_norm(a, -1), amin(a.abs().sum({-2}), {-1}));
  test::check_close(linalg::matrix_norm(a, inf), amax(a.abs().sum({-1}), {-1}));
  test::check_close(linalg::matrix_norm(a, -inf), amin(a.abs().sum({-1}), {-1}));
  // Other dims, keepdim.
  const Tensor moved = a.movedim({0, 2}, {1, 2});  // the matrices along dims 0 and 2 of a
  test::check_close(linalg::matrix_norm(a, "nuc", {0, 2}), linalg::matrix_norm(moved, "nuc"));
  test::check_close(linalg::matrix_norm(a, 1, {2, 0}), linalg::matrix_norm(moved, 1, {-1, -2}));
  CHECK(linalg::matrix_norm(a, 2, {0, 2}, true).sizes() == Shape{1, 4, 1});
  CHECK(linalg::matrix_norm(a, inf, {0, 2}, true).sizes() == Shape{1, 4, 1});
  CHECK(linalg::matrix_norm(a, "fro", {0, 2}, true).sizes() == Shape{1, 4, 1});
  // linalg::norm picks vector or matrix norms as PyTorch's.
  test::check_close(linalg::norm(a), (a * a).sum().sqrt());
  test::check_close(linalg::norm(a[0], 1.0), linalg::matrix_norm(a[0], 1));
  test::check_close(linalg::norm(a[0][0], 1.0), a[0][0].abs().sum());
  test::check_close(linalg::norm(a, 3.0, Shape{1}), linalg::vector_norm(a, 3, {1}));
  test::check_close(linalg::norm(a, "nuc", Shape{0, 1}), linalg::matrix_norm(a, "nuc", {0, 1}));
  // cond: s_max / s_min; norm(A) norm(A^-1) for the other orders; inf for a singular matrix.
  const Tensor sq = full_rank(4, 4, 0.3);
  const Tensor sv = linalg::svdvals(sq);
  test::check_close(linalg::cond(sq), sv[0] / sv[3]);
  test::check_close(linalg::cond(sq, -2), sv[3] / sv[0]);
  for (double p : {1.0, -1.0, inf, -inf}) {
    test::check_close(linalg::cond(sq, p), linalg::matrix_norm(sq, p) * linalg::matrix_norm(linalg::inv(sq), p));
  }
  test::check_close(linalg::cond(sq, "fro"), linalg::matrix_norm(sq) * linalg::matrix_norm(linalg::inv(sq)));
  const Tensor singular = stack({tensor({{1.0, 2.0}, {2.0, 4.0}}, f64), eye(2, {}, f64)});
  test::check_equal(linalg::cond(singular, 1), tensor({inf, 1.0}, f64));
  CHECK(std::isinf(linalg::cond(singular[0]).item<double>()));
}

TEST_CASE("svd and its family: bad arguments are Errors naming them", "[ops][linalg][svd]") {
  const Tensor a = full_rank(4, 3, 0.2);
  test::check_error([&] { linalg::svd(zeros({3}, f64)); }, {"linalg.svd", "at least 2 dimensions"});
  test::check_error([&] { linalg::svd(zeros({3, 3}, kInt64)); }, {"linalg.svd", "int64", "float32"});
  test::check_error([&] { linalg::svdvals(zeros({3, 3}, kFloat16)); }, {"linalg.svdvals", "float16"});
  test::check_error([&] { linalg::pinv(a, -1.0); }, {"linalg.pinv", "non-negative"});
  test::check_error([&] { linalg::pinv(a, {}, {}, true); }, {"linalg.pinv", "hermitian", "square"});
  test::check_error([&] { linalg::matrix_rank(a, {}, {}, true); }, {"linalg.matrix_rank", "square"});
  test::check_error([&] { linalg::lstsq(a, zeros({5, 2}, f64)); }, {"linalg.lstsq", "4 rows"});
  test::check_error([&] { linalg::lstsq(a, zeros({4, 2})); }, {"linalg.lstsq", "same dtype"});
  test::check_error([&] { linalg::lstsq(a, zeros({4, 2}, f64), {}, "gelsx"); }, {"linalg.lstsq", "driver", "gelsx"});
  test::check_error([&] { linalg::lstsq(a, zeros({}, f64)); }, {"linalg.lstsq", "at least 1 dimension"});
  test::check_error([&] { linalg::matrix_norm(a, 3); }, {"linalg.matrix_norm", "order 3", "not supported"});
  test::check_error([&] { linalg::matrix_norm(a, "max"); }, {"linalg.matrix_norm", "'max'"});
  test::check_error([&] { linalg::matrix_norm(a, 2, {0, 0}); }, {"linalg.matrix_norm", "different"});
  test::check_error([&] { linalg::matrix_norm(a, 2, {0}); }, {"linalg.matrix_norm", "2-tuple"});
  test::check_error([&] { linalg::matrix_norm(zeros({3}, f64)); }, {"linalg.matrix_norm", "2 dimensions"});
  test::check_error([&] { linalg::matrix_norm(zeros({3, 3}, kInt64)); }, {"linalg.matrix_norm", "floating"});
  test::check_error([&] { linalg::vector_norm(zeros({3}, kInt64)); }, {"linalg.vector_norm", "floating"});
  test::check_error([&] { linalg::norm(zeros({2, 2, 2}, f64), 2.0); }, {"linalg.norm", "1-D or 2-D"});
  test::check_error([&] { linalg::norm(zeros({3}, f64), "fro"); }, {"linalg.norm", "matrix norm"});
  test::check_error([&] { linalg::cond(a, 1); }, {"linalg.cond", "square"});
  test::check_error([&] { linalg::cond(a, "max"); }, {"linalg.cond", "'max'"});
}
