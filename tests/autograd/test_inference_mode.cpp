// tests/autograd/test_inference_mode.cpp: InferenceMode and inference tensors, against what torch 1.13
// does for the same code (torch.inference_mode, Tensor.is_inference; Note [inference mode] in
// core/grad_mode.h): which tensors are inference tensors, what is refused outside the mode and left
// untouched when it is, and that results inside the mode equal those under no_grad.
#include "support.h"

using namespace kiln;
using test::check_equal;
using test::check_error;
using test::sines;

namespace {
const std::vector<std::string> kWriteRefused{"inference tensor", "only inside an InferenceMode scope", "clone()"};
}

TEST_CASE("InferenceMode turns grad mode off, nests, and records nothing even under AutoGradMode(true)") {
  Tensor w = sines({3}, 0.1);
  REQUIRE(!InferenceMode::is_enabled());
  {
    InferenceMode guard;
    CHECK(InferenceMode::is_enabled());
    CHECK(!GradMode::is_enabled());
    {
      AutoGradMode on(true);  // torch: is_grad_enabled() is True here, yet w * 2 records nothing
      Tensor y = w * 2;
      CHECK(!y.requires_grad());
      CHECK(y.grad_fn() == nullptr);
      CHECK(y.is_inference());
    }
    {
      InferenceMode off(false);  // as torch.inference_mode(False): grad mode back on
      CHECK(!InferenceMode::is_enabled());
      CHECK(GradMode::is_enabled());
      Tensor z = w * 2;
      CHECK(z.requires_grad());
      CHECK(!z.is_inference());
    }
    CHECK(InferenceMode::is_enabled());
    CHECK(!GradMode::is_enabled());
  }
  CHECK(!InferenceMode::is_enabled());
  CHECK(GradMode::is_enabled());
  {
    NoGradGuard no_grad;
    { InferenceMode guard; }
    CHECK(!GradMode::is_enabled());  // the guard restores what it found
  }
}

TEST_CASE("Inference tensors are what is allocated in the mode and views of it") {
  Tensor normal = ones({4});
  Tensor a, view_inside, view_of_normal;
  {
    InferenceMode guard;
    a = ones({4});
    view_inside = a.narrow(0, 1, 2);
    view_of_normal = normal.narrow(0, 1, 2);
    CHECK((normal + 1).is_inference());  // an op's result inside the mode
  }
  CHECK(a.is_inference());
  CHECK(view_inside.is_inference());
  CHECK(!view_of_normal.is_inference());  // torch: a view of a normal tensor stays normal
  CHECK(a.narrow(0, 0, 2).is_inference());  // a view made outside of an inference tensor
  CHECK(a.detach().is_inference());
  CHECK(!normal.is_inference());
  CHECK(!(normal * a).is_inference());  // functional ops outside the mode make normal tensors
  CHECK(!a.clone().is_inference());
  // Views of inference tensors are not counted (nothing to protect); a view of a normal one made in
  // the mode is, as under no_grad.
  CHECK(a.impl()->storage->live_views.load() == 0);
  CHECK(normal.impl()->storage->live_views.load() == 1);
}

TEST_CASE("In-place changes of an inference tensor are refused outside the mode, with the tensor untouched") {
  Tensor a, mask;
  {
    InferenceMode guard;
    a = arange(4, kFloat32);
    mask = gt(a, 1.5);
  }
  Tensor before = a.clone();
  const std::vector<std::pair<const char*, std::function<void()>>> writes{
      {"add_", [&] { a.add_(ones({4})); }},
      {"add_", [&] { a.add_(1); }},
      {"mul_", [&] { a.narrow(0, 1, 2).mul_(2); }},  // a view of it, made outside the mode
      {"relu_", [&] { a.relu_(); }},
      {"pow_", [&] { a.pow_(2); }},
      {"clamp_", [&] { a.clamp_(0, 1); }},
      {"masked_fill_", [&] { a.masked_fill_(mask, 9); }},
      {"fill_", [&] { a.fill_(3); }},
      {"fill_", [&] { a.zero_(); }},
      {"copy_", [&] { a.copy_(ones({4})); }},
      {"addmm_out", [&] { addmm_out(a.view({2, 2}), zeros({2}), ones({2, 2}), ones({2, 2})); }},
  };
  for (const auto& [op, write] : writes) {
    INFO(op);
    std::vector<std::string> fragments = kWriteRefused;
    fragments.push_back(op);
    check_error(write, fragments);
    {
      NoGradGuard no_grad;  // no_grad is not inference mode
      check_error(write, fragments);
    }
    check_equal(a, before);
  }
  {
    InferenceMode guard;  // inside the mode: allowed
    a.add_(1);
    a.narrow(0, 1, 2).mul_(2);
  }
  check_equal(a, from_vector<float>({1, 4, 6, 4}, {4}));
}

TEST_CASE("Fused optimizer steps refuse inference params and state outside the mode") {
  Tensor p, m;
  {
    InferenceMode guard;
    p = ones({3});
    m = zeros({3});
  }
  Tensor g = full({3}, 0.5);
  Tensor normal_p = ones({3}), normal_m = zeros({3});
  check_error([&] { fused_sgd_({p}, {g}, {}, {.lr = 0.1}); }, {"fused_sgd_", "inference tensor"});
  check_error([&] { fused_sgd_({normal_p}, {g}, {m}, {.lr = 0.1, .momentum = 0.9}); },
              {"fused_sgd_", "inference tensor"});
  check_equal(p, ones({3}));
  check_equal(normal_p, ones({3}));  // refused before anything was written
  {
    InferenceMode guard;
    fused_sgd_({p}, {g}, {}, {.lr = 0.1});
  }
  test::check_close(p, full({3}, 0.95));
  // An inference gradient is only read: allowed.
  Tensor g_inf;
  {
    InferenceMode guard;
    g_inf = full({3}, 0.5);
  }
  fused_sgd_({normal_p}, {g_inf}, {}, {.lr = 0.1});
  test::check_close(normal_p, full({3}, 0.95));
}

TEST_CASE("Inference tensors cannot be saved for backward or require grad outside the mode") {
  Tensor w = sines({3}, 0.2);
  Tensor a;
  {
    InferenceMode guard;
    a = sines({3}, 0.7, false);
  }
  // torch: "Inference tensors cannot be saved for backward" (w * a saves a for w's gradient).
  check_error([&] { (w * a).sum(); }, {"inference tensor", "cannot be saved for backward", "clone()"});
  // A sum saves nothing: allowed, as in torch.
  Tensor s = (w + a).sum();
  s.backward();
  check_equal(w.grad(), ones({3}, kFloat64));
  // The workaround the message gives: a clone is a normal tensor.
  w.set_grad({});
  (w * a.clone()).sum().backward();
  check_equal(w.grad(), a);
  check_error([&] { a.requires_grad_(); }, {"requires_grad_", "inference tensor", "InferenceMode"});
  CHECK(!a.requires_grad());
  // Inside the mode a tensor may be made to require grad; it then trains as a leaf outside it, as in
  // torch (t.grad = [2, 2, 2] for (t * 2).sum()).
  Tensor t;
  {
    InferenceMode guard;
    t = ones({3}, kFloat64).requires_grad_();
  }
  (t * 2).sum().backward();
  check_equal(t.grad(), full({3}, 2.0, kFloat64));
  CHECK(!t.grad().is_inference());
}

TEST_CASE("A view made in inference mode cannot carry an in-place change under autograd") {
  Tensor x = sines({4}, 0.3);
  Tensor h = x * 2;  // a non-leaf with history
  Tensor v;
  {
    InferenceMode guard;
    v = h.narrow(0, 1, 2);  // normal (h is), but made without autograd
  }
  CHECK(!v.is_inference());
  // torch: "A view was created in inference mode and is being modified inplace in normal mode."
  check_error([&] { v.mul_(sines({2}, 0.5)); }, {"mul_", "in inference mode", "clone()"});
  check_error([&] { h.add_(1); }, {"add_", "live views made without autograd", "inference mode"});
}

TEST_CASE("A model's forward in inference mode gives what it gives under no_grad") {
  manual_seed(7);
  nn::Sequential model{nn::Linear(5, 8), nn::ReLU(), nn::Linear(8, 3)};
  Tensor x = test::sample({4, 5});
  Tensor expected;
  {
    NoGradGuard no_grad;
    expected = model(x);
  }
  Tensor y;
  {
    InferenceMode guard;
    y = model(x);
    CHECK(y.is_inference());
    CHECK(!y.requires_grad());
  }
  check_equal(y, expected);
  // The parameters were made outside the mode and still train.
  model(x).sum().backward();
  for (const auto& p : model.parameters()) CHECK(p.grad().defined());
}
