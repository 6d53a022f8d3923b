// tests/optim/test_schedulers.cpp: the learning-rate schedulers over 30-40 steps, against the
// values PyTorch 1.13 and DeepSpeed 0.12.6 give (tests/fixtures/optim_golden.txt) and against each
// schedule's closed-form formula written out here.
#include <cmath>
#include <numbers>

#include "optim_golden.h"
#include "support.h"

using namespace kiln;
using namespace kiln::optim;
using namespace kiln::test;

namespace {

constexpr double kPi = std::numbers::pi;

// Two groups (lr 0.1 and 0.05) as the generator's; SGD with momentum 0.9, or Adam.
struct Setup {
  Tensor a = zeros({2}).requires_grad_();
  Tensor b = zeros({3}).requires_grad_();
  std::unique_ptr<Optimizer> opt;
  explicit Setup(bool adam = false) {
    if (adam) {
      opt = std::make_unique<Adam>(
          std::vector<GroupSpec<AdamOptions>>{{{a}, {.lr = 0.1}}, {{b}, {.lr = 0.05}}});
    } else {
      opt = std::make_unique<SGD>(std::vector<GroupSpec<SGDOptions>>{
          {{a}, {.lr = 0.1, .momentum = 0.9}}, {{b}, {.lr = 0.05, .momentum = 0.9}}});
    }
  }
};

// The schedulers of the fixture's "sched" records, with the generator's arguments.
std::unique_ptr<LRScheduler> make_scheduler(const std::string& id, Optimizer& o) {
  if (id == "step") return std::make_unique<StepLR>(o, 7, 0.5);
  if (id == "multistep")
    return std::make_unique<MultiStepLR>(o, std::vector<int64_t>{3, 10, 10, 20}, 0.3);
  if (id == "exponential") return std::make_unique<ExponentialLR>(o, 0.9);
  if (id == "cosine") return std::make_unique<CosineAnnealingLR>(o, 10, 0.001);
  if (id == "linear") return std::make_unique<LinearLR>(o, 0.25, 0.9, 12);
  if (id == "lambda") {
    return std::make_unique<LambdaLR>(o, [](int64_t e) { return 1.0 / (1 + e) + 0.05 * (e % 3); });
  }
  if (id == "onecycle_cos")
    return std::make_unique<OneCycleLR>(o, OneCycleLROptions{.max_lr = 0.5, .total_steps = 30});
  if (id == "onecycle_linear_3phase") {
    return std::make_unique<OneCycleLR>(o, OneCycleLROptions{.max_lr = 0.4,
                                                             .total_steps = 30,
                                                             .pct_start = 0.25,
                                                             .anneal_strategy = "linear",
                                                             .div_factor = 10,
                                                             .final_div_factor = 100,
                                                             .three_phase = true});
  }
  if (id == "onecycle_adam") {
    return std::make_unique<OneCycleLR>(o, OneCycleLROptions{.max_lr = 0.3,
                                                             .epochs = 3,
                                                             .steps_per_epoch = 10,
                                                             .base_momentum = 0.8,
                                                             .max_momentum = 0.9});
  }
  if (id == "sequential") {
    auto warm = std::make_shared<LinearLR>(o, 0.1, 1.0, 5);
    auto cosine = std::make_shared<CosineAnnealingLR>(o, 20, 0.0);
    return std::make_unique<SequentialLR>(
        o, std::vector<std::shared_ptr<LRScheduler>>{warm, cosine}, std::vector<int64_t>{5});
  }
  if (id == "sequential3") {
    auto e = std::make_shared<ExponentialLR>(o, 0.8);
    auto s = std::make_shared<StepLR>(o, 3, 0.5);
    auto l = std::make_shared<LinearLR>(o, 0.5, 1.0, 4);
    return std::make_unique<SequentialLR>(o, std::vector<std::shared_ptr<LRScheduler>>{e, s, l},
                                          std::vector<int64_t>{4, 15});
  }
  if (id == "constant") return std::make_unique<ConstantLR>(o, 0.4, 6);
  if (id == "multiplicative") {
    return std::make_unique<MultiplicativeLR>(o, [](int64_t e) { return e % 2 ? 0.95 : 1.02; });
  }
  if (id == "polynomial") return std::make_unique<PolynomialLR>(o, 20, 1.7);
  if (id == "warm_restarts") return std::make_unique<CosineAnnealingWarmRestarts>(o, 3, 2, 0.001);
  if (id == "warm_restarts1") return std::make_unique<CosineAnnealingWarmRestarts>(o, 7);
  if (id == "sequential_restarts") {
    auto c = std::make_shared<ConstantLR>(o, 0.5, 4);
    auto w = std::make_shared<CosineAnnealingWarmRestarts>(o, 4, 2);
    return std::make_unique<SequentialLR>(o, std::vector<std::shared_ptr<LRScheduler>>{c, w},
                                          std::vector<int64_t>{6});
  }
  if (id == "cyclic_triangular") {
    return std::make_unique<CyclicLR>(o, CyclicLROptions{.base_lr = 0.01, .max_lr = 0.1, .step_size_up = 4});
  }
  if (id == "cyclic_triangular2") {
    return std::make_unique<CyclicLR>(o, CyclicLROptions{.base_lrs = {0.01, 0.005},
                                                         .max_lrs = {0.1, 0.2},
                                                         .step_size_up = 3,
                                                         .step_size_down = 5,
                                                         .mode = "triangular2",
                                                         .base_momentum = 0.85,
                                                         .max_momentum = 0.95});
  }
  if (id == "cyclic_exp_range") {
    return std::make_unique<CyclicLR>(o, CyclicLROptions{.base_lr = 0.02, .max_lr = 0.3, .step_size_up = 5,
                                                         .mode = "exp_range", .gamma = 0.97, .cycle_momentum = false});
  }
  if (id == "cyclic_scale_fn") {
    return std::make_unique<CyclicLR>(
        o, CyclicLROptions{.base_lr = 0.01, .max_lr = 0.2, .step_size_up = 2, .step_size_down = 3,
                           .scale_fn = [](double x) { return 0.5 * (1 + std::sin(x * kPi / 2)); },
                           .scale_mode = "iterations"});
  }
  if (id == "chained") {
    return std::make_unique<ChainedScheduler>(std::vector<std::shared_ptr<LRScheduler>>{
        std::make_shared<ConstantLR>(o, 0.1, 2), std::make_shared<ExponentialLR>(o, 0.9)});
  }
  if (id == "sequential_poly") {
    auto l = std::make_shared<LinearLR>(o, 0.2, 1.0, 3);
    auto p = std::make_shared<PolynomialLR>(o, 10, 2.0);
    auto c = std::make_shared<ConstantLR>(o, 0.25, 3);
    return std::make_unique<SequentialLR>(o, std::vector<std::shared_ptr<LRScheduler>>{l, p, c},
                                          std::vector<int64_t>{5, 17});
  }
  if (id == "ds_warmup_log") {
    return std::make_unique<WarmupLR>(o, WarmupLROptions{.warmup_min_lr = 0.001,
                                                         .warmup_max_lr = 0.1,
                                                         .warmup_num_steps = 10,
                                                         .warmup_type = "log"});
  }
  if (id == "ds_warmup_linear") {
    return std::make_unique<WarmupLR>(o, WarmupLROptions{.warmup_min_lr = 0.0,
                                                         .warmup_max_lr = 0.02,
                                                         .warmup_num_steps = 15,
                                                         .warmup_type = "linear"});
  }
  if (id == "ds_warmup_decay") {
    return std::make_unique<WarmupDecayLR>(o, WarmupDecayLROptions{.total_num_steps = 30,
                                                                   .warmup_min_lr = 0.001,
                                                                   .warmup_max_lr = 0.1,
                                                                   .warmup_num_steps = 10,
                                                                   .warmup_type = "linear"});
  }
  if (id == "ds_warmup_decay_log") {
    return std::make_unique<WarmupDecayLR>(
        o,
        WarmupDecayLROptions{.total_num_steps = 25, .warmup_max_lr = 0.05, .warmup_num_steps = 8});
  }
  if (id == "ds_warmup_cosine") {
    return std::make_unique<WarmupCosineLR>(o, WarmupCosineLROptions{.total_num_steps = 30,
                                                                     .warmup_min_ratio = 0.1,
                                                                     .warmup_num_steps = 8,
                                                                     .cos_min_ratio = 0.01,
                                                                     .warmup_type = "linear"});
  }
  if (id == "ds_warmup_cosine_log") {
    return std::make_unique<WarmupCosineLR>(
        o, WarmupCosineLROptions{.total_num_steps = 35, .warmup_num_steps = 6});
  }
  FAIL("no scheduler " << id);
  return nullptr;
}

bool is_deepspeed(const std::string& id) { return id.rfind("ds_", 0) == 0; }

// lrs[k] of group g: PyTorch's schedulers after construction then after each step; DeepSpeed's
// after each step (they take none when built). momentum: group 0's momentum (or beta1) alongside.
struct Run {
  std::vector<double> lr0, lr1, momentum;
};

Run run(const std::string& id, size_t values) {
  Setup s(id == "onecycle_adam");
  auto sched = make_scheduler(id, *s.opt);
  Run r;
  auto record = [&] {
    r.lr0.push_back(s.opt->param_groups()[0].lr());
    r.lr1.push_back(s.opt->param_groups()[1].lr());
    const ParamGroup& g = s.opt->param_groups()[0];
    r.momentum.push_back(g.has("beta1") ? g.get("beta1") : g.get("momentum"));
  };
  if (!is_deepspeed(id)) record();
  while (r.lr0.size() < values) {
    s.opt->step();
    sched->step();
    record();
    CHECK(sched->get_last_lr()[0] == r.lr0.back());
  }
  return r;
}

void check_values(const std::vector<double>& actual, const std::vector<double>& expected,
                  double rtol) {
  REQUIRE(actual.size() == expected.size());
  for (size_t k = 0; k < actual.size(); ++k) {
    INFO("value " << k << ": " << actual[k] << " vs " << expected[k]);
    CHECK(std::abs(actual[k] - expected[k]) <= 1e-15 + rtol * std::abs(expected[k]));
  }
}

}  // namespace

TEST_CASE(
    "every scheduler gives PyTorch's / DeepSpeed's values, for both groups and the momentum") {
  const OptimGolden& golden = OptimGolden::get();
  REQUIRE(golden.sched.size() == 29);
  for (const auto& [id, expected] : golden.sched) {
    INFO("scheduler " << id);
    Run r = run(id, expected.size());
    check_values(r.lr0, expected, 1e-12);
    check_values(r.lr1, golden.sched1.at(id), 1e-12);
    if (golden.momentum.count(id)) check_values(r.momentum, golden.momentum.at(id), 1e-12);
  }
}

TEST_CASE("PyTorch's schedulers match their closed forms") {
  const size_t n = 31;
  auto closed = [&](const std::string& id, auto&& formula) {
    INFO("scheduler " << id);
    Run r = run(id, n);
    std::vector<double> expected;
    for (size_t e = 0; e < n; ++e) expected.push_back(formula(static_cast<double>(e), 0.1));
    check_values(r.lr0, expected, 1e-9);
  };
  closed("step", [](double e, double base) { return base * std::pow(0.5, std::floor(e / 7)); });
  closed("multistep", [](double e, double base) {
    return base * std::pow(0.3, (e >= 3) + 2 * (e >= 10) + (e >= 20));
  });
  closed("exponential", [](double e, double base) { return base * std::pow(0.9, e); });
  closed("cosine", [](double e, double base) {
    return 0.001 + (base - 0.001) * (1 + std::cos(kPi * e / 10)) / 2;
  });
  closed("linear", [](double e, double base) {
    return base * (0.25 + (0.9 - 0.25) * std::min(e, 12.0) / 12);
  });
  closed("lambda", [](double e, double base) {
    return base * (1.0 / (1 + e) + 0.05 * (static_cast<int>(e) % 3));
  });
  // OneCycleLR, two phases, cos: from 0.5/25 up to 0.5 until step 0.3*30-1 = 8, then to 0.02/1e4.
  closed("onecycle_cos", [](double e, double) {
    auto cos_anneal = [](double start, double end, double pct) {
      return end + (start - end) / 2 * (1 + std::cos(kPi * pct));
    };
    return e <= 8 ? cos_anneal(0.02, 0.5, e / 8) : cos_anneal(0.5, 0.02 / 1e4, (e - 8) / (29 - 8));
  });
  // SequentialLR: LinearLR(0.1 -> 1 over 5), then cosine from 0.1 with T_max 20 restarted at 5.
  closed("sequential", [](double e, double base) {
    if (e < 5) return base * (0.1 + 0.9 * e / 5);
    return base * (1 + std::cos(kPi * (e - 5) / 20)) / 2;
  });
  closed("constant", [](double e, double base) { return base * (e < 6 ? 0.4 : 1.0); });
  closed("polynomial", [](double e, double base) { return base * std::pow(1 - std::min(e, 20.0) / 20, 1.7); });
  // Cycles of 3, 6, 12, 24 epochs starting at 0, 3, 9, 21.
  closed("warm_restarts", [](double e, double base) {
    double start = 0, length = 3;
    while (e >= start + length) {
      start += length;
      length *= 2;
    }
    return 0.001 + (base - 0.001) * (1 + std::cos(kPi * (e - start) / length)) / 2;
  });
  closed("warm_restarts1", [](double e, double base) {
    return base * (1 + std::cos(kPi * std::fmod(e, 7.0) / 7)) / 2;
  });
}

TEST_CASE("CosineAnnealingWarmRestarts resumed from its state_dict goes on in the same cycle") {
  for (int stop : {2, 3, 8, 10}) {  // inside the first cycle, at a restart, the last epoch of one, inside
    INFO("stopped after " << stop << " steps");
    Setup first, second, straight;
    CosineAnnealingWarmRestarts a(*first.opt, 3, 2, 0.001), b(*second.opt, 3, 2, 0.001),
        c(*straight.opt, 3, 2, 0.001);
    for (int k = 0; k < stop; ++k) {
      a.step();
      c.step();
    }
    second.opt->load_state_dict(first.opt->state_dict());
    b.load_state_dict(a.state_dict());
    for (int k = stop; k < 30; ++k) {
      b.step();
      c.step();
      CHECK(b.get_last_lr() == c.get_last_lr());
    }
  }
  Setup s;
  CosineAnnealingWarmRestarts w(*s.opt, 3, 2);
  TensorDict bad = w.state_dict();
  bad.set("T_cur", scalar_tensor(int64_t{5}));  // past the end of a cycle of 3
  check_error([&] { w.load_state_dict(bad); }, {"CosineAnnealingWarmRestarts", "'T_cur' 5", "T_0 = 3"});
}

TEST_CASE("DeepSpeed's warmup schedules match their formulas") {
  const size_t n = 40;
  auto check = [&](const std::string& id, auto&& formula) {
    INFO("scheduler " << id);
    Run r = run(id, n);
    std::vector<double> expected;
    for (size_t i = 0; i < n; ++i) expected.push_back(formula(static_cast<double>(i)));
    check_values(r.lr0, expected, 1e-12);
  };
  check("ds_warmup_log", [](double i) {
    return 0.001 + (0.1 - 0.001) * (i < 10 ? std::log(i + 1) / std::log(10.0) : 1.0);
  });
  check("ds_warmup_linear", [](double i) { return 0.02 * (i < 15 ? i / 15 : 1.0); });
  check("ds_warmup_decay", [](double i) {
    const double gamma = i < 10 ? i / 10 : std::max(0.0, (30 - i) / 20);
    return 0.001 + (0.1 - 0.001) * gamma;
  });
  check("ds_warmup_cosine", [](double i) {
    if (i < 8) return 0.1 * (0.1 + 0.9 * i / 8);
    return 0.1 * std::max(0.0, 0.01 + 0.99 * (1 + std::cos(kPi * (i - 7) / 22)) / 2);
  });
  // They leave the lr alone until their first step.
  Setup s;
  WarmupLR warm(*s.opt, {.warmup_max_lr = 0.5, .warmup_num_steps = 10});
  CHECK(s.opt->param_groups()[0].lr() == 0.1);
  check_error([&] { warm.get_last_lr(); }, {"WarmupLR", "step() first"});
  warm.step();
  CHECK(warm.last_epoch() == 0);
  CHECK(s.opt->param_groups()[0].lr() == 0.0);  // log(1) = 0: the min lr
}

TEST_CASE(
    "scheduler state_dict round trip: 5 steps, save, load into fresh ones, 5 more == 10 steps") {
  for (const std::string id : {"step", "cosine", "onecycle_cos", "onecycle_adam", "sequential3", "lambda",
                               "ds_warmup_decay", "ds_warmup_cosine", "constant", "multiplicative", "polynomial",
                               "warm_restarts", "sequential_restarts", "cyclic_triangular2", "chained"}) {
    INFO("scheduler " << id);
    const bool adam = id == "onecycle_adam";
    Run whole = run(id, is_deepspeed(id) ? 10 : 11);

    Setup s(adam);
    auto sched = make_scheduler(id, *s.opt);
    for (int k = 0; k < 5; ++k) {
      s.opt->step();
      sched->step();
    }
    const TensorDict opt_state = s.opt->state_dict(), sched_state = sched->state_dict();

    Setup fresh(adam);
    auto resumed = make_scheduler(id, *fresh.opt);
    fresh.opt->load_state_dict(opt_state);
    resumed->load_state_dict(sched_state);
    CHECK(resumed->last_epoch() == sched->last_epoch());
    CHECK(resumed->get_last_lr() == sched->get_last_lr());
    for (int k = 0; k < 5; ++k) {
      fresh.opt->step();
      resumed->step();
    }
    CHECK(fresh.opt->param_groups()[0].lr() == whole.lr0.back());
    CHECK(fresh.opt->param_groups()[1].lr() == whole.lr1.back());
    const ParamGroup& g = fresh.opt->param_groups()[0];
    CHECK((g.has("beta1") ? g.get("beta1") : g.get("momentum")) == whole.momentum.back());
  }
}

TEST_CASE("OneCycleLR takes one max_lr per param group") {
  // The schedule is linear in max_lr, so group 1 (max_lr 0.05) runs at a tenth of group 0 (0.5), and
  // group 0 runs exactly as with the single max_lr.
  Setup one, two;
  OneCycleLR single(*one.opt, {.max_lr = 0.5, .total_steps = 30});
  OneCycleLR per_group(*two.opt, {.max_lrs = {0.5, 0.05}, .total_steps = 30});
  for (int k = 0; k < 29; ++k) {
    INFO("step " << k);
    const auto& g = two.opt->param_groups();
    CHECK(g[0].lr() == one.opt->param_groups()[0].lr());
    CHECK(std::abs(g[1].lr() - g[0].lr() / 10) <= 1e-14 * g[0].lr());
    CHECK(g[1].get("max_lr") == 0.05);
    single.step();
    per_group.step();
  }
  Setup s;
  check_error([&] { OneCycleLR(*s.opt, {.max_lrs = {0.5}, .total_steps = 10}); },
              {"OneCycleLR", "max_lrs has 1 values", "2 param groups"});
  check_error([&] { OneCycleLR(*s.opt, {.max_lrs = {0.5, -1}, .total_steps = 10}); },
              {"OneCycleLR", "max_lrs[1]", "positive"});
}

TEST_CASE("OneCycleLR: a step in a phase of no length is an Error, not a NaN lr") {
  // PyTorch raises ZeroDivisionError in these cases; Kiln set the lr and momentum to NaN.
  Setup a;
  check_error([&] { OneCycleLR(*a.opt, {.max_lr = 0.5, .total_steps = 4, .pct_start = 0.25, .three_phase = true}); },
              {"OneCycleLR", "step 0 falls in phase 1 of 3", "no length", "total_steps 4"});
  // 0.1 * 10 - 1 is 0 in Python's arithmetic; fused into an FMA it was 5.6e-17 and the step went on.
  Setup c;
  check_error([&] { OneCycleLR(*c.opt, {.max_lr = 1.0, .total_steps = 10, .pct_start = 0.1}); },
              {"OneCycleLR", "step 0 falls in phase 1 of 2", "no length"});
  Setup b;  // pct_start 1: the second phase is empty, and reached only by the last allowed step
  OneCycleLR one(*b.opt, {.max_lr = 0.5, .total_steps = 7, .pct_start = 1.0});
  for (int k = 1; k < 7; ++k) one.step();
  CHECK(std::isfinite(b.opt->param_groups()[0].lr()));
  check_error([&] { one.step(); }, {"OneCycleLR", "step 7 falls in phase 2 of 2", "no length"});
  CHECK(std::isfinite(b.opt->param_groups()[0].lr()));
}

TEST_CASE("OneCycleLR: a div_factor of 0 is an Error, and a damaged last_epoch does not load") {
  // PyTorch: max_lr / div_factor raises ZeroDivisionError; Kiln set an lr of inf.
  Setup a;
  check_error([&] { OneCycleLR(*a.opt, {.max_lr = 0.5, .total_steps = 10, .div_factor = 0}); },
              {"OneCycleLR", "div_factor and final_div_factor must be positive"});
  check_error([&] { OneCycleLR(*a.opt, {.max_lr = 0.5, .total_steps = 10, .final_div_factor = 0}); },
              {"OneCycleLR", "div_factor and final_div_factor must be positive"});
  // A last_epoch of 2^62 loaded, its next step would overflow into a non-finite lr.
  Setup b;
  StepLR sched(*b.opt, 2);
  TensorDict dict = sched.state_dict();
  dict.set("last_epoch", scalar_tensor(int64_t{1} << 62, kInt64));
  check_error([&] { sched.load_state_dict(dict); }, {"StepLR.load_state_dict", "'last_epoch'", "damaged"});
  CHECK(sched.last_epoch() == 0);  // left as it was
}

TEST_CASE("a group added after the scheduler was made is an Error at its next step") {
  // CosineAnnealingLR read base_lrs_[1] from a one-element vector at the bottom of its cycle.
  Tensor p = zeros({2}).requires_grad_(), q = zeros({2}).requires_grad_();
  SGD opt({p}, {.lr = 0.1});
  CosineAnnealingLR cos(opt, 2);
  opt.add_param_group({q}, {.lr = 0.2});
  check_error([&] { cos.step(); },
              {"CosineAnnealingLR", "2 parameter groups", "made for 1", "after adding every group"});
  CHECK(cos.last_epoch() == 0);  // nothing moved
}

TEST_CASE("DeepSpeed's warmup schedules take per-group min and max lrs") {
  // Group g follows min_g + (max_g - min_g) * gamma(i), gamma as for one group: read gamma off a
  // single-group run from 0 to 1.
  Setup one, two;
  WarmupDecayLR unit(*one.opt, {.total_num_steps = 20, .warmup_min_lr = 0, .warmup_max_lr = 1,
                                .warmup_num_steps = 6, .warmup_type = "linear"});
  WarmupDecayLR per_group(*two.opt, {.total_num_steps = 20, .warmup_num_steps = 6, .warmup_type = "linear",
                                     .warmup_min_lrs = {0.001, 0.0}, .warmup_max_lrs = {0.1, 0.02}});
  for (int i = 0; i < 20; ++i) {
    INFO("iteration " << i);
    unit.step();
    per_group.step();
    const double gamma = one.opt->param_groups()[0].lr();
    CHECK(std::abs(two.opt->param_groups()[0].lr() - (0.001 + (0.1 - 0.001) * gamma)) <= 1e-15);
    CHECK(std::abs(two.opt->param_groups()[1].lr() - 0.02 * gamma) <= 1e-15);
  }
  Setup s;
  check_error([&] { WarmupLR(*s.opt, {.warmup_max_lrs = {0.1}}); },
              {"WarmupLR", "warmup_max_lrs has 1 values", "2 param groups"});
}

TEST_CASE("bad scheduler arguments are Errors that name the problem") {
  Setup s;
  Optimizer& o = *s.opt;
  check_error([&] { StepLR(o, 0); }, {"StepLR", "step_size"});
  check_error([&] { CosineAnnealingLR(o, 0); }, {"CosineAnnealingLR", "T_max"});
  // Decay factors and floors that make every later lr NaN or negative (PyTorch takes them silently).
  check_error([&] { StepLR(o, 2, NAN); }, {"StepLR", "gamma must be finite and >= 0, got nan"});
  check_error([&] { MultiStepLR(o, {2, 4}, -0.5); }, {"MultiStepLR", "gamma", "-0.5"});
  check_error([&] { ExponentialLR(o, -0.9); }, {"ExponentialLR", "gamma", "-0.9"});
  check_error([&] { CosineAnnealingLR(o, 10, NAN); }, {"CosineAnnealingLR", "eta_min", "nan"});
  check_error([&] { CosineAnnealingWarmRestarts(o, 10, 1, -0.05); }, {"CosineAnnealingWarmRestarts", "eta_min"});
  check_error([&] { OneCycleLR(o, {.max_lr = INFINITY, .total_steps = 10}); }, {"OneCycleLR", "positive and finite"});
  check_error([&] { LinearLR(o, 1.5); }, {"LinearLR", "start_factor"});
  check_error([&] { LambdaLR(o, std::vector<LambdaLR::Lambda>{[](int64_t) { return 1.0; }}); },
              {"LambdaLR", "expected 2 lr_lambdas", "got 1"});
  check_error([&] { OneCycleLR(o, {.max_lr = 0.1}); }, {"OneCycleLR", "total_steps", "epochs"});
  check_error(
      [&] { OneCycleLR(o, {.max_lr = 0.1, .total_steps = 10, .anneal_strategy = "cosine"}); },
      {"OneCycleLR", "anneal_strategy", "cosine"});
  check_error([&] { OneCycleLR(o, {.max_lr = 0.1, .total_steps = 10, .pct_start = 1.5}); },
              {"OneCycleLR", "pct_start"});
  Tensor p = zeros({2}).requires_grad_();
  Adagrad adagrad({p}, {});
  check_error([&] { OneCycleLR(adagrad, {.max_lr = 0.1, .total_steps = 10}); },
              {"OneCycleLR", "Adagrad", "cycle_momentum = false"});
  Adam adam({p}, {});
  check_error([&] { OneCycleLR(adam, {.max_lr = 0.1, .total_steps = 10, .max_momentum = 1.5}); },
              {"OneCycleLR", "Adam's beta1", "in [0, 1)", "1.5"});
  OneCycleLR short_cycle(o, {.max_lr = 0.1, .total_steps = 3});
  for (int k = 0; k < 3; ++k) short_cycle.step();
  check_error([&] { short_cycle.step(); },
              {"OneCycleLR", "tried to step 5 times", "total steps is 3"});
  Setup other;
  auto foreign = std::make_shared<StepLR>(*other.opt, 3);
  auto mine = std::make_shared<StepLR>(o, 3);
  check_error(
      [&] {
        SequentialLR(o, {mine, foreign}, {3});
      },
      {"SequentialLR", "scheduler 1", "another optimizer"});
  check_error([&] { SequentialLR(o, {mine}, {3}); }, {"SequentialLR", "one milestone fewer"});
  check_error([&] { ConstantLR(o, 0.0); }, {"ConstantLR", "factor", "(0, 1]"});
  check_error([&] { ConstantLR(o, 0.5, -1); }, {"ConstantLR", "total_iters"});
  check_error([&] { PolynomialLR(o, 0); }, {"PolynomialLR", "total_iters must be positive"});
  check_error([&] { PolynomialLR(o, 5, -1); }, {"PolynomialLR", "power"});
  check_error([&] { CosineAnnealingWarmRestarts(o, 0); }, {"CosineAnnealingWarmRestarts", "T_0"});
  check_error([&] { CosineAnnealingWarmRestarts(o, 3, 0); }, {"CosineAnnealingWarmRestarts", "T_mult"});
  check_error([&] { MultiplicativeLR(o, std::vector<MultiplicativeLR::Lambda>{[](int64_t) { return 1.0; }}); },
              {"MultiplicativeLR", "expected 2 lr_lambdas", "got 1"});
  check_error([&] { CyclicLR(o, {.base_lr = 0.1, .max_lr = 0.05}); }, {"CyclicLR", "base_lr <= max_lr"});
  check_error([&] { CyclicLR(o, {.base_lr = 0.01, .max_lr = 0.1, .mode = "cosine"}); }, {"CyclicLR", "mode", "'cosine'"});
  check_error([&] { CyclicLR(o, {.base_lrs = {0.01}, .max_lr = 0.1}); }, {"CyclicLR", "base_lrs has 1 values", "2 param groups"});
  check_error([&] { CyclicLR(adagrad, {.base_lr = 0.01, .max_lr = 0.1}); }, {"CyclicLR", "no momentum", "cycle_momentum = false"});
  check_error([&] { ChainedScheduler({mine, foreign}); }, {"ChainedScheduler", "scheduler 1", "another optimizer"});
  check_error([&] { ChainedScheduler({}); }, {"ChainedScheduler", "no schedulers"});
  check_error([&] { WarmupLR(o, {.warmup_type = "cos"}); }, {"WarmupLR", "warmup_type", "'cos'"});
  check_error([&] { WarmupCosineLR(o, {.total_num_steps = 5, .warmup_num_steps = 10}); },
              {"WarmupCosineLR", "total_num_steps", "warmup_num_steps"});
  check_error([&] { WarmupDecayLR(o, {}); }, {"WarmupDecayLR", "total_num_steps"});
  StepLR step(o, 2);
  TensorDict missing = step.state_dict();
  TensorDict partial{{"last_epoch", missing.at("last_epoch")}};
  check_error([&] { step.load_state_dict(partial); }, {"StepLR", "lacks"});
  // Counters and rates a damaged file could hold; the scheduler is left as it was.
  TensorDict early = missing;
  early.set("last_epoch", scalar_tensor(int64_t{-10}));
  check_error([&] { step.load_state_dict(early); }, {"StepLR", "'last_epoch' is -10", "damaged"});
  TensorDict nan_lr = missing;
  std::vector<double> lrs = missing.at("base_lrs").to(kFloat64).to_vector<double>();
  lrs[0] = std::nan("");
  nan_lr.set("base_lrs", from_vector<double>(lrs));
  check_error([&] { step.load_state_dict(nan_lr); }, {"StepLR", "'base_lrs' holds nan", "damaged"});
  CHECK(step.state_dict().at("last_epoch").item<int64_t>() == missing.at("last_epoch").item<int64_t>());
}

namespace {

// The options of the fixture's "plateau" cases, as the generator gives them.
ReduceLROnPlateauOptions plateau_options(const std::string& id) {
  if (id == "min_rel") return {.factor = 0.5, .patience = 2, .threshold = 0.1};
  if (id == "min_abs_cooldown") {
    return {.factor = 0.3, .patience = 1, .threshold = 0.05, .threshold_mode = "abs", .cooldown = 2,
            .min_lrs = {0.01, 0.004}};
  }
  if (id == "max_rel") return {.mode = "max", .factor = 0.2, .patience = 1, .threshold = 0.02, .cooldown = 1};
  if (id == "max_abs_eps") {
    return {.mode = "max", .factor = 0.5, .patience = 0, .threshold = 0, .threshold_mode = "abs", .eps = 0.02};
  }
  if (id == "min_rel_negative") return {.factor = 0.5, .patience = 1, .threshold = 0.05, .min_lr = 0.02};
  if (id == "defaults") return {};
  FAIL("no plateau case " << id);
  return {};
}

}  // namespace

TEST_CASE("ReduceLROnPlateau gives PyTorch's lrs, best and counters at every step") {
  const auto& cases = OptimGolden::get().plateau;
  REQUIRE(cases.size() == 6);
  for (const auto& [id, series] : cases) {
    INFO("case " << id);
    Setup s;
    ReduceLROnPlateau sched(*s.opt, plateau_options(id));
    const std::vector<double>& metrics = series.at("metric");
    for (size_t k = 0; k < metrics.size(); ++k) {
      INFO("step " << k + 1 << ", metric " << metrics[k]);
      sched.step(metrics[k]);
      // Exact: each lr is a product of the factor and the lr, or a min_lr, as in Python.
      CHECK(s.opt->param_groups()[0].lr() == series.at("lr0")[k]);
      CHECK(s.opt->param_groups()[1].lr() == series.at("lr1")[k]);
      CHECK(sched.best() == series.at("best")[k]);
      CHECK(sched.num_bad_epochs() == static_cast<int64_t>(series.at("num_bad_epochs")[k]));
      CHECK(sched.cooldown_counter() == static_cast<int64_t>(series.at("cooldown_counter")[k]));
      CHECK(sched.last_epoch() == static_cast<int64_t>(k + 1));
      CHECK(sched.get_last_lr() == std::vector<double>{series.at("lr0")[k], series.at("lr1")[k]});
    }
  }
}

TEST_CASE("ReduceLROnPlateau resumed from its state_dict goes on as if never stopped") {
  const auto& series = OptimGolden::get().plateau.at("min_abs_cooldown");
  const std::vector<double>& metrics = series.at("metric");
  const ReduceLROnPlateauOptions options = plateau_options("min_abs_cooldown");
  for (size_t stop : {size_t{5}, size_t{6}, size_t{11}}) {  // mid-cooldown, cooldown start, after the NaN
    INFO("stopped after step " << stop);
    Setup first;
    ReduceLROnPlateau sched(*first.opt, options);
    for (size_t k = 0; k < stop; ++k) sched.step(metrics[k]);
    const TensorDict opt_state = first.opt->state_dict(), sched_state = sched.state_dict();

    Setup second;
    ReduceLROnPlateau resumed(*second.opt, options);
    second.opt->load_state_dict(opt_state);
    resumed.load_state_dict(sched_state);
    CHECK(resumed.get_last_lr() == sched.get_last_lr());
    for (size_t k = stop; k < metrics.size(); ++k) {
      resumed.step(metrics[k]);
      CHECK(second.opt->param_groups()[0].lr() == series.at("lr0")[k]);
      CHECK(second.opt->param_groups()[1].lr() == series.at("lr1")[k]);
      CHECK(resumed.cooldown_counter() == static_cast<int64_t>(series.at("cooldown_counter")[k]));
    }
  }
}

TEST_CASE("ReduceLROnPlateau takes a one-element tensor as its metric") {
  Setup a, b;
  ReduceLROnPlateau by_value(*a.opt, {.patience = 0}), by_tensor(*b.opt, {.patience = 0});
  for (double m : {3.0, 2.0, 2.5, 2.5, 1.0}) {
    by_value.step(m);
    by_tensor.step(full({1}, m));  // float32 on the way: 2.5 and 1.0 are exact
    CHECK(by_tensor.get_last_lr() == by_value.get_last_lr());
  }
  CHECK(by_value.get_last_lr()[0] == 0.1 * 0.1 * 0.1);
  check_error([&] { by_tensor.step(full({2}, 1.0)); }, {"ReduceLROnPlateau.step", "one element", "[2]"});
  check_error([&] { by_tensor.step(Tensor()); }, {"ReduceLROnPlateau.step", "undefined"});
}

TEST_CASE("ReduceLROnPlateau: bad options, groups and state dicts are Errors that name the problem") {
  Setup s;
  Optimizer& o = *s.opt;
  check_error([&] { ReduceLROnPlateau(o, {.mode = "minimum"}); }, {"ReduceLROnPlateau", "mode", "minimum"});
  check_error([&] { ReduceLROnPlateau(o, {.threshold_mode = "relative"}); },
              {"ReduceLROnPlateau", "threshold_mode", "relative"});
  check_error([&] { ReduceLROnPlateau(o, {.factor = 1.0}); }, {"ReduceLROnPlateau", "factor", "[0, 1)"});
  check_error([&] { ReduceLROnPlateau(o, {.factor = -0.5}); }, {"ReduceLROnPlateau", "factor"});
  check_error([&] { ReduceLROnPlateau(o, {.patience = -1}); }, {"ReduceLROnPlateau", "patience"});
  check_error([&] { ReduceLROnPlateau(o, {.cooldown = -2}); }, {"ReduceLROnPlateau", "cooldown"});
  check_error([&] { ReduceLROnPlateau(o, {.threshold = std::nan("")}); }, {"ReduceLROnPlateau", "threshold"});
  check_error([&] { ReduceLROnPlateau(o, {.min_lr = -1e-3}); }, {"ReduceLROnPlateau", "min_lr"});
  check_error([&] { ReduceLROnPlateau(o, {.min_lrs = {0.1}}); },
              {"ReduceLROnPlateau", "min_lrs has 1 values", "2 param groups"});

  ReduceLROnPlateau sched(o, {.patience = 1});
  check_error([&] { sched.get_last_lr(); }, {"ReduceLROnPlateau", "before the first step"});
  CHECK(sched.state_dict().at("last_lr").numel() == 0);
  sched.step(1.0);
  sched.step(2.0);
  const TensorDict good = sched.state_dict();
  TensorDict missing;
  for (const auto& [key, t] : good) {
    if (key != "best") missing.insert(key, t);
  }
  check_error([&] { sched.load_state_dict(missing); }, {"ReduceLROnPlateau.load_state_dict", "lacks 'best'"});
  TensorDict negative = good;
  negative.set("num_bad_epochs", scalar_tensor(int64_t{-3}));
  check_error([&] { sched.load_state_dict(negative); }, {"ReduceLROnPlateau.load_state_dict", "damaged"});
  TensorDict long_cooldown = good;
  long_cooldown.set("cooldown_counter", scalar_tensor(int64_t{4}));  // this one's cooldown is 0
  check_error([&] { sched.load_state_dict(long_cooldown); }, {"ReduceLROnPlateau.load_state_dict", "other options"});
  TensorDict one_lr = good;
  one_lr.set("last_lr", from_vector<double>({0.1}));
  check_error([&] { sched.load_state_dict(one_lr); }, {"'last_lr' has 1 values", "2 groups"});
  CHECK(sched.num_bad_epochs() == 1);  // nothing taken from the damaged dicts
  CHECK(sched.best() == 1.0);

  Tensor extra = zeros({2}).requires_grad_();
  static_cast<SGD&>(o).add_param_group({extra}, {.lr = 0.2});
  check_error([&] { sched.step(0.5); }, {"ReduceLROnPlateau", "3 parameter groups", "made for 2"});
  CHECK(sched.last_epoch() == 2);
}
