// tests/ops/test_sort.cpp: sort, topk, median and the running reductions (ops/sort.cpp) beyond the op
// table's PyTorch goldens: the CPU kernels against a reference written here (std::stable_sort of each
// line, a running loop in float64) over many lines with ties and NaN, every dtype, one and two
// threads, topk's partial sort against the full sort, cumprod's gradient with zeros against PyTorch's,
// and the Errors.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "cpu/parallel.h"
#include "support.h"

using namespace kiln;

namespace {

// Values with ties (a coarse grid) and, for floating dtypes, NaN and infinities among them.
Tensor tied(const Shape& shape, DType dtype, double seed) {
  Tensor v = (test::sample(shape, kFloat64, seed) * 3).round();
  if (is_floating(dtype)) {
    const Tensor pos = arange(v.numel(), kInt64).reshape(shape);
    v = where(remainder(pos, 11).eq(3), full({}, NAN, TensorOptions(kFloat64)), v);
    v = where(remainder(pos, 13).eq(5), full({}, INFINITY, TensorOptions(kFloat64)), v);
    v = where(remainder(pos, 17).eq(7), full({}, -INFINITY, TensorOptions(kFloat64)), v);
  }
  if (dtype == kBool) return v.gt(0);
  if (dtype == kUInt8) return v.abs().to(kUInt8);
  return v.to(dtype);
}

// The permutation that moves dim d of nd to the end, and its inverse.
Shape to_last(int nd, int d) {
  Shape p;
  for (int k = 0; k < nd; ++k) {
    if (k != d) p.push_back(k);
  }
  p.push_back(d);
  return p;
}
Shape from_last(int nd, int d) {
  const Shape p = to_last(nd, d);
  Shape inverse = p;
  for (int k = 0; k < nd; ++k) inverse[p[k]] = k;
  return inverse;
}

// The reference sort of each line along `dim`: std::stable_sort of (value, position) in float64 by
// PyTorch's rule (NaN above everything), descending by a stable sort on the reversed comparison.
std::tuple<Tensor, Tensor> reference_sort(const Tensor& x, int64_t dim, bool descending) {
  const int d = static_cast<int>(dim < 0 ? dim + x.dim() : dim);
  const Tensor moved = x.to(kFloat64).permute(to_last(x.dim(), d)).contiguous();
  const int64_t n = moved.sizes()[moved.dim() - 1], lines = n == 0 ? 0 : moved.numel() / n;
  const std::vector<double> v = moved.reshape({-1}).to_vector<double>();
  std::vector<double> values(v.size());
  std::vector<int64_t> indices(v.size());
  for (int64_t l = 0; l < lines; ++l) {
    std::vector<int64_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    const double* line = v.data() + l * n;
    const auto key_less = [](double a, double b) { return !std::isnan(a) && (std::isnan(b) || a < b); };
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return descending ? key_less(line[b], line[a]) : key_less(line[a], line[b]);
    });
    for (int64_t j = 0; j < n; ++j) {
      values[l * n + j] = line[order[j]];
      indices[l * n + j] = order[j];
    }
  }
  const Tensor vt = from_vector(values).reshape(moved.sizes()).permute(from_last(x.dim(), d));
  const Tensor it = from_vector(indices).reshape(moved.sizes()).permute(from_last(x.dim(), d));
  return {vt, it};
}

// check_equal with NaN equal to NaN (as a number no input holds).
void check_same(const Tensor& actual, const Tensor& expected) {
  const auto marked = [](const Tensor& t) {
    const Tensor w = t.to(kFloat64);
    return where(w.isnan(), full({}, 12345.0, TensorOptions(kFloat64)), w);
  };
  CHECK(actual.dtype() == expected.dtype());
  test::check_equal(marked(actual), marked(expected));
}

void check_sort_like_reference(const Tensor& x, int64_t dim, bool descending) {
  auto [values, indices] = sort(x, dim, descending);
  auto [expected_values, expected_indices] = reference_sort(x, dim, descending);
  CHECK(values.dtype() == x.dtype());
  test::check_equal(indices, expected_indices);
  check_same(values, expected_values.to(x.dtype()));
  // topk's partial sort: the full sort's first k, for k well below n (the heap) and above.
  const int64_t n = x.sizes()[dim < 0 ? dim + x.dim() : dim];
  for (int64_t k : {int64_t{1}, n / 9, n / 2, n}) {
    if (k == 0) continue;
    auto [top_values, top_indices] = topk(x, k, dim, !descending ? false : true);
    test::check_equal(top_indices, indices.narrow(dim, 0, k));
    check_same(top_values, values.narrow(dim, 0, k));
  }
}

// The running reductions of x along the last dim in float64, by loops written here.
Tensor reference_scan(const Tensor& x, ScanKind kind) {
  const int64_t n = x.sizes()[x.dim() - 1], lines = x.numel() / n;
  std::vector<double> v = x.to(kFloat64).contiguous().reshape({-1}).to_vector<double>();
  for (int64_t l = 0; l < lines; ++l) {
    double acc = kind == ScanKind::Prod ? 1 : (kind == ScanKind::LogSumExp ? -INFINITY : 0);
    for (int64_t j = 0; j < n; ++j) {
      double& e = v[l * n + j];
      if (kind == ScanKind::Sum) acc += e;
      if (kind == ScanKind::Prod) acc *= e;
      if (kind == ScanKind::LogSumExp) acc = std::max(acc, e) + std::log1p(std::exp(-std::abs(acc - e)));
      e = acc;
    }
  }
  return from_vector(v).reshape(x.sizes());
}

}  // namespace

TEST_CASE("sort and topk: the CPU kernel against a stable sort of each line, every dtype, 1 and 2 threads",
          "[ops][sort]") {
  const int threads = get_num_threads();
  for (int t : {1, 2}) {
    set_num_threads(t);
    for (DType dtype : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kInt8, kUInt8, kBool}) {
      INFO("dtype " << dtype_name(dtype) << ", threads " << t);
      // Many short lines (several pieces of the pool), lines of 40 for the partial sort, one long line.
      const Tensor x = tied({64, 3, 40}, dtype, 0.3);
      for (int64_t dim : {0, 1, 2}) {
        check_sort_like_reference(x, dim, false);
        check_sort_like_reference(x, dim, true);
      }
      check_sort_like_reference(x.transpose(0, 2), 1, true);  // strided lines
      check_sort_like_reference(tied({3000}, dtype, 0.9), 0, false);
    }
  }
  set_num_threads(threads);
}

TEST_CASE("sort: its gradient goes back to where each value came from", "[ops][sort]") {
  const Tensor x = test::sample({3, 5}, kFloat64, 0.4).requires_grad_(true);
  auto [values, indices] = sort(x, 1, true);
  const Tensor g = test::sample({3, 5}, kFloat64, 1.7);
  values.backward(g);
  // x.grad[i, indices[i, j]] = g[i, j]
  test::check_equal(x.grad().gather(1, indices), g);
  // topk's and kthvalue's only to the positions they kept.
  const Tensor y = test::sample({4, 6}, kFloat64, 0.8).requires_grad_(true);
  auto [top, top_index] = topk(y, 2, 1);
  top.sum().backward();
  CHECK(y.grad().sum().item<double>() == 8);
  test::check_equal(y.grad().gather(1, top_index), ones({4, 2}, kFloat64));
}

TEST_CASE("cumsum, cumprod, logcumsumexp: the CPU kernel against float64 loops, integers exact and wrapping",
          "[ops][sort]") {
  for (DType dtype : {kFloat32, kFloat64, kBFloat16}) {
    INFO(dtype_name(dtype));
    const Tensor x = test::sample({5, 2, 300}, kFloat64, 0.2).to(dtype);
    const Tensor near_one = (test::sample({5, 2, 300}, kFloat64, 0.6) * 0.05 + 1).to(dtype);
    // float32 and float64 sum in double and round once: the float64 loop's values rounded.
    const test::Tolerance tol = dtype == kBFloat16 ? test::Tolerance{2e-2, 5e-2} : test::Tolerance{0, 0};
    test::check_close(cumsum(x, -1), reference_scan(x, ScanKind::Sum).to(dtype), tol);
    test::check_close(cumprod(near_one, -1), reference_scan(near_one, ScanKind::Prod).to(dtype),
                      dtype == kBFloat16 ? tol : test::Tolerance{1e-6, 0});
    test::check_close(logcumsumexp(x, -1), reference_scan(x, ScanKind::LogSumExp).to(dtype),
                      dtype == kBFloat16 ? tol : test::Tolerance{1e-6, 1e-6});
  }
  // Along a dim that is not the last, the kernel steps the lines of a contiguous tensor side by side:
  // the same values, to the bit, as each line moved to the end and scanned alone.
  for (DType dtype : {kFloat32, kBFloat16, kInt64}) {
    INFO(dtype_name(dtype));
    const Tensor x = (test::sample({3, 50, 1100}, kFloat64, 0.4) * 4).to(dtype);
    for (int64_t d : {0, 1}) {
      const auto alone = [&](const Tensor& y) { return y.transpose(d, -1).contiguous(); };
      test::check_equal(cumsum(x, d), alone(cumsum(alone(x), -1)));
      auto [values, indices] = cummax(x, d);
      auto [alone_values, alone_indices] = cummax(alone(x), -1);
      test::check_equal(values, alone(alone_values));
      test::check_equal(indices, alone(alone_indices));
      if (is_floating(dtype)) test::check_equal(logcumsumexp(x, d), alone(logcumsumexp(alone(x), -1)));
    }
  }
  // Integers: int64 results, sums and products that wrap as two's complement (PyTorch's values).
  const Tensor i = tensor({{3, -2, 5, 7}, {100, 100, 100, 100}}, kInt32);
  CHECK(cumsum(i, 1).dtype() == kInt64);
  test::check_equal(cumsum(i, 1), tensor({{3, 1, 6, 13}, {100, 200, 300, 400}}, kInt64));
  test::check_equal(cumprod(i, 1), tensor({{3, -6, -30, -210}, {100, 10000, 1000000, 100000000}}, kInt64));
  const Tensor big = from_vector<int64_t>({int64_t{1} << 40, int64_t{1} << 40});
  test::check_equal(cumprod(big, 0), from_vector<int64_t>({int64_t{1} << 40, 0}));
  CHECK(cumsum(tensor({1.5, 2.5}), 0, kFloat64).dtype() == kFloat64);
}

TEST_CASE("cummax and cummin: the latest position of the running extreme, NaN holding until the next NaN",
          "[ops][sort]") {
  const Tensor x = tensor({1.0, 3.0, 3.0, NAN, 2.0, 3.0, NAN, -1.0});
  auto [values, indices] = cummax(x, 0);
  test::check_equal(indices, from_vector<int64_t>({0, 1, 2, 3, 3, 3, 6, 6}));
  CHECK(values[2].item<float>() == 3);
  CHECK(std::isnan(values[4].item<float>()));
  auto [low, low_index] = cummin(tensor({{2, 1, 1, 3, 0}}, kInt64), 1);
  test::check_equal(low, tensor({{2, 1, 1, 1, 0}}, kInt64));
  test::check_equal(low_index, tensor({{0, 1, 2, 2, 4}}, kInt64));
}

TEST_CASE("cumprod: gradients at zeros as PyTorch's, and second derivatives there", "[ops][sort][grad]") {
  // PyTorch 1.13: x = [[2, 0, 3, 0, 4], [0, 1.5, 2, -1, 0.5]] (float64), cumprod(x, 1) backward of
  // the cotangent [[1, 2, 3, 4, 5], [-1, 0.5, 2, 1, 3]]: 22 = 2 * 2 + 3 * (2 * 3) at the first zero,
  // -1.75 = -1 + 0.5 * 1.5 + 2 * 3 + 1 * -3 + 3 * -1.5, 0 after the first zero.
  const Tensor x = tensor({{2.0, 0.0, 3.0, 0.0, 4.0}, {0.0, 1.5, 2.0, -1.0, 0.5}}, kFloat64).requires_grad_(true);
  const Tensor g = tensor({{1.0, 2.0, 3.0, 4.0, 5.0}, {-1.0, 0.5, 2.0, 1.0, 3.0}}, kFloat64);
  cumprod(x, 1).backward(g);
  test::check_close(x.grad(), tensor({{1.0, 22.0, 0.0, 0.0, 0.0}, {-1.75, 0.0, 0.0, 0.0, 0.0}}, kFloat64),
                    test::Tolerance{1e-12, 1e-12});
  // One zero per line: the first zero's gradient holds the products after it.
  const Tensor y = tensor({{1.5, -0.5, 0.0, 2.0, 3.0}}, kFloat64).requires_grad_(true);
  cumprod(y, 1).backward(ones({1, 5}, kFloat64));
  // PyTorch: [[0.5, 1.5, -0.75 * (1 + 2 + 6), 0, 0]]
  test::check_close(y.grad(), tensor({{0.5, 1.5, -6.75, 0.0, 0.0}}, kFloat64), test::Tolerance{1e-12, 1e-12});
  // Second derivatives where lines hold one, two and no zeros.
  using autograd::TensorList;
  const auto f = [](const TensorList& in) { return TensorList{cumprod(in[0], 1)}; };
  const Tensor z = tensor({{2.0, 0.0, 3.0, 0.0, 4.0}, {0.0, 1.5, 2.0, -1.0, 0.5}, {1.2, 0.7, -0.9, 1.1, 2.0}}, kFloat64)
                       .requires_grad_(true);
  CHECK(autograd::gradgradcheck(f, {z}));
}

TEST_CASE("median and nanmedian: the lower middle, NaN where a line holds NaN, nanmedian without it", "[ops][sort]") {
  const Tensor x = tensor({{3.0, NAN, 1.0, 2.0}, {4.0, 1.0, 3.0, 2.0}, {NAN, NAN, NAN, NAN}});
  auto [m, mi] = median(x, 1);
  CHECK(std::isnan(m[0].item<float>()));
  CHECK(mi[0].item<int64_t>() == 1);  // the first NaN
  CHECK(m[1].item<float>() == 2);
  CHECK(mi[1].item<int64_t>() == 3);
  auto [nm, nmi] = nanmedian(x, 1);
  CHECK(nm[0].item<float>() == 2);
  CHECK(nmi[0].item<int64_t>() == 3);
  CHECK(nm[1].item<float>() == 2);
  CHECK(std::isnan(nm[2].item<float>()));
  CHECK(median(tensor({5, 1, 4, 2}, kInt64)).item<int64_t>() == 2);
  CHECK(nanmedian(tensor({NAN, 5.0, 1.0})).item<float>() == 1);
}

TEST_CASE("sort, topk, kthvalue, median and the scans: bad arguments are Errors naming them", "[ops][sort]") {
  const Tensor x = test::sample({3, 4});
  test::check_error([&] { topk(x, 5, 1); }, {"topk", "k (5)", "[0, 4]"});
  test::check_error([&] { topk(x, -1, 1); }, {"topk", "k (-1)"});
  test::check_error([&] { kthvalue(x, 0, 1); }, {"kthvalue", "k (0)", "[1, 4]"});
  test::check_error([&] { median(zeros({3, 0}), 1); }, {"median", "empty"});
  test::check_error([&] { sort(x, 2); }, {"sort", "dim"});
  test::check_error([&] { cumsum(x, -3); }, {"cumsum", "dim"});
  test::check_error([&] { logcumsumexp(tensor({1, 2}, kInt64), 0); }, {"logcumsumexp", "floating"});
  test::check_error([&] { cumsum(x, 0, kBool); }, {"cumsum", "bool"});
  test::check_error([&] { cumprod(x, 0, kBool); }, {"cumprod", "bool"});
}
