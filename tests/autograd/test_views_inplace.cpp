// tests/autograd/test_views_inplace.cpp: autograd's edge cases against PyTorch 1.13 (values from torch
// for the same inputs): views taken before a tensor took part in autograd, in-place ops on what a custom
// Function or checkpoint passed through, in-place ops on views (CopySlices, remade views,
// as_strided), retain_grad across an in-place op, grad() with respect to a
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

struct TwiceInPlace : autograd::Function<TwiceInPlace> {  // torch's mark_dirty example
  static Tensor forward(AutogradContext* ctx, const Tensor& x) {
    Tensor t = x;
    t.mul_(2);
    ctx->mark_dirty({x});
    return x;
  }
  static TensorList backward(AutogradContext*, TensorList g) { return {g[0] * 2}; }
};

}  // namespace

TEST_CASE("a view taken before its base changed in place follows the change, as torch's", "[autograd]") {
  Tensor w = sines({2, 3}, 0.1);
  Tensor buf = zeros({2, 3}, kFloat64);
  Tensor col = buf.t()[1];  // no history yet: buf does not require grad
  CHECK_FALSE(col.requires_grad());
  buf.add_(w);
  // col's grad_fn is made anew from buf's, as PyTorch's AsStridedBackward.
  REQUIRE(col.requires_grad());
  CHECK(std::string(col.grad_fn()->name()) == "AsStridedBackward");
  CHECK(col._base().impl() == buf.impl());
  (col * col).sum().backward();
  test::check_close(w.grad(), from_vector<double>({0, 2 * std::sin(0.47), 0, 0, 2 * std::sin(1.58), 0}, {2, 3}),
                    {1e-15, 0});
  // A view made under no_grad has no link to its base: autograd refuses what it cannot follow.
  Tensor buf2 = zeros({2, 3}, kFloat64);
  {
    Tensor under_no_grad;
    {
      NoGradGuard no_grad;
      under_no_grad = buf2.narrow(0, 0, 1);
    }
    CHECK_FALSE(under_no_grad._is_view());
    test::check_error([&] { buf2.mul_(w); }, {"mul_", "live views", "under no_grad"});
    test::check_equal(buf2, zeros({2, 3}, kFloat64));  // refused before writing
    test::check_error([&] { under_no_grad.add_(w[0]); }, {"add_", "made under no_grad", "clone()"});
  }
  buf2.mul_(w);  // once the view is gone
  CHECK(buf2.requires_grad());
  // Without autograd (no grad mode, or nothing requiring grad) views do not matter.
  Tensor plain = zeros({3});
  Tensor view = plain.narrow(0, 1, 2);
  plain.add_(ones({3}));
  CHECK(view.to_vector<float>() == std::vector<float>{1, 1});
  CHECK_FALSE(view.requires_grad());
}

// The expected values below are torch 1.13's for the same inputs and the same ops (float64).
TEST_CASE("an in-place op on a view rewrites its base's history (CopySlices), as torch's", "[autograd]") {
  SECTION("mul_ of a slice of a non-leaf") {
    Tensor x = sines({3, 4}, 0.1), w = sines({3, 2}, 0.5);
    Tensor h = x * 2;
    h.narrow(1, 1, 2).mul_(w);
    CHECK(std::string(h.grad_fn()->name()) == "CopySlices");
    (h * h).sum().backward();
    test::check_close(x.grad(),
                      from_vector<double>({0.79866733317462524, 0.83276312437080524, 3.4801564840271615,
                                           7.4849280124270869, 7.9996611719899207, 6.6476905188962565,
                                           5.8488530676388866, 3.4911926572810104, 0.65201721408215296,
                                           -1.9151916889289737, -2.4777519697628905, -6.8518237933200092},
                                          {3, 4}),
                      {1e-13, 1e-15});
    test::check_close(w.grad(),
                      from_vector<double>({0.78666438816543827, 3.3905226620594715, 6.5294366297822659,
                                           4.2860073481539764, 0.59375106254483401, 2.1308346806685905},
                                          {3, 2}),
                      {1e-13, 1e-15});
  }
  SECTION("copy_ into rows of a buffer that did not require grad") {
    Tensor a = sines({3}, 0.2), b = sines({3}, 0.7);
    Tensor buf = zeros({2, 3}, kFloat64);
    buf[0].copy_(a);
    buf.select(0, 1).copy_(b * b);
    CHECK(std::string(buf.grad_fn()->name()) == "CopySlices");
    CHECK((buf.requires_grad() && !buf.is_leaf()));
    buf.exp().sum().backward();
    test::check_close(a.grad(), from_vector<double>({1.2197785560006189, 1.7153755714366377, 2.2424255176182242}, {3}),
                      {1e-13, 1e-15});
    test::check_close(b.grad(), from_vector<double>({1.9512008875159157, 3.7871290206298101, 5.2992139379830387}, {3}),
                      {1e-13, 1e-15});
  }
  SECTION("a strided view of a transposed view, with another view taken before the change") {
    Tensor x = sines({4, 5}, 0.2), w = sines({2, 4}, 0.9);
    Tensor y = x * 3 - 1;
    Tensor v1 = y.t();
    Tensor v2 = v1.slice(0, 1, 4, 2);  // columns 1 and 3 of y
    Tensor v3 = y[2];
    CHECK(v2._base().impl() == y.impl());  // the root of the chain of views
    v2.mul_(w);
    CHECK(std::string(v3.grad_fn()->name()) == "AsStridedBackward");
    Tensor loss = y.sin().sum() + (v3 * v3).sum() * 0.5 + v1.cos().sum() + (v2 * 3).sum();
    loss.backward();
    test::check_close(
        x.grad(),
        from_vector<double>({3.937773630663834, 8.033971829281823, -2.524406975742183, 4.7438942777974598,
                             -3.9492609061624915, -3.2609997568561893, 7.9812845357426401, 2.8988258013791475,
                             4.9370852434546446, 0.92607635236746677, -11.946062530907433, -6.2279952833607757,
                             -16.210068780714728, 0.25885965790617682, -13.637130683379853, -0.71210390964446535,
                             11.397577168410765, 3.9053663848385654, -4.2934285111502639, -2.5651474307495881},
                            {4, 5}),
        {1e-13, 1e-14});
    test::check_close(w.grad(),
                      from_vector<double>({2.1158446717142967, 2.734641407259736, 7.7229198052975709,
                                           -6.2434257673175306, 4.3505144255135981, -4.5500290143853999,
                                           -15.458619406778586, 2.6663856574498923},
                                          {2, 4}),
                      {1e-13, 1e-14});
  }
  SECTION("split's pieces (torch refuses in-place on them; Kiln follows the change like any view)") {
    Tensor x = sines({5}, 0.4);
    Tensor h = x * 1;
    auto pieces = ops::split_with_sizes(h, {2, 2, 1});
    pieces[0].mul_(3);
    (h * h).sum().backward();  // torch, with h.narrow(0, 0, 2).mul_(3)
    test::check_close(x.grad(),
                      from_vector<double>({7.0095301615557091, 12.530434295292419, 1.8172669922317666,
                                           1.9963049449950963, 1.9051523885431907},
                                          {5}),
                      {1e-13, 1e-15});
  }
  SECTION("a base that retains its gradient keeps it through CopySlices") {
    Tensor x = sines({2, 2}, 0.5), w = sines({2}, 0.1);
    Tensor h = x.sin();
    h.retain_grad();
    h[1].add_(w);
    (h * h).sum().backward();
    test::check_close(h.grad(),
                      from_vector<double>({0.92253911006636136, 1.3841054993513406, 1.8215786467885531,
                                           2.587883744275504},
                                          {2, 2}),
                      {1e-13, 1e-15});
    test::check_close(x.grad(),
                      from_vector<double>({0.81853209758649781, 0.99911230676448681, 1.0658189089641978,
                                           1.3999123566660689},
                                          {2, 2}),
                      {1e-13, 1e-15});
    test::check_close(w.grad(), from_vector<double>({1.8215786467885531, 2.587883744275504}, {2}), {1e-13, 1e-15});
  }
  SECTION("a custom Function that marks a view dirty") {
    Tensor x = sines({3, 2}, 0.2);
    Tensor h = x * 1.5;
    Tensor col = h.select(1, 1);
    Tensor out = TwiceInPlace::apply(col);
    CHECK(out.impl() == col.impl());
    CHECK(std::string(h.grad_fn()->name()) == "CopySlices");
    (h * h).sum().backward();
    test::check_close(x.grad(),
                      from_vector<double>({0.89401198857777553, 9.7133768772114468, 3.6340114518230138,
                                           17.391329129029209, 4.4731944098913416, 15.972522635400754},
                                          {3, 2}),
                      {1e-13, 1e-15});
  }
}

TEST_CASE("the example of docs/tensors-and-autograd.md 3.7", "[autograd]") {
  Tensor x = tensor({1.0, 2.0, 3.0}, TensorOptions(kFloat64).requires_grad(true));
  Tensor w = tensor({10.0}, TensorOptions(kFloat64).requires_grad(true));
  Tensor h = x * 2;
  Tensor tail = h.narrow(0, 1, 2);
  h.narrow(0, 0, 1).mul_(w);
  CHECK(std::string(h.grad_fn()->name()) == "CopySlices");
  (h * tail.sum()).sum().backward();
  test::check_equal(x.grad(), tensor({200.0, 80.0, 80.0}, kFloat64));
  test::check_equal(w.grad(), tensor({20.0}, kFloat64));
}

TEST_CASE("second derivatives go through CopySlices and a remade view, as torch's", "[autograd]") {
  Tensor x = sines({2, 3}, 0.3), w = sines({2}, 0.8);
  Tensor y = x * x;
  Tensor c = y.select(1, 1);
  y.select(1, 0).mul_(w);
  Tensor loss = (y.exp() * c.unsqueeze(1)).sum();
  auto g = autograd::grad({loss}, {x, w}, {}, /*retain_graph=*/true, /*create_graph=*/true);
  test::check_close(g[0],
                    from_vector<double>({0.17406977594602022, 6.465763279347386, 1.3992879914053509,
                                         4.2659151051511337, 18.706886136414415, 3.2265241149966184},
                                        {2, 3}),
                    {1e-13, 1e-15});
  test::check_close(g[1], from_vector<double>({0.035854673023377262, 2.2866589723452613}, {2}), {1e-13, 1e-15});
  auto gg = autograd::grad({(g[0] * g[0]).sum() + g[1].sum()}, {x, w});
  test::check_close(gg[0],
                    from_vector<double>({7.7383365510712512, 217.54320619909555, 69.573245351263324,
                                         438.14305235760514, 1939.5536765456545, 306.54291814575424},
                                        {2, 3}),
                    {1e-12, 1e-14});
  test::check_close(gg[1], from_vector<double>({1.5861899504352059, 252.13874300290829}, {2}), {1e-12, 1e-14});
}

TEST_CASE("as_strided is differentiable: overlapping windows sum their gradients, as torch's", "[autograd]") {
  Tensor x = sines({6}, 0.3);
  Tensor y = ops::as_strided(x, {3, 3}, {1, 1}, 1);  // rows x[1:4], x[2:5], x[3:6]
  CHECK(std::string(y.grad_fn()->name()) == "AsStridedBackward");
  Tensor m = sines({3, 3}, 1.1, false);
  (y * y * m).sum().backward();
  test::check_close(x.grad(),
                    from_vector<double>({0, 1.106854564283994, 3.1003352904598076, 2.6040795928653897,
                                         -0.64738253249612276, -1.3300593961944469},
                                        {6}),
                    {1e-13, 1e-15});
  // Of a non-contiguous input: the window is read from the storage, whatever the input's layout.
  Tensor x2 = sines({4, 3}, 0.6);
  Tensor z = ops::as_strided((x2 * 1).t(), {2, 2}, {3, 1}, 4);  // storage elements 4, 5, 7, 8
  z.pow(3).sum().backward();
  test::check_close(x2.grad(),
                    from_vector<double>({0, 0, 0, 0, 2.2870835997110195, 1.2202314458661365, 0,
                                         0.0070243243548546701, 0.4952529707852027, 0, 0, 0},
                                        {4, 3}),
                    {1e-13, 1e-15});
  test::check_error([&] { ops::as_strided(sines({3}, 0.1).expand({2, 3}), {3}, {1}, 0); },
                    {"as_strided", "expanded", "contiguous()"});
}

TEST_CASE("in-place ops on views: what autograd refuses, as torch does", "[autograd]") {
  Tensor x = sines({4}, 0.1);
  // A view of a leaf that requires grad: the change would reach the leaf.
  test::check_error([&] { x.narrow(0, 0, 2).mul_(2); }, {"mul_", "view of a leaf", "NoGradGuard"});
  CHECK(x.is_leaf());
  {
    NoGradGuard no_grad;  // as optimizers do
    x.narrow(0, 0, 2).mul_(2);
  }
  CHECK(x.to_vector<double>()[0] == 2 * std::sin(0.1));
  // An expanded view: several elements share a location.
  Tensor h = x * 1;
  test::check_error([&] { h[0].expand({3}).add_(x.narrow(0, 0, 3)); }, {"add_", "expanded"});
  // detach_ turns a view without history into one made without autograd.
  Tensor buf = zeros({3}, kFloat64);
  Tensor v = buf.narrow(0, 0, 2);
  v.detach_();
  CHECK_FALSE(v._is_view());
  test::check_error([&] { buf.add_(x.narrow(0, 0, 3)); }, {"add_", "live views"});
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
