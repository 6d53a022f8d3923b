// tests/autograd/test_engine.cpp: the autograd engine: gradients of small graphs against hand-derived
// values, accumulation, retain_graph and the freed-graph Error, create_graph (second derivatives),
// grad(), no_grad, detach, hooks, retain_grad, in-place ops, split's one node, saved-tensor hooks, and
// to_dot.
#include <optional>
#include <thread>

#include "support.h"

using namespace kiln;
using autograd::TensorList;

static TensorOptions grad_f64() { return TensorOptions(kFloat64).requires_grad(true); }

TEST_CASE("gradients of a small graph match the hand-derived ones") {
  // f = sum((a * b + sin(a)) / c), so df/da = (b + cos a) / c, df/db = a / c, df/dc = -(ab + sin a) / c^2
  Tensor a = tensor({0.5, -1.0, 2.0}, grad_f64()), b = tensor({1.5, 2.0, -0.5}, grad_f64());
  Tensor c = tensor({3.0}, grad_f64());  // broadcast: its gradient sums over the three elements
  Tensor f = ((a * b + a.sin()) / c).sum();
  f.backward();
  test::check_close(a.grad(), (b.detach() + a.detach().cos()) / 3.0);
  test::check_close(b.grad(), a.detach() / 3.0);
  Tensor num = a.detach() * b.detach() + a.detach().sin();
  test::check_close(c.grad(), (-(num / 9.0)).sum().reshape({1}));
  CHECK(c.grad().sizes() == Shape{1});
}

TEST_CASE("a leaf used twice gets the sum of both paths, gradients accumulate across backward calls") {
  Tensor x = tensor({2.0}, grad_f64());
  Tensor y = x * x + x * 3;  // dy/dx = 2x + 3 = 7
  y.backward();
  CHECK(x.grad().item<double>() == 7);
  (x * 5).backward();
  CHECK(x.grad().item<double>() == 12);
}

TEST_CASE("a second backward through a freed graph is an Error that suggests retain_graph") {
  Tensor x = tensor({1.0, 2.0}, grad_f64());
  Tensor y = (x.exp() * x).sum();
  y.backward({}, /*retain_graph=*/true);
  Tensor first = x.grad().clone();
  y.backward();  // allowed: the graph was retained
  test::check_close(x.grad(), first * 2);
  test::check_error([&] { y.backward(); }, {"second time", "retain_graph"});
}

TEST_CASE("backward of a non-scalar needs a gradient, outputs that need no grad are an Error") {
  Tensor x = tensor({1.0, 2.0}, grad_f64());
  Tensor y = x * 2;
  test::check_error([&] { y.backward(); }, {"backward", "single-element", "[2]"});
  y.backward(tensor({1.0, -1.0}, kFloat64));
  test::check_close(x.grad(), tensor({2.0, -2.0}, kFloat64));
  test::check_error([] { tensor({1.0}).backward(); }, {"does not require grad"});
}

TEST_CASE("create_graph gives second derivatives, grad() returns them without touching .grad()") {
  Tensor x = tensor({1.5, -2.0}, grad_f64());
  Tensor y = (x * x * x).sum();  // dy/dx = 3x^2, d2y/dx2 = 6x
  TensorList g = autograd::grad({y}, {x}, {}, {}, /*create_graph=*/true);
  test::check_close(g[0], x.detach() * x.detach() * 3);
  CHECK(!x.grad().defined());
  g[0].sum().backward();
  test::check_close(x.grad(), x.detach() * 6);
}

TEST_CASE("grad() reports unused inputs unless allowed") {
  Tensor x = tensor({1.0}, grad_f64()), z = tensor({1.0}, grad_f64());
  Tensor y = x * 2;
  test::check_error([&] { autograd::grad({y}, {x, z}, {}, true); }, {"input 1", "allow_unused"});
  TensorList g = autograd::grad({y}, {x, z}, {}, true, false, true);
  CHECK(g[0].item<double>() == 2);
  CHECK(!g[1].defined());
}

TEST_CASE("grad() of an intermediate tensor") {
  Tensor x = tensor({3.0}, grad_f64());
  Tensor h = x * x;      // 9
  Tensor y = h.log();    // dy/dh = 1/h
  TensorList g = autograd::grad({y}, {h});
  CHECK(g[0].item<double>() == Approx(1.0 / 9));
}

TEST_CASE("no_grad and detach stop recording") {
  Tensor x = tensor({1.0}, grad_f64());
  {
    NoGradGuard guard;
    Tensor y = x * 2;
    CHECK(!y.requires_grad());
  }
  CHECK((x * 2).requires_grad());
  Tensor d = x.detach();
  CHECK(!d.requires_grad());
  Tensor y = x * d;  // d is a constant: dy/dx = d = 1
  y.backward();
  CHECK(x.grad().item<double>() == 1);
  test::check_error([] { zeros({2}, kInt64).requires_grad_(); }, {"floating-point", "int64"});
}

TEST_CASE("tensor hooks see and may replace gradients, retain_grad keeps a non-leaf's gradient") {
  Tensor x = tensor({1.0, 2.0}, grad_f64());
  Tensor h = x * 3;
  h.retain_grad();
  Tensor seen;
  h.register_hook([&](const Tensor& g) {
    seen = g.clone();
    return g * 10;  // the gradient flowing on to x is scaled
  });
  x.register_hook([](const Tensor& g) { return g + 1; });
  (h * h).sum().backward();  // d/dh = 2h = (6, 12)
  test::check_close(seen, tensor({6.0, 12.0}, kFloat64));
  test::check_close(h.grad(), tensor({6.0, 12.0}, kFloat64));
  test::check_close(x.grad(), tensor({181.0, 361.0}, kFloat64));  // 6*10*3 + 1, 12*10*3 + 1
  test::check_error([] { tensor({1.0}).register_hook([](const Tensor& g) { return g; }); }, {"does not require grad"});
}

TEST_CASE("in-place ops on non-leaf tensors are differentiated through") {
  Tensor x = tensor({1.0, -2.0}, grad_f64());
  Tensor y = x * 2;
  y.add_(1);
  y.mul_(x);  // y = (2x + 1) x: dy/dx = 4x + 1
  y.sum().backward();
  test::check_close(x.grad(), tensor({5.0, -7.0}, kFloat64));
}

TEST_CASE("in-place misuse is an Error: on a leaf that requires grad, and on a tensor saved for backward") {
  Tensor x = tensor({1.0, 2.0}, grad_f64());
  test::check_error([&] { x.add_(1); }, {"add_", "leaf", "NoGradGuard"});
  Tensor h = x * 1;
  Tensor y = h.exp();  // saves exp(h) ...
  Tensor z = (h * h).sum();  // ... and mul saves h
  h.add_(1);
  test::check_error([&] { z.backward(); }, {"modified by an in-place operation", "version"});
  {
    NoGradGuard guard;
    x.add_(1);  // the way optimizers update parameters
  }
  CHECK(x.to_vector<double>() == std::vector<double>{2.0, 3.0});
}

TEST_CASE("saved-tensor hooks pack and unpack every saved tensor, gradients are unchanged") {
  Tensor x = tensor({0.3, -0.7, 1.1}, grad_f64());
  Tensor plain = (x.tanh() * x.sigmoid()).sum();
  TensorList expected = autograd::grad({plain}, {x});
  int packed = 0, unpacked = 0;
  Tensor y;
  {
    autograd::SavedTensorHooksGuard hooks({[&](const Tensor& t) {
                                             ++packed;
                                             return t.detach().clone();  // e.g. move to host memory
                                           },
                                           [&](const Tensor& t) {
                                             ++unpacked;
                                             return t;
                                           }});
    y = (x.tanh() * x.sigmoid()).sum();
  }
  CHECK(packed >= 3);  // tanh's output, sigmoid's output, and both sides of the product
  TensorList got = autograd::grad({y}, {x});
  CHECK(unpacked == packed);
  test::check_close(got[0], expected[0]);
}

TEST_CASE("to_dot draws the graph") {
  Tensor w = tensor({1.0, 2.0}, grad_f64());
  std::string dot = autograd::to_dot((w.exp() * 2).sum());
  CHECK(dot.find("digraph") != std::string::npos);
  CHECK(dot.find("SumBackward") != std::string::npos);
  CHECK(dot.find("MulBackward") != std::string::npos);
  CHECK(dot.find("ExpBackward") != std::string::npos);
  CHECK(dot.find("AccumulateGrad\\n[2]") != std::string::npos);
}

TEST_CASE("deep chains do not lose gradient and graphs free their memory") {
  MemoryStats before = memory::stats(Device::cpu());
  {
    Tensor x = ones({100}, grad_f64());
    Tensor y = x;
    for (int i = 0; i < 200; ++i) y = y * 1.01;
    y.sum().backward();
    CHECK(x.grad().to_vector<double>()[0] == Approx(std::pow(1.01, 200)));
  }
  CHECK(memory::stats(Device::cpu()).allocated_bytes == before.allocated_bytes);
}

TEST_CASE("a graph of 300000 nodes in a chain is freed without deep recursion") {
  MemoryStats before = memory::stats(Device::cpu());
  Tensor x = tensor({1.0}).requires_grad_();
  {
    Tensor y = x;
    for (int i = 0; i < 300000; ++i) y = y + 1.0;  // freeing it recursively overflowed an 8 MiB stack
    CHECK(y.item<double>() == 300001.0);
  }
  {
    Tensor y = x;
    for (int i = 0; i < 300000; ++i) y = y * 1.0;
    y.backward();  // the engine walks it, then frees it
  }
  CHECK(x.grad().item<double>() == 1.0);
  CHECK(memory::stats(Device::cpu()).allocated_bytes == before.allocated_bytes + 8);  // x.grad()
}

TEST_CASE("saved-tensor hooks can shrink what a graph holds (the basis of offloading)") {
  Tensor x = full({1 << 20}, 0.5, TensorOptions().requires_grad(true));  // 4 MiB
  auto held_by_graph = [&](bool packed) {
    int64_t before = memory::stats(Device::cpu()).allocated_bytes;
    std::optional<autograd::SavedTensorHooksGuard> hooks;
    if (packed) {  // keep exp's output as float16, restore it to float32 for the backward
      hooks.emplace(autograd::SavedTensorHooks{[](const Tensor& t) { return t.to(kFloat16); },
                                               [](const Tensor& t) { return t.to(kFloat32); }});
    }
    Tensor y = x.exp().sum();
    hooks.reset();
    int64_t held = memory::stats(Device::cpu()).allocated_bytes - before;
    y.backward();
    return held;
  };
  int64_t plain = held_by_graph(false);
  Tensor g_plain = x.grad().clone();
  x.grad().zero_();
  int64_t packed = held_by_graph(true);
  CHECK(plain >= (4 << 20));
  CHECK(packed < (2 << 20) + 4096);  // the float32 buffer was freed; only the float16 copy stays
  test::check_close(x.grad(), g_plain, {1e-3, 1e-5});
}

TEST_CASE("a create_graph backward stores a copy of each gradient, so later accumulation stays separate") {
  Tensor x = ones({3}, grad_f64()), y = ones({3}, grad_f64());
  (x + y).sum().backward({}, false, /*create_graph=*/true);  // both leaves receive the same tensor
  (x * 1).sum().backward();
  test::check_close(x.grad(), full({3}, 2.0, kFloat64));
  test::check_close(y.grad(), full({3}, 1.0, kFloat64));
}

TEST_CASE("in-place ops on a tensor and on its view both reach the gradient") {
  Tensor a = tensor({1.0, 2.0}, grad_f64());
  Tensor x = a * 1;
  Tensor v = x.view({2});
  x.mul_(3);  // v is remade from x's new history on its next use
  v.mul_(3);  // and x takes v's change into its own (CopySlices)
  test::check_equal(x, tensor({9.0, 18.0}, kFloat64));
  (x * x).sum().backward();  // d/da sum((9a)^2) = 162 a
  test::check_close(a.grad(), tensor({162.0, 324.0}, kFloat64));
}

TEST_CASE("split's pieces share one backward node: their gradients are joined, zeros where none came") {
  Tensor a = tensor({1.0, 2.0, 3.0, 4.0, 5.0}, grad_f64());
  Tensor x = a * 1;
  auto pieces = x.split(2, 0);  // [1, 2] | [3, 4] | [5]
  REQUIRE(pieces.size() == 3);
  CHECK(pieces[0].grad_fn() == pieces[2].grad_fn());
  CHECK(std::string(pieces[0].grad_fn()->name()) == "SplitBackward");
  // The middle piece takes no part in the loss: its part of the gradient is zero.
  ((pieces[0] * 10).sum() + (pieces[2] * pieces[2]).sum()).backward({}, /*retain_graph=*/true);
  test::check_equal(a.grad(), tensor({10.0, 10.0, 0.0, 0.0, 10.0}, kFloat64));
  // After an in-place change of their base the pieces follow it, as any view does.
  x.mul_(3);
  CHECK(std::string(pieces[1].grad_fn()->name()) == "AsStridedBackward");
  a.set_grad({});
  (pieces[1] * pieces[1]).sum().backward();  // d/da of (3 a2)^2 + (3 a3)^2
  test::check_equal(a.grad(), tensor({0.0, 0.0, 54.0, 72.0, 0.0}, kFloat64));
  // Second derivatives go through the cat of the backward.
  Tensor b = tensor({1.0, 2.0, 3.0}, grad_f64());
  auto parts = (b * b).chunk(3, 0);
  Tensor y = (parts[1] * parts[2]).sum();  // b1^2 b2^2
  Tensor g = autograd::grad({y}, {b}, {}, true, true)[0];
  test::check_close(g, tensor({0.0, 2 * 2.0 * 9.0, 2 * 3.0 * 4.0}, kFloat64));
  Tensor gg = autograd::grad({g.sum()}, {b})[0];  // d/db of (2 b1 b2^2 + 2 b1^2 b2)
  test::check_close(gg, tensor({0.0, 2 * 9.0 + 4 * 2.0 * 3.0, 4 * 2.0 * 3.0 + 2 * 4.0}, kFloat64));
}

TEST_CASE("fill_ and zero_ keep a non-leaf in the graph with a zero gradient to its old value") {
  Tensor x = tensor({1.0, 2.0}, grad_f64());
  Tensor h = x * 2;
  h.fill_(3);
  CHECK(h.requires_grad());
  (h * x).sum().backward();  // d/dx sum(3 x) = 3; the old value (2x) contributes nothing
  test::check_close(x.grad(), full({2}, 3.0, kFloat64));
}

namespace {
struct Identity : autograd::Function<Identity> {
  static Tensor forward(autograd::AutogradContext*, const Tensor& x) { return x; }
  static TensorList backward(autograd::AutogradContext*, TensorList g) { return {g[0] * 2}; }
};
}  // namespace

TEST_CASE("a Function that returns its input unchanged does not turn the input into a non-leaf") {
  Tensor x = tensor({1.0, 2.0}, grad_f64());
  Tensor y = Identity::apply(x);
  CHECK(x.is_leaf());
  CHECK(!y.is_leaf());
  y.sum().backward();
  test::check_close(x.grad(), full({2}, 2.0, kFloat64));
}

TEST_CASE("the pool runs every piece exactly once, also oversubscribed with changing piece counts") {
  set_num_threads(3);  // more threads than this machine's 2 cores
  Tensor small = ones({70000}), large = ones({200000});  // 2 and 3 pieces of the elementwise grain
  bool all_right = true;
  for (int i = 0; i < 300 && all_right; ++i) {
    Tensor s = small.mul(2), l = large.add(1);
    all_right = s.sum().item<double>() == 140000 && l.sum().item<double>() == 400000;
  }
  set_num_threads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  CHECK(all_right);
}

TEST_CASE("with saved-tensor hooks, double backward still reaches a leaf input") {
  Tensor x = tensor({1.5, -0.5}, grad_f64());
  Tensor y;
  {
    autograd::SavedTensorHooksGuard hooks({[](const Tensor& t) { return t.detach().clone(); },
                                           [](const Tensor& t) { return t; }});
    y = (x * x * x).sum();
  }
  TensorList g = autograd::grad({y}, {x}, {}, {}, /*create_graph=*/true);  // 3 x^2
  g[0].sum().backward();                                                     // d/dx = 6 x
  test::check_close(x.grad(), x.detach() * 6);
}
