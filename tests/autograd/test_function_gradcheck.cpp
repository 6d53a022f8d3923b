// tests/autograd/test_function_gradcheck.cpp: user-defined autograd::Function, and gradcheck /
// gradgradcheck themselves: they pass on right gradients and fail, with a message, on wrong ones.
#include <cmath>

#include "support.h"

using namespace kiln;
using autograd::AutogradContext;
using autograd::TensorList;

namespace {

struct Cube : autograd::Function<Cube> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x) {
    ctx->save_for_backward({x});
    return x * x * x;
  }
  static TensorList backward(AutogradContext* ctx, TensorList g) {
    Tensor x = ctx->get_saved_variables()[0];
    return {g[0] * x * x * 3};
  }
};

// A deliberately wrong backward (2x^2 instead of 3x^2): gradcheck must catch it.
struct WrongCube : autograd::Function<WrongCube> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x) {
    ctx->save_for_backward({x});
    return x * x * x;
  }
  static TensorList backward(AutogradContext* ctx, TensorList g) {
    Tensor x = ctx->get_saved_variables()[0];
    return {g[0] * x * x * 2};
  }
};

// Returns its gradient in float64 whatever the input's dtype: cast back to the input's, as PyTorch.
struct Float64Grad : autograd::Function<Float64Grad> {
  static Tensor forward(AutogradContext*, const Tensor& x) { return x * 2; }
  static TensorList backward(AutogradContext*, TensorList g) { return {g[0].to(kFloat64) * 2}; }
};

// Two tensor arguments, a non-tensor one, and a saved output: y = scale * a * b.
struct ScaledProduct : autograd::Function<ScaledProduct> {
  static Tensor forward(AutogradContext* ctx, const Tensor& a, const Tensor& b, double scale) {
    Tensor y = a * b * scale;
    ctx->save_for_backward({a, b});
    ctx->saved_data["scale"] = scale;
    return y;
  }
  static TensorList backward(AutogradContext* ctx, TensorList g) {
    auto saved = ctx->get_saved_variables();
    double scale = std::any_cast<double>(ctx->saved_data["scale"]);
    return {g[0] * saved[1] * scale, g[0] * saved[0] * scale, Tensor()};
  }
};

}  // namespace

TEST_CASE("a user-defined Function records a node and gives its gradient") {
  Tensor x = tensor({1.0, -2.0}, TensorOptions(kFloat64).requires_grad(true));
  Tensor y = Cube::apply(x);
  CHECK(y.grad_fn()->name() == std::string("CppFunction"));
  y.sum().backward();
  test::check_close(x.grad(), tensor({3.0, 12.0}, kFloat64));
  Tensor a = tensor({2.0}, TensorOptions(kFloat64).requires_grad(true)), b = tensor({5.0}, kFloat64);
  Tensor z = ScaledProduct::apply(a, b, 0.5);
  z.backward();
  CHECK(a.grad().item<double>() == 2.5);
  CHECK(!b.grad().defined());
}

TEST_CASE("gradcheck passes right gradients and rejects wrong ones") {
  Tensor x = tensor({0.7, -1.3, 0.4}, TensorOptions(kFloat64).requires_grad(true));
  CHECK(autograd::gradcheck([](const TensorList& in) -> TensorList { return {Cube::apply(in[0])}; }, {x}));
  test::check_error(
      [&] { autograd::gradcheck([](const TensorList& in) -> TensorList { return {WrongCube::apply(in[0])}; }, {x}); },
      {"gradcheck", "input 0", "analytic", "numeric"});
  autograd::GradcheckOptions quiet;
  quiet.raise_exception = false;
  CHECK(!autograd::gradcheck([](const TensorList& in) -> TensorList { return {WrongCube::apply(in[0])}; }, {x}, quiet));
  test::check_error([] {
    autograd::gradcheck([](const TensorList& in) -> TensorList { return {in[0] * 2}; },
                        {tensor({1.0}, TensorOptions().requires_grad(true))});
  }, {"float64"});
}

TEST_CASE("gradgradcheck checks second derivatives through create_graph") {
  Tensor x = tensor({0.7, -1.3, 0.4}, TensorOptions(kFloat64).requires_grad(true));
  Tensor w = tensor({{0.2, -0.1}, {0.5, 0.3}, {-0.4, 0.9}}, TensorOptions(kFloat64).requires_grad(true));
  CHECK(autograd::gradgradcheck(
      [](const TensorList& in) -> TensorList { return {(matmul(in[0], in[1]).tanh() * in[0].sum()).exp()}; }, {x, w}));
  // Cube's backward is built from differentiable ops, so its second derivative is right too.
  CHECK(autograd::gradgradcheck([](const TensorList& in) -> TensorList { return {Cube::apply(in[0])}; }, {x}));
}

namespace {
struct WrongShape : autograd::Function<WrongShape> {
  static Tensor forward(AutogradContext*, const Tensor& x) { return x * 2; }
  static TensorList backward(AutogradContext*, TensorList g) { return {g[0].t().contiguous()}; }
};
}  // namespace

TEST_CASE("a user backward returning a gradient of the wrong shape is an Error") {
  Tensor x = zeros({2, 3}, TensorOptions(kFloat64).requires_grad(true));
  test::check_error([&] { WrongShape::apply(x).sum().backward(); }, {"CppFunction", "[3, 2]", "[2, 3]"});
}

TEST_CASE("a Function's gradient of another dtype is cast to its argument's dtype", "[autograd]") {
  Tensor x = tensor({1.0, -3.0}).requires_grad_();  // float32
  Float64Grad::apply(x).sum().backward();
  REQUIRE(x.grad().dtype() == kFloat32);
  CHECK(x.grad().to_vector<float>() == std::vector<float>{2, 2});
}

TEST_CASE("gradcheck with no input that requires grad is an Error, as PyTorch's ValueError") {
  // It returned true having compared nothing.
  const autograd::DifferentiableFn f = [](const autograd::TensorList& in) { return autograd::TensorList{in[0] * 2}; };
  kiln::test::check_error([&] { autograd::gradcheck(f, {ones({2}, kFloat64)}); }, {"gradcheck", "no input requires grad"});
  kiln::test::check_error([&] { autograd::gradcheck(f, {}); }, {"gradcheck", "no input requires grad"});
  CHECK(autograd::gradcheck(f, {ones({2}, kFloat64).requires_grad_()}));
}

TEST_CASE("gradcheck and gradgradcheck with an empty function or a step that is not positive are Errors") {
  // gradgradcheck called the empty function (std::bad_function_call); an eps of 0 or NaN reported
  // a gradient mismatch ("numeric nan").
  const Tensor x = ones({2}, kFloat64).requires_grad_();
  kiln::test::check_error([&] { autograd::gradgradcheck(autograd::DifferentiableFn(), {x}); },
                          {"gradgradcheck: the function is empty"});
  const autograd::DifferentiableFn f = [](const autograd::TensorList& in) { return autograd::TensorList{in[0] * 2}; };
  for (double eps : {0.0, -1e-6, std::nan(""), double(INFINITY)}) {
    kiln::test::check_error([&] { autograd::gradcheck(f, {x}, {.eps = eps}); }, {"gradcheck: eps must be a positive"});
  }
}
