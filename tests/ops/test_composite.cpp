// tests/ops/test_composite.cpp: diagonal and diag_embed (ops/views.cpp) and the compositions of
// ops/composite.cpp beyond the op table's PyTorch goldens: the views share storage and carry in-place
// changes under autograd, tensordot and kron against einsum and loops over larger shapes, roll and
// repeat_interleave against index formulas, matrix_power's inverse powers, cdist's gradient where two
// points coincide, and the Errors.
#include <cmath>
#include <vector>

#include "support.h"

using namespace kiln;

namespace {

double largest(const Tensor& t) { return t.abs().max().item<double>(); }

}  // namespace

TEST_CASE("diagonal: a view that writes through, in-place changes under autograd, diag_embed its inverse",
          "[ops][composite]") {
  Tensor base = zeros({3, 4}, TensorOptions(kFloat64));
  Tensor d = base.diagonal(1);
  CHECK(d.sizes() == Shape{3});
  d.fill_(7);
  test::check_equal(base, from_vector<double>({0, 7, 0, 0, 0, 0, 7, 0, 0, 0, 0, 7}, {3, 4}));
  // An in-place change of the diagonal of a non-leaf: the gradient through CopySlices is the
  // upstream gradient doubled on that diagonal and passed through elsewhere.
  Tensor x = test::sample({4, 4}, kFloat64, 0.3).requires_grad_();
  Tensor y = x * 1;
  y.diagonal().mul_(2);
  y.sum().backward();
  test::check_equal(x.grad(), ones({4, 4}, TensorOptions(kFloat64)) + eye(4, {}, TensorOptions(kFloat64)));
  // diag_embed(diagonal(m)) keeps the diagonal only; diagonal(diag_embed(v)) is v, over a batch and offsets.
  const Tensor v = test::sample({2, 3, 5}, kFloat32, 0.6);
  for (int64_t offset : {-2, 0, 3}) {
    test::check_equal(diagonal(diag_embed(v, offset, 0, 2), offset, 0, 2), v);
    const Tensor m = diag_embed(v, offset);
    CHECK(m.sizes() == Shape{2, 3, 5 + std::abs(offset), 5 + std::abs(offset)});
    CHECK(m.abs().sum().item<double>() == v.abs().sum().item<double>());
  }
  CHECK(diagonal(test::sample({3, 4}), 9).numel() == 0);
}

TEST_CASE("tensordot, inner, kron and linalg::cross against einsum and loops", "[ops][composite]") {
  const Tensor a = test::sample({3, 4, 5, 2}, kFloat64, 0.1), b = test::sample({5, 6, 4}, kFloat64, 0.2);
  test::check_close(tensordot(a, b, {1, 2}, {2, 0}), einsum("ijkl,kmj->ilm", {a, b}), {1e-14, 1e-14});
  test::check_close(tensordot(b, test::sample({6, 4, 3}, kFloat64, 0.3), 2),
                    einsum("ijk,jkl->il", {b, test::sample({6, 4, 3}, kFloat64, 0.3)}), {1e-14, 1e-14});
  test::check_close(inner(a, test::sample({7, 2}, kFloat64, 0.4)),
                    einsum("ijkl,ml->ijkm", {a, test::sample({7, 2}, kFloat64, 0.4)}), {1e-14, 1e-14});
  const Tensor p = test::sample({3, 2}, kFloat64, 0.5), q = test::sample({2, 4}, kFloat64, 0.6);
  const Tensor k = kron(p, q);
  REQUIRE(k.sizes() == Shape{6, 8});
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 2; ++j)
      for (int64_t r = 0; r < 2; ++r)
        for (int64_t c = 0; c < 4; ++c)
          CHECK(k[i * 2 + r][j * 4 + c].item<double>() == p[i][j].item<double>() * q[r][c].item<double>());
  // a x b is perpendicular to both, |a x b| = |a| |b| sin: checked through (a x b) . a = 0 and Lagrange's identity.
  const Tensor u = test::sample({10, 3}, kFloat64, 0.7), w = test::sample({10, 3}, kFloat64, 0.8);
  const Tensor c = linalg::cross(u, w);
  CHECK(largest((c * u).sum({1})) < 1e-14);
  const Tensor lagrange = (u * u).sum({1}) * (w * w).sum({1}) - (u * w).sum({1}).square();
  test::check_close((c * c).sum({1}), lagrange, {1e-13, 1e-14});
}

TEST_CASE("roll, repeat_interleave, movedim, rot90 and take_along_dim against index formulas", "[ops][composite]") {
  const Tensor x = arange(60, kInt64).reshape({3, 4, 5});
  const Tensor r = roll(x, {2, -7}, {2, 1});
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 4; ++j)
      for (int64_t l = 0; l < 5; ++l)
        CHECK(r[i][j][l].item<int64_t>() == x[i][((j + 7) % 4)][((l - 2 + 5) % 5)].item<int64_t>());
  test::check_equal(roll(x, {61}), roll(x.flatten(), {1}, {0}).view({3, 4, 5}));
  const Tensor counts = from_vector<int64_t>({2, 0, 3});
  test::check_equal(repeat_interleave(counts), from_vector<int64_t>({0, 0, 2, 2, 2}));
  test::check_equal(repeat_interleave(x, counts, 0), index_select(x, 0, from_vector<int64_t>({0, 0, 2, 2, 2})));
  test::check_equal(repeat_interleave(x, 2, 2), x.unsqueeze(3).expand({3, 4, 5, 2}).reshape({3, 4, 10}));
  const Tensor moved = movedim(x, {0, 2}, {2, 0});
  CHECK(moved.sizes() == Shape{5, 4, 3});
  CHECK(moved.storage_offset() == x.storage_offset());  // a view
  test::check_equal(moved, x.permute({2, 1, 0}));
  // Four quarter turns are none; one is the transpose of the flip of the second dim.
  const Tensor m = arange(12, kInt64).reshape({3, 4});
  test::check_equal(rot90(rot90(rot90(rot90(m)))), m);
  test::check_equal(rot90(m, -1), rot90(m, 3));
  test::check_equal(take_along_dim(m, argsort(m, 1, true), 1), std::get<0>(sort(m, 1, true)));
}

TEST_CASE("matrix_power, cdist and meshgrid: inverse powers, the gradient where points coincide, views",
          "[ops][composite]") {
  const Tensor a = test::sample({4, 4}, kFloat64, 0.2) + eye(4, {}, TensorOptions(kFloat64)) * 3;
  CHECK(largest(matmul(linalg::matrix_power(a, -3), linalg::matrix_power(a, 3)) - eye(4, {}, a.options())) < 1e-13);
  test::check_close(linalg::matrix_power(a, 7), matmul(linalg::matrix_power(a, 3), linalg::matrix_power(a, 4)),
                    {1e-13, 1e-13});
  // Two coincident points: distance 0, and a gradient of 0 there (PyTorch's), not the NaN of sqrt's.
  Tensor p = from_vector<double>({0, 0, 1, 2}, {2, 2}).requires_grad_();
  const Tensor q = from_vector<double>({0, 0, 4, 6}, {2, 2});
  const Tensor d = cdist(p, q);
  test::check_close(d, from_vector<double>({0, std::sqrt(52.0), std::sqrt(5.0), 5}, {2, 2}), {1e-15, 0});
  d.sum().backward();
  CHECK(p.grad().isfinite().all().item<bool>());
  test::check_close(p.grad()[0], -(from_vector<double>({4, 6}) / std::sqrt(52.0)), {1e-15, 1e-15});
  // meshgrid's outputs are expanded views of its inputs.
  const Tensor s = arange(3, kFloat32), t = arange(2, kFloat32);
  auto grids = meshgrid({s, t}, "xy");
  CHECK(grids[0].sizes() == Shape{2, 3});
  CHECK(grids[0].strides() == Shape{0, 1});
  test::check_equal(cartesian_prod({s, t}),
                    stack({meshgrid({s, t})[0].reshape({-1}), meshgrid({s, t})[1].reshape({-1})}, 1));
  test::check_equal(tril_indices(3, 3), from_vector<int64_t>({0, 1, 1, 2, 2, 2, 0, 0, 1, 0, 1, 2}, {2, 6}));
}

TEST_CASE("diagonals, products and arrangements: Errors name what is wrong", "[ops][composite]") {
  const Tensor m = test::sample({3, 4}), v = test::sample({4});
  test::check_error([&] { diagonal(v); }, {"diagonal", "2 dims"});
  test::check_error([&] { diagonal(m, 0, 1, -1); }, {"diagonal", "dim1 and dim2 must differ"});
  test::check_error([&] { diag(test::sample({2, 2, 2})); }, {"diag", "1-D", "2-D"});
  test::check_error([&] { trace(v); }, {"trace", "2-D"});
  test::check_error([&] { dot(v, test::sample({3})); }, {"dot", "one length"});
  test::check_error([&] { dot(v, v.to(kFloat64)); }, {"dot", "one dtype"});
  test::check_error([&] { mv(m, test::sample({3})); }, {"mv", "sizes must match"});
  test::check_error([&] { tensordot(m, m, {1}, {1, 0}); }, {"tensordot", "as many dims"});
  test::check_error([&] { tensordot(m, m, {1}, {0}); }, {"tensordot", "contracted dims must match"});
  test::check_error([&] { linalg::cross(m, m); }, {"linalg.cross", "size 3"});
  test::check_error([&] { linalg::matrix_power(m, 2); }, {"linalg.matrix_power", "square"});
  test::check_error([&] { cdist(m, test::sample({2, 3})); }, {"cdist", "coordinates"});
  test::check_error([&] { roll(m, {1, 2}); }, {"roll", "one shift"});
  test::check_error([&] { repeat_interleave(v, -1); }, {"repeat_interleave", "non-negative"});
  test::check_error([&] { repeat_interleave(from_vector<int64_t>({1, -2})); }, {"repeat_interleave", "non-negative"});
  test::check_error(
      [&] {
        repeat_interleave(m, from_vector<int64_t>({1, 2}), 0);
      },
      {"repeat_interleave", "one per slice"});
  test::check_error([&] { movedim(m, {0}, {0, 1}); }, {"movedim", "same length"});
  test::check_error([&] { rot90(m, 1, {0, 0}); }, {"rot90", "must differ"});
  test::check_error([&] { meshgrid({v, m}); }, {"meshgrid", "0-d or 1-D"});
  test::check_error([&] { meshgrid({v}, "ji"); }, {"meshgrid", "'ij' or 'xy'"});
  test::check_error([&] { take_along_dim(m, from_vector<int32_t>({0}), 0); }, {"take_along_dim", "int64"});
  test::check_error([&] { tril_indices(-1, 3); }, {"tril_indices", "non-negative"});
}
