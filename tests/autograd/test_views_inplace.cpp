// tests/autograd/test_views_inplace.cpp: autograd's edge cases against PyTorch 1.13 (values from torch
// for the same inputs): views taken before a tensor took part in autograd, in-place ops on what a custom
// Function or checkpoint passed through, retain_grad across an in-place op, grad() with respect to a
// non-leaf, second backwards through nodes that saved nothing, the root gradient's dtype, custom
// Function gradients (unused outputs, extra or broadcast gradients), copy_ of a constant, and freeing
// deep graphs whose nodes are shared.
#include <cmath>

#include "support.h"

using namespace kiln;
using autograd::AutogradContext;
using autograd::TensorList;
using test::sines;

namespace {

struct Ident : autograd::Function<Ident> {
  static Tensor forward(AutogradContext*, const Tensor& x) { return x; }
  static TensorList backward(AutogradContext*, TensorList g) { return {g[0]}; }
};
struct TwoOut : autograd::Function<TwoOut> {
  static TensorList forward(AutogradContext*, const Tensor& x) { return {x * 2, x * 3}; }
  static TensorList backward(AutogradContext*, TensorList g) { return {g[0] * 2 + g[1] * 3}; }
};
struct Double : autograd::Function<Double> {  // saves nothing: can run backward twice
  static Tensor forward(AutogradContext* ctx, const Tensor& x) {
    ctx->saved_data["needs"] = ctx->needs_input_grad(0);
    return x * 2;
  }
  static TensorList backward(AutogradContext*, TensorList g) { return {g[0] * 2}; }
};
struct ExtraGrads : autograd::Function<ExtraGrads> {
  static Tensor forward(AutogradContext*, const Tensor& x) { return x * 2; }
  static TensorList backward(AutogradContext* ctx, TensorList g) {
    if (std::any_cast<bool>(ctx->saved_data.at("undefined_extra"))) return {g[0] * 2, Tensor()};
    return {g[0] * 2, g[0]};
  }
};
struct BroadcastGrad : autograd::Function<BroadcastGrad> {
  static Tensor forward(AutogradContext*, const Tensor& x) { return x * 2; }
  static TensorList backward(AutogradContext*, TensorList g) { return {g[0].unsqueeze(0).expand({4, 3}) * 2}; }
};

}  // namespace

TEST_CASE("an in-place op that autograd records refuses a tensor with views taken before, while they live",
          "[autograd]") {
  Tensor w = sines({2, 3}, 0.1);
  Tensor buf = zeros({2, 3}, kFloat64);
  {
    Tensor col = buf.t()[1];  // no history: buf did not require grad yet
    // PyTorch rebuilds col's history; Kiln refuses rather than give w no gradient through col.
    test::check_error([&] { buf.add_(w); }, {"add_", "live views", "taken before it took part in autograd"});
    test::check_equal(buf, zeros({2, 3}, kFloat64));  // refused before writing
    Tensor under_no_grad;
    {
      NoGradGuard no_grad;
      under_no_grad = buf.narrow(0, 0, 1);
    }
    test::check_error([&] { buf.mul_(w); }, {"mul_", "views"});
  }
  // Once the views are gone the op is recorded, and the gradient is torch's.
  buf.add_(w);
  Tensor col = buf.t()[1];
  (col * col).sum().backward();
  test::check_close(w.grad(), from_vector<double>({0, 2 * std::sin(0.47), 0, 0, 2 * std::sin(1.58), 0}, {2, 3}),
                    {1e-15, 0});
  // Without autograd (no grad mode, or nothing requiring grad) views do not matter.
  Tensor plain = zeros({3});
  Tensor view = plain.narrow(0, 1, 2);
  plain.add_(ones({3}));
  CHECK(view.to_vector<float>() == std::vector<float>{1, 1});
}

TEST_CASE("what a custom Function or checkpoint passes through is a view: in-place on it is an Error",
          "[autograd]") {
  Tensor x = sines({3}, 0.3);
  const Tensor before = x.detach().clone();
  Tensor y = Ident::apply(x);
  test::check_error([&] { y.mul_(2); }, {"mul_", "view"});
  Tensor z = autograd::checkpoint([](const TensorList& in) -> TensorList { return {in[0]}; }, {x})[0];
  test::check_error([&] { z.mul_(2); }, {"mul_", "view"});
  test::check_equal(x.detach(), before);  // the leaf was not overwritten
  CHECK(x.is_leaf());
  (y + z).sum().backward();
  test::check_equal(x.grad(), full({3}, 2.0, kFloat64));
  // A non-leaf passed through refuses in-place changes while the view lives, and takes them after.
  Tensor h = x * 2;
  {
    Tensor passed = Ident::apply(h);
    test::check_error([&] { h.add_(x); }, {"add_", "live views", "custom Function"});
  }
  h.add_(x);
  h.sum().backward();
  test::check_equal(x.grad(), full({3}, 5.0, kFloat64));
}

TEST_CASE("retain_grad follows a tensor through an in-place op, as torch's", "[autograd]") {
  Tensor x = sines({3}, 0.1);
  Tensor y = x * 2;
  y.retain_grad();
  y.mul_(3);
  Tensor v = sines({3}, 0.5, false);
  (y * v).sum().backward();
  test::check_equal(y.grad(), v);  // torch: v (the gradient of the new y), not 3 v
  test::check_close(x.grad(), v * 6, {1e-15, 0});
}

TEST_CASE("grad() with respect to a non-leaf runs nothing past it", "[autograd]") {
  Tensor x = sines({3}, 0.1);
  Tensor k = (x * 3) * (x * 3);
  k.sum().backward();  // frees k's node: grad() below must not run it
  test::check_equal(autograd::grad({(k * 2).sum()}, {k})[0], full({3}, 2.0, kFloat64));

  // A tensor that k's node saved, changed in place: only a backward through k's node would read it.
  Tensor z = sines({3}, 0.2);
  Tensor c = z * 1;
  Tensor k2 = x * c;
  c.add_(1);
  test::check_close(autograd::grad({(k2 * k2).sum()}, {k2})[0], (k2 * 2).detach(), {1e-15, 0});

  // A hook past the inputs does not run: h keeps no gradient.
  Tensor h = x * 3;
  h.retain_grad();
  Tensor k3 = h * 2;
  autograd::grad({(k3 * k3).sum()}, {k3});
  CHECK_FALSE(h.grad().defined());
}

TEST_CASE("nodes that saved no tensor run again in a second backward, as torch's", "[autograd]") {
  Tensor a = sines({2, 3}, 0.1), b = sines({2, 3}, 0.2);
  Tensor s = cat({a, b}, 1).sum();
  s.backward();
  s.backward();
  test::check_equal(a.grad(), full({2, 3}, 2.0, kFloat64));
  Tensor c = sines({6}, 0.1);
  auto pieces = c.split(3);
  pieces[0].sum().backward();
  pieces[1].sum().backward();
  test::check_equal(c.grad(), ones({6}, kFloat64));
  Tensor d = sines({3}, 0.1);
  Tensor padded = pad(d, {1, 1}).sum();
  padded.backward();
  padded.backward();
  test::check_equal(d.grad(), full({3}, 2.0, kFloat64));
  Tensor e = sines({2, 3}, 0.1);
  Tensor lower = e.tril().sum();
  lower.backward();
  lower.backward();
  test::check_equal(e.grad(), from_vector<double>({2, 0, 0, 2, 2, 0}, {2, 3}));
  Tensor f = sines({3}, 0.3);
  Tensor doubled = Double::apply(f).sum();
  doubled.backward();
  doubled.backward();
  test::check_equal(f.grad(), full({3}, 4.0, kFloat64));
  // A node that saved a tensor still refuses.
  Tensor g = sines({3}, 0.3);
  Tensor sq = (g * g).sum();
  sq.backward();
  test::check_error([&] { sq.backward(); }, {"second time", "retain_graph"});
}

TEST_CASE("a root gradient of another dtype is cast to the output's, as torch's", "[autograd]") {
  Tensor x = sines({3}, 0.1);
  x.backward(ones({3}, kFloat32));
  (x * x).sum().backward();
  CHECK(x.grad().dtype() == kFloat64);
  test::check_close(x.grad(), (x * 2 + 1).detach(), {1e-15, 0});
  Tensor x2 = sines({2, 3}, 0.1);
  CHECK(autograd::grad({x2.view({6})}, {x2}, {ones({6}, kFloat32)})[0].dtype() == kFloat64);
  test::check_error([&] { x.backward(ones({3}, kInt64)); }, {"backward", "int64", "floating"});
}

TEST_CASE("autograd::grad through a checkpoint is an Error that leaves .grad() alone", "[autograd]") {
  Tensor W = sines({3, 3}, 0.1), x = sines({2, 3}, 0.2);
  Tensor y = autograd::checkpoint([&](const TensorList& in) -> TensorList { return {in[0].matmul(W).tanh()}; },
                                  {x})[0];
  test::check_error([&] { autograd::grad({y.sum()}, {x, W}, {}, {}, false, true); },
                    {"checkpoint", "autograd::grad()", "backward()"});
  CHECK_FALSE(W.grad().defined());
}

TEST_CASE("a custom Function's gradients follow torch: zeros for unused outputs, extra and broadcast ones",
          "[autograd]") {
  Tensor x = sines({3}, 0.3);
  TwoOut::apply(x)[0].sum().backward();  // backward gets zeros for the second output
  test::check_equal(x.grad(), full({3}, 2.0, kFloat64));

  Tensor n = sines({3}, 0.3);
  Tensor out = Double::apply(n);
  CHECK(std::any_cast<bool>(static_cast<const autograd::CppNode<Double>*>(out.grad_fn().get())
                                ->ctx.saved_data.at("needs")));  // needs_input_grad in forward
  {
    NoGradGuard no_grad;
    Tensor m = sines({3}, 0.3);
    CHECK(!Double::apply(m).requires_grad());
  }

  Tensor e = sines({3}, 0.3);
  Tensor extra = ExtraGrads::apply(e);
  auto* node = static_cast<autograd::CppNode<ExtraGrads>*>(extra.grad_fn().get());
  node->ctx.saved_data["undefined_extra"] = false;
  test::check_error([&] { extra.sum().backward({}, true); }, {"CppFunction", "returned 2 gradients", "took 1"});
  node->ctx.saved_data["undefined_extra"] = true;  // a trailing undefined one is dropped, as torch's None
  extra.sum().backward();
  test::check_equal(e.grad(), full({3}, 2.0, kFloat64));

  Tensor bcast = sines({3}, 0.3);
  BroadcastGrad::apply(bcast).sum().backward();  // (4, 3) summed down to (3)
  test::check_equal(bcast.grad(), full({3}, 8.0, kFloat64));
}

TEST_CASE("copy_ of a constant keeps a tensor in the graph, a leaf told to stop requiring grad gets none",
          "[autograd]") {
  Tensor a = sines({3}, 0.1);
  Tensor y = a * 2;
  y.copy_(sines({3}, 0.5, false));
  CHECK(y.requires_grad());
  y.sum().backward();
  test::check_equal(a.grad(), zeros({3}, kFloat64));  // torch: zeros
  // An integer destination takes the values and stays out of autograd.
  Tensor idx = zeros({3}, kInt64);
  idx.copy_(a * 2);
  CHECK_FALSE(idx.requires_grad());

  Tensor b = sines({3}, 0.1);
  Tensor loss = (b * 2).sum();
  b.requires_grad_(false);
  loss.backward();
  CHECK_FALSE(b.grad().defined());  // torch: None

  Tensor c = sines({3}, 0.1);
  Tensor piece = (c * 2).narrow(0, 0, 2);
  test::check_error([&] { piece.detach_(); }, {"detach_", "view", "detach()"});
}

TEST_CASE("freeing a deep graph whose nodes are shared does not recurse", "[autograd]") {
  Tensor x = tensor({1.0, -1.0}).requires_grad_();
  {
    Tensor y = x;
    for (int i = 0; i < 100000; ++i) y = y * y;  // two edges to one node: freed inside each other before
  }
  {
    Tensor y = x;
    for (int i = 0; i < 100000; ++i) y = y.sin() + y;  // sin's saved input holds the previous node
  }
  {
    Tensor y = x;
    for (int i = 0; i < 100000; ++i) y = y.sin();
    y.sum().backward();
  }
  CHECK(x.grad().defined());
}
