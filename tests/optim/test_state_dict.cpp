// tests/optim/test_state_dict.cpp: an optimizer's state_dict resumes bit-identically (5 steps,
// save, load into a fresh optimizer, 5 more == 10 steps), and load_state_dict names each mismatch.
#include <cmath>
#include <tuple>

#include "optim_golden.h"
#include "support.h"

using namespace kiln;
using namespace kiln::optim;
using namespace kiln::test;

namespace {

// A deep copy, as a checkpoint written to disk would be.
TensorDict deep_copy(const TensorDict& dict) {
  TensorDict out;
  for (const auto& [key, t] : dict) out.insert(key, t.clone());
  return out;
}

}  // namespace

TEST_CASE("every optimizer resumes bit-identically from its state_dict") {
  for (const OptimCase& c : OptimGolden::get().cases) {
    INFO("case " << c.id);
    std::vector<Tensor> whole_params;
    auto whole = make_optimizer(c, whole_params);
    for (int k = 0; k < 10; ++k) golden_step(c, *whole, whole_params);

    std::vector<Tensor> params;
    auto first = make_optimizer(c, params);
    for (int k = 0; k < 5; ++k) golden_step(c, *first, params);
    const TensorDict saved = deep_copy(first->state_dict());
    std::vector<Tensor> saved_params;
    for (const Tensor& p : params) saved_params.push_back(p.detach().clone());

    // A fresh optimizer over fresh parameters holding the 5-step values.
    std::vector<Tensor> resumed_params;
    auto resumed = make_optimizer(c, resumed_params);
    {
      NoGradGuard no_grad;
      for (size_t i = 0; i < params.size(); ++i) resumed_params[i].copy_(saved_params[i]);
    }
    resumed->load_state_dict(saved);
    for (int k = 0; k < 5; ++k) golden_step(c, *resumed, resumed_params);
    for (size_t i = 0; i < params.size(); ++i) {
      INFO("parameter " << i);
      check_equal(resumed_params[i].detach(), whole_params[i].detach());
    }
    // The saved entries: group hyperparameters as float64 0-d tensors, the params' indices.
    CHECK(saved.at("param_groups.0.lr").dtype() == kFloat64);
    CHECK(saved.at("param_groups.0.lr").dim() == 0);
    CHECK(saved.at("param_groups.0.lr").item<double>() == whole->param_groups()[0].lr());
    CHECK(saved.at("param_groups.0.params").dtype() == kInt64);
  }
}

TEST_CASE("state_dict names follow PyTorch's indices across groups") {
  const OptimCase& c = OptimGolden::get().find("adam_groups");  // groups=1,0,0
  std::vector<Tensor> params;
  auto opt = make_optimizer(c, params);
  for (int k = 0; k < 2; ++k) golden_step(c, *opt, params);
  const TensorDict d = opt->state_dict();
  // Group 0 holds the case's parameters 1 and 2 (indices 0, 1); group 1 its parameter 0 (index 2).
  check_equal(d.at("param_groups.0.params"), from_vector(std::vector<int64_t>{0, 1}));
  check_equal(d.at("param_groups.1.params"), from_vector(std::vector<int64_t>{2}));
  CHECK(d.at("param_groups.1.lr").item<double>() == 0.01);
  CHECK(d.at("param_groups.1.weight_decay").item<double>() == 0.1);
  CHECK(d.at("state.0.step").item<int64_t>() == 2);
  CHECK(d.at("state.0.exp_avg").sizes() == params[1].sizes());
  CHECK(d.at("state.2.exp_avg_sq").sizes() == params[0].sizes());
  CHECK(!d.contains("state.1.step"));  // parameter 2 of the case never gets a grad
}

TEST_CASE("load_state_dict names the mismatch: groups, parameter counts, shapes, entries") {
  Tensor a = sample({3, 2}).requires_grad_(), b = sample({4}).requires_grad_();
  Tensor c = sample({5}).requires_grad_();
  Adam one({a, b}, {.lr = 0.1});
  a.set_grad(ones({3, 2}));
  b.set_grad(ones({4}));
  one.step();
  const TensorDict saved = one.state_dict();

  Adam two_groups(std::vector<GroupSpec<AdamOptions>>{{{a}, {}}, {{b}, {}}});
  check_error([&] { two_groups.load_state_dict(saved); }, {"Adam", "1 parameter groups", "has 2"});
  Adam three_params({a, b, c}, {});
  check_error([&] { three_params.load_state_dict(saved); },
              {"Adam", "group 0", "2 parameters in the state dict", "3"});
  Tensor wide = sample({3, 3}).requires_grad_();
  Adam reshaped({wide, b}, {});
  check_error([&] { reshaped.load_state_dict(saved); }, {"state.0.exp_avg", "[3, 2]", "[3, 3]"});
  TensorDict extra = saved;
  extra.insert("momentum", zeros({}));
  Adam same({a, b}, {});
  check_error([&] { same.load_state_dict(extra); }, {"unexpected entry 'momentum'"});
  TensorDict no_lr;
  for (const auto& [k, t] : saved) {
    if (k != "param_groups.0.lr") no_lr.insert(k, t);
  }
  check_error([&] { same.load_state_dict(no_lr); }, {"lacks 'param_groups.0.lr'"});
  // Values the constructor would refuse, from a damaged or hand-edited file: Adam's own check_group
  // names its rule, the base the finite numbers.
  const std::vector<std::tuple<std::string, double, std::vector<std::string>>> bad = {
      {"param_groups.0.lr", std::nan(""), {"'param_groups.0.lr' is nan", "a finite number"}},
      {"param_groups.0.weight_decay", INFINITY, {"'param_groups.0.weight_decay' is inf", "a finite number"}},
      {"param_groups.0.beta1", 5, {"'param_groups.0'", "invalid beta parameter at index 0: 5", "in [0, 1)"}},
      {"param_groups.0.eps", -1, {"'param_groups.0'", "invalid epsilon value -1"}},
      {"param_groups.0.amsgrad", 0.5, {"'param_groups.0'", "option 'amsgrad' is 0.5", "a flag: 0 or 1"}}};
  for (const auto& [key, value, fragments] : bad) {
    INFO(key << " = " << value);
    TensorDict damaged;
    for (const auto& [k, t] : saved) damaged.insert(k, k == key ? scalar_tensor(value, t.dtype()) : t);
    std::vector<std::string> expected = fragments;
    expected.push_back("Adam.load_state_dict");
    expected.push_back("the state dict is damaged");
    check_error([&] { same.load_state_dict(damaged); }, expected);
  }
  TensorDict damaged_max_lr = saved;  // OneCycleLR's, in a group that has it
  damaged_max_lr.insert("param_groups.0.max_lr", scalar_tensor(-1.0, kFloat64));
  check_error([&] { same.load_state_dict(damaged_max_lr); }, {"'param_groups.0.max_lr' is -1", ">= 0"});
  TensorDict negative_step;
  for (const auto& [k, t] : saved) negative_step.insert(k, k == "state.0.step" ? scalar_tensor(-5, t.dtype()) : t);
  check_error([&] { same.load_state_dict(negative_step); }, {"'state.0.step' is -5", "damaged"});
  // A failed load leaves the optimizer as it was.
  CHECK(same.param_groups()[0].lr() == 1e-3);
  CHECK(same.find_state(a) == nullptr);
  // A state dict from before the `fused` option loads, and the optimizer keeps its own setting.
  TensorDict no_fused;
  for (const auto& [k, t] : saved) {
    if (k != "param_groups.0.fused") no_fused.insert(k, t);
  }
  REQUIRE(no_fused.size() + 1 == saved.size());
  Adam fused({a, b}, {.fused = true});
  fused.load_state_dict(no_fused);
  CHECK(fused.param_groups()[0].get("fused") == 1);
  CHECK(fused.find_state(a) != nullptr);
}

TEST_CASE("load_state_dict refuses buffers that step would not find, before it changes anything") {
  Tensor a = sample({3, 2}).requires_grad_(), b = sample({4}).requires_grad_();
  const auto take_step = [&](Optimizer& opt) {
    a.set_grad(ones({3, 2}));
    b.set_grad(ones({4}));
    opt.step();
  };
  const auto without = [](const TensorDict& dict, const std::string& key) {
    TensorDict out;
    for (const auto& [k, t] : dict) {
      if (k != key) out.insert(k, t.clone());
    }
    REQUIRE(out.size() + 1 == dict.size());
    return out;
  };
  // Adam with amsgrad reads three buffers: a state dict that lacks one was loaded, and the next step
  // updated parameter 0 and then stopped at parameter 1 (a half-applied step).
  Adam amsgrad({a, b}, {.lr = 0.1, .amsgrad = true});
  take_step(amsgrad);
  const TensorDict saved = amsgrad.state_dict();
  Adam target({a, b}, {.lr = 0.1, .amsgrad = true});
  check_error([&] { target.load_state_dict(without(saved, "state.1.max_exp_avg_sq")); },
              {"Adam.load_state_dict", "'state.1' lacks 'max_exp_avg_sq'", "group 0",
               "exp_avg, exp_avg_sq, max_exp_avg_sq", "damaged or from another optimizer"});
  CHECK(target.find_state(a) == nullptr);  // nothing loaded
  // amsgrad comes from the state dict: one saved without it loads, one saved with it needs its buffer.
  Adam plain({a, b}, {.lr = 0.1});
  take_step(plain);
  Adam toggled({a, b}, {.lr = 0.1, .amsgrad = true});
  toggled.load_state_dict(plain.state_dict());
  CHECK(toggled.param_groups()[0].get("amsgrad") == 0);
  // A buffer of another optimizer or other options is named.
  TensorDict foreign = plain.state_dict();
  foreign.insert("state.0.momentum_buffer", zeros({3, 2}));
  check_error([&] { target.load_state_dict(foreign); },
              {"'state.0.momentum_buffer' is not a buffer Adam keeps", "exp_avg, exp_avg_sq", "other options"});
  // A parameter without state (no entry, or a step-0 entry without buffers) is fine.
  TensorDict no_state = without(without(without(plain.state_dict(), "state.1.step"), "state.1.exp_avg"),
                                "state.1.exp_avg_sq");
  target.load_state_dict(no_state);
  take_step(target);
  CHECK(target.find_state(b)->step == 1);

  // RMSprop: momentum_buffer and grad_avg when momentum > 0 and centered.
  RMSprop rms({a, b}, {.lr = 0.01, .momentum = 0.9, .centered = true});
  take_step(rms);
  RMSprop rms_target({a, b}, {.lr = 0.01, .momentum = 0.9, .centered = true});
  check_error([&] { rms_target.load_state_dict(without(rms.state_dict(), "state.0.grad_avg")); },
              {"RMSprop.load_state_dict", "'state.0' lacks 'grad_avg'", "square_avg, momentum_buffer, grad_avg"});
  rms_target.load_state_dict(rms.state_dict());
  // SGD's momentum buffer is optional (momentum restarts without it, as PyTorch's); others are not.
  SGD sgd({a, b}, {.lr = 0.1, .momentum = 0.9});
  take_step(sgd);
  SGD sgd_target({a, b}, {.lr = 0.1, .momentum = 0.9});
  sgd_target.load_state_dict(without(sgd.state_dict(), "state.0.momentum_buffer"));
  TensorDict sgd_foreign = sgd.state_dict();
  sgd_foreign.insert("state.0.exp_avg", zeros({3, 2}));
  check_error([&] { sgd_target.load_state_dict(sgd_foreign); },
              {"SGD.load_state_dict", "'state.0.exp_avg' is not a buffer SGD keeps", "momentum_buffer (optional)"});
  // Adagrad: a parameter that took steps needs its sum; one without state starts from
  // initial_accumulator_value, as at construction.
  Adagrad ada({a, b}, {.lr = 0.1, .initial_accumulator_value = 0.5});
  take_step(ada);
  Adagrad ada_target({a, b}, {.lr = 0.1, .initial_accumulator_value = 0.5});
  check_error([&] { ada_target.load_state_dict(without(ada.state_dict(), "state.1.sum")); },
              {"Adagrad.load_state_dict", "'state.1' lacks 'sum'"});
  ada_target.load_state_dict(without(without(ada.state_dict(), "state.1.sum"), "state.1.step"));
  take_step(ada_target);
  check_close(ada_target.find_state(b)->buffers.at("sum"), full({4}, 1.5), {0, 0});  // 0.5 + 1^2
}

TEST_CASE("a state dict saved before a scheduler was made loads into an optimizer that has one") {
  // The scheduler's initial_lr is absent from it; PyTorch loads it, and so does Kiln now (it was
  // "the state dict lacks 'param_groups.0.initial_lr'"). The group keeps the scheduler's value.
  Tensor p = ones({2}).requires_grad_(), q = ones({2}).requires_grad_();
  SGD before({p}, {.lr = 0.1, .momentum = 0.9});
  p.set_grad(ones({2}));
  before.step();
  const TensorDict saved = before.state_dict();
  SGD after({q}, {.lr = 0.1, .momentum = 0.9});
  StepLR sched(after, 1, 0.5);
  after.load_state_dict(saved);
  CHECK(after.param_groups()[0].get("initial_lr") == 0.1);
  sched.step();
  CHECK(after.param_groups()[0].lr() == 0.05);
  q.set_grad(ones({2}));
  after.step();  // the loaded momentum buffer (1) times 0.9, plus the grad: q = 1 - 0.05 * 1.9
  check_close(q.detach(), full({2}, 1 - 0.05 * 1.9));
}

TEST_CASE(
    "optimizer and scheduler resume together bit-identically (AdamW + OneCycleLR, SGD + "
    "SequentialLR)") {
  for (const std::string id : {"adamw_wd_amsgrad", "sgd_nesterov_wd"}) {
    INFO("case " << id);
    const OptimCase& c = OptimGolden::get().find(id);
    auto make_scheduler = [&](Optimizer& opt) -> std::unique_ptr<LRScheduler> {
      if (c.optimizer == "AdamW") {
        return std::make_unique<OneCycleLR>(opt,
                                            OneCycleLROptions{.max_lr = 0.05, .total_steps = 10});
      }
      auto warm = std::make_shared<LinearLR>(opt, 0.2, 1.0, 3);
      auto decay = std::make_shared<ExponentialLR>(opt, 0.7);
      return std::make_unique<SequentialLR>(
          opt, std::vector<std::shared_ptr<LRScheduler>>{warm, decay}, std::vector<int64_t>{3});
    };
    std::vector<Tensor> whole_params;
    auto whole = make_optimizer(c, whole_params);
    auto whole_sched = make_scheduler(*whole);
    for (int k = 0; k < 10; ++k) {
      golden_step(c, *whole, whole_params);
      if (k < 9) whole_sched->step();  // OneCycleLR's 10 steps end at its last value
    }

    std::vector<Tensor> params;
    auto first = make_optimizer(c, params);
    auto first_sched = make_scheduler(*first);
    for (int k = 0; k < 5; ++k) {
      golden_step(c, *first, params);
      first_sched->step();
    }
    const TensorDict opt_state = deep_copy(first->state_dict());
    const TensorDict sched_state = deep_copy(first_sched->state_dict());

    std::vector<Tensor> resumed_params;
    auto resumed = make_optimizer(c, resumed_params);
    auto resumed_sched = make_scheduler(*resumed);
    {
      NoGradGuard no_grad;
      for (size_t i = 0; i < params.size(); ++i) resumed_params[i].copy_(params[i]);
    }
    resumed->load_state_dict(opt_state);
    resumed_sched->load_state_dict(sched_state);
    for (int k = 5; k < 10; ++k) {
      golden_step(c, *resumed, resumed_params);
      if (k < 9) resumed_sched->step();
    }
    for (size_t i = 0; i < params.size(); ++i) {
      INFO("parameter " << i);
      check_equal(resumed_params[i].detach(), whole_params[i].detach());
    }
    CHECK(resumed->param_groups()[0].lr() == whole->param_groups()[0].lr());
    CHECK(resumed_sched->get_last_lr() == whole_sched->get_last_lr());
    // The schedule did change the lr along the way (the check above is not vacuous).
    CHECK(whole->param_groups()[0].lr() != c.options.at("lr"));
  }
}

TEST_CASE("every optimizer's load_state_dict applies its constructor's checks to the loaded options") {
  Tensor w = sample({3, 2}).requires_grad_();
  // The saved dict of `opt`, with `key` set to `value`.
  auto with = [](const Optimizer& opt, const std::string& key, double value) {
    TensorDict dict = opt.state_dict();
    dict.set(key, scalar_tensor(value, kFloat64));
    return dict;
  };
  SGD sgd({w}, {.lr = 0.1, .momentum = 0.9, .nesterov = true});
  check_error([&] { sgd.load_state_dict(with(sgd, "param_groups.0.momentum", 0)); },
              {"SGD.load_state_dict: 'param_groups.0' holds options that SGD refuses",
               "Nesterov momentum requires a momentum and zero dampening", "damaged"});
  check_error([&] { sgd.load_state_dict(with(sgd, "param_groups.0.fused", 2)); }, {"option 'fused' is 2"});
  RMSprop rmsprop({w}, {});
  check_error([&] { rmsprop.load_state_dict(with(rmsprop, "param_groups.0.alpha", -0.5)); },
              {"RMSprop refuses", "invalid alpha value -0.5"});
  check_error([&] { rmsprop.load_state_dict(with(rmsprop, "param_groups.0.centered", -1)); },
              {"option 'centered' is -1", "a flag: 0 or 1"});
  Adagrad adagrad({w}, {});
  check_error([&] { adagrad.load_state_dict(with(adagrad, "param_groups.0.lr_decay", -1)); },
              {"Adagrad refuses", "invalid lr_decay value -1"});
  AdamW adamw({w}, {});
  check_error([&] { adamw.load_state_dict(with(adamw, "param_groups.0.beta2", 1)); },
              {"AdamW refuses", "AdamW: invalid beta parameter at index 1: 1"});
  // MasterWeights checks through its inner optimizer; a 16-bit parameter has a float32 master.
  Tensor half = sample({3, 2}).to(kBFloat16).requires_grad_();
  MasterWeights master({half}, [](std::vector<Tensor> masters) {
    return std::make_unique<AdamW>(std::move(masters), AdamWOptions{});
  });
  check_error([&] { master.load_state_dict(with(master, "param_groups.0.eps", -1)); },
              {"AdamW refuses", "invalid epsilon value -1"});
  // The checks leave the good values loadable, and a failed load changes nothing.
  CHECK(sgd.param_groups()[0].get("momentum") == 0.9);
  sgd.load_state_dict(with(sgd, "param_groups.0.lr", 0.5));
  CHECK(sgd.param_groups()[0].lr() == 0.5);
}

TEST_CASE("an optimizer's state dict after PyTorch's OneCycleLR loop loads, its negative last lr too",
          "[optim][state_dict]") {
  // PyTorch's loop calls sched.step() total_steps times; the last call anneals linearly past min_lr to
  // -0.014285257142857138 (PyTorch 1.13's value), and the end-of-training checkpoint held it. It was
  // refused as "damaged" (the constructor's lr >= 0 rule).
  Tensor p = full({2}, 1.0, kFloat64).requires_grad_();
  optim::SGD opt({p}, {.lr = 0.1, .momentum = 0.9});
  optim::OneCycleLR sched(opt, {.max_lr = 0.1, .total_steps = 10, .anneal_strategy = "linear"});
  for (int i = 0; i < 10; ++i) {
    p.set_grad(full({2}, 1.0, kFloat64));
    opt.step();
    sched.step();
  }
  CHECK(opt.param_groups()[0].lr() == Approx(-0.014285257142857138).epsilon(1e-12));
  Tensor q = full({2}, 1.0, kFloat64).requires_grad_();
  optim::SGD reloaded({q}, {.lr = 0.1, .momentum = 0.9});
  reloaded.load_state_dict(opt.state_dict());
  CHECK(reloaded.param_groups()[0].lr() == opt.param_groups()[0].lr());
  // A NaN from a LambdaLR's function is an Error at the step that computes it, naming the scheduler.
  optim::LambdaLR bad(opt, [](int64_t epoch) { return epoch >= 2 ? std::nan("") : 1.0; });
  bad.step();
  check_error([&] { bad.step(); }, {"LambdaLR", "learning rate nan", "finite"});
}
