// tests/optim/test_grad_scaler.cpp: GradScaler (optim/grad_scaler.h) on injected overflows: the
// skipped step leaves the parameters and the optimizer state alone and is counted; the scale over
// steps follows DeepSpeed's DynamicLossScaler (the expected sequences were made by running
// DeepSpeed's update_scale, deepspeed/runtime/fp16/loss_scaler.py, on the same overflow pattern),
// with and without consecutive_hysteresis, clamped at min_loss_scale or stopping there; static
// scaling; unscaling; the state_dict round trip; a disabled scaler; the Errors; and under float16
// autocast, a loss computed outside the scope (float16, so its gradient, the scale, overflows).
#include <cmath>
#include <limits>
#include <tuple>

#include "support.h"

using namespace kiln;
using optim::GradScaler;
using optim::GradScalerOptions;

namespace {

const double kInf = std::numeric_limits<double>::infinity();

// A parameter, Adam over it, and one training iteration with an optional overflow put into the
// gradient after the backward (as an fp16 backward that overflowed would leave it).
struct Rig {
  Tensor p = test::sample({6}).requires_grad_();
  Tensor c = test::sample({6}, kFloat32, 1.5);  // d loss / d p
  optim::Adam opt{{p}, {.lr = 0.1}};

  // Returns whether the optimizer stepped.
  bool iteration(GradScaler& scaler, double inject = 0) {
    opt.zero_grad();
    Tensor loss = (p * c).sum();
    scaler.scale(loss).backward();
    if (inject != 0) {
      NoGradGuard no_grad;
      p.grad().narrow(0, 2, 1).fill_(inject);
    }
    bool stepped = scaler.step(opt);
    scaler.update();
    return stepped;
  }
};

GradScalerOptions small_window(bool consecutive = false) {
  return {.initial_scale_power = 4, .loss_scale_window = 3, .hysteresis = 2, .consecutive_hysteresis = consecutive,
          .min_loss_scale = 2, .raise_error_at_min_scale = false};
}

}  // namespace

TEST_CASE("GradScaler: an overflow skips the step, leaves params and state alone, and counts", "[optim][amp]") {
  Rig rig;
  GradScaler scaler(small_window());
  CHECK(scaler.get_scale() == 16);
  REQUIRE(rig.iteration(scaler));  // a good step: Adam has state now
  // The optimizer read unscaled gradients: exactly c (the scale is a power of two).
  test::check_equal(rig.p.grad(), rig.c);
  const Tensor p_before = rig.p.detach().clone();
  const optim::ParamState& st = *rig.opt.find_state(rig.p);
  const Tensor m_before = st.buffers.at("exp_avg").clone(), v_before = st.buffers.at("exp_avg_sq").clone();
  for (double bad : {kInf, -kInf, std::nan("")}) {
    INFO("injected " << bad);
    const int64_t skipped = scaler.skipped_steps();
    CHECK_FALSE(rig.iteration(scaler, bad));
    CHECK(scaler.skipped_steps() == skipped + 1);
    test::check_equal(rig.p.detach(), p_before);
    CHECK(st.step == 1);
    test::check_equal(st.buffers.at("exp_avg"), m_before);
    test::check_equal(st.buffers.at("exp_avg_sq"), v_before);
  }
  CHECK(rig.iteration(scaler));  // and training goes on
  CHECK(st.step == 2);
  CHECK_FALSE(rig.p.detach().eq(p_before).all().item<bool>());
}

TEST_CASE("GradScaler: the scale over steps follows DeepSpeed's rule (window 3, hysteresis 2, min 2)",
          "[optim][amp]") {
  // Overflow pattern and, after each update(), DeepSpeed's (scale, cur_hysteresis):
  //   good x2: 16; the 3rd good step completes a window: 32.  Overflow: hysteresis 2 -> 1, scale
  //   stays.  Good: the window restarts at the overflow, hysteresis is not refilled.  Overflow:
  //   hysteresis is 1, so 32 -> 16; then every overflow halves: 8, 4, 2 = min.  Three good steps
  //   after the last overflow: 4, hysteresis back to 2; three more: 8.
  const char* pattern = "FFFTFTTTTFFFFFF";
  const double scales[] = {16, 16, 32, 32, 32, 16, 8, 4, 2, 2, 2, 4, 4, 4, 8};
  const int hysteresis[] = {2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2};
  Rig rig;
  GradScaler scaler(small_window());
  int64_t skipped = 0;
  for (int i = 0; pattern[i]; ++i) {
    INFO("iteration " << i << " (" << pattern[i] << ")");
    const bool overflow = pattern[i] == 'T';
    const bool stepped = rig.iteration(scaler, overflow ? kInf : 0);
    CHECK(stepped == !overflow);
    if (!overflow) test::check_equal(rig.p.grad(), rig.c);  // unscaled by the scale it was scaled with
    skipped += overflow;
    CHECK(scaler.get_scale() == scales[i]);
    CHECK(scaler.cur_hysteresis() == hysteresis[i]);
    CHECK(scaler.skipped_steps() == skipped);
  }
}

TEST_CASE("GradScaler: consecutive_hysteresis refills the hysteresis after every good step", "[optim][amp]") {
  // Same pattern; DeepSpeed with consecutive_hysteresis = true: the good step after the first
  // overflow refills the hysteresis, so the second overflow does not halve.
  const char* pattern = "FFFTFTTTTFFFFFF";
  const double scales[] = {16, 16, 32, 32, 32, 32, 16, 8, 4, 4, 4, 8, 8, 8, 16};
  const int hysteresis[] = {2, 2, 2, 1, 2, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2};
  Rig rig;
  GradScaler scaler(small_window(/*consecutive=*/true));
  for (int i = 0; pattern[i]; ++i) {
    INFO("iteration " << i << " (" << pattern[i] << ")");
    rig.iteration(scaler, pattern[i] == 'T' ? kInf : 0);
    CHECK(scaler.get_scale() == scales[i]);
    CHECK(scaler.cur_hysteresis() == hysteresis[i]);
  }
}

TEST_CASE("GradScaler: never below min_loss_scale, at the minimum an overflow is an Error by default",
          "[optim][amp]") {
  {
    Rig rig;
    GradScalerOptions o = small_window();
    o.hysteresis = 1;
    o.min_loss_scale = 3;  // not a power of two: 16 -> 8 -> 4 -> max(2, 3) = 3
    GradScaler scaler(o);
    const double expected[] = {8, 4, 3, 3, 3};
    for (double e : expected) {
      CHECK_FALSE(rig.iteration(scaler, kInf));
      CHECK(scaler.get_scale() == e);
    }
    CHECK(scaler.skipped_steps() == 5);
  }
  {
    Rig rig;
    GradScaler scaler({.initial_scale_power = 2, .hysteresis = 1, .min_loss_scale = 2});  // raise (default)
    rig.iteration(scaler, kInf);
    CHECK(scaler.get_scale() == 2);
    rig.opt.zero_grad();
    scaler.scale((rig.p * rig.c).sum()).backward();
    {
      NoGradGuard no_grad;
      rig.p.grad().fill_(kInf);
    }
    CHECK_FALSE(scaler.step(rig.opt));
    test::check_error([&] { scaler.update(); }, {"overflowed at the minimum loss scale 2", "raise_error_at_min_scale"});
  }
}

TEST_CASE("GradScaler: static scaling keeps its scale, still skips steps with inf/NaN", "[optim][amp]") {
  Rig rig;
  GradScaler scaler({.loss_scale = 128});
  CHECK_FALSE(scaler.is_dynamic());
  for (const char* pattern = "FTTFFFFT"; *pattern; ++pattern) {
    const bool overflow = *pattern == 'T';
    CHECK(rig.iteration(scaler, overflow ? kInf : 0) == !overflow);
    CHECK(scaler.get_scale() == 128);
    if (!overflow) test::check_equal(rig.p.grad(), rig.c);
  }
  CHECK(scaler.skipped_steps() == 3);
  // The scaled loss is loss * 128, in float32 for a 16-bit loss.
  Tensor half_loss = scalar_tensor(1.5, kFloat16);
  CHECK(scaler.scale(half_loss).dtype() == kFloat32);
  CHECK(scaler.scale(half_loss).item<double>() == 192);
}

TEST_CASE("GradScaler: unscale_ before clipping, float16 gradients, and the call-order Errors", "[optim][amp]") {
  Tensor p = test::sample({5}, kFloat16).requires_grad_();
  optim::SGD opt({p}, {.lr = 0.5});
  GradScaler scaler;  // 2^16
  // A loss whose gradient is 2^-20 (below float16's normal range, 2^-14): scaled by 2^16 it is
  // 2^-4 in the float16 backward, and unscaled back to 2^-20 (a float16 subnormal, exact).
  Tensor loss = (p.to(kFloat32) * std::ldexp(1.0, -20)).sum();
  scaler.scale(loss).backward();
  test::check_equal(p.grad(), full({5}, std::ldexp(1.0, -4), kFloat16));
  scaler.unscale_(opt);
  test::check_equal(p.grad(), full({5}, std::ldexp(1.0, -20), kFloat16));
  // Clipping after unscale_ sees the true gradients: norm sqrt(5) 2^-20, not 2^16 times that.
  const Tensor total = nn::utils::clip_grad_norm_({p}, 1.0);
  CHECK(total.to(kFloat64).item<double>() == Approx(std::sqrt(5.0) * std::ldexp(1.0, -20)).epsilon(0.05));
  test::check_error([&] { scaler.unscale_(opt); }, {"unscale_: already called", "since the last update()"});
  const Tensor before = p.detach().clone();
  CHECK(scaler.step(opt));  // does not unscale a second time
  test::check_equal(p.detach(), (before.to(kFloat32) - 0.5 * std::ldexp(1.0, -20)).to(kFloat16));
  test::check_error([&] { scaler.step(opt); }, {"step: already called"});
  scaler.update();
  test::check_error([&] { scaler.update(); }, {"no inf checks were recorded"});
  // A float16 gradient that overflowed is found (the sum runs in float32).
  opt.zero_grad();
  scaler.scale((p.to(kFloat32) * 1e6).sum()).backward();  // 1e6 * 2^16 > 65504: inf in float16
  CHECK(std::isinf(p.grad().to(kFloat32).abs().max().item<double>()));
  CHECK_FALSE(scaler.step(opt));
  scaler.update();
  // No gradient at all (backward never ran): an Error, as PyTorch's "No inf checks were recorded
  // for this optimizer"; it was a "step" of nothing that returned true.
  opt.zero_grad();
  const int64_t skipped = scaler.skipped_steps();
  test::check_error([&] { scaler.step(opt); }, {"GradScaler.step", "has a gradient", "backward() before step"});
  CHECK(scaler.skipped_steps() == skipped);
}

TEST_CASE("GradScaler: state_dict round trip resumes the same scale sequence", "[optim][amp]") {
  Rig a;
  GradScaler first(small_window());
  for (char f : std::string("FFFTF")) a.iteration(first, f == 'T' ? kInf : 0);
  const TensorDict saved = first.state_dict();
  CHECK(saved.at("scale").item<double>() == 32);
  CHECK(saved.at("cur_hysteresis").item<int64_t>() == 1);
  CHECK(saved.at("skipped_steps").item<int64_t>() == 1);
  CHECK(saved.at("loss_scale_window").item<int64_t>() == 3);

  GradScaler second;  // defaults: everything comes from the dict
  second.load_state_dict(saved);
  Rig b;
  for (char f : std::string("TTFFFFT")) {
    a.iteration(first, f == 'T' ? kInf : 0);
    b.iteration(second, f == 'T' ? kInf : 0);
    CHECK(second.get_scale() == first.get_scale());
    CHECK(second.cur_hysteresis() == first.cur_hysteresis());
    CHECK(second.skipped_steps() == first.skipped_steps());
  }
  // Errors: unknown and missing entries, an empty dict (from a disabled scaler).
  TensorDict extra = saved;
  extra.insert("growth_tracker", scalar_tensor(0));
  test::check_error([&] { GradScaler().load_state_dict(extra); }, {"unexpected entry 'growth_tracker'"});
  TensorDict missing;
  for (const auto& [k, t] : saved)
    if (k != "scale") missing.insert(k, t);
  test::check_error([&] { GradScaler().load_state_dict(missing); }, {"lacks 'scale'"});
  GradScaler disabled({.enabled = false});
  CHECK(disabled.state_dict().size() == 0);
  test::check_error([&] { GradScaler().load_state_dict(disabled.state_dict()); }, {"state dict is empty"});
  // Values the constructor would refuse: an Error naming the entry, and the scaler unchanged (a
  // loss_scale_window of 0 used to divide by zero in update()).
  const std::vector<std::tuple<std::string, double, std::string>> bad = {
      {"loss_scale_window", 0, ">= 1"},         {"scale", 0, "positive finite"},
      {"scale", std::nan(""), "positive finite"}, {"scale_factor", 0.5, "> 1"},
      {"hysteresis", -3, ">= 1"},                 {"cur_hysteresis", 0, "in [1, hysteresis]"},
      {"min_loss_scale", -1, "positive finite"},  {"skipped_steps", -1, ">= 0"},
      {"last_overflow_iter", 1e6, "in [-1, cur_iter]"}, {"dynamic", 7, "0 or 1"}};
  for (const auto& [key, value, rule] : bad) {
    INFO(key << " = " << value);
    TensorDict damaged;
    for (const auto& [k, t] : saved) damaged.insert(k, k == key ? scalar_tensor(value, t.dtype()) : t);
    GradScaler target;
    test::check_error([&] { target.load_state_dict(damaged); }, {"'" + key + "'", rule, "damaged"});
    CHECK(target.get_scale() == 65536);
  }
  // A count saved as a floating number must be whole (2.5 was read as 2), and cur_iter leaves room
  // to count on (INT64_MAX overflowed at the next step).
  for (const auto& [key, value, rule] : std::vector<std::tuple<std::string, Tensor, std::string>>{
           {"hysteresis", scalar_tensor(2.5, kFloat64), "is 2.5, but it must be a whole number"},
           {"cur_iter", scalar_tensor(std::numeric_limits<int64_t>::max(), kInt64), "in [0, 2^62)"}}) {
    INFO(key);
    TensorDict damaged;
    for (const auto& [k, t] : saved) damaged.insert(k, k == key ? value : t);
    GradScaler target;
    test::check_error([&] { target.load_state_dict(damaged); }, {"'" + key + "'", rule, "damaged"});
  }
  TensorDict whole;  // a whole number saved as float64 is read
  for (const auto& [k, t] : saved) whole.insert(k, k == "hysteresis" ? scalar_tensor(2.0, kFloat64) : t);
  GradScaler target;
  target.load_state_dict(whole);
  CHECK(target.get_scale() == saved.at("scale").item<double>());
}

TEST_CASE("GradScaler: disabled, it does nothing and always steps", "[optim][amp]") {
  Rig rig;
  GradScaler scaler({.enabled = false});
  CHECK(scaler.get_scale() == 1);
  Tensor loss = (rig.p * rig.c).sum();
  CHECK(scaler.scale(loss).is_same(loss));
  CHECK(rig.iteration(scaler, kInf));  // even with inf: a disabled scaler is a plain step
  CHECK(scaler.skipped_steps() == 0);
}

TEST_CASE("GradScaler: bad options are Errors", "[optim][amp]") {
  test::check_error([] { GradScaler({.loss_scale = -1}); }, {"loss_scale must be 0 (dynamic)"});
  test::check_error([] { GradScaler({.loss_scale_window = 0}); }, {"loss_scale_window must be >= 1"});
  test::check_error([] { GradScaler({.hysteresis = 0}); }, {"hysteresis must be >= 1"});
  test::check_error([] { GradScaler({.initial_scale_power = 2, .min_loss_scale = 8}); },
                    {"initial scale 2^2 = 4 is below min_loss_scale 8"});
  // What load_state_dict would refuse as damaged is refused here first.
  test::check_error([] { GradScaler({.scale_factor = kInf}); }, {"scale_factor must be a finite number > 1", "inf"});
  test::check_error([] { GradScaler({.loss_scale = 8, .min_loss_scale = kInf}); },
                    {"min_loss_scale must be a finite number > 0"});
}

TEST_CASE("GradScaler: finite gradients whose sum overflows float32 step, the scale never grows to inf",
          "[optim][amp]") {
  // Each element is finite, their float32 sum is not: PyTorch checks elements, and so does the step.
  Tensor w = ones({2}).requires_grad_();
  optim::SGD opt({w}, {.lr = 1e-39});
  GradScaler scaler({.loss_scale = 1});
  (w * 3e38f).sum().backward();
  CHECK(scaler.step(opt));
  scaler.update();
  CHECK(scaler.skipped_steps() == 0);
  // An inf among them is still found.
  opt.zero_grad();
  (w * 3e38f).sum().backward();
  {
    NoGradGuard no_grad;
    w.grad().narrow(0, 1, 1).fill_(kInf);
  }
  CHECK_FALSE(scaler.step(opt));
  scaler.update();
  // A float64 model with a huge factor: the scale stops below inf instead of reaching it and then
  // skipping every step.
  Tensor v = ones({2}, kFloat64).requires_grad_();
  optim::SGD sgd({v}, {.lr = 0.0});
  GradScaler growing({.initial_scale_power = 64, .loss_scale_window = 1, .scale_factor = 1e200});
  for (int i = 0; i < 4; ++i) {
    sgd.zero_grad();
    growing.scale((v * v).sum()).backward();
    CHECK(growing.step(sgd));
    growing.update();
    CHECK(std::isfinite(growing.get_scale()));
  }
  CHECK(growing.get_scale() == Approx(std::ldexp(1.0, 64) * 1e200));
}

TEST_CASE("GradScaler: a float16 loss's gradient is the scale itself, past float16 at 2^16, and steps resume at 2^15",
          "[optim][amp]") {
  // Under float16 autocast on the CPU: a loss computed inside the scope is float32 (the policy for
  // losses), and the default scale of 2^16 steps at once. Computed outside from the float16 logits,
  // the loss is float16, and backward's first gradient, 2^16, is past float16's 65504: every
  // gradient is inf or NaN, the scaler skips (hysteresis 2: twice), halves the scale, and the third
  // step goes through with finite gradients.
  Generator data(3);
  const Tensor x = randn({4, 16}, kFloat32, &data), y = randint(0, 8, {4}, kInt64, &data);
  for (bool loss_inside : {true, false}) {
    INFO("loss computed " << (loss_inside ? "inside" : "outside") << " autocast");
    manual_seed(7);
    test::NormNet net(16, 32, 8);
    optim::SGD opt(net.parameters(), {.lr = 0.01});
    GradScaler scaler;
    std::vector<bool> stepped;
    for (int step = 0; step < 3; ++step) {
      opt.zero_grad();
      Tensor loss, logits;
      {
        AutocastGuard ac(Device::cpu(), kFloat16);
        logits = net.forward(x);
        if (loss_inside) loss = nn::cross_entropy(logits, y);
      }
      if (!loss_inside) loss = nn::cross_entropy(logits, y);
      CHECK(loss.dtype() == (loss_inside ? kFloat32 : kFloat16));
      scaler.scale(loss).backward();
      const bool finite = net.f1.weight.grad().isfinite().all().item<bool>();
      stepped.push_back(scaler.step(opt));
      CHECK(finite == stepped.back());
      scaler.update();
    }
    if (loss_inside) {
      CHECK(stepped == std::vector<bool>{true, true, true});
      CHECK(scaler.get_scale() == 65536);
    } else {
      CHECK(stepped == std::vector<bool>{false, false, true});
      CHECK(scaler.get_scale() == 32768);
      CHECK(scaler.skipped_steps() == 2);
    }
  }
}
