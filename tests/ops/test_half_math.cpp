// tests/ops/test_half_math.cpp: float16 and bfloat16 on the CPU. Their elementwise math runs in
// float32: a contiguous run of a unary op, or of GELU's backward, goes through float32 buffers in
// chunks of 512 and the float32 kernels (cpu/elementwise.cpp), and a cast of contiguous tensors is
// a plain loop (cpu/copy.cpp). So each result must be, bit for bit, the float32 op on the widened
// inputs rounded once: checked here at lengths that end a chunk early, exactly and late, and in
// place; strided views keep the scalar loop, within the 16-bit format's tolerance.
#include <cmath>
#include <limits>

#include "cpu/kernels.h"
#include "support.h"

using namespace kiln;

namespace {

using Fn = Tensor (*)(const Tensor&);

// The same shape, dtype and values, NaN matching NaN (test::check_equal counts NaN unequal).
void check_same(const Tensor& actual, const Tensor& expected) {
  REQUIRE(actual.sizes() == expected.sizes());
  REQUIRE(actual.dtype() == expected.dtype());
  const std::vector<double> a = actual.to_vector<double>(), e = expected.to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(e[i])) continue;
    INFO("element " << i);
    REQUIRE(a[i] == e[i]);
  }
}

const std::vector<std::pair<const char*, Fn>>& unary_ops() {
  static const std::vector<std::pair<const char*, Fn>> ops = {
      {"exp", [](const Tensor& t) { return exp(t); }},
      {"log", [](const Tensor& t) { return log(t); }},
      {"tanh", [](const Tensor& t) { return tanh(t); }},
      {"sigmoid", [](const Tensor& t) { return sigmoid(t); }},
      {"erf", [](const Tensor& t) { return erf(t); }},
      {"gelu", [](const Tensor& t) { return gelu(t); }},
      {"gelu tanh", [](const Tensor& t) { return gelu(t, "tanh"); }},
      {"silu", [](const Tensor& t) { return silu(t); }},
      {"relu", [](const Tensor& t) { return relu(t); }},
      {"neg", [](const Tensor& t) { return neg(t); }},
      {"sqrt", [](const Tensor& t) { return sqrt(t); }},  // not vectorized: the scalar loop
  };
  return ops;
}

// Inputs N(0, 9) with a few special values; positive ones for log and sqrt.
Tensor inputs(int64_t n, bool positive) {
  Generator gen(static_cast<uint64_t>(n));
  Tensor x = randn({n}, kFloat32, &gen) * 3;
  if (positive) x = abs(x) + 0.01;
  if (n > 10) {
    x[3].fill_(std::numeric_limits<double>::quiet_NaN());
    x[5].fill_(positive ? 1e4 : -1e4);
    x[7].fill_(positive ? 1e-6 : -7.5);  // GELU's Gaussian tail
  }
  return x;
}

}  // namespace

TEST_CASE("float16 and bfloat16 unary ops equal the float32 op rounded once", "[ops][half]") {
  for (DType dt : {kBFloat16, kFloat16}) {
    for (int64_t n : {1, 100, 512, 513, 5000}) {
      for (const auto& [name, f] : unary_ops()) {
        const bool positive = std::string(name) == "log" || std::string(name) == "sqrt";
        INFO(name << ", " << dtype_name(dt) << ", n " << n);
        Tensor x = inputs(n, positive).to(dt);
        Tensor expected = f(x.to(kFloat32)).to(dt);
        check_same(f(x), expected);
        // A strided view takes the scalar loop (libm's functions, not the vectorized ones): the
        // same values to the last bit of the 16-bit format.
        Tensor wide = zeros({n, 2}, TensorOptions(dt));
        wide.select(1, 0).copy_(x);
        test::check_close(f(wide.select(1, 0)), expected);
      }
    }
  }
  // In place: each chunk is read before it is written.
  Tensor x = inputs(1500, false).to(kBFloat16);
  Tensor expected = exp(x.to(kFloat32)).to(kBFloat16);
  x.exp_();
  check_same(x, expected);
}

TEST_CASE("float16 and bfloat16 GELU gradients equal float32's rounded once", "[ops][half]") {
  for (DType dt : {kBFloat16, kFloat16}) {
    for (const char* approximate : {"none", "tanh"}) {
      for (int64_t n : {7, 512, 1300}) {
        INFO(dtype_name(dt) << ", " << approximate << ", n " << n);
        Tensor x = inputs(n, false).to(dt);
        Tensor g = inputs(n + 1, false).narrow(0, 1, n).to(dt);
        Tensor x16 = x.clone().requires_grad_();
        gelu(x16, approximate).backward(g);
        // The backward's own inputs, widened: g * gelu'(x) in float32, then rounded.
        Tensor x32 = x.to(kFloat32).requires_grad_();
        gelu(x32, approximate).backward(g.to(kFloat32));
        check_same(x16.grad(), x32.grad().to(dt));
      }
    }
  }
}

TEST_CASE("casts of contiguous tensors equal the strided casts", "[ops][half]") {
  // The contiguous loop of cpu/copy.cpp against the strided one, for every pair of dtypes, with
  // values that round; between floating dtypes also NaN, infinity, float16's overflow and its
  // subnormals (a float that is not finite has no integer value to cast to).
  const std::vector<DType> dtypes = {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kBool};
  auto floating = [](DType d) { return d == kFloat32 || d == kFloat64 || d == kFloat16 || d == kBFloat16; };
  Generator gen(5);
  Tensor plain = randn({1000}, kFloat64, &gen) * 300;
  Tensor special = plain.clone();
  special[3].fill_(std::numeric_limits<double>::quiet_NaN());
  special[9].fill_(-std::numeric_limits<double>::infinity());
  special[11].fill_(70000.0);
  special[13].fill_(1e-6);
  for (DType from : dtypes) {
    for (DType to : dtypes) {
      INFO(dtype_name(from) << " -> " << dtype_name(to));
      Tensor src = (floating(from) && floating(to) ? special : plain).to(from);
      Tensor wide = zeros({1000, 3}, TensorOptions(from));
      wide.select(1, 1).copy_(src);
      check_same(src.to(to), wide.select(1, 1).to(to));
    }
  }
}

TEST_CASE("float16 and bfloat16 matmul equals float32's rounded once, an empty sum is zero", "[ops][half]") {
  // cpu/matmul.cpp multiplies 16-bit operands in float32 scratch (from the caching allocator) and
  // rounds the product once. bfloat16 can go to cpu/bf16gemm.cpp instead (Note [which bfloat16
  // GEMM]), whose float32 sums add in another order: the two sums lie within d = 4 (k + 1) 2^-24
  // (|a| @ |b|) of each other, and each rounding moves a sum by at most 2^-8 of it
  // (tests/ops/test_matmul.cpp checks the kernels against float64).
  Generator gen(11);
  for (DType dt : {kBFloat16, kFloat16}) {
    INFO(dtype_name(dt));
    const bool same_sums = dt == kFloat16 || cpu::bf16gemm_choice() == cpu::Bf16Gemm::kFloat;
    auto check_product = [&](const Tensor& a, const Tensor& b) {
      const Tensor actual = matmul(a, b), expected = matmul(a.to(kFloat32), b.to(kFloat32)).to(dt);
      if (same_sums) return check_same(actual, expected);
      Tensor e = expected.to(kFloat64);
      Tensor d = matmul(a.to(kFloat64).abs(), b.to(kFloat64).abs()) * (4.0 * (a.size(-1) + 1) * std::ldexp(1.0, -24));
      Tensor bound = (e.abs() + d) * std::ldexp(1.0, -6) + d;  // 2^-6: room for both roundings
      CHECK(((actual.to(kFloat64) - e).abs() - bound).max().item<double>() <= 0.0);
    };
    Tensor a = randn({2, 7, 300}, kFloat32, &gen).to(dt), b = randn({2, 300, 65}, kFloat32, &gen).to(dt);
    check_product(a, b);
    Tensor bt = randn({2, 65, 300}, kFloat32, &gen).to(dt).transpose(1, 2);  // a strided operand
    check_product(a, bt);
    // K = 0 right after a product of the same output size has left nonzero scratch in the cache.
    Tensor warm = matmul(full({3, 5}, 2.0).to(dt), full({5, 4}, 3.0).to(dt));
    CHECK(warm.to(kFloat32).sum().item<double>() == 360.0);
    check_same(matmul(zeros({3, 0}).to(dt), zeros({0, 4}).to(dt)), zeros({3, 4}).to(dt));
  }
}
