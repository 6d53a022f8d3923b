// tests/optim/test_master_weights.cpp: MasterWeights (optim/master_weights.h). Updates below
// bfloat16's resolution are lost by a plain optimizer on bf16 weights and kept by the float32
// masters (bit-equal to a float32 AdamW); a bf16 MLP trained with MasterWeights + AdamW against
// a float32 run whose weights are rounded to bf16 before each step; with a GradScaler on a float16
// model (unscaling in float32, a skipped step); schedulers; the state_dict round trip; Errors.
#include <cmath>
#include <limits>

#include "support.h"

using namespace kiln;
using optim::MasterWeights;

namespace {

MasterWeights::MakeOptimizer adamw(double lr, double weight_decay = 0) {
  return [=](std::vector<Tensor> masters) {
    return std::make_unique<optim::AdamW>(std::move(masters), optim::AdamWOptions{.lr = lr, .weight_decay = weight_decay});
  };
}

// x (N, 8) -> linear 8->16 -> tanh -> linear 16->4; params: w1 (16, 8), b1 (16), w2 (4, 16), b2 (4).
Tensor mlp(const std::vector<Tensor>& p, const Tensor& x) {
  return nn::linear(nn::linear(x, p[0], p[1]).tanh(), p[2], p[3]);
}
std::vector<Tensor> mlp_init(DType dtype) {
  std::vector<Tensor> p{test::sample({16, 8}, kFloat32, 0.1) * 0.4, test::sample({16}, kFloat32, 0.2) * 0.1,
                        test::sample({4, 16}, kFloat32, 0.3) * 0.3, test::sample({4}, kFloat32, 0.4) * 0.1};
  for (Tensor& t : p) t = t.to(dtype).requires_grad_();
  return p;
}

}  // namespace

TEST_CASE("MasterWeights: masters are float32, the model stays bfloat16, small updates accumulate",
          "[optim][amp]") {
  // loss = sum(p * c): the gradient is c whatever p is, so the float32 reference sees exactly the
  // gradients the bf16 model produces. lr = 1e-3 is below half a bf16 ulp of 1.0 (2^-9 = 0.00195).
  const Tensor c = test::sample({8}, kFloat32, 0.9).to(kBFloat16);
  const int steps = 10;

  // A plain AdamW on the bf16 weights: every update rounds away.
  Tensor plain = ones({8}, kBFloat16).requires_grad_();
  optim::AdamW plain_opt({plain}, {.lr = 1e-3, .weight_decay = 0});
  // MasterWeights over the same start, and the float32 reference.
  Tensor p = ones({8}, kBFloat16).requires_grad_();
  MasterWeights opt({p}, adamw(1e-3));
  Tensor ref = ones({8}).requires_grad_();
  optim::AdamW ref_opt({ref}, {.lr = 1e-3, .weight_decay = 0});
  for (int i = 0; i < steps; ++i) {
    for (Tensor* t : {&plain, &p}) (*t * c).sum().backward();
    (ref * c.to(kFloat32)).sum().backward();
    plain_opt.step();
    opt.step();
    ref_opt.step();
    plain_opt.zero_grad();
    opt.zero_grad();
    ref_opt.zero_grad();
  }
  test::check_equal(plain.detach(), ones({8}, kBFloat16));  // ten steps of 1e-3, all lost
  const Tensor& master = opt.master(p);
  CHECK(master.dtype() == kFloat32);
  CHECK(p.dtype() == kBFloat16);
  CHECK(opt.inner().find_state(master)->buffers.at("exp_avg").dtype() == kFloat32);
  test::check_equal(master.detach(), ref.detach());            // the same float32 AdamW, bit for bit
  test::check_equal(p.detach(), ref.detach().to(kBFloat16));   // the model: the masters rounded
  // The masters moved by about steps * lr = 0.01 (Adam's step is lr per unit-size gradient), which
  // the model now shows: 1 - 0.01 rounds to 0.98828125 or 0.9921875 in bf16, not 1.
  CHECK((master.detach() - 1).abs().max().item<double>() == Approx(0.01).margin(1e-4));
  CHECK_FALSE(p.detach().eq(1.0).any().item<bool>());
}

TEST_CASE("MasterWeights: a bf16 MLP with AdamW against a float32 run rounded to bf16 each step",
          "[optim][amp]") {
  // Reference: float32 masters stepped by AdamW; before each step the model's weights are the
  // masters rounded to bf16 (held in float32) and the forward and backward run in float32. The bf16
  // run differs only in the rounding of activations and gradients to 8 significant bits.
  const int steps = 8;
  const double lr = 1e-2;
  const Tensor x = test::sample({32, 8}, kFloat32, 0.6), y = test::sample({32, 4}, kFloat32, 0.8) * 0.5;

  std::vector<Tensor> model = mlp_init(kBFloat16);
  MasterWeights opt(model, adamw(lr, 0.01));
  std::vector<Tensor> masters = mlp_init(kFloat32);
  for (size_t i = 0; i < masters.size(); ++i) {
    NoGradGuard no_grad;
    masters[i].copy_(model[i]);  // the same start: the bf16 init, widened
  }
  optim::AdamW ref_opt(masters, {.lr = lr, .weight_decay = 0.01});

  for (int step = 0; step < steps; ++step) {
    INFO("step " << step);
    opt.zero_grad();
    Tensor loss = nn::mse_loss(mlp(model, x.to(kBFloat16)).to(kFloat32), y);
    loss.backward();
    opt.step();

    std::vector<Tensor> rounded;
    for (const Tensor& m : masters) rounded.push_back(m.detach().to(kBFloat16).to(kFloat32).requires_grad_());
    Tensor ref_loss = nn::mse_loss(mlp(rounded, x), y);
    ref_loss.backward();
    for (size_t i = 0; i < masters.size(); ++i) masters[i].set_grad(rounded[i].grad());
    ref_opt.step();

    CHECK(loss.item<double>() == Approx(ref_loss.item<double>()).epsilon(1.6e-2));
  }
  for (size_t i = 0; i < model.size(); ++i) {
    INFO("parameter " << i);
    CHECK(model[i].dtype() == kBFloat16);
    CHECK(opt.master(model[i]).dtype() == kFloat32);
    // An Adam step moves a weight by about lr whatever the gradient's size, so the rounding of a
    // small gradient can change a step by up to lr (its sign, at worst 2 lr). Measured: at most 0.4 lr
    // apart after 8 steps. Bound: the masters within one step (lr); the bf16 weights within that and
    // one bf16 rounding (rtol).
    test::check_close(opt.master(model[i]), masters[i].detach(), test::Tolerance{0, lr});
    test::check_close(model[i].detach().to(kFloat32), masters[i].detach().to(kBFloat16).to(kFloat32),
                      test::Tolerance{1.6e-2, lr});
  }
}

TEST_CASE("MasterWeights with a GradScaler: float16 model, unscaled in float32, skipped steps", "[optim][amp]") {
  // A gradient of 2^-26 is below float16's smallest subnormal (2^-24): without scaling it is 0.
  // Scaled by 2^16 it is 2^-10 in the float16 backward; MasterWeights copies it to float32, where
  // GradScaler unscales it back to exactly 2^-26.
  Tensor p = ones({4}, kFloat16).requires_grad_();
  MasterWeights opt({p}, [](std::vector<Tensor> m) {
    return std::make_unique<optim::SGD>(std::move(m), optim::SGDOptions{.lr = 1024});
  });
  optim::GradScaler scaler({.initial_scale_power = 16, .hysteresis = 1});
  auto loss_of = [&p] { return (p.to(kFloat32) * std::ldexp(1.0, -26)).sum(); };

  opt.zero_grad();
  scaler.scale(loss_of()).backward();
  test::check_equal(p.grad(), full({4}, std::ldexp(1.0, -10), kFloat16));
  scaler.unscale_(opt);
  const std::vector<Tensor> master_grads = opt.grads();
  REQUIRE(master_grads.size() == 1);
  CHECK(master_grads[0].dtype() == kFloat32);
  test::check_equal(master_grads[0], full({4}, std::ldexp(1.0, -26)));
  CHECK(scaler.step(opt));
  scaler.update();
  // SGD moved the master by 1024 * 2^-26 = 2^-16, too little for float16 at 1.0 (ulp 2^-10).
  test::check_equal(opt.master(p).detach(), full({4}, 1 - std::ldexp(1.0, -16)));
  test::check_equal(p.detach(), ones({4}, kFloat16));

  // An overflow: skipped, masters and model unchanged; the next iteration copies fresh gradients.
  const Tensor master_before = opt.master(p).detach().clone();
  opt.zero_grad();
  scaler.scale(loss_of()).backward();
  {
    NoGradGuard no_grad;
    p.grad().narrow(0, 1, 1).fill_(std::numeric_limits<double>::infinity());
  }
  CHECK_FALSE(scaler.step(opt));
  scaler.update();
  CHECK(scaler.get_scale() == 32768);
  test::check_equal(opt.master(p).detach(), master_before);
  opt.zero_grad();
  scaler.scale(loss_of()).backward();
  CHECK(scaler.step(opt));
  scaler.update();
  test::check_equal(opt.master(p).detach(), master_before - std::ldexp(1.0, -16));

  // Another overflow, then the grads cleared on the model (p.set_grad) instead of opt.zero_grad():
  // the next step must copy the new grads, not reuse the master grads that held the inf.
  const Tensor master_again = opt.master(p).detach().clone();
  scaler.scale(loss_of()).backward();
  {
    NoGradGuard no_grad;
    p.grad().narrow(0, 0, 1).fill_(std::numeric_limits<double>::infinity());
  }
  CHECK_FALSE(scaler.step(opt));
  scaler.update();
  p.set_grad(Tensor());
  scaler.scale(loss_of()).backward();
  CHECK(scaler.step(opt));
  scaler.update();
  test::check_equal(opt.master(p).detach(), master_again - std::ldexp(1.0, -16));
}

TEST_CASE("MasterWeights: float32 params are their own masters, schedulers reach the inner optimizer",
          "[optim][amp]") {
  Tensor half = test::sample({3}, kBFloat16).requires_grad_();
  Tensor full32 = test::sample({2}, kFloat32, 1).requires_grad_();
  MasterWeights opt({half, full32}, adamw(0.1));
  CHECK(opt.name() == "MasterWeights(AdamW)");
  CHECK(opt.master(full32).is_same(full32));
  CHECK_FALSE(opt.master(half).is_same(half));
  CHECK(opt.master_params().size() == 2);
  optim::StepLR sched(opt, 1, 0.5);
  for (int i = 0; i < 2; ++i) {
    opt.zero_grad();
    (half.to(kFloat32).sum() + full32.sum()).backward();
    opt.step();
    sched.step();
  }
  CHECK(opt.param_groups()[0].lr() == Approx(0.025));
  CHECK(opt.inner().param_groups()[0].lr() == Approx(0.05));  // pushed at the last step
  CHECK(opt.inner().find_state(full32)->step == 2);
}

TEST_CASE("MasterWeights: state_dict round trip resumes bit-identically", "[optim][amp]") {
  const Tensor x = test::sample({6, 8}, kFloat32, 0.6).to(kBFloat16);
  const Tensor y = test::sample({6, 4}, kFloat32, 0.8);
  auto train = [&](std::vector<Tensor>& model, MasterWeights& opt, int steps) {
    for (int i = 0; i < steps; ++i) {
      opt.zero_grad();
      nn::mse_loss(mlp(model, x).to(kFloat32), y).backward();
      opt.step();
    }
  };
  std::vector<Tensor> a = mlp_init(kBFloat16);
  MasterWeights opt_a(a, adamw(1e-2));
  train(a, opt_a, 3);
  const TensorDict saved = opt_a.state_dict();
  CHECK(saved.at("master.0").dtype() == kFloat32);
  CHECK(saved.at("state.0.exp_avg").dtype() == kFloat32);
  CHECK(saved.at("param_groups.0.lr").item<double>() == Approx(1e-2));

  std::vector<Tensor> b = mlp_init(kBFloat16);  // the initial weights; the dict brings the trained ones
  MasterWeights opt_b(b, adamw(1e-2));
  opt_b.load_state_dict(saved);
  for (size_t i = 0; i < a.size(); ++i) test::check_equal(b[i].detach(), a[i].detach());
  train(a, opt_a, 2);
  train(b, opt_b, 2);
  for (size_t i = 0; i < a.size(); ++i) {
    test::check_equal(b[i].detach(), a[i].detach());
    test::check_equal(opt_b.master(b[i]).detach(), opt_a.master(a[i]).detach());
  }
  TensorDict missing;
  for (const auto& [k, t] : saved)
    if (k != "master.2") missing.insert(k, t);
  test::check_error([&] { opt_b.load_state_dict(missing); }, {"lacks 'master.2'"});
}

TEST_CASE("MasterWeights: Errors", "[optim][amp]") {
  Tensor p = ones({2}, kBFloat16).requires_grad_();
  test::check_error([&] { MasterWeights({p}, nullptr); }, {"inner optimizer is empty"});
  Tensor stranger = ones({2}).requires_grad_();
  test::check_error([&] {
    MasterWeights({p}, [&](std::vector<Tensor>) {
      return std::make_unique<optim::SGD>(std::vector<Tensor>{stranger}, optim::SGDOptions{.lr = 0.1});
    });
  }, {"not one of the masters"});
  // A parameter given another shape by set_data after the masters were made: named, where it was
  // copy_'s "shapes [2] and [5] cannot be broadcast".
  MasterWeights mw({p}, [](std::vector<Tensor> masters) {
    return std::make_unique<optim::SGD>(std::move(masters), optim::SGDOptions{.lr = 0.1});
  });
  p.set_data(ones({5}, kBFloat16));
  p.set_grad(ones({5}, kBFloat16));
  test::check_error([&] { mw.step(); }, {"MasterWeights(SGD): parameter 0 has shape [5] but its float32 master [2]",
                                         "set_data"});
}
