// tests/ops/test_select.cpp: the selections of ops/select.cpp and the searches and quantiles of
// ops/sort.cpp beyond the op table's PyTorch goldens: the CPU nonzero and searchsorted kernels against
// loops written here over sizes that cross the kernels' blocks, one and two threads; unique against a
// std::set; quantile against a float64 formula; NaN where PyTorch 1.13 has no answer to compare
// with; the Tensor methods; and the Errors.
#include <algorithm>
#include <climits>
#include <cmath>
#include <map>
#include <set>
#include <vector>

#include "support.h"

using namespace kiln;

namespace {

// A mask with about a fraction p of true elements, spread by the sample formula.
Tensor mask_with(const Shape& shape, double p, double seed) {
  return (test::sample(shape, kFloat64, seed) / 3.96 + 0.5).lt(p);
}

std::vector<int64_t> true_positions(const Tensor& mask) {
  const std::vector<uint8_t> m = mask.contiguous().reshape({-1}).to(kUInt8).to_vector<uint8_t>();
  std::vector<int64_t> out;
  for (size_t i = 0; i < m.size(); ++i) {
    if (m[i] != 0) out.push_back(static_cast<int64_t>(i));
  }
  return out;
}

}  // namespace

TEST_CASE("nonzero: the CPU kernel against a loop across its blocks, 1 and 2 threads", "[ops][select]") {
  for (int t : {1, 2}) {
    test::ThreadsGuard threads(t);
    // 200003 elements: three blocks of 2^16 and a partial one.
    for (double p : {0.0, 0.003, 0.5, 0.97, 1.0}) {
      INFO("threads " << t << ", fraction " << p);
      const Tensor mask = mask_with({200003}, p, 0.3);
      const std::vector<int64_t> expected = true_positions(mask);
      const Tensor flat = nonzero(mask);
      REQUIRE(flat.sizes() == Shape{static_cast<int64_t>(expected.size()), 1});
      CHECK(flat.reshape({-1}).to_vector<int64_t>() == expected);
      // The coordinates of a 3-D view of the same mask, and masked_select's values at them.
      const Tensor cube = mask.narrow(0, 0, 200000).reshape({50, 40, 100});
      const Tensor coords = nonzero(cube);
      const Tensor values = arange(200000, kInt64).reshape({50, 40, 100});
      const Tensor flat_again = coords.select(1, 0) * 4000 + coords.select(1, 1) * 100 + coords.select(1, 2);
      test::check_equal(flat_again, masked_select(values, cube));
      CHECK(count_nonzero(cube).item<int64_t>() == coords.sizes()[0]);
    }
  }
  // A strided, non-bool input: nonzero of a transposed float tensor in its logical order.
  const Tensor x = test::sample({7, 5}, kFloat32, 0.9).round();
  test::check_equal(nonzero(x.t()), nonzero(x.t().contiguous()));
}

TEST_CASE("masked_select and masked_scatter: values, broadcasting and gradients", "[ops][select]") {
  const Tensor x = test::sample({4, 6}, kFloat64, 0.2).requires_grad_();
  const Tensor mask = mask_with({4, 6}, 0.4, 1.1);
  const int64_t count = count_nonzero(mask).item<int64_t>();
  REQUIRE(count > 0);
  // masked_scatter then masked_select gives source's first elements back; elsewhere x is unchanged.
  const Tensor source = test::sample({30}, kFloat64, 0.7).requires_grad_();
  const Tensor y = masked_scatter(x, mask, source);
  test::check_equal(masked_select(y, mask), source.narrow(0, 0, count));
  test::check_equal(masked_select(y, mask.logical_not()), masked_select(x, mask.logical_not()));
  // The gradient: the mask's places to source (the unused rest 0), the others to x.
  sum(y * arange(24, kFloat64).reshape({4, 6})).backward();
  test::check_equal(x.grad(), where(mask, zeros({}, kFloat64), arange(24, kFloat64).reshape({4, 6})));
  const Tensor used = masked_select(arange(24, kFloat64).reshape({4, 6}), mask);
  test::check_equal(source.grad(), cat({used, zeros({30 - count}, kFloat64)}));
  // Methods, and a mask broadcast over rows.
  const Tensor row_mask = tensor({1, 0, 0, 1, 1, 0}).gt(0);
  test::check_equal(x.detach().masked_select(row_mask), masked_select(x.detach(), row_mask.expand({4, 6})));
  CHECK(x.detach().masked_scatter(row_mask, source.detach()).sizes() == Shape{4, 6});
}

TEST_CASE("unique: against std::set and std::map of the values and of the rows", "[ops][select]") {
  const Tensor x = (test::sample({40, 7}, kFloat64, 0.4) * 2).round().to(kInt32);
  auto [values, inverse, counts] = unique(x);
  const std::vector<int32_t> v = x.reshape({-1}).to_vector<int32_t>();
  std::map<int32_t, int64_t> seen;
  for (int32_t e : v) ++seen[e];
  std::vector<int32_t> keys;
  std::vector<int64_t> times;
  for (auto [k, c] : seen) {
    keys.push_back(k);
    times.push_back(c);
  }
  CHECK(values.to_vector<int32_t>() == keys);
  CHECK(counts.to_vector<int64_t>() == times);
  test::check_equal(values.index_select(0, inverse.reshape({-1})).reshape(x.sizes()), x);
  // Rows (dim 0) and columns (dim 1) in lexicographic order.
  for (int64_t dim : {0, 1}) {
    INFO("dim " << dim);
    const Tensor slices = dim == 0 ? x : x.t();
    std::set<std::vector<int32_t>> rows;
    for (int64_t r = 0; r < slices.sizes()[0]; ++r) rows.insert(slices[r].contiguous().to_vector<int32_t>());
    auto [rv, ri, rc] = unique(x, dim);
    const Tensor got = dim == 0 ? rv : rv.t();
    REQUIRE(got.sizes()[0] == static_cast<int64_t>(rows.size()));
    int64_t r = 0;
    for (const auto& row : rows) CHECK(got[r++].contiguous().to_vector<int32_t>() == row);
    test::check_equal(got.index_select(0, ri), slices);
    CHECK(sum(rc).item<int64_t>() == slices.sizes()[0]);
  }
  // The method.
  test::check_equal(std::get<0>(x.unique()), values);
  // Integers spanning more than their number (sorted, not counted: Note [unique by counting]),
  // up to int64's extremes, whose span overflows int64.
  const int64_t lo = INT64_MIN, hi = INT64_MAX;
  for (const std::vector<int64_t>& v :
       {std::vector<int64_t>{0, 1000000, 5, 0, 5}, std::vector<int64_t>{hi, 5, lo, 5}}) {
    auto [wv, wi, wc] = unique(from_vector(v));
    std::vector<int64_t> keys(v);
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    CHECK(wv.to_vector<int64_t>() == keys);
    test::check_equal(wv.index_select(0, wi), from_vector(v));
    CHECK(sum(wc).item<int64_t>() == static_cast<int64_t>(v.size()));
  }
}

TEST_CASE("unique with NaN and signed zeros: NaN last, each its own value", "[ops][select]") {
  // (PyTorch 1.13's CPU unique leaves NaN unsorted, [0, 2, nan, nan, 1] here; PyTorch 2 gives this.)
  const Tensor x = tensor({1.0, NAN, 0.0, -0.0, NAN, 2.0, 1.0});
  auto [values, inverse, counts] = unique(x);
  const std::vector<float> v = values.to_vector<float>();
  REQUIRE(v.size() == 5);
  CHECK(v[0] == 0.0f);
  CHECK(v[1] == 1.0f);
  CHECK(v[2] == 2.0f);
  CHECK(std::isnan(v[3]));
  CHECK(std::isnan(v[4]));
  CHECK(counts.to_vector<int64_t>() == std::vector<int64_t>{2, 2, 1, 1, 1});
  CHECK(inverse.to_vector<int64_t>() == std::vector<int64_t>{1, 3, 0, 0, 4, 2, 1});
  auto [cv, ci, cc] = unique_consecutive(tensor({NAN, NAN, 3.0, 3.0}));
  CHECK(cc.to_vector<int64_t>() == std::vector<int64_t>{1, 1, 2});
  CHECK(ci.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 2});
}

TEST_CASE("searchsorted: the CPU kernel against std::lower_bound and upper_bound, 1 and 2 threads", "[ops][select]") {
  for (int t : {1, 2}) {
    test::ThreadsGuard threads(t);
    for (DType dtype : {kFloat32, kFloat64, kBFloat16, kInt64, kInt32}) {
      INFO("dtype " << dtype_name(dtype) << ", threads " << t);
      // 5 rows of 301 sorted values with runs of equal ones, 5 x 9000 probes (several pieces of the pool).
      const Tensor seq = std::get<0>(sort((test::sample({5, 301}, kFloat64, 0.1) * 40).round().to(dtype)));
      const Tensor probes = (test::sample({5, 9000}, kFloat64, 0.6) * 45).round().to(dtype);
      const std::vector<double> s = seq.to(kFloat64).reshape({-1}).to_vector<double>();
      const std::vector<double> p = probes.to(kFloat64).reshape({-1}).to_vector<double>();
      for (bool right : {false, true}) {
        std::vector<int64_t> expected(p.size()), one_row(p.size());
        for (size_t i = 0; i < p.size(); ++i) {
          const auto row = s.begin() + static_cast<int64_t>(i / 9000) * 301;
          const auto bound = right ? std::upper_bound(row, row + 301, p[i]) : std::lower_bound(row, row + 301, p[i]);
          expected[i] = bound - row;
          const auto first = right ? std::upper_bound(s.begin(), s.begin() + 301, p[i])
                                   : std::lower_bound(s.begin(), s.begin() + 301, p[i]);
          one_row[i] = first - s.begin();
        }
        CHECK(searchsorted(seq, probes, false, right).reshape({-1}).to_vector<int64_t>() == expected);
        CHECK(searchsorted(seq[0], probes, true, right).to(kInt64).reshape({-1}).to_vector<int64_t>() == one_row);
        CHECK(bucketize(probes, seq[0], false, right).reshape({-1}).to_vector<int64_t>() == one_row);
      }
    }
  }
}

TEST_CASE("quantile: against the float64 formula on long lines, and the Tensor methods", "[ops][select]") {
  const Tensor x = test::sample({3, 1001}, kFloat64, 0.8);
  const Tensor q = tensor({0.0, 0.1, 0.33, 0.5, 0.999, 1.0}, TensorOptions(kFloat64));
  const Tensor got = quantile(x, q, 1);
  REQUIRE(got.sizes() == Shape{6, 3});
  for (int64_t r = 0; r < 3; ++r) {
    std::vector<double> line = x[r].to_vector<double>();
    std::sort(line.begin(), line.end());
    for (int64_t k = 0; k < 6; ++k) {
      const double rank = q[k].item<double>() * 1000, below = std::floor(rank);
      const double above = line[static_cast<size_t>(std::ceil(rank))], low = line[static_cast<size_t>(below)];
      CHECK(got[k][r].item<double>() == Approx(low + (rank - below) * (above - low)).epsilon(1e-14));
    }
  }
  // The methods give the functions' values.
  CHECK(x.quantile(0.25).item<double>() == quantile(x, 0.25).item<double>());
  test::check_equal(x.nanquantile(0.5, 0, true, "lower"), nanquantile(x, 0.5, 0, true, "lower"));
  test::check_equal(x.msort(), std::get<0>(sort(x, 0)));
}

TEST_CASE("bincount and histc: counts against loops, and histc leaves NaN out", "[ops][select]") {
  const Tensor v = (test::sample({5000}, kFloat64, 0.2) * 15).abs().floor().to(kInt64);  // 0 to 29
  std::vector<int64_t> expected(31, 0);
  for (int64_t e : v.to_vector<int64_t>()) ++expected[static_cast<size_t>(e)];
  std::vector<int64_t> got = v.bincount({}, 31).to_vector<int64_t>();
  CHECK(got == expected);
  // histc over [0, 31) of the same values as floats, one bin a value: the same counts.
  const Tensor h = v.to(kFloat32).histc(31, 0, 31);
  CHECK(h.to(kInt64).to_vector<int64_t>() == expected);
  // Enough values for the CPU's integer histogram in pieces (cpu/index.cpp, add_in_pieces), 1 and 2
  // threads, through bincount and index_add itself; a bad index in a piece is still an Error.
  const Tensor many = (test::sample({300001}, kFloat64, 0.7) * 250).abs().floor().to(kInt64);  // 0 to 494
  std::vector<int64_t> often(495, 0);
  for (int64_t e : many.to_vector<int64_t>()) ++often[static_cast<size_t>(e)];
  for (int t : {1, 2}) {
    test::ThreadsGuard threads(t);
    CHECK(bincount(many).to_vector<int64_t>() == often);
    const Tensor in_int32 = index_add(ones({495}, kInt32), 0, many, full({300001}, 2, TensorOptions(kInt32)));
    for (size_t k = 0; k < often.size(); ++k)
      CHECK(in_int32[static_cast<int64_t>(k)].item<int64_t>() == 1 + 2 * often[k]);
    test::check_error([&] { index_add(zeros({400}, kInt64), 0, many, ones({300001}, kInt64)); },
                      {"index_add", "out of bounds", "size 400"});
  }
  // PyTorch documents NaN as left out (its 1.13 CPU kernel counts NaN in bin 0).
  test::check_equal(histc(tensor({NAN, 0.5, NAN, 1.5}), 2, 0, 2), tensor({1.0, 1.0}));
  test::check_equal(histc(tensor({1.0, 2.0, 3.0, 4.0}).to(kBFloat16), 3), tensor({1.0, 1.0, 2.0}).to(kBFloat16));
}

TEST_CASE("selections, searches and quantiles: bad arguments are Errors naming them", "[ops][select]") {
  const Tensor x = test::sample({3, 4});
  test::check_error([&] { masked_select(x, x); }, {"masked_select", "bool", "float32"});
  test::check_error([&] { masked_select(x, ones({5}, kBool)); }, {"masked_select"});
  test::check_error([&] { masked_scatter(x, x.gt(-10), zeros({5})); }, {"masked_scatter", "12 true", "only 5"});
  test::check_error([&] { masked_scatter(x, x.gt(0), zeros({20}, kFloat64)); }, {"masked_scatter", "float64"});
  test::check_error([&] { bincount(tensor({1.0, 2.0})); }, {"bincount", "non-negative integers", "float32"});
  test::check_error([&] { bincount(from_vector<int64_t>({1, -2, 3})); }, {"bincount", "negative", "-2"});
  test::check_error([&] { bincount(from_vector<int64_t>({1, 2}), tensor({1.0})); }, {"bincount", "weights"});
  test::check_error([&] { bincount(from_vector<int64_t>({1}), {}, -1); }, {"bincount", "minlength"});
  test::check_error([&] { histc(from_vector<int64_t>({1, 2})); }, {"histc", "floating", "int64"});
  test::check_error([&] { histc(x, 0); }, {"histc", "bins (0)"});
  test::check_error([&] { histc(x, 4, 3, 1); }, {"histc", "max"});
  test::check_error([&] { histc(tensor({NAN, 1.0})); }, {"histc", "not finite"});
  // Rows of a sequence with no values to search, and a sequence of empty rows.
  CHECK(searchsorted(zeros({3, 5}), zeros({3, 0})).sizes() == Shape{3, 0});
  test::check_equal(searchsorted(zeros({2, 0}), ones({2, 3})), zeros({2, 3}, kInt64));
  test::check_error([&] { searchsorted(zeros({}), x); }, {"searchsorted", "0-d"});
  test::check_error([&] { searchsorted(zeros({2, 5}), x); }, {"searchsorted", "leading dims"});
  test::check_error([&] { searchsorted(zeros({4}), x, false, false, zeros({4})); }, {"searchsorted", "sorter"});
  test::check_error([&] { bucketize(x, zeros({2, 2})); }, {"bucketize", "1-D"});
  test::check_error([&] { quantile(x, 1.5); }, {"quantile", "[0, 1]"});
  test::check_error([&] { quantile(x, 0.5, 1, false, "cubic"); }, {"quantile", "interpolation", "cubic"});
  test::check_error([&] { quantile(x.to(kFloat16), 0.5); }, {"quantile", "float32 or float64", "float16"});
  test::check_error([&] { quantile(zeros({0}), 0.5); }, {"quantile", "no elements"});
  test::check_error([&] { quantile(x, tensor({0.5}, TensorOptions(kFloat64))); }, {"quantile", "q (float64)"});
  test::check_error([&] { quantile(x, zeros({2, 2})); }, {"quantile", "0-d or 1-D"});
  test::check_error([&] { nanquantile(x, 0.5, 2); }, {"nanquantile"});
  test::check_error([&] { unique(zeros({3, 0}), 0); }, {"unique", "no elements"});
}
