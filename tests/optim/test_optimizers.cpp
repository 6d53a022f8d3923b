// tests/optim/test_optimizers.cpp: SGD, Adam, AdamW, RMSprop and Adagrad against PyTorch 1.13:
// 10-step trajectories and final state from tests/fixtures/optim_golden.txt, parameter groups,
// skipped parameters, zero_grad, and the Errors on bad options.
#include "optim_golden.h"
#include "support.h"

using namespace kiln;
using namespace kiln::test;

namespace {

const Tolerance kTrajectory{1e-5, 1e-6};

void check_trajectory(const OptimCase& c, bool fused = false) {
  INFO("case " << c.id << " (" << c.optimizer << (fused ? ", fused" : "") << ")");
  std::vector<Tensor> params;
  auto opt = make_optimizer(c, params, fused);
  for (size_t step = 0; step < c.after.size(); ++step) {
    golden_step(c, *opt, params);
    for (size_t i = 0; i < params.size(); ++i) {
      INFO("step " << step + 1 << ", parameter " << i);
      check_close(params[i].detach(), c.after[step][i], kTrajectory);
    }
  }
  for (size_t i = 0; i < params.size(); ++i) {
    INFO("state of parameter " << i);
    const optim::ParamState* st = opt->find_state(params[i]);
    if (!c.state.count(static_cast<int>(i))) {
      CHECK(st == nullptr);  // a parameter without grad gets no state
      continue;
    }
    REQUIRE(st != nullptr);
    const auto& expected = c.state.at(static_cast<int>(i));
    size_t buffers = 0;
    for (const auto& [name, t] : expected) {
      INFO("state " << name);
      if (name == "step") {
        CHECK(st->step == t.item<int64_t>());
      } else {
        ++buffers;
        const Tensor* b = st->buffers.find(name);
        REQUIRE(b != nullptr);
        check_close(*b, t.to(kFloat32), kTrajectory);
      }
    }
    CHECK(st->buffers.size() == buffers);
  }
}

void check_cases_of(const std::string& optimizer, bool fused = false) {
  int n = 0;
  for (const OptimCase& c : OptimGolden::get().cases) {
    if (c.optimizer != optimizer) continue;
    check_trajectory(c, fused);
    ++n;
  }
  CHECK(n >= 3);
}

}  // namespace

TEST_CASE(
    "SGD (momentum, dampening, Nesterov, weight decay, maximize) follows PyTorch for 10 steps") {
  check_cases_of("SGD");
}

TEST_CASE("Adam (betas, eps, weight decay, amsgrad, maximize) follows PyTorch for 10 steps") {
  check_cases_of("Adam");
}

TEST_CASE("AdamW (decoupled weight decay, amsgrad, maximize) follows PyTorch for 10 steps") {
  check_cases_of("AdamW");
}

TEST_CASE("SGD with fused = true follows PyTorch for 10 steps") {
  check_cases_of("SGD", /*fused=*/true);
}

TEST_CASE("Adam and AdamW with fused = true follow PyTorch for 10 steps") {
  check_cases_of("Adam", /*fused=*/true);
  check_cases_of("AdamW", /*fused=*/true);
}

TEST_CASE(
    "RMSprop (alpha, momentum, centered, weight decay, maximize) follows PyTorch for 10 steps") {
  check_cases_of("RMSprop");
}

TEST_CASE("Adagrad (lr_decay, weight decay, initial accumulator, eps, maximize) follows PyTorch") {
  check_cases_of("Adagrad");
}

TEST_CASE("parameter groups keep their own hyperparameters") {
  const OptimCase& sgd = OptimGolden::get().find("sgd_groups");
  const OptimCase& adam = OptimGolden::get().find("adam_groups");
  check_trajectory(sgd);
  check_trajectory(adam);
  std::vector<Tensor> params;
  auto opt = make_optimizer(sgd, params);
  REQUIRE(opt->param_groups().size() == 2);
  CHECK(opt->param_groups()[0].lr() == 0.1);
  CHECK(opt->param_groups()[1].lr() == 0.01);
  CHECK(opt->param_groups()[1].get("momentum") == 0.5);
  CHECK(opt->param_groups()[1].params.size() == 2);
}

TEST_CASE("the construction forms of DESIGN.md, add_param_group and writable lr") {
  Tensor w = sample({4, 3}).requires_grad_();
  Tensor b = sample({3}, kFloat32, 1.5).requires_grad_();
  optim::AdamW opt({w}, {.lr = 1e-3});
  CHECK(opt.param_groups()[0].get("weight_decay") == 1e-2);  // AdamW's default
  CHECK(opt.param_groups()[0].get("beta2") == 0.999);
  opt.add_param_group({b}, {.lr = 0.5, .weight_decay = 0});
  REQUIRE(opt.param_groups().size() == 2);
  opt.param_groups()[1].set_lr(0.25);
  CHECK(opt.param_groups()[1].lr() == 0.25);

  // lr written through param_groups() is the lr the next step uses: SGD moves by exactly lr * g.
  Tensor p = zeros({2}).requires_grad_();
  optim::SGD sgd({p}, {.lr = 1.0});
  sgd.param_groups()[0].set_lr(0.5);
  p.set_grad(tensor({2.0, -4.0}));
  sgd.step();
  check_equal(p.detach(), tensor({-1.0, 2.0}));

  optim::SGD two({{{w}, {.lr = 0.1}}, {{b}, {.lr = 0.2, .momentum = 0.9}}});
  CHECK(two.param_groups()[1].get("momentum") == 0.9);
}

TEST_CASE(
    "zero_grad drops grads (set_to_none) or zeroes them, parameters without grad are skipped") {
  Tensor a = sample({3}).requires_grad_();
  Tensor b = sample({2}, kFloat32, 2.0).requires_grad_();
  Tensor b0 = b.detach().clone();
  optim::Adam opt({a, b}, {.lr = 0.1});
  a.set_grad(ones({3}));
  opt.step();
  check_equal(b.detach(), b0);
  CHECK(opt.find_state(b) == nullptr);
  CHECK(opt.state(a).step == 1);
  opt.zero_grad(false);
  REQUIRE(a.grad().defined());
  check_equal(a.grad(), zeros({3}));
  opt.zero_grad();
  CHECK(!a.grad().defined());
  CHECK(!b.grad().defined());
  // A grad that is part of a graph is detached before it is zeroed, as PyTorch does; it kept
  // requires_grad, and the next accumulation would have built on its graph.
  Tensor w = ones({3}).requires_grad_();
  a.set_grad(w * 2);
  REQUIRE(a.grad().requires_grad());
  opt.zero_grad(false);
  CHECK(!a.grad().requires_grad());
  CHECK(!a.grad().grad_fn());
  check_equal(a.grad(), zeros({3}));
  check_equal(w.detach(), ones({3}));  // the graph's input is untouched
}

TEST_CASE("steps are in place, under no_grad, and do not record a graph") {
  Tensor p = sample({5}).requires_grad_();
  void* data = p.data_ptr();
  const uint64_t version = p._version();
  optim::SGD opt({p}, {.lr = 0.1, .momentum = 0.9});
  p.set_grad(ones({5}));
  opt.step();
  CHECK(p.data_ptr() == data);
  CHECK(p._version() > version);
  CHECK(p.is_leaf());
  CHECK(p.requires_grad());
  CHECK(!opt.state(p).buffers.at("momentum_buffer").requires_grad());
}

TEST_CASE("bad options and parameters are Errors that name the problem") {
  Tensor p = sample({3}).requires_grad_();
  check_error([&] { optim::SGD({p}, {.lr = -0.1}); }, {"SGD", "learning rate", "-0.1"});
  check_error([&] { optim::SGD({p}, {}); }, {"SGD", "lr is required"});
  check_error([&] { optim::SGD({p}, {.lr = 0.1, .nesterov = true}); },
              {"Nesterov", "momentum", "dampening"});
  check_error(
      [&] { optim::SGD({p}, {.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .nesterov = true}); },
      {"Nesterov", "zero dampening"});
  check_error([&] { optim::SGD({p}, {.lr = 0.1, .momentum = -1}); }, {"momentum", "-1"});
  check_error([&] { optim::Adam({p}, {.beta1 = 1.0}); }, {"Adam", "beta", "index 0", "[0, 1)"});
  check_error([&] { optim::Adam({p}, {.beta2 = -0.5}); }, {"Adam", "beta", "index 1"});
  check_error([&] { optim::AdamW({p}, {.eps = -1e-8}); }, {"AdamW", "epsilon"});
  check_error([&] { optim::AdamW({p}, {.weight_decay = -1}); }, {"AdamW", "weight_decay"});
  check_error([&] { optim::RMSprop({p}, {.alpha = -0.9}); }, {"RMSprop", "alpha"});
  check_error([&] { optim::RMSprop({p}, {.momentum = -0.9}); }, {"RMSprop", "momentum"});
  check_error([&] { optim::Adagrad({p}, {.lr_decay = -1}); }, {"Adagrad", "lr_decay"});
  // Non-finite values, and RMSprop's alpha above 1: every parameter NaN within a step or two.
  check_error([&] { optim::SGD({p}, {.lr = INFINITY}); }, {"SGD", "learning rate inf", "finite"});
  check_error([&] { optim::SGD({p}, {.lr = 0.1, .momentum = INFINITY}); }, {"SGD", "momentum value inf"});
  check_error([&] { optim::SGD({p}, {.lr = 0.1, .dampening = NAN}); }, {"SGD", "dampening value nan"});
  check_error([&] { optim::SGD({p}, {.lr = 0.1, .weight_decay = INFINITY}); }, {"SGD", "weight_decay value inf"});
  check_error([&] { optim::Adam({p}, {.lr = INFINITY}); }, {"Adam", "learning rate inf"});
  check_error([&] { optim::AdamW({p}, {.weight_decay = INFINITY}); }, {"AdamW", "weight_decay value inf"});
  check_error([&] { optim::RMSprop({p}, {.alpha = 1.5}); }, {"RMSprop", "alpha value 1.5", "[0, 1]"});
  check_error([&] { optim::Adagrad({p}, {.lr_decay = INFINITY}); }, {"Adagrad", "lr_decay value inf"});
  check_error([&] { optim::Adagrad({p}, {.initial_accumulator_value = -1}); },
              {"Adagrad", "initial_accumulator_value"});
  check_error([&] { optim::Adam(std::vector<Tensor>{}, {}); }, {"Adam", "empty parameter list"});
  check_error([&] { optim::Adam({p, p}, {}); }, {"Adam", "same tensor"});
  Tensor non_leaf = p * 2;
  check_error([&] { optim::Adam({non_leaf}, {}); }, {"Adam", "non-leaf"});
  check_error([&] { optim::Adam({zeros({2}, kInt64)}, {}); }, {"Adam", "int64", "floating"});
  optim::Adam opt({p}, {});
  check_error([&] { opt.add_param_group({p}, {}); }, {"already in group 0"});
  check_error([&] { opt.param_groups()[0].get("momentum"); },
              {"no option 'momentum'", "lr", "beta1"});
}

TEST_CASE(
    "the training loop of DESIGN.md: zero_grad, backward, step fits a least-squares problem") {
  // y = x w* with w* = (1, -2, 0.5); float64 parameters keep float64 state.
  Generator gen(7);
  Tensor x = randn({32, 3}, kFloat64, &gen);
  Tensor y = matmul(x, tensor({1.0, -2.0, 0.5}, kFloat64).view({3, 1}));
  Tensor w = zeros({3, 1}, kFloat64).requires_grad_();
  optim::Adam opt({w}, {.lr = 0.1});
  double first = 0, last = 0;
  for (int k = 0; k < 300; ++k) {
    opt.zero_grad();
    Tensor loss = (matmul(x, w) - y).square().mean();
    loss.backward();
    opt.step();
    (k == 0 ? first : last) = loss.item<double>();
  }
  CHECK(last < 1e-6 * first);
  check_close(w.detach(), tensor({1.0, -2.0, 0.5}, kFloat64).view({3, 1}), {1e-3, 1e-3});
  CHECK(opt.state(w).buffers.at("exp_avg").dtype() == kFloat64);
  CHECK(opt.state(w).step == 300);
}
