// tests/autograd/test_autograd_api.cpp: autograd's API beyond backward() and grad(), against PyTorch
// 1.13 (values from torch for the same inputs, or compositions of Kiln's own ops in float64):
// backward(inputs=), hook handles and remove_hook, anomaly detection, custom Functions with TensorList
// arguments, mark_dirty, mark_non_differentiable and set_materialize_grads, isnan/isinf/isfinite, a
// reshape that copies being no view, and backward from a gradient edge.
#include <cmath>
#include <limits>

#include "core/rebind.h"
#include "support.h"

using namespace kiln;
using autograd::AutogradContext;
using autograd::TensorList;
using test::check_close;
using test::check_equal;
using test::check_error;
using test::sines;

namespace {

Tensor f64(const std::vector<double>& v) { return from_vector(v); }

// (xs[0] * xs[1]) * scale, with a TensorList argument and a non-tensor one.
struct ScaledProduct : autograd::Function<ScaledProduct> {
  static Tensor forward(AutogradContext* ctx, const TensorList& xs, double scale) {
    ctx->save_for_backward(xs);
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["needs"] = std::vector<bool>{ctx->needs_input_grad(0), ctx->needs_input_grad(1),
                                                 ctx->needs_input_grad(2)};
    return xs[0] * xs[1] * scale;
  }
  static TensorList backward(AutogradContext* ctx, TensorList g) {
    TensorList s = ctx->get_saved_variables();
    const double scale = std::any_cast<double>(ctx->saved_data.at("scale"));
    return {g[0] * s[1] * scale, g[0] * s[0] * scale, Tensor()};
  }
};

// x * scale + (bias if given): an optional tensor argument is one graph input (its slot undefined
// when empty).
struct AffineOpt : autograd::Function<AffineOpt> {
  static Tensor forward(AutogradContext*, const Tensor& x, double scale, const std::optional<Tensor>& bias) {
    return bias ? x * scale + *bias : x * scale;
  }
  static TensorList backward(AutogradContext* ctx, TensorList g) {
    return {g[0] * 2.0, Tensor(), ctx->needs_input_grad(2) ? g[0] : Tensor()};
  }
};

// x *= 2 in place, said with mark_dirty; optionally also marked non-differentiable, or saved.
struct MulInplace : autograd::Function<MulInplace> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, bool non_differentiable = false, bool save = false) {
    Tensor y = x;
    y.mul_(2);
    ctx->mark_dirty({x});
    if (non_differentiable) ctx->mark_non_differentiable({x});
    if (save) ctx->save_for_backward({x});
    return x;
  }
  static TensorList backward(AutogradContext*, TensorList g) { return {g[0] * 2, Tensor(), Tensor()}; }
};
// Changes x in place, marks it dirty, but returns another tensor.
struct DirtyNotReturned : autograd::Function<DirtyNotReturned> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x) {
    Tensor y = x;
    y.mul_(2);
    ctx->mark_dirty({x});
    return x * 1;
  }
  static TensorList backward(AutogradContext*, TensorList g) { return {g[0] * 2}; }
};

// {3 x, sign mask of x}; the mask is marked non-differentiable. backward records whether the second
// gradient arrived defined.
struct WithMask : autograd::Function<WithMask> {
  static TensorList forward(AutogradContext* ctx, const Tensor& x, bool materialize) {
    ctx->set_materialize_grads(materialize);
    Tensor mask = x.gt(0).to(x.dtype());
    ctx->mark_non_differentiable({mask});
    return {x * 3, mask};
  }
  static TensorList backward(AutogradContext* ctx, TensorList g) {
    ctx->saved_data["second_defined"] = g[1].defined();
    return {g[0] * 3, Tensor()};
  }
};

}  // namespace

TEST_CASE("backward with inputs accumulates into those tensors only, as PyTorch", "[autograd]") {
  Tensor x = sines({3}, 0.1), w = sines({3}, 0.7);
  int fired = 0;
  w.register_hook([&](const Tensor&) {
    ++fired;
    return Tensor();
  });
  (x * w).sin().sum().backward({}, false, false, {x});
  // torch: y = (x * w).sin().sum(); y.backward(inputs=[x])
  check_close(x.grad(), f64({0.6428857919, 0.8088840137, 0.7333078426}), {1e-9, 1e-9});
  CHECK_FALSE(w.grad().defined());
  CHECK(fired == 0);  // w's part of the graph did not run

  // A non-leaf input gets its gradient in .grad(); x's stays as it was. Accumulates across calls.
  Tensor h = x.exp();
  Tensor z = (h * h * w).sum();
  autograd::backward({z}, {}, /*retain_graph=*/true, false, {h});
  check_close(h.grad(), f64({1.4237041205, 2.7594014172, 4.1754075059}), {1e-9, 1e-9});
  check_close(x.grad(), f64({0.6428857919, 0.8088840137, 0.7333078426}), {1e-9, 1e-9});
  autograd::backward({z}, {}, false, false, {h, w});
  check_close(h.grad(), f64({2.8474082411, 5.5188028343, 8.3508150118}), {1e-9, 1e-9});
  check_close(w.grad(), f64({1.2209958952, 2.4738424033, 4.4339296274}), {1e-9, 1e-9});
  CHECK(fired == 1);
  check_close(x.grad(), f64({0.6428857919, 0.8088840137, 0.7333078426}), {1e-9, 1e-9});

  // With create_graph the accumulated gradient keeps its history: d(sum x.grad)/dx = 2 (x.grad = 2 x).
  Tensor a = sines({3}, 0.4);
  (a * a).sum().backward({}, false, true, {a});
  REQUIRE(a.grad().requires_grad());
  Tensor gg = autograd::grad({a.grad().sum()}, {a})[0];
  check_close(gg, f64({2, 2, 2}));
  a.set_grad(Tensor());  // a.grad()'s graph holds a: the cycle PyTorch warns of with create_graph
}

TEST_CASE("backward with inputs: unused, repeated and root inputs, as PyTorch", "[autograd]") {
  // An input the outputs do not use keeps an undefined .grad() (its AccumulateGrad exists only for
  // this call); one given twice gets its gradient once; a root input gets the root gradient.
  Tensor x = sines({3}, 0.1), unused = sines({2}, 0.5);
  Tensor y = x * x;
  Tensor loss = y.sum();
  autograd::backward({loss}, {}, /*retain_graph=*/true, false, {unused, x, x});
  CHECK_FALSE(unused.grad().defined());
  check_close(x.grad(), x.detach() * 2);  // torch: 2x, not 4x
  autograd::backward({loss}, {}, false, false, {y});
  check_close(y.grad(), f64({1, 1, 1}));
  check_close(x.grad(), x.detach() * 2);  // y's node did not run
}

TEST_CASE("backward with inputs refuses inputs without grad and checkpointed graphs", "[autograd]") {
  Tensor x = sines({3}, 0.1), c = sines({3}, 0.2, false);
  Tensor h = x * 2;
  Tensor y = (h * c).sum();
  check_error([&] { y.backward({}, true, false, {h, c}); }, {"backward", "inputs[1] does not require grad"});
  CHECK_FALSE(h.retains_grad());  // checked before anything changed
  check_error([&] { y.backward({}, true, false, {c}); }, {"backward", "inputs[0] does not require grad"});
  Tensor out = autograd::checkpoint([](const TensorList& in) { return TensorList{in[0].sin()}; }, {x})[0];
  check_error([&] { out.sum().backward({}, false, false, {x}); },
              {"checkpoint", "backward(inputs=)", "use backward() without inputs"});
}

// torch.autograd.graph.get_gradient_edge, and backward started from it: the same gradients as
// backward from the tensor, with the tensor itself gone (what a pipeline stage keeps of its output).
TEST_CASE("backward from a gradient edge equals backward from its tensor, without the tensor", "[autograd]") {
  Tensor w = from_vector<double>({0.5, -1.5, 2.0}).requires_grad_();
  Tensor g = from_vector<double>({1.0, 2.0, -3.0});
  (w.exp() * 3).backward(g);
  const Tensor expected = w.grad().clone();
  w.set_grad(Tensor());
  autograd::GradientEdge edge;
  std::weak_ptr<TensorImpl> gone;
  {
    Tensor out = w.exp() * 3;  // mul by a number saves nothing of its output
    gone = out.impl_ptr();
    edge = autograd::get_gradient_edge(out);
  }
  CHECK(gone.expired());
  CHECK(edge.shape == Shape{3});
  autograd::backward(edge, g.to(kFloat32));  // cast to the tensor's dtype, as backward(g) does
  check_close(w.grad(), expected, {1e-7, 1e-7});
  // Errors: no graph at the tensor, a gradient of another shape, an integer gradient.
  test::check_error([] { autograd::get_gradient_edge(from_vector<float>({1})); }, {"does not require grad"});
  autograd::GradientEdge again = autograd::get_gradient_edge(w * 2);
  test::check_error([&] { autograd::backward(again, zeros({2}, kFloat64)); },
                    {"the gradient for output 0 has shape [2] but the output has shape [3]"});
  test::check_error([&] { autograd::backward(again, zeros({3}, kInt64)); }, {"it must be floating"});
}

TEST_CASE("register_hook returns a handle that remove_hook removes", "[autograd]") {
  Tensor x = sines({3}, 0.3);
  const uint64_t doubling = x.register_hook([](const Tensor& g) { return g * 2; });
  const uint64_t plus_one = x.register_hook([](const Tensor& g) { return g + 1; });
  CHECK(doubling != plus_one);
  CHECK(doubling != 0);
  (x * 3).sum().backward();
  check_close(x.grad(), f64({7, 7, 7}));  // (3 * 2) + 1
  x.remove_hook(doubling);
  x.remove_hook(doubling);  // twice: nothing
  x.remove_hook(12345678);  // unknown: nothing
  x.set_grad(Tensor());
  (x * 3).sum().backward();
  check_close(x.grad(), f64({4, 4, 4}));

  // On a non-leaf: the hook is on its grad_fn.
  Tensor leaf = sines({3}, 0.5);
  Tensor y = leaf * 5;
  const uint64_t zeroing = y.register_hook([](const Tensor& g) { return g * 0; });
  y.remove_hook(zeroing);
  y.sum().backward();
  check_close(leaf.grad(), f64({5, 5, 5}));

  // A hook that removes itself while it runs fires once.
  Tensor z = sines({2}, 0.9);
  int calls = 0;
  uint64_t self = 0;
  self = z.register_hook([&](const Tensor&) {
    ++calls;
    z.remove_hook(self);
    return Tensor();
  });
  Tensor zz = (z * z).sum();
  zz.backward({}, true);
  zz.backward();
  CHECK(calls == 1);

  // remove_hook leaves retain_grad's hook alone, and an undefined tensor is an Error.
  Tensor r = sines({2}, 0.1) * 2;
  r.retain_grad();
  r.remove_hook(0);
  r.sum().backward();
  check_close(r.grad(), f64({1, 1}));
  check_error([&] { Tensor().remove_hook(1); }, {"undefined"});
}

TEST_CASE("anomaly detection names the node whose gradient holds a NaN", "[autograd]") {
  // sqrt at 0 has an infinite derivative; times the 0 arriving from `* 0` it is NaN.
  Tensor a = f64({0.0, 1.0}).requires_grad_();
  (a.sqrt() * 0).sum().backward();
  // torch: tensor([nan, 0.])
  CHECK(std::isnan(a.grad().to_vector<double>()[0]));
  CHECK(a.grad().to_vector<double>()[1] == 0.0);

  CHECK_FALSE(autograd::AnomalyMode::is_enabled());
  {
    autograd::DetectAnomalyGuard anomaly;
    CHECK(autograd::AnomalyMode::is_enabled());
    a.set_grad(Tensor());
    // torch: "Function 'SqrtBackward0' returned nan values in its 0th output."
    check_error([&] { (a.sqrt() * 0).sum().backward(); },
                {"anomaly", "SqrtBackward returned nan values in its 0th output", "AccumulateGrad"});
    CHECK_FALSE(a.grad().defined());  // the Error came before the leaf was reached
    // A graph without NaNs gives the same gradient as without the check.
    Tensor b = sines({4}, 0.2);
    (b.exp() * b).sum().backward();
    Tensor bd = b.detach();
    check_close(b.grad(), bd.exp() * (bd + 1));
  }
  CHECK_FALSE(autograd::AnomalyMode::is_enabled());
}

TEST_CASE("custom Function: the elements of a TensorList argument are graph inputs", "[autograd]") {
  Tensor x = sines({3}, 0.1), w = sines({3}, 0.6), c = sines({3}, 0.8, false);
  Tensor y = ScaledProduct::apply(TensorList{x, w}, 2.5);
  REQUIRE(y.requires_grad());
  (y * c).sum().backward();
  Tensor xd = x.detach(), wd = w.detach();
  check_close(x.grad(), wd * c * 2.5);
  check_close(w.grad(), xd * c * 2.5);

  // needs_input_grad counts the elements: the one that requires grad needs one, the constant does
  // not, the double has none.
  auto needs = [](const Tensor& p, const Tensor& q) {
    Tensor out = ScaledProduct::apply(TensorList{p, q}, 1.0);
    auto* node = dynamic_cast<autograd::CppNode<ScaledProduct>*>(out.grad_fn().get());
    REQUIRE(node != nullptr);
    return std::any_cast<std::vector<bool>>(node->ctx.saved_data.at("needs"));
  };
  CHECK(needs(x, c) == std::vector<bool>{true, false, false});
  CHECK(needs(c, w) == std::vector<bool>{false, true, false});
}

TEST_CASE("custom Function: an optional tensor argument is a graph input", "[autograd]") {
  Tensor x = sines({3}, 0.1), b = sines({3}, 0.4);
  (AffineOpt::apply(x, 2.0, std::optional<Tensor>(b)) * x.detach()).sum().backward();
  check_close(x.grad(), x.detach() * 2);
  check_close(b.grad(), x.detach());
  Tensor x2 = sines({3}, 0.1);
  AffineOpt::apply(x2, 2.0, std::optional<Tensor>()).sum().backward();
  check_close(x2.grad(), f64({2, 2, 2}));
}

TEST_CASE("custom Function: mark_dirty makes the changed input the output, as PyTorch", "[autograd]") {
  Tensor x = sines({3}, 0.2);
  Tensor a = x * 3;
  const uint64_t v0 = a._version();
  Tensor b = MulInplace::apply(a);
  CHECK(b.is_same(a));  // torch: b is a
  CHECK(a._version() - v0 == 2);  // mul_ and mark_dirty each bump it, as in torch
  REQUIRE(a.grad_fn() != nullptr);
  CHECK(std::string(a.grad_fn()->name()) == "CppFunction");
  (b * b).sum().backward();
  // torch: x.grad = 72 x
  check_close(x.grad(), f64({14.3041918172, 38.8535075088, 58.1441832292}), {1e-9, 1e-9});

  // retain_grad follows the tensor to its new node.
  Tensor x2 = sines({3}, 0.2);
  Tensor a2 = x2 * 3;
  a2.retain_grad();
  Tensor b2 = MulInplace::apply(a2);
  (b2 * 4).sum().backward();
  check_close(a2.grad(), f64({4, 4, 4}));

  Tensor leaf = sines({3}, 0.3);
  check_error([&] { MulInplace::apply(leaf); }, {"CppFunction (mark_dirty)", "leaf tensor that requires grad"});
  check_error([&] { DirtyNotReturned::apply(x * 1); }, {"mark_dirty", "returns as an output"});
  // Without recording it only bumps the version.
  Tensor plain = sines({3}, 0.3, false);
  const uint64_t p0 = plain._version();
  Tensor same = MulInplace::apply(plain);
  CHECK(same.is_same(plain));
  CHECK(plain._version() - p0 == 2);
  CHECK_FALSE(plain.requires_grad());

  // Dirty and non-differentiable: a detached tensor sharing the data (torch: `b is a` is False and b
  // does not require grad).
  Tensor a3 = sines({3}, 0.2) * 3;
  Tensor b3 = MulInplace::apply(a3, /*non_differentiable=*/true, false);
  CHECK_FALSE(b3.is_same(a3));
  CHECK_FALSE(b3.requires_grad());
  CHECK(b3.data_ptr() == a3.data_ptr());

  // A saved-tensor hook that throws leaves the dirty input where it was in the graph.
  Tensor x4 = sines({3}, 0.2);
  Tensor a4 = x4 * 3;
  const autograd::Node* before = a4.grad_fn().get();
  {
    autograd::SavedTensorHooksGuard failing({[](const Tensor&) -> Tensor { KILN_FAIL("pack refused"); },
                                             [](const Tensor& t) { return t; }});
    check_error([&] { MulInplace::apply(a4, false, /*save=*/true); }, {"pack refused"});
  }
  CHECK(a4.grad_fn().get() == before);
  (a4 * 1).sum().backward();  // a4's old history is whole: d(3 x)/dx
  check_close(x4.grad(), f64({3, 3, 3}));
}

TEST_CASE("custom Function: mark_non_differentiable and set_materialize_grads", "[autograd]") {
  for (bool materialize : {true, false}) {
    Tensor x = f64({-1.0, 2.0, 0.5}).requires_grad_();
    TensorList out = WithMask::apply(x, materialize);
    CHECK(out[0].requires_grad());
    CHECK_FALSE(out[1].requires_grad());
    check_equal(out[1], f64({0, 1, 1}));
    out[0].sum().backward();
    check_close(x.grad(), f64({3, 3, 3}));
    auto* node = dynamic_cast<autograd::CppNode<WithMask>*>(out[0].grad_fn().get());
    REQUIRE(node != nullptr);
    CHECK(std::any_cast<bool>(node->ctx.saved_data.at("second_defined")) == materialize);
  }
}

TEST_CASE("isnan isinf and isfinite as torch", "[ops]") {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  for (DType dt : {kFloat64, kFloat32, kFloat16, kBFloat16}) {
    Tensor v = f64({1.0, nan, inf, -inf, 0.0, -2.5}).to(dt);
    // torch.isnan / isinf / isfinite of the same values
    check_equal(v.isnan(), from_vector(std::vector<bool>{false, true, false, false, false, false}));
    check_equal(v.isinf(), from_vector(std::vector<bool>{false, false, true, true, false, false}));
    check_equal(v.isfinite(), from_vector(std::vector<bool>{true, false, false, false, true, true}));
  }
  Tensor i = from_vector(std::vector<int64_t>{1, -3, 0});
  check_equal(isnan(i), from_vector(std::vector<bool>{false, false, false}));
  check_equal(isinf(i), from_vector(std::vector<bool>{false, false, false}));
  check_equal(isfinite(i), from_vector(std::vector<bool>{true, true, true}));
  Tensor g = f64({1.0, inf}).requires_grad_();
  CHECK_FALSE(g.isinf().requires_grad());
  CHECK_FALSE(g.isfinite().requires_grad());
}

TEST_CASE("a reshape that has to copy gives no view, so in-place ops may change it", "[autograd]") {
  Tensor x = sines({2, 3}, 0.3);
  Tensor a = x * 1;
  Tensor y = a.t().reshape({-1});  // a.t() is not contiguous: a copy (torch: y._base is None)
  CHECK(y.is_contiguous());
  y.mul_(2);
  (y * sines({6}, 0.9, false)).sum().backward();
  // torch: x.grad
  check_close(x.grad(), from_vector(std::vector<double>{1.5666538193, 1.9952127626, 1.3801499671, 1.9102017112,
                                                        1.8101811267, 0.7633219841},
                                    {2, 3}),
              {1e-9, 1e-9});
  CHECK(std::string(a.t().reshape({-1}).grad_fn()->name()) == "UnsafeViewBackward");
}

TEST_CASE("linear keeps its input only when the weight needs a gradient, as PyTorch", "[autograd]") {
  // A frozen weight: linear saves no input, so changing the input in place after the forward is fine
  // (torch gives the same gradient and no Error).
  Tensor leaf = sines({2, 3}, 0.1);
  Tensor w = sines({4, 3}, 0.5, false), c = sines({2, 4}, 0.9, false);
  Tensor x = leaf * 2;
  Tensor y = nn::functional::linear(x, w);
  x.add_(1);
  (y * c).sum().backward();
  check_close(leaf.grad(), matmul(c, w) * 2);
  // With a weight that needs a gradient, the input is saved and the same change is an Error.
  Tensor w2 = sines({4, 3}, 0.5);
  Tensor x2 = leaf * 2;
  Tensor y2 = nn::functional::linear(x2, w2);
  x2.add_(1);
  check_error([&] { (y2 * c).sum().backward(); }, {"LinearBackward", "modified by an in-place operation"});
}

TEST_CASE("backward into a leaf whose data set_data gave another shape after the forward is an Error naming it",
          "[autograd]") {
  // It was sum_to's "shape [5] does not broadcast to [3]", naming an op the user never called.
  Tensor x = ones({3}).requires_grad_();
  Tensor y = (x * 2).sum();
  x.set_data(ones({5}));
  test::check_error([&] { y.backward(); }, {"gradient for a leaf of shape [5] has shape [3]", "set_data"});
  // A broadcastable change (the gradient sums to it) still accumulates, as before.
  Tensor z = ones({2, 3}).requires_grad_();
  Tensor w = (z * 2).sum();
  z.set_data(ones({1, 3}));
  w.backward();
  CHECK(z.grad().sizes() == Shape{1, 3});
  CHECK(z.grad().to_vector<float>() == std::vector<float>{4, 4, 4});
}

TEST_CASE("rebind points a handle at another tensor's data and history, and graphs recorded before keep theirs",
          "[autograd][rebind]") {
  Tensor a = tensor({1.0, 2.0}, TensorOptions(kFloat64).requires_grad(true));
  Tensor handle = a * 1.0;  // a non-leaf, as a recomputed weight
  Tensor also = handle;     // a second holder of the same handle
  Tensor y1 = (handle * handle).sum();  // MulBackward saves the handle's tensor: [1, 2]
  Tensor b = tensor({3.0, 5.0}, TensorOptions(kFloat64).requires_grad(true));
  Tensor value = b * 2.0;
  rebind(handle, value);
  check_equal(also, value.detach());  // every holder sees [6, 10]
  CHECK(also.grad_fn() == value.grad_fn());
  CHECK(also.impl() != value.impl());
  y1.backward();  // still 2 * [1, 2] into a, not the rebound data
  check_close(a.grad(), tensor({2.0, 4.0}, kFloat64));
  (also * 1.0).sum().backward();  // the new history: d/db of 2b
  check_close(b.grad(), tensor({2.0, 2.0}, kFloat64));
  // A leaf rebound: its gradient and hooks go, it is a leaf of the new value.
  Tensor leaf = tensor({1.0}, TensorOptions(kFloat64).requires_grad(true));
  (leaf * 3.0).sum().backward();
  REQUIRE(leaf.grad().defined());
  rebind(leaf, tensor({7.0}, kFloat64));
  CHECK_FALSE(leaf.grad().defined());
  CHECK_FALSE(leaf.requires_grad());
  CHECK(leaf.item<double>() == 7.0);
  check_error([&] { rebind(leaf, Tensor()); }, {"rebind", "must be defined"});
}
