// tests/autograd/test_backward_hooks.cpp: post-accumulate-grad hooks and queue_callback, the two
// engine features DistributedDataParallel starts and finishes its all-reduces from.
#include "support.h"

using namespace kiln;
using kiln::test::check_close;
using kiln::test::check_error;

TEST_CASE("post-accumulate-grad hooks see the accumulated gradient, once per backward", "[autograd]") {
  Tensor w = tensor({1.0, 2.0, 3.0}).requires_grad_();
  std::vector<Tensor> seen;
  uint64_t h = w.register_post_accumulate_grad_hook([&](const Tensor& leaf) { seen.push_back(leaf.grad().clone()); });
  // w is used twice: its gradients are summed before the one accumulation.
  ((w * w).sum() + (w * 3).sum()).backward();
  REQUIRE(seen.size() == 1);
  check_close(seen[0], tensor({5.0, 7.0, 9.0}));  // 2w + 3
  (w * 2).sum().backward();  // accumulates onto the existing gradient
  REQUIRE(seen.size() == 2);
  check_close(seen[1], tensor({7.0, 9.0, 11.0}));
  w.remove_post_accumulate_grad_hook(h);
  (w * 2).sum().backward();
  CHECK(seen.size() == 2);
  Tensor nonleaf = w * 2;
  check_error([&] { nonleaf.register_post_accumulate_grad_hook([](const Tensor&) {}); },
              {"register_post_accumulate_grad_hook", "result of an op"});
  check_error([&] { tensor({1.0}).register_post_accumulate_grad_hook([](const Tensor&) {}); },
              {"without requires_grad"});
}

TEST_CASE("queue_callback runs once every node of the backward has run, in queue order", "[autograd]") {
  Tensor a = tensor({1.0, 2.0}).requires_grad_();
  Tensor b = tensor({3.0, 4.0}).requires_grad_();
  std::vector<std::string> events;
  a.register_post_accumulate_grad_hook([&](const Tensor&) {
    events.push_back("a");
    autograd::queue_callback([&] {
      // Both leaves have their gradients by now.
      events.push_back(b.grad().defined() && a.grad().defined() ? "callback: both ready" : "callback: early");
      autograd::queue_callback([&] { events.push_back("queued by a callback"); });
    });
  });
  b.register_post_accumulate_grad_hook([&](const Tensor&) { events.push_back("b"); });
  (a * b).sum().backward();
  REQUIRE(events.size() == 4);
  CHECK(events[2] == "callback: both ready");
  CHECK(events[3] == "queued by a callback");
  check_error([] { autograd::queue_callback([] {}); }, {"queue_callback", "no backward is running"});
}

TEST_CASE("a gradient hook may change values, not the gradient's dtype, shape or device", "[autograd]") {
  Tensor leaf = tensor({1.0, 2.0}).requires_grad_();
  leaf.register_hook([](const Tensor&) { return ones({2}, kInt64); });
  check_error([&] { (leaf * 3).sum().backward(); }, {"register_hook", "dtype", "was float32, got int64"});
  CHECK_FALSE(leaf.grad().defined());  // nothing was accumulated

  Tensor x = tensor({1.0, 2.0}).requires_grad_();
  Tensor mid = x * 2;  // a hook on a non-leaf runs before its node
  mid.register_hook([](const Tensor& g) { return g.sum(); });
  check_error([&] { mid.sum().backward(); }, {"register_hook", "shape", "was [2], got []"});

  Tensor z = tensor({1.0, 2.0}).requires_grad_();
  z.register_hook([](const Tensor& g) { return g * 10; });  // values: allowed
  (z * 3).sum().backward();
  check_close(z.grad(), tensor({30.0, 30.0}));
}

TEST_CASE("empty hooks and callbacks, an unpack hook that returns nothing, a tensor as its own grad: Errors") {
  // Each threw std::bad_function_call, or crashed in backward (the unpack hook).
  Tensor x = ones({2}).requires_grad_();
  kiln::test::check_error([&] { x.register_hook(nullptr); }, {"register_hook", "empty"});
  kiln::test::check_error([&] { x.register_post_accumulate_grad_hook(nullptr); }, {"register_post_accumulate_grad_hook", "empty"});
  kiln::test::check_error([] { autograd::SavedTensorHooksGuard g({nullptr, [](const Tensor& t) { return t; }}); },
                          {"SavedTensorHooksGuard", "empty"});
  Tensor y;
  {
    autograd::SavedTensorHooksGuard g({[](const Tensor& t) { return t; }, [](const Tensor&) { return Tensor(); }});
    y = (x * 1).sin().sum();
  }
  kiln::test::check_error([&] { y.backward(); }, {"unpack hook returned an undefined tensor"});
  // "can't assign Variable as its own grad" in PyTorch
  kiln::test::check_error([&] { x.set_grad(x); }, {"set_grad", "its own gradient"});
  nn::Linear lin(2, 2);
  kiln::test::check_error([&] { lin.register_forward_hook(nullptr); }, {"register_forward_hook", "empty"});
  kiln::test::check_error([&] { lin.apply(nullptr); }, {"apply", "empty"});
}
