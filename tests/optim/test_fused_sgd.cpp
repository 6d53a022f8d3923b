// tests/optim/test_fused_sgd.cpp: SGD with fused = true (kiln::fused_sgd_, cpu/optim.cpp) against
// the unfused step, over every option of the rule, float32 and float64, at sizes that split over
// the pool; parameters that are skipped or take the unfused path; state_dict; fused_sgd_'s Errors.
// The PyTorch trajectories with fused = true are in test_optimizers.cpp.
#include <algorithm>

#include "support.h"

using namespace kiln;
using namespace kiln::test;

namespace {

const std::vector<Shape> kShapes = {{1}, {7}, {1023}, {40000}, {33, 5}};

Tolerance tolerance_of(DType dtype) {
  return dtype == kFloat64 ? Tolerance{1e-12, 1e-12} : Tolerance{1e-6, 1e-6};
}

// Steps a fused and an unfused SGD over copies of the same params with the same grads, and checks
// params and momentum buffers after every step. A param listed in late_grad gets its first grad at
// the second step (its buffer starts then, beside buffers already running).
void check_fused_equals_unfused(optim::SGDOptions options, DType dtype,
                                const std::vector<size_t>& late_grad = {}) {
  std::vector<Tensor> fused_params, plain_params;
  for (size_t i = 0; i < kShapes.size(); ++i) {
    Tensor p = sample(kShapes[i], dtype, 0.3 * i);
    fused_params.push_back(p.clone().requires_grad_());
    plain_params.push_back(p.clone().requires_grad_());
  }
  optim::SGDOptions plain_options = options;
  options.fused = true;
  optim::SGD fused(fused_params, options), plain(plain_params, plain_options);
  for (int step = 0; step < 4; ++step) {
    for (size_t i = 0; i < kShapes.size(); ++i) {
      const bool late = std::find(late_grad.begin(), late_grad.end(), i) != late_grad.end();
      if (step == 0 && late) continue;
      Tensor g = sample(kShapes[i], dtype, 1.0 + step + 0.1 * i);
      fused_params[i].set_grad(g.clone());
      plain_params[i].set_grad(g);
    }
    fused.step();
    plain.step();
    for (size_t i = 0; i < kShapes.size(); ++i) {
      INFO("step " << step + 1 << ", param " << i << " " << kShapes[i].str());
      check_close(fused_params[i].detach(), plain_params[i].detach(), tolerance_of(dtype));
      const optim::ParamState* fs = fused.find_state(fused_params[i]);
      const optim::ParamState* ps = plain.find_state(plain_params[i]);
      REQUIRE((fs == nullptr) == (ps == nullptr));
      if (ps == nullptr) continue;
      REQUIRE(fs->buffers.size() == ps->buffers.size());
      if (const Tensor* pb = ps->buffers.find("momentum_buffer")) {
        const Tensor* fb = fs->buffers.find("momentum_buffer");
        REQUIRE(fb != nullptr);
        CHECK(fb->dtype() == dtype);
        CHECK(!fb->requires_grad());
        check_close(*fb, *pb, tolerance_of(dtype));
      }
    }
  }
}

}  // namespace

TEST_CASE(
    "fused SGD equals the unfused step (momentum, dampening, Nesterov, weight decay, maximize)",
    "[optim][fused]") {
  ThreadsGuard threads(2);  // 40000 elements: two pieces of the pool
  const std::vector<std::pair<const char*, optim::SGDOptions>> cases = {
      {"plain", {.lr = 0.1}},
      {"weight decay, maximize", {.lr = 0.1, .weight_decay = 0.01, .maximize = true}},
      {"momentum", {.lr = 0.1, .momentum = 0.9}},
      {"momentum, dampening, weight decay",
       {.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01}},
      {"Nesterov, weight decay",
       {.lr = 0.05, .momentum = 0.9, .weight_decay = 0.1, .nesterov = true}},
      {"Nesterov, maximize", {.lr = 0.05, .momentum = 0.9, .nesterov = true, .maximize = true}},
      {"everything but Nesterov",
       {.lr = 0.02, .momentum = 0.5, .dampening = 0.5, .weight_decay = 0.05, .maximize = true}},
  };
  for (DType dtype : {kFloat32, kFloat64}) {
    for (const auto& [name, options] : cases) {
      INFO(dtype_name(dtype) << ": " << name);
      check_fused_equals_unfused(options, dtype);
      // Params 1 and 3 start their buffers a step late: two batches, new buffers and running ones.
      check_fused_equals_unfused(options, dtype, {1, 3});
    }
  }
}

TEST_CASE("fused SGD skips params without grad, the others take the unfused path where they must",
          "[optim][fused]") {
  Tensor a = sample({5}).requires_grad_();
  Tensor b = sample({4}, kFloat32, 2.0).requires_grad_();
  Tensor b0 = b.detach().clone();
  optim::SGD opt({a, b}, {.lr = 0.1, .momentum = 0.9, .fused = true});
  const uint64_t version = a._version();
  a.set_grad(ones({5}));
  opt.step();
  check_equal(b.detach(), b0);
  CHECK(opt.find_state(b) == nullptr);
  REQUIRE(opt.find_state(a) != nullptr);
  check_equal(opt.state(a).buffers.at("momentum_buffer"), ones({5}));
  CHECK(a._version() > version);

  // A non-contiguous param (unfused path) and a non-contiguous grad (made contiguous for the fused
  // kernel), in one fused optimizer beside ordinary params: each equals the unfused step.
  Tensor base = sample({6, 4}, kFloat64, 0.7);
  auto make = [&] {
    return std::vector<Tensor>{
        base.t().contiguous().t().detach().requires_grad_(),  // (6, 4), strides (1, 6)
        sample({4, 6}, kFloat64, 0.2).requires_grad_(), sample({3}, kFloat64, 0.9).requires_grad_(),
        sample({8}, kFloat64, 1.1).requires_grad_()};
  };
  std::vector<Tensor> fused_params = make(), plain_params = make();
  REQUIRE(!fused_params[0].is_contiguous());
  optim::SGD fused(fused_params, {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .fused = true});
  optim::SGD plain(plain_params, {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01});
  for (int step = 0; step < 3; ++step) {
    const std::vector<Tensor> grads = {
        sample({6, 4}, kFloat64, step), sample({6, 4}, kFloat64, step + 0.5).t(),
        sample({3}, kFloat64, step + 0.25), sample({8}, kFloat64, step + 0.75)};
    for (size_t i = 0; i < grads.size(); ++i) {
      fused_params[i].set_grad(grads[i].clone());
      plain_params[i].set_grad(grads[i].clone());
    }
    fused.step();
    plain.step();
  }
  for (size_t i = 0; i < fused_params.size(); ++i) {
    INFO("param " << i);
    check_close(fused_params[i].detach(), plain_params[i].detach(), {1e-12, 1e-12});
    check_close(fused.state(fused_params[i]).buffers.at("momentum_buffer"),
                plain.state(plain_params[i]).buffers.at("momentum_buffer"), {1e-12, 1e-12});
  }
}

TEST_CASE("fused SGD's state_dict has the unfused keys, and either one resumes the other",
          "[optim][fused]") {
  auto make = [] {
    return std::vector<Tensor>{sample({7}).requires_grad_(),
                               sample({3, 2}, kFloat32, 1.5).requires_grad_()};
  };
  std::vector<Tensor> fused_params = make(), plain_params = make();
  optim::SGD fused(fused_params, {.lr = 0.1, .momentum = 0.9, .nesterov = true, .fused = true});
  optim::SGD plain(plain_params, {.lr = 0.1, .momentum = 0.9, .nesterov = true});
  auto step_both = [&](double seed) {
    for (size_t i = 0; i < fused_params.size(); ++i) {
      Tensor g = sample(fused_params[i].sizes(), kFloat32, seed + i);
      fused_params[i].set_grad(g.clone());
      plain_params[i].set_grad(g);
    }
    fused.step();
    plain.step();
  };
  step_both(0.5);
  step_both(1.5);
  const TensorDict fused_dict = fused.state_dict(), plain_dict = plain.state_dict();
  CHECK(fused_dict.keys() == plain_dict.keys());
  CHECK(fused_dict.contains("state.0.momentum_buffer"));
  CHECK(fused_dict.at("param_groups.0.fused").item<double>() == 1);
  CHECK(plain_dict.at("param_groups.0.fused").item<double>() == 0);
  check_close(fused_dict.at("state.1.momentum_buffer"), plain_dict.at("state.1.momentum_buffer"),
              {1e-6, 1e-6});

  // Swap the states: each optimizer goes on from the other's buffers (and keeps its own `fused`).
  fused.load_state_dict(plain_dict);
  plain.load_state_dict(fused_dict);
  fused.param_groups()[0].set("fused", 1);
  plain.param_groups()[0].set("fused", 0);
  step_both(2.5);
  for (size_t i = 0; i < fused_params.size(); ++i) {
    INFO("param " << i);
    check_close(fused_params[i].detach(), plain_params[i].detach(), {1e-6, 1e-6});
  }
}

TEST_CASE("fused_sgd_ checks its lists: counts, shapes, dtypes, devices and layout",
          "[optim][fused]") {
  const Tensor p = sample({4}), g = sample({4}, kFloat32, 1.0), buf = zeros({4});
  const SgdStepArgs plain{.lr = 0.1}, momentum{.lr = 0.1, .momentum = 0.9};
  check_error([&] { fused_sgd_({p, p}, {g}, {}, plain); },
              {"fused_sgd_", "2 params", "1 grads", "one of each per param"});
  check_error([&] { fused_sgd_({p}, {g}, {}, momentum); },
              {"fused_sgd_", "0 momentum_buffers", "momentum 0.9"});
  check_error([&] { fused_sgd_({p}, {g}, {buf}, plain); },
              {"fused_sgd_", "1 momentum_buffers", "only with a nonzero momentum"});
  check_error([&] { fused_sgd_({p}, {sample({5})}, {}, plain); },
              {"fused_sgd_", "grads[0]", "shape [4]", "float32 [5]"});
  check_error([&] { fused_sgd_({p}, {g.to(kFloat64)}, {}, plain); },
              {"grads[0]", "float32 tensor", "got float64"});
  check_error([&] { fused_sgd_({p}, {g}, {zeros({4}, kFloat64)}, momentum); },
              {"momentum_buffers[0]", "float32 tensor", "got float64"});
  check_error([&] { fused_sgd_({p}, {g}, {Tensor()}, momentum); },
              {"momentum_buffers[0]", "an undefined tensor"});
  const Tensor strided = sample({4, 2}).select(1, 0);  // (4), stride 2
  check_error([&] { fused_sgd_({p}, {strided}, {}, plain); }, {"grads[0]", "not contiguous"});
  check_error([&] { fused_sgd_({p.to(kFloat16)}, {g.to(kFloat16)}, {}, plain); },
              {"fused_sgd_", "float32 or float64", "float16"});
  check_error([&] { fused_sgd_({zeros({4}, kInt64)}, {g}, {}, plain); },
              {"fused_sgd_", "float32 or float64", "int64"});
  // Nothing to do is no Error; the params are untouched.
  fused_sgd_({}, {}, {}, plain);
  Tensor q = p.clone();
  fused_sgd_({q}, {g}, {}, plain);
  check_close(q, p - g * 0.1, {1e-6, 1e-7});
}
