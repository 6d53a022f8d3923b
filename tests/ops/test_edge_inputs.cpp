// tests/ops/test_edge_inputs.cpp: tensors with no elements, bool tensors, undefined tensors and odd
// arguments, given to every op. Where PyTorch defines a result the values are its (torch 1.13,
// printed by the snippets quoted beside them); elsewhere the op must raise a kiln::Error, never
// crash, hang or throw anything else. The last case sweeps a few hundred ops over every pair of
// two dozen odd inputs (tests/ops/edge_sweep.h; under the sanitizers in CI, a read out of bounds
// there fails it).
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "nn/functional.h"
#include "ops/edge_sweep.h"
#include "support.h"

using namespace kiln;

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();

Tensor bools() { return tensor({{0, 1, 1}, {0, 0, 0}}, kBool); }  // torch.tensor([[0,1,1],[0,0,0]], dtype=bool)
}  // namespace

TEST_CASE("reductions over no elements give PyTorch's values", "[ops]") {
  const Tensor e = zeros({3, 0});
  // torch.zeros(3,0).sum(1), .prod(1), .mean(1), .logsumexp(1); torch.zeros(0).logsumexp(0)
  test::check_equal(e.sum({1}), zeros({3}));
  test::check_equal(e.prod(1), ones({3}));
  CHECK(e.mean({1}).isnan().all().item<bool>());
  test::check_equal(e.logsumexp({1}), full({3}, -kInf));
  test::check_equal(zeros({0}).logsumexp({0}), full({}, -kInf));
  // Over a non-empty dim the result itself has no elements: torch.zeros(3,0).amax(0).shape == (0,)
  CHECK(e.amax({0}).sizes() == Shape{0});
  CHECK(e.logsumexp({0}).sizes() == Shape{0});
  // An extreme of nothing has no value: an Error, as PyTorch's IndexError.
  test::check_error([&] { e.amax({1}); }, {"amax", "dim 1 of size 0"});
  // logsumexp's gradient over nothing is nothing, and no NaN reaches the other rows.
  Tensor x = zeros({2, 0}).requires_grad_();
  x.logsumexp({1}).sum().backward();
  CHECK(x.grad().sizes() == Shape{2, 0});
}

TEST_CASE("reductions of bool tensors, as PyTorch", "[ops]") {
  const Tensor b = bools();
  // b.prod(), b.prod(0), b.prod(1): int64 0, [0, 0, 0], [0, 0]
  CHECK(b.prod().dtype() == kInt64);
  CHECK(b.prod().item<int64_t>() == 0);
  test::check_equal(b.prod(0), zeros({3}, kInt64));
  test::check_equal(from_vector<bool>({true, true}).prod(), scalar_tensor(1, kInt64));
  // b.amax(0) = [False, True, True], b.amax(1) = [True, False], b.amin(1) = [False, False]
  test::check_equal(b.amax({0}), tensor({0, 1, 1}, kBool));
  test::check_equal(b.amax({1}), tensor({1, 0}, kBool));
  test::check_equal(b.amin({1}), tensor({0, 0}, kBool));
  CHECK(max(b).item<bool>());   // b.max() = True
  CHECK(!min(b).item<bool>());  // b.min() = False
  // b.max(1) = (values [True, False], indices [1, 0]); b.min(0) = ([False]*3, [0, 1, 1])
  auto [mx, imx] = b.max(1);
  test::check_equal(mx, tensor({1, 0}, kBool));
  test::check_equal(imx, tensor({1, 0}, kInt64));
  auto [mn, imn] = b.min(0);
  test::check_equal(mn, tensor({0, 0, 0}, kBool));
  test::check_equal(imn, tensor({0, 1, 1}, kInt64));
  test::check_equal(b.argmax(1), imx);  // the first largest, as max(dim)'s indices
  test::check_equal(b.argmin(0), imn);
  CHECK(b.argmax().item<int64_t>() == 1);
}

TEST_CASE("logsumexp of integers is float32, as PyTorch", "[ops]") {
  const Tensor i = tensor({{3, -1, 2}, {0, 5, 5}}, kInt64);
  // torch.tensor([[3,-1,2],[0,5,5]]).logsumexp(0) and .logsumexp(1)
  Tensor r0 = i.logsumexp({0}), r1 = i.logsumexp({1});
  CHECK(r0.dtype() == kFloat32);
  test::check_close(r0, tensor({3.0485873222351074, 5.002475738525391, 5.048587322235107}));
  test::check_close(r1, tensor({3.3265626430511475, 5.696510314941406}));
  test::check_close(bools().logsumexp({1}), tensor({std::log(1 + 2 * std::exp(1.0)), std::log(3.0)}));
}

TEST_CASE("bool tensors in arithmetic and math, as PyTorch", "[ops]") {
  const Tensor b = tensor({1, 0}, kBool), nb = logical_not(b);  // torch.tensor([True, False])
  // torch.exp(b), torch.sigmoid(b), torch.reciprocal(b): float32
  test::check_close(exp(b), tensor({std::exp(1.0), 1.0}));
  test::check_close(sigmoid(b), tensor({0.7310585975646973, 0.5}));
  test::check_equal(reciprocal(b), tensor({1.0, kInf}));
  test::check_equal(sqrt(b), tensor({1.0, 0.0}));
  // torch.sign(b) is b; b.square(), b ** 2, b.clamp(-1, 2): int64 [1, 0]; b ** 0.5, b.clamp(0.5): float32
  test::check_equal(sign(b), b);
  test::check_equal(square(b), tensor({1, 0}, kInt64));
  test::check_equal(pow(b, 2), tensor({1, 0}, kInt64));
  test::check_equal(clamp(b, -1, 2), tensor({1, 0}, kInt64));
  test::check_equal(pow(b, 0.5), tensor({1.0, 0.0}));
  test::check_equal(clamp(b, 0.5), tensor({1.0, 0.5}));
  // b + b, torch.add(b, b, alpha=2), b * b: bool [True, False]; maximum(b, ~b) [True, True],
  // minimum(b, ~b) [False, False]; b / b float32 [1, nan]
  test::check_equal(b + b, b);
  test::check_equal(add(b, b, 2), b);
  test::check_equal(b * b, b);
  test::check_equal(maximum(b, nb), tensor({1, 1}, kBool));
  test::check_equal(minimum(b, nb), tensor({0, 0}, kBool));
  const Tensor q = b / b;
  CHECK(q.dtype() == kFloat32);
  CHECK(q[0].item<double>() == 1.0);
  CHECK(std::isnan(q[1].item<double>()));
  // "Subtraction, the `-` operator, with a bool tensor is not supported": on either side
  test::check_error([&] { b - b; }, {"sub", "bool tensor"});
  test::check_error([&] { tensor({1, 2}, kInt64) - b; }, {"sub", "bool tensor"});
  test::check_error([&] { rsub(b, 1); }, {"sub", "bool tensor"});
  // the activations refuse bool, as PyTorch's kernels
  test::check_error([&] { silu(b); }, {"silu", "bool"});
}

namespace {
// x's gradient of f(x) summed, x float32 leaves holding `values`.
Tensor grad_of(const std::function<Tensor(const Tensor&)>& f, std::vector<double> values) {
  Tensor x = from_vector<double>(values).to(kFloat32).requires_grad_();
  f(x).sum().backward();
  return x.grad();
}
}  // namespace

TEST_CASE("gradients at the edges of their formulas, as PyTorch", "[ops]") {
  // p-norms (torch.linalg.vector_norm(x, p).backward()): 0 where the norm is 0, 0 at x = 0 for p < 1
  test::check_equal(grad_of([](const Tensor& x) { return x.norm(3); }, {0, 0}), zeros({2}));
  test::check_equal(grad_of([](const Tensor& x) { return x.norm(3); }, {0, 1}), tensor({0.0, 1.0}));
  test::check_equal(grad_of([](const Tensor& x) { return x.norm(0.5); }, {0, 1}), tensor({0.0, 1.0}));
  test::check_equal(grad_of([](const Tensor& x) { return x.norm(-1); }, {0, 1}), zeros({2}));
  test::check_close(grad_of([](const Tensor& x) { return x.norm(3); }, {2, -1}), tensor({0.9244816899299622, -0.23112042248249054}));
  test::check_close(grad_of([](const Tensor& x) { return x.norm(0.5); }, {2, -1}), tensor({1.7071068286895752, -2.4142136573791504}));
  test::check_close(grad_of([](const Tensor& x) { return x.norm(-1); }, {2, -1}), tensor({0.111111119389534, -0.444444477558136}));
  test::check_close(grad_of([](const Tensor& x) { return x.norm(1.5); }, {2, -1}), tensor({0.9040133953094482, -0.6392340064048767}));
  // x / x at x = 1e-30 in float32: 1/x - (x/x)/x = 0, where x*x underflows (it was -inf)
  test::check_equal(grad_of([](const Tensor& x) { return x / x; }, {1e-30, 2}), zeros({2}));
  // pow(x, exponent tensor 0) at x = 0: 0, not 0 * 0^-1 (torch.pow(x, torch.tensor([0.])))
  test::check_equal(grad_of([](const Tensor& x) { return pow(x, tensor({0.0, 0.0})); }, {0, 3}), zeros({2}));
  test::check_equal(grad_of([](const Tensor& x) { return x.pow(0); }, {0, 3}), zeros({2}));
}

TEST_CASE("signed integer arithmetic wraps as two's complement, as PyTorch", "[ops]") {
  // m = torch.tensor([-2**63, 2**63 - 1, 2**62]): -m, m.abs(), m * 4, m + m, m.square();
  // torch.tensor([2**31 - 1], dtype=torch.int32) + 1. (In C++'s signed types these overflow, which is
  // undefined: the sanitizers' CI build checks that Kiln computes them where the wrap is defined.)
  constexpr int64_t lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
  const Tensor m = from_vector<int64_t>({lo, hi, int64_t{1} << 62});
  CHECK((-m).to_vector<int64_t>() == std::vector<int64_t>{lo, -hi, -(int64_t{1} << 62)});
  CHECK(m.abs().to_vector<int64_t>() == std::vector<int64_t>{lo, hi, int64_t{1} << 62});
  CHECK((m * 4).to_vector<int64_t>() == std::vector<int64_t>{0, -4, 0});
  CHECK((m + m).to_vector<int64_t>() == std::vector<int64_t>{0, -2, lo});
  CHECK(m.square().to_vector<int64_t>() == std::vector<int64_t>{0, 1, 0});
  CHECK((from_vector<int32_t>({2147483647}) + 1).to_vector<int32_t>() == std::vector<int32_t>{-2147483648});
  // Reductions and matmul too: torch.tensor([2**62, 2**62]).sum() and torch.tensor([2**62, 4]).prod()
  // are -2**63 and 0; [[2**62, 1], [-2**63, 2**63 - 1]] @ [[4], [3]] is [[3], [9223372036854775805]]
  CHECK(from_vector<int64_t>({int64_t{1} << 62, int64_t{1} << 62}).sum().item<int64_t>() == lo);
  CHECK(from_vector<int64_t>({int64_t{1} << 62, 4}).prod().item<int64_t>() == 0);
  const Tensor a = from_vector<int64_t>({int64_t{1} << 62, 1, lo, hi}, {2, 2}), b = from_vector<int64_t>({4, 3}, {2, 1});
  CHECK(matmul(a, b).to_vector<int64_t>() == std::vector<int64_t>{3, 9223372036854775805});
}

TEST_CASE("chunk and split of a dim of size 0, as PyTorch", "[ops]") {
  // [t.shape for t in torch.zeros(0).chunk(3)] == [(0,), (0,), (0,)]
  auto c = zeros({0}).chunk(3);
  REQUIRE(c.size() == 3);
  for (const Tensor& t : c) CHECK(t.sizes() == Shape{0});
  auto c1 = zeros({3, 0}).chunk(2, 1);  // [(3, 0), (3, 0)]
  REQUIRE(c1.size() == 2);
  CHECK(c1[1].sizes() == Shape{3, 0});
  // torch.zeros(0).split(0) == (tensor([]),); a split size of 0 is only for a dim of size 0
  auto s = split(zeros({0}), 0);
  REQUIRE(s.size() == 1);
  CHECK(s[0].sizes() == Shape{0});
  test::check_error([] { split(zeros({4}), 0); }, {"split", "split_size", "size 4"});
  test::check_error([] { zeros({0}).chunk(int64_t{1} << 40); }, {"chunk", "too many"});
  auto c5 = zeros({5}).chunk(2);  // ceil(5 / 2): pieces of 3 and 2
  REQUIRE(c5.size() == 2);
  CHECK(c5[0].numel() == 3);
  CHECK(c5[1].numel() == 2);
}

TEST_CASE("arguments whose size arithmetic passes 2^63 are Errors, not wrapped sizes", "[ops]") {
  // Each computed a size in int64 that overflowed (undefined behaviour: the sanitizers' CI build
  // stops at it) and was refused, if at all, by a later check naming a wrapped size.
  const int64_t big = int64_t{1} << 62, top = std::numeric_limits<int64_t>::max(),
                bottom = std::numeric_limits<int64_t>::min();
  const Tensor x = ones({1, 1, 4, 4}), w = ones({1, 1, 3, 3});
  test::check_error([&] { conv2d(x, w, {}, {1, 1}, {0, 0}, {big, 1}); }, {"conv2d", "dilated kernel (9223372036854775809 x 3)"});
  test::check_error([&] { conv2d(x, w, {}, {1, 1}, {top, 0}); }, {"conv2d", "output would be 18446744073709551616 long"});
  test::check_error([&] { conv2d(ones({1, 2, 4, 4}), zeros({0, big, 1, 1}), {}, {1, 1}, {0, 0}, {1, 1}, 4); },
                    {"conv2d", "expects 18446744073709551616"});
  test::check_error([&] { conv1d(ones({1, 1, 4}), ones({1, 1, 3}), {}, 1, 0, top); }, {"conv1d", "dilated kernel"});
  test::check_error([&] { conv3d(ones({1, 1, 4, 4, 4}), ones({1, 1, 2, 2, 2}), {}, {1, 1, 1}, {0, 0, 0}, {1, top, 1}); },
                    {"conv3d", "9223372036854775808"});
  test::check_error([&] { conv_transpose2d(ones({2, 1, 3, 3}), w, {}, {top, top}); },
                    {"conv_transpose2d", "more elements than fit in 64 bits"});
  test::check_error([&] { conv_transpose1d(ones({1, 1, 4}), ones({1, 1, 3}), {}, top); },
                    {"conv_transpose2d", "more elements than fit in 64 bits"});
  test::check_error([&] { conv2d_backward_weight(ones({1, 1, 2, 2}), x, {1, 1, bottom, 3}, {1, 1}, {0, 0}, {1, 1}, 1); },
                    {"conv2d_backward_weight", "non-negative"});
  test::check_error([&] { dropout_part(ones({4, 3}), 0.5, true, 0, top, top); },
                    {"dropout_part", "indices [9223372036854775807, 9223372036854775811)"});
  test::check_error([&] { dropout_part(ones({4, 3}), 0.5, true, 1, 0, top); },
                    {"dropout_part", "more elements than fit in 64 bits"});
  test::check_error([&] { repeat(zeros({4, 0}), {big, 1}); }, {"repeat", "past 2^63"});
  test::check_error([&] { pad(zeros({16}), {top, 1}); }, {"pad", "longer than 2^63"});
  test::check_error([&] { pad(zeros({16}), {bottom, top}); }, {"pad", "-2^63"});
  test::check_error([&] { split_with_sizes(empty({big, 0}), {big, big}); }, {"split", "more than 2^63"});
  // Two that have an answer: var divides by count - correction taken in double; chunk(2^63 - 1) of 16
  // elements gives pieces of ceil(16 / (2^63 - 1)) = 1.
  CHECK(var(tensor({1, 2, 3, 4}), {}, bottom).item<double>() == 5.0 / (4.0 + 0x1p63));
  CHECK(chunk(zeros({16}), top).size() == 16);
}

TEST_CASE("a tensor with no elements and a dim of 2^62", "[ops]") {
  // Its strides and offsets multiply past 2^63 if an op computes them before it sees there is
  // nothing to compute (undefined behaviour, which the sanitizers' CI build stops at), and its rows,
  // 2^62 of nothing, took softmax, index_add and attention's backward past any test's time.
  const int64_t big = int64_t{1} << 62;
  test::check_error([&] { zeros({0, big, 3}); }, {"multiply past 2^63"});  // its first stride would wrap
  const Tensor e = zeros({0, big}).t();                                     // [2^62, 0]
  CHECK(e.numel() == 0);
  // 2^62 * 4 * 0: the element count of a view whose sizes before the 0 multiply past 2^63
  CHECK(zeros({0, big}).unsqueeze(-1).expand({0, big, 4}).permute({1, 2, 0}).numel() == 0);
  CHECK(softmax(e, 1).sizes() == Shape{big, 0});
  CHECK(log_softmax(e, 0).sizes() == Shape{big, 0});
  CHECK(e.narrow(0, big - 1, 1).sizes() == Shape{1, 0});
  CHECK(e.select(0, big - 1).sizes() == Shape{0});
  CHECK(e.flip({0, 1}).sizes() == Shape{big, 0});
  CHECK(cat({e, e}, 1).sizes() == Shape{big, 0});
  test::check_error([&] { cat({e, e}, 0); }, {"cat", "past 2^63"});
  CHECK(split(e, big / 2, 0).size() == 2);
  test::check_error([&] { split(e, 2, 0); }, {"split", "2^31"});
  CHECK(index_add(e, 1, zeros({0}, kInt64), e).sizes() == Shape{big, 0});
  // Attention whose values have no columns: an empty output and zero gradients, as PyTorch's
  // (F.scaled_dot_product_attention(q, k, v) with v of shape (1, 1, 4, 0)).
  Tensor q = ones({1, 1, 2, 3}).requires_grad_(), k = ones({1, 1, 4, 3}).requires_grad_();
  Tensor v = zeros({1, 1, 4, 0}).requires_grad_();
  Tensor o = scaled_dot_product_attention(q, k, v);
  CHECK(o.sizes() == Shape{1, 1, 2, 0});
  o.sum().backward();
  test::check_equal(q.grad(), zeros({1, 1, 2, 3}));
  test::check_equal(k.grad(), zeros({1, 1, 4, 3}));
  CHECK(v.grad().sizes() == Shape{1, 1, 4, 0});
}

TEST_CASE("cross_entropy with class probabilities over no classes", "[nn]") {
  const Tensor x = zeros({3, 0}), t = zeros({3, 0});
  // F.cross_entropy(torch.zeros(3,0), torch.zeros(3,0)) is nan; reduction 'none' [-0., -0., -0.],
  // 'sum' -0. (an integer division by the 0 classes was a SIGFPE here)
  CHECK(std::isnan(nn::cross_entropy(x, t).item<double>()));
  CHECK(std::isnan(nn::cross_entropy(x, t, {.label_smoothing = 0.2}).item<double>()));
  test::check_equal(nn::cross_entropy(x, t, {.reduction = "none"}), zeros({3}));
  CHECK(nn::cross_entropy(x, t, {.reduction = "sum"}).item<double>() == 0.0);
  CHECK(std::isnan(nn::cross_entropy(zeros({0}), zeros({0})).item<double>()));
}

TEST_CASE("an undefined tensor is an Error in detach and every in-place method", "[ops]") {
  // Each was a null dereference; now an Error that says the tensor is undefined (and, where the
  // in-place check is the first to look, which op).
  const Tensor ok = ones({2});
  struct Row {
    const char* op;
    std::function<void(Tensor&)> call;
    std::vector<std::string> fragments;
  };
  const std::vector<Row> rows = {
      {"detach", [](Tensor& u) { detach(u); }, {"detach", "undefined"}},
      {"detach_", [](Tensor& u) { u.detach_(); }, {"detach_", "undefined"}},
      {"add_", [&](Tensor& u) { u.add_(ok); }, {"add_", "undefined"}},
      {"sub_", [&](Tensor& u) { u.sub_(ok); }, {"sub_", "undefined"}},
      {"mul_", [&](Tensor& u) { u.mul_(ok); }, {"mul_", "undefined"}},
      {"div_", [&](Tensor& u) { u.div_(ok); }, {"div_", "undefined"}},
      {"pow_", [](Tensor& u) { u.pow_(2); }, {"pow_", "undefined"}},
      {"copy_", [&](Tensor& u) { u.copy_(ok); }, {"copy_", "undefined"}},
      {"masked_fill_", [](Tensor& u) { u.masked_fill_(ones({2}, kBool), 1); }, {"masked_fill_", "undefined"}},
      {"clamp_", [](Tensor& u) { u.clamp_(0, 1); }, {"clamp_", "undefined"}},
      {"fill_", [](Tensor& u) { u.fill_(1); }, {"fill_", "undefined"}},
      {"zero_", [](Tensor& u) { u.zero_(); }, {"fill_", "undefined"}},  // zero_ is fill_(0)
      {"neg_", [](Tensor& u) { u.neg_(); }, {"neg_", "undefined"}},
      {"relu_", [](Tensor& u) { u.relu_(); }, {"relu_", "undefined"}},
      {"lerp_", [&](Tensor& u) { u.lerp_(ok, 0.5); }, {"undefined", "check .defined()"}},
      {"addcmul_", [&](Tensor& u) { u.addcmul_(ok, ok); }, {"undefined", "check .defined()"}},
  };
  for (const Row& row : rows) {
    INFO(row.op);
    Tensor u;
    test::check_error([&] { row.call(u); }, row.fragments);
  }
}

TEST_CASE("every op on every pair of odd inputs returns a tensor or raises a kiln::Error", "[ops]") {
  const std::vector<test::EdgeInput> inputs = test::edge_inputs();
  int64_t returned = 0, refused = 0;
  for (const test::EdgeOp& op : test::edge_ops()) {
    for (const test::EdgeInput& first : inputs) {
      for (size_t j = 0; j < (op.binary ? inputs.size() : 1); ++j) {
        for (bool grad : {false, true}) {
          Tensor a = first.make(), c = inputs[j].make();
          if (grad) {  // floating inputs as leaves that require grad: the backward paths too
            if (a.defined() && is_floating(a.dtype())) a = a.detach().requires_grad_();
            if (c.defined() && is_floating(c.dtype())) c = c.detach().requires_grad_();
          }
          const std::string name = op.name + "(" + first.name +
                                   (op.binary ? std::string(", ") + inputs[j].name : "") + ") with grad " +
                                   (grad ? "on" : "off");
          Tensor y;
          try {
            y = op.call(a, c);
          } catch (const Error&) {
            ++refused;
            continue;
          } catch (const std::exception& e) {
            FAIL_CHECK(name << " threw a non-kiln exception: " << e.what());
            continue;
          }
          ++returned;
          if (!y.defined()) continue;
          try {  // a result must be readable, every element (its layout inside its storage)
            // and its element count within int64 (a shape with a 0 may have other dims past it)
            const Shape& s = y.sizes();
            int64_t n = 1;
            if (std::find(s.begin(), s.end(), 0) == s.end()) {
              for (int64_t size : s) REQUIRE(!__builtin_mul_overflow(n, size, &n));
            } else {
              n = 0;
            }
            if (n < 100000) (void)y.contiguous().to(kFloat64).sum().item<double>();
          } catch (const std::exception& e) {
            FAIL_CHECK(name << " returned a result of shape " << y.sizes().str() << " that cannot be read: " << e.what());
            continue;
          }
          try {  // and its backward may refuse, but only with an Error
            if (y.requires_grad() && is_floating(y.dtype())) y.to(kFloat32).sum().backward();
          } catch (const Error&) {
          } catch (const std::exception& e) {
            FAIL_CHECK(name << ": its backward threw a non-kiln exception: " << e.what());
          }
        }
      }
    }
  }
  // Both outcomes are common: the sweep reaches the ops' results as well as their checks.
  CHECK(returned > 10000);
  CHECK(refused > 10000);
}

TEST_CASE("values near the top of float32's range, and sums, variances and norms that cancel, against float64",
          "[ops]") {
  // exp: Eigen's vectorized float exp gave inf for x in [88.38, 88.72], where exp(x) < FLT_MAX
  // (PyTorch 1.13: exp(88.7) = 3.3259769e38). 32 elements, so that the vectorized path runs.
  std::vector<float> top(32);
  for (size_t i = 0; i < top.size(); ++i) top[i] = 88.0f + 0.0225f * static_cast<float>(i);  // 88 .. 88.7
  const Tensor x = from_vector(top);
  const std::vector<float> e = exp(x).to_vector<float>(), m1 = expm1(x).to_vector<float>();
  const std::vector<float> b = exp(x.to(kBFloat16)).to(kFloat32).to_vector<float>();
  for (size_t i = 0; i < top.size(); ++i) {
    INFO("x = " << top[i]);
    const double want = std::exp(static_cast<double>(top[i]));
    CHECK(std::fabs(e[i] - want) <= 4e-7 * want);
    CHECK(std::fabs(m1[i] - want) <= 4e-7 * want);
    CHECK(std::isfinite(b[i]));
  }
  CHECK(std::isinf(exp(full({32}, 88.75)).to_vector<float>()[0]));  // past FLT_MAX: inf, as it should

  // var over a dim of float32 columns 1e4 +- 0.005: the float32 mean's rounding added its square
  // (+3%; PyTorch 7.8756884e-06). Reference: the same float32 values, two passes in long double.
  std::vector<float> cols(1000 * 100);
  for (size_t i = 0; i < cols.size(); ++i) cols[i] = 1e4f + 1e-2f * (static_cast<float>((i * 7919) % 1000) / 1000 - 0.5f);
  const Tensor y = from_vector(cols, {1000, 100});
  const std::vector<float> v = y.var({0}).to_vector<float>();
  for (int64_t c = 0; c < 100; c += 33) {
    long double mean = 0, ss = 0;
    for (int64_t r = 0; r < 1000; ++r) mean += cols[static_cast<size_t>(r * 100 + c)];
    mean /= 1000;
    for (int64_t r = 0; r < 1000; ++r) ss += (cols[static_cast<size_t>(r * 100 + c)] - mean) * (cols[static_cast<size_t>(r * 100 + c)] - mean);
    const double want = static_cast<double>(ss / 999);
    INFO("column " << c);
    CHECK(std::fabs(v[static_cast<size_t>(c)] - want) <= 1e-5 * want);
  }

  // float64: a variance at an offset of 1e8 and a long sum keep their digits (they were 1e-9 and
  // 4e-12 off, relative; PyTorch's are exact), a layer_norm at an offset of 1e7 keeps all but what
  // the offset's ulp leaves, and one of a constant row is 0 (it was 3.7e-8).
  std::vector<double> far(1 << 20);
  for (size_t i = 0; i < far.size(); ++i) far[i] = 1e8 + 1e-2 * (static_cast<double>((i * 7919) % 1000) / 1000 - 0.5);
  long double mean = 0, ss = 0;
  for (double f : far) mean += f;
  mean /= far.size();
  for (double f : far) ss += (f - mean) * (f - mean);
  const double var_want = static_cast<double>(ss / (far.size() - 1));
  CHECK(std::fabs(from_vector(far).var().item<double>() - var_want) <= 1e-12 * var_want);
  const int64_t n = 1 << 22;
  CHECK(std::fabs(full({n}, 0.1, kFloat64).sum().item<double>() - 0.1 * n) <= 1e-14 * 0.1 * n);
  std::vector<double> row(1024);
  for (size_t i = 0; i < row.size(); ++i) row[i] = 1e7 + (static_cast<double>((i * 7919) % 1000) / 1000 - 0.5);
  long double rm = 0, rv = 0;
  for (double r : row) rm += r;
  rm /= row.size();
  for (double r : row) rv += (r - rm) * (r - rm);
  rv /= row.size();
  const std::vector<double> ln = layer_norm(from_vector(row, {1, 1024}), {1024}, {}, {}, 0).to_vector<double>();
  double worst = 0;
  for (size_t i = 0; i < row.size(); ++i) {
    worst = std::max(worst, std::fabs(ln[i] - static_cast<double>((row[i] - rm) / std::sqrt(rv))));
  }
  CHECK(worst < 1e-8);
  const std::vector<double> flat = layer_norm(full({2, 1000}, 12345.678, kFloat64), {1000}).to_vector<double>();
  CHECK(*std::max_element(flat.begin(), flat.end()) == 0);
  CHECK(*std::min_element(flat.begin(), flat.end()) == 0);
}

TEST_CASE("clamp with a NaN bound gives NaN everywhere, as PyTorch's, not the other bound alone", "[ops]") {
  const Tensor x = from_vector<float>({-2, 0.5, 3});
  for (const auto& [lo, hi] : std::vector<std::pair<std::optional<Scalar>, std::optional<Scalar>>>{
           {0.0, NAN}, {NAN, 1.0}, {NAN, std::nullopt}}) {
    const std::vector<float> out = clamp(x, lo, hi).to_vector<float>();
    CHECK(std::all_of(out.begin(), out.end(), [](float f) { return std::isnan(f); }));
    Tensor inplace = x.clone();
    inplace.clamp_(lo, hi);
    const std::vector<float> in = inplace.to_vector<float>();
    CHECK(std::all_of(in.begin(), in.end(), [](float f) { return std::isnan(f); }));
  }
  Tensor g = x.clone().requires_grad_();
  clamp(g, 0.0, NAN).sum().backward();
  test::check_equal(g.grad(), zeros({3}));  // no element is inside [min, max]
  test::check_equal(clamp(x, 0.0, 1.0), from_vector<float>({0, 0.5, 1}));  // unchanged
}

TEST_CASE("std's gradient at a constant slice is 0, as PyTorch's, and a fractional alpha on integers is an Error",
          "[ops]") {
  // std was var().sqrt(): sqrt's derivative at 0 is inf, times var's 0 a nan that poisoned the row.
  // Golden: PyTorch 1.13, x.std(1).backward([1, 2]).
  Tensor x = from_vector<double>({1, 2, 4, 8, 3, 3, 3, 3}, {2, 4}).requires_grad_();
  Tensor s = x.std({1});
  test::check_close(s, from_vector<double>({3.0956959368344514, 0}));
  (s * from_vector<double>({1, 2})).sum().backward();
  test::check_close(x.grad(), from_vector<double>({-0.29611004613199104, -0.18843366572035794, 0.026919095102908276,
                                                   0.4576246167494407, 0, 0, 0, 0},
                                                  {2, 4}));
  // alpha 0.9 was cut to 0 in an int64 add (add(a, b, 0.9) returned a), 2.5 to 2 in sub.
  const Tensor a = from_vector<int64_t>({1, 2}), b = from_vector<int64_t>({1, 1});
  test::check_error([&] { add(a, b, 0.9); }, {"add: alpha (0.9) must be a whole number for int64 tensors"});
  test::check_error([&] { sub(a, b, 2.5); }, {"sub: alpha (2.5) must be a whole number"});
  test::check_error([&] { a.clone().add_(b, 0.5); }, {"add_: alpha (0.5) must be a whole number"});
  test::check_equal(add(a, b, 3), from_vector<int64_t>({4, 5}));
  test::check_equal(sub(a, b, 2.0), from_vector<int64_t>({-1, 0}));  // whole: as the integer 2
  test::check_close(add(a.to(kFloat32), b.to(kFloat32), 0.5), from_vector<float>({1.5, 2.5}));
}

TEST_CASE("batch_norm in training on an empty batch gives an empty output and keeps its running statistics",
          "[ops]") {
  // It was "expected more than 1 value per channel"; PyTorch refuses exactly 1 value only.
  Tensor x = zeros({0, 3, 4, 4}).requires_grad_();
  Tensor rm = ones({3}), rv = full({3}, 2.0);
  Tensor y = batch_norm(x, rm, rv, ones({3}), zeros({3}), /*training=*/true);
  CHECK(y.sizes() == Shape{0, 3, 4, 4});
  test::check_equal(rm, ones({3}));
  test::check_equal(rv, full({3}, 2.0));
  y.sum().backward();
  CHECK(x.grad().sizes() == Shape{0, 3, 4, 4});
  test::check_error([] { batch_norm(ones({1, 3}), Tensor(), Tensor(), Tensor(), Tensor(), true); },
                    {"batch_norm: expected more than 1 value per channel when training", "[1, 3]"});
}

TEST_CASE("masked_fill broadcasts its tensor to the mask out of place, and all/any of uint8 are uint8, as PyTorch",
          "[ops]") {
  // masked_fill of a [5] tensor with a [2, 5] mask was an Error; PyTorch gives the [2, 5] result and
  // sums its gradient back to [5]. Goldens: PyTorch 1.13.
  Tensor x = from_vector<float>({1, 2, 3, 4, 5}).requires_grad_();
  const Tensor mask = from_vector(std::vector<bool>{true, false, true, false, false, false, false, false, false, true}, {2, 5});
  Tensor y = masked_fill(x, mask, 2.0);
  test::check_equal(y, from_vector<float>({2, 2, 2, 4, 5, 1, 2, 3, 4, 2}, {2, 5}));
  (y * arange(10, kFloat32).view({2, 5})).sum().backward();
  test::check_equal(x.grad(), from_vector<float>({5, 7, 7, 11, 4}));
  test::check_error([&] { x.detach().clone().masked_fill_(mask, 2.0); },
                    {"masked_fill_: the mask of shape [2, 5] must broadcast to the tensor's shape [5]"});
  // all and any of uint8 give uint8 (0 or 1), of other dtypes bool.
  test::check_equal(from_vector<int64_t>({1, 2, 0}).to(kUInt8).all(), scalar_tensor(0, kUInt8));
  test::check_equal(from_vector<int64_t>({1, 2, 0, 0}, {2, 2}).to(kUInt8).any(1), from_vector<int64_t>({1, 0}).to(kUInt8));
  CHECK(from_vector<int64_t>({1, 2}).all().dtype() == kBool);
}

TEST_CASE("norm of order 0 counts the nonzeros, and backward from it runs and sends no gradient, as PyTorch's",
          "[ops]") {
  // It recorded nothing, so norm(x, 0).backward() said x did not require grad. PyTorch 1.13's runs
  // and leaves x.grad None.
  Tensor x = from_vector<float>({1, 0, 3, 4}, {2, 2}).requires_grad_();
  Tensor n = norm(x, 0);
  test::check_equal(n, scalar_tensor(3.0, kFloat32));
  CHECK(n.requires_grad());
  n.backward();
  CHECK_FALSE(x.grad().defined());
  test::check_equal(norm(x.detach(), 0, {1}), from_vector<float>({1, 2}));
}

TEST_CASE("cat gives a skipped 1-D empty input an empty gradient and promotes its dtype, as PyTorch", "[ops]") {
  // PyTorch skips 1-D empty tensors in cat whatever the others' shapes; its backward still gives
  // them a gradient (tensor([])), where Kiln's left grad() undefined.
  Tensor e = zeros({0}).requires_grad_(), b = ones({2, 3}).requires_grad_();
  Tensor y = cat({e, b, e.to(kFloat64)}, 1);
  CHECK(y.sizes() == Shape{2, 3});
  CHECK(y.dtype() == kFloat64);  // the skipped ones promote too: torch.cat([zeros(0), ones(2, 3), zeros(0, dtype=float64)], 1)
  (y * 2).sum().backward();
  REQUIRE(e.grad().defined());
  CHECK(e.grad().sizes() == Shape{0});
  test::check_equal(b.grad(), full({2, 3}, 2.0));
}
