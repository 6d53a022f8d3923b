// tests/ops/test_edge_inputs.cpp: tensors with no elements, bool tensors, undefined tensors and odd
// arguments, given to every op. Where PyTorch defines a result the values are its (torch 1.13,
// printed by the snippets quoted beside them); elsewhere the op must raise a kiln::Error, never
// crash, hang or throw anything else. The last case sweeps a few hundred ops over every pair of
// two dozen odd inputs (under the sanitizers in CI, a read out of bounds there fails it).
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "nn/functional.h"
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

// ---- the sweep ----
namespace {

struct Input {
  const char* name;
  std::function<Tensor()> make;
};

std::vector<Input> odd_inputs() {
  return {
      {"f32[2,3]", [] { return test::sample({2, 3}); }},
      {"f32[]", [] { return scalar_tensor(1.5); }},
      {"f32[0]", [] { return zeros({0}); }},
      {"f32[3,0]", [] { return zeros({3, 0}); }},
      {"f32[0,4]", [] { return zeros({0, 4}); }},
      {"f32[2,3]^T", [] { return test::sample({2, 3}).t(); }},
      {"f32[4,3] expanded", [] { return test::sample({1, 3}).expand({4, 3}); }},
      {"f32[1]", [] { return ones({1}); }},
      {"f32[2,3,4,5]", [] { return test::sample({2, 3, 4, 5}); }},
      {"f32[2,3,4]", [] { return test::sample({2, 3, 4}); }},
      {"f32 nan inf", [] { return tensor({NAN, kInf, -kInf, 0.0, -0.0}); }},
      {"f64[2,3]", [] { return test::sample({2, 3}, kFloat64); }},
      {"f16[2,3]", [] { return test::sample({2, 3}).to(kFloat16); }},
      {"bf16[2,3]", [] { return test::sample({2, 3}).to(kBFloat16); }},
      {"i64[2,3]", [] { return tensor({{0, 1, 2}, {2, 1, 0}}, kInt64); }},
      {"i64 out of range", [] { return tensor({{-7, 1, 9}, {2, 100000, 0}}, kInt64); }},
      {"i64[]", [] { return scalar_tensor(1, kInt64); }},
      {"i32[2,3]", [] { return tensor({{0, 1, 2}, {2, 1, 0}}, kInt32); }},
      {"u8[2,3]", [] { return tensor({{0, 1, 255}, {2, 1, 0}}, kUInt8); }},
      {"i8[2,3]", [] { return tensor({{0, -1, 127}, {-128, 1, 0}}, kInt8); }},
      {"bool[2,3]", [] { return bools(); }},
      {"i64[0]", [] { return zeros({0}, kInt64); }},
      {"i64 extremes", [] { return from_vector<int64_t>({std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()}); }},
      {"undefined", [] { return Tensor(); }},
  };
}

using Call = std::function<Tensor(const Tensor&, const Tensor&)>;
struct SweptOp {
  std::string name;
  bool binary;
  Call call;
};

std::vector<SweptOp> swept_ops() {
  std::vector<SweptOp> v;
  const auto u = [&](std::string n, std::function<Tensor(const Tensor&)> f) {
    v.push_back({std::move(n), false, [f](const Tensor& a, const Tensor&) { return f(a); }});
  };
  const auto b = [&](std::string n, Call f) { v.push_back({std::move(n), true, std::move(f)}); };
  const auto ud = [&](const std::string& n, std::function<Tensor(const Tensor&, int64_t)> f) {
    for (int64_t d : {-5, -1, 0, 1, 3})
      v.push_back({n + "@" + std::to_string(d), false, [f, d](const Tensor& a, const Tensor&) { return f(a, d); }});
  };
  const auto bd = [&](const std::string& n, std::function<Tensor(const Tensor&, const Tensor&, int64_t)> f) {
    for (int64_t d : {-5, -1, 0, 1})
      v.push_back({n + "@" + std::to_string(d), true, [f, d](const Tensor& a, const Tensor& c) { return f(a, c, d); }});
  };
  // elementwise
  u("neg", [](const Tensor& a) { return neg(a); });
  u("abs", [](const Tensor& a) { return abs(a); });
  u("sign", [](const Tensor& a) { return sign(a); });
  u("exp", [](const Tensor& a) { return exp(a); });
  u("log1p", [](const Tensor& a) { return log1p(a); });
  u("rsqrt", [](const Tensor& a) { return rsqrt(a); });
  u("reciprocal", [](const Tensor& a) { return reciprocal(a); });
  u("sigmoid", [](const Tensor& a) { return sigmoid(a); });
  u("relu", [](const Tensor& a) { return relu(a); });
  u("gelu", [](const Tensor& a) { return gelu(a); });
  u("gelu tanh", [](const Tensor& a) { return gelu(a, "tanh"); });
  u("gelu fast", [](const Tensor& a) { return gelu(a, "fast"); });
  u("silu", [](const Tensor& a) { return silu(a); });
  u("erf", [](const Tensor& a) { return erf(a); });
  u("pow -1", [](const Tensor& a) { return pow(a, -1); });
  u("pow 0.5", [](const Tensor& a) { return pow(a, 0.5); });
  u("clamp", [](const Tensor& a) { return clamp(a, -0.5, 0.5); });
  u("clamp none", [](const Tensor& a) { return clamp(a, std::nullopt, std::nullopt); });
  u("clamp min > max", [](const Tensor& a) { return clamp(a, 1, -1); });
  u("round", [](const Tensor& a) { return round(a); });
  u("bitwise_not", [](const Tensor& a) { return bitwise_not(a); });
  u("isnan", [](const Tensor& a) { return isnan(a); });
  u("logical_not", [](const Tensor& a) { return logical_not(a); });
  u("div by 0", [](const Tensor& a) { return div(a, 0); });
  u("rdiv", [](const Tensor& a) { return rdiv(1, a); });
  u("remainder by 0", [](const Tensor& a) { return remainder(a, 0); });
  u("fmod by 0", [](const Tensor& a) { return fmod(a, 0); });
  u("floor_divide by 0", [](const Tensor& a) { return floor_divide(a, 0); });
  u("bitwise_and 3", [](const Tensor& a) { return bitwise_and(a, 3); });
  u("leaky_relu", [](const Tensor& a) { return nn::leaky_relu(a); });
  u("hardtanh min > max", [](const Tensor& a) { return nn::hardtanh(a, 1, -1); });
  u("softplus beta 0", [](const Tensor& a) { return nn::softplus(a, 0.0); });
  // reductions
  u("sum", [](const Tensor& a) { return sum(a); });
  u("mean", [](const Tensor& a) { return mean(a); });
  u("prod", [](const Tensor& a) { return prod(a); });
  u("max", [](const Tensor& a) { return max(a); });
  u("argmax", [](const Tensor& a) { return argmax(a); });
  u("var", [](const Tensor& a) { return var(a); });
  u("var correction 5", [](const Tensor& a) { return var(a, {}, 5); });
  u("norm 1", [](const Tensor& a) { return norm(a, 1); });
  u("norm inf", [](const Tensor& a) { return norm(a, kInf); });
  u("norm 0", [](const Tensor& a) { return norm(a, 0); });
  u("all", [](const Tensor& a) { return all(a); });
  ud("sum", [](const Tensor& a, int64_t d) { return sum(a, {d}); });
  ud("sum twice", [](const Tensor& a, int64_t d) { return sum(a, {d, d}); });
  ud("mean keepdim", [](const Tensor& a, int64_t d) { return mean(a, {d}, true); });
  ud("prod", [](const Tensor& a, int64_t d) { return prod(a, d); });
  ud("amax", [](const Tensor& a, int64_t d) { return amax(a, {d}); });
  ud("max values", [](const Tensor& a, int64_t d) { return std::get<0>(max(a, d)); });
  ud("min indices", [](const Tensor& a, int64_t d) { return std::get<1>(min(a, d, true)); });
  ud("argmin", [](const Tensor& a, int64_t d) { return argmin(a, d); });
  ud("var", [](const Tensor& a, int64_t d) { return var(a, {d}); });
  ud("norm 3", [](const Tensor& a, int64_t d) { return norm(a, 3, {d}); });
  ud("logsumexp", [](const Tensor& a, int64_t d) { return logsumexp(a, {d}); });
  ud("any", [](const Tensor& a, int64_t d) { return any(a, d); });
  ud("softmax", [](const Tensor& a, int64_t d) { return softmax(a, d); });
  ud("log_softmax", [](const Tensor& a, int64_t d) { return log_softmax(a, d); });
  // views and shapes
  u("contiguous", [](const Tensor& a) { return contiguous(a); });
  u("detach", [](const Tensor& a) { return detach(a); });
  u("to float16", [](const Tensor& a) { return a.to(kFloat16); });
  u("to int8", [](const Tensor& a) { return a.to(kInt8); });
  u("view -1", [](const Tensor& a) { return view(a, {-1}); });
  u("view -1 -1", [](const Tensor& a) { return view(a, {-1, -1}); });
  u("view 0 -1", [](const Tensor& a) { return view(a, {0, -1}); });
  u("reshape 3 -1", [](const Tensor& a) { return reshape(a, {3, -1}); });
  u("reshape -2", [](const Tensor& a) { return reshape(a, {-2, 3}); });
  u("reshape 2^62", [](const Tensor& a) { return reshape(a, {int64_t{1} << 62, 4}); });
  u("permute 1 0", [](const Tensor& a) { return permute(a, {1, 0}); });
  u("permute 0 0", [](const Tensor& a) { return permute(a, {0, 0}); });
  u("expand", [](const Tensor& a) { return expand(a, {5, 2, 3}); });
  u("expand 2^40", [](const Tensor& a) { return expand(a, {int64_t{1} << 40, int64_t{1} << 40, 3}); });
  u("flatten 1 0", [](const Tensor& a) { return flatten(a, 1, 0); });
  u("unflatten -1 -1", [](const Tensor& a) { return unflatten(a, 0, {-1, -1}); });
  u("as_strided past the end", [](const Tensor& a) { return as_strided(a, {2, 2}, {100, 1}, 0); });
  u("as_strided negative stride", [](const Tensor& a) { return as_strided(a, {2, 2}, {-1, 1}, 0); });
  u("as_strided negative offset", [](const Tensor& a) { return as_strided(a, {1}, {1}, -3); });
  u("narrow past the end", [](const Tensor& a) { return narrow(a, 0, 1, 5); });
  u("narrow negative length", [](const Tensor& a) { return narrow(a, 0, 0, -1); });
  u("slice step 0", [](const Tensor& a) { return slice(a, 0, 0, 2, 0); });
  u("slice wide", [](const Tensor& a) { return slice(a, 0, -100, 100); });
  u("select 100", [](const Tensor& a) { return select(a, 0, 100); });
  u("flip 0 0", [](const Tensor& a) { return flip(a, {0, 0}); });
  u("repeat 0 2", [](const Tensor& a) { return repeat(a, {0, 2}); });
  u("repeat -1 2", [](const Tensor& a) { return repeat(a, {-1, 2}); });
  u("pad negative", [](const Tensor& a) { return pad(a, {-5, -5}); });
  u("pad odd", [](const Tensor& a) { return pad(a, {1}); });
  u("pad 5 dims", [](const Tensor& a) { return pad(a, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1}); });
  u("tril -100", [](const Tensor& a) { return tril(a, -100); });
  u("chunk 5", [](const Tensor& a) { return chunk(a, 5).back(); });
  u("split sizes -1", [](const Tensor& a) { return split_with_sizes(a, {1, -1, 3})[0]; });
  u("cat none", [](const Tensor&) { return cat({}, 0); });
  u("one_hot", [](const Tensor& a) { return one_hot(a); });
  u("one_hot 2", [](const Tensor& a) { return one_hot(a, 2); });
  ud("transpose", [](const Tensor& a, int64_t d) { return transpose(a, 0, d); });
  ud("unsqueeze", [](const Tensor& a, int64_t d) { return unsqueeze(a, d); });
  ud("squeeze", [](const Tensor& a, int64_t d) { return squeeze(a, d); });
  ud("select", [](const Tensor& a, int64_t d) { return select(a, d, 0); });
  ud("split", [](const Tensor& a, int64_t d) { return split(a, 2, d)[0]; });
  ud("chunk", [](const Tensor& a, int64_t d) { return chunk(a, 2, d)[0]; });
  ud("cat itself", [](const Tensor& a, int64_t d) { return cat({a, a}, d); });
  ud("stack itself", [](const Tensor& a, int64_t d) { return stack({a, a}, d); });
  ud("tril", [](const Tensor& a, int64_t d) { return tril(a, d); });
  ud("dropout_part", [](const Tensor& a, int64_t d) { return dropout_part(a, 0.5, true, d, 1, 3); });
  ud("one_hot", [](const Tensor& a, int64_t d) { return one_hot(a, d); });
  // nn
  u("dropout 1", [](const Tensor& a) { return dropout(a, 1.0); });
  u("dropout 1.5", [](const Tensor& a) { return dropout(a, 1.5); });
  u("layer_norm [3]", [](const Tensor& a) { return layer_norm(a, {3}); });
  u("layer_norm []", [](const Tensor& a) { return layer_norm(a, {}); });
  u("rms_norm [3]", [](const Tensor& a) { return rms_norm(a, {3}); });
  u("group_norm 0", [](const Tensor& a) { return group_norm(a, 0); });
  u("max_pool2d 2", [](const Tensor& a) { return max_pool2d(a, {2, 2}); });
  u("max_pool2d 0", [](const Tensor& a) { return max_pool2d(a, {0, 0}); });
  u("max_pool2d stride 0", [](const Tensor& a) { return max_pool2d(a, {2, 2}, {0, 0}); });
  u("max_pool2d padding 3", [](const Tensor& a) { return max_pool2d(a, {2, 2}, {1, 1}, {3, 3}); });
  u("avg_pool2d padding 5", [](const Tensor& a) { return avg_pool2d(a, {2, 2}, {1, 1}, {5, 5}); });
  u("adaptive_avg_pool2d 0", [](const Tensor& a) { return adaptive_avg_pool2d(a, {0, 0}); });
  u("adaptive_max_pool2d -1", [](const Tensor& a) { return adaptive_max_pool2d(a, {-1, 2}); });
  u("max_pool1d 0", [](const Tensor& a) { return max_pool1d(a, 0); });
  u("avg_pool1d -2", [](const Tensor& a) { return avg_pool1d(a, -2); });
  u("adaptive_max_pool1d 0", [](const Tensor& a) { return adaptive_max_pool1d(a, 0); });
  // factories
  u("randperm -1", [](const Tensor&) { return randperm(-1); });
  u("arange step 0", [](const Tensor&) { return arange(0, 10, 0); });
  u("arange backwards", [](const Tensor&) { return arange(10, 0, 1); });
  u("arange to nan", [](const Tensor&) { return arange(0, NAN, 1); });
  u("linspace -1", [](const Tensor&) { return linspace(0, 1, -1); });
  u("eye -1", [](const Tensor&) { return eye(-1); });
  u("randint empty range", [](const Tensor&) { return randint(5, 5, {3}); });
  u("empty -1", [](const Tensor&) { return empty({-1, 3}); });
  u("zeros 2^65 elements", [](const Tensor&) { return zeros({int64_t{1} << 62, 8}); });
  u("full nan int32", [](const Tensor&) { return full({2}, NAN, kInt32); });
  u("bernoulli 2", [](const Tensor&) { return bernoulli({2}, 2.0); });
  // in place
  b("add_", [](const Tensor& a, const Tensor& c) { Tensor x = a; return x.add_(c); });
  b("mul_", [](const Tensor& a, const Tensor& c) { Tensor x = a; return x.mul_(c); });
  b("copy_", [](const Tensor& a, const Tensor& c) { Tensor x = a; return x.copy_(c); });
  b("masked_fill_", [](const Tensor& a, const Tensor& c) { Tensor x = a; return x.masked_fill_(c, 1.0); });
  b("lerp_", [](const Tensor& a, const Tensor& c) { Tensor x = a; return x.lerp_(c, 0.5); });
  b("addcdiv_", [](const Tensor& a, const Tensor& c) { Tensor x = a; return x.addcdiv_(c, c); });
  b("set_data", [](const Tensor& a, const Tensor& c) { Tensor x = a; x.set_data(c); return x; });
  b("set_grad", [](const Tensor& a, const Tensor& c) { Tensor x = a; x.set_grad(c); return x.grad(); });
  b("backward with a gradient", [](const Tensor& a, const Tensor& c) { (a * 2).backward(c); return a.grad(); });
  u("fill_ nan", [](const Tensor& a) { Tensor x = a; return x.fill_(NAN); });
  u("zero_", [](const Tensor& a) { Tensor x = a; return x.zero_(); });
  u("sqrt_", [](const Tensor& a) { Tensor x = a; return x.sqrt_(); });
  u("clamp_", [](const Tensor& a) { Tensor x = a; return x.clamp_(0, 1); });
  u("requires_grad_", [](const Tensor& a) { Tensor x = a; return x.requires_grad_(); });
  u("backward", [](const Tensor& a) { Tensor x = a; x.backward(); return x.grad(); });
  u("backward twice", [](const Tensor& a) { Tensor y = a.sum() * 2; y.backward(); y.backward(); return a.grad(); });
  u("item", [](const Tensor& a) { return scalar_tensor(a.item<double>()); });
  u("to_string", [](const Tensor& a) { return scalar_tensor(static_cast<double>(to_string(a).size())); });
  // binary
  b("add alpha", [](const Tensor& a, const Tensor& c) { return add(a, c, 2.5); });
  b("sub", [](const Tensor& a, const Tensor& c) { return sub(a, c); });
  b("div", [](const Tensor& a, const Tensor& c) { return div(a, c); });
  b("div floor", [](const Tensor& a, const Tensor& c) { return div(a, c, "floor"); });
  b("div round", [](const Tensor& a, const Tensor& c) { return div(a, c, "round"); });
  b("remainder", [](const Tensor& a, const Tensor& c) { return remainder(a, c); });
  b("floor_divide", [](const Tensor& a, const Tensor& c) { return floor_divide(a, c); });
  b("bitwise_xor", [](const Tensor& a, const Tensor& c) { return bitwise_xor(a, c); });
  b("pow", [](const Tensor& a, const Tensor& c) { return pow(a, c); });
  b("maximum", [](const Tensor& a, const Tensor& c) { return maximum(a, c); });
  b("lt", [](const Tensor& a, const Tensor& c) { return lt(a, c); });
  b("logical_and", [](const Tensor& a, const Tensor& c) { return logical_and(a, c); });
  b("where", [](const Tensor& a, const Tensor& c) { return where(a, c, c); });
  b("masked_fill", [](const Tensor& a, const Tensor& c) { return masked_fill(a, c, 7); });
  b("addcmul", [](const Tensor& a, const Tensor& c) { return addcmul(a, c, c, 0.5); });
  b("lerp", [](const Tensor& a, const Tensor& c) { return lerp(a, c, c); });
  b("matmul", [](const Tensor& a, const Tensor& c) { return matmul(a, c); });
  b("matmul by the transpose", [](const Tensor& a, const Tensor& c) { return matmul(a, c.t()); });
  b("bmm", [](const Tensor& a, const Tensor& c) { return bmm(a, c); });
  b("addmm", [](const Tensor& a, const Tensor& c) { return addmm(a, c, c.t()); });
  b("addmm_gelu", [](const Tensor& a, const Tensor& c) { return addmm_gelu(a, c, c.t()); });
  b("addmm_out", [](const Tensor& a, const Tensor& c) { return addmm_out(a, a, c, c.t()); });
  b("cat", [](const Tensor& a, const Tensor& c) { return cat({a, c}); });
  b("stack", [](const Tensor& a, const Tensor& c) { return stack({a, c}); });
  b("expand as", [](const Tensor& a, const Tensor& c) { return expand(a, c.sizes()); });
  b("sum_to", [](const Tensor& a, const Tensor& c) { return sum_to(a, c.sizes()); });
  b("view as", [](const Tensor& a, const Tensor& c) { return view(a, c.sizes()); });
  b("bias_gelu", [](const Tensor& a, const Tensor& c) { return bias_gelu(a, c); });
  b("embedding", [](const Tensor& a, const Tensor& c) { return embedding(a, c); });
  b("nn::embedding padding -100", [](const Tensor& a, const Tensor& c) { return nn::embedding(c, a, -100); });
  b("linear", [](const Tensor& a, const Tensor& c) { return nn::linear(a, c, c); });
  b("linear_gelu", [](const Tensor& a, const Tensor& c) { return nn::linear_gelu(a, c, a); });
  b("cross_entropy", [](const Tensor& a, const Tensor& c) { return nn::cross_entropy(a, c); });
  b("cross_entropy smoothing", [](const Tensor& a, const Tensor& c) {
    return nn::cross_entropy(a, c, {.ignore_index = 0, .label_smoothing = 0.2});
  });
  b("cross_entropy weight", [](const Tensor& a, const Tensor& c) { return nn::cross_entropy(a, c, {.weight = c}); });
  b("softmax_cross_entropy", [](const Tensor& a, const Tensor& c) { return softmax_cross_entropy(a, c); });
  b("nll_loss", [](const Tensor& a, const Tensor& c) { return nn::nll_loss(a, c); });
  b("smooth_l1 beta 0", [](const Tensor& a, const Tensor& c) { return nn::smooth_l1_loss(a, c, {.beta = 0}); });
  b("huber delta -1", [](const Tensor& a, const Tensor& c) { return nn::huber_loss(a, c, {.delta = -1}); });
  b("kl_div", [](const Tensor& a, const Tensor& c) { return nn::kl_div(a, c); });
  b("binary_cross_entropy", [](const Tensor& a, const Tensor& c) { return nn::binary_cross_entropy(a, c); });
  b("conv2d", [](const Tensor& a, const Tensor& c) { return conv2d(a, c); });
  b("conv1d stride 0", [](const Tensor& a, const Tensor& c) { return conv1d(a, c, {}, 0); });
  b("conv_transpose1d", [](const Tensor& a, const Tensor& c) { return conv_transpose1d(a, c); });
  b("layer_norm affine", [](const Tensor& a, const Tensor& c) { return layer_norm(a, {a.dim() ? a.size(-1) : 1}, c, c); });
  b("add_layer_norm", [](const Tensor& a, const Tensor& c) { return std::get<0>(add_layer_norm(a, c, {3})); });
  b("batch_norm", [](const Tensor& a, const Tensor& c) { return batch_norm(a, c, c, {}, {}, true); });
  b("group_norm affine", [](const Tensor& a, const Tensor& c) { return group_norm(a, 1, c, c); });
  b("attention", [](const Tensor& a, const Tensor& c) { return scaled_dot_product_attention(a, c, c); });
  b("attention with a mask", [](const Tensor& a, const Tensor& c) { return scaled_dot_product_attention(a, a, a, c); });
  bd("index_select", [](const Tensor& a, const Tensor& c, int64_t d) { return index_select(a, d, c); });
  bd("gather", [](const Tensor& a, const Tensor& c, int64_t d) { return gather(a, d, c); });
  bd("scatter", [](const Tensor& a, const Tensor& c, int64_t d) { return scatter(a, d, c, a); });
  bd("scatter_add", [](const Tensor& a, const Tensor& c, int64_t d) { return scatter_add(a, d, c, a); });
  bd("index_add", [](const Tensor& a, const Tensor& c, int64_t d) { return index_add(a, d, c, a); });
  bd("cat", [](const Tensor& a, const Tensor& c, int64_t d) { return cat({a, c}, d); });
  bd("conv2d stride", [](const Tensor& a, const Tensor& c, int64_t d) { return conv2d(a, c, {}, {d, d}); });
  bd("conv2d groups", [](const Tensor& a, const Tensor& c, int64_t d) { return conv2d(a, c, {}, {1, 1}, {0, 0}, {1, 1}, d); });
  bd("conv2d dilation", [](const Tensor& a, const Tensor& c, int64_t d) { return conv2d(a, c, {}, {1, 1}, {0, 0}, {d, d}); });
  bd("cross_entropy ignore_index", [](const Tensor& a, const Tensor& c, int64_t d) {
    return nn::cross_entropy(a, c, {.ignore_index = d});
  });
  return v;
}

}  // namespace

TEST_CASE("every op on every pair of odd inputs returns a tensor or raises a kiln::Error", "[ops]") {
  const std::vector<Input> inputs = odd_inputs();
  int64_t returned = 0, refused = 0;
  for (const SweptOp& op : swept_ops()) {
    for (const Input& first : inputs) {
      for (size_t j = 0; j < (op.binary ? inputs.size() : 1); ++j) {
        for (bool grad : {false, true}) {
          Tensor a = first.make(), c = inputs[j].make();
          if (grad) {  // floating inputs as leaves that require grad: the backward paths too
            if (a.defined() && is_floating(a.dtype())) a = a.detach().requires_grad_();
            if (c.defined() && is_floating(c.dtype())) c = c.detach().requires_grad_();
          }
          try {
            Tensor y = op.call(a, c);
            if (y.defined()) {
              // Read every element (an output's layout must stay inside its storage), then backward.
              if (y.numel() < 100000) (void)y.contiguous().to(kFloat64).sum().item<double>();
              if (y.requires_grad() && is_floating(y.dtype())) y.to(kFloat32).sum().backward();
            }
            ++returned;
          } catch (const Error&) {
            ++refused;
          } catch (const std::exception& e) {
            FAIL_CHECK(op.name << "(" << first.name << (op.binary ? std::string(", ") + inputs[j].name : "")
                               << ") with grad " << grad << " threw a non-kiln exception: " << e.what());
          }
        }
      }
    }
  }
  // Both outcomes are common: the sweep reaches the ops' results as well as their checks.
  CHECK(returned > 10000);
  CHECK(refused > 10000);
}
