// nn/init.cpp: see nn/init.h. Draws are made with the random factories of ops/ and copied in.
#include "nn/init.h"

#include <cmath>

#include "core/grad_mode.h"
#include "ops/ops.h"

namespace kiln::nn::init {

namespace {

void check_floating(const Tensor& t, const char* op) {
  KILN_CHECK(t.defined() && t.is_floating_point(), "nn::init::{}: needs a defined floating tensor, got {}", op,
             t.defined() ? dtype_name(t.dtype()) : "an undefined tensor");
}

int64_t fan(const Tensor& t, const std::string& mode, const char* op) {
  Fans f = calculate_fan_in_and_fan_out(t);
  if (mode == "fan_in") return f.fan_in;
  if (mode == "fan_out") return f.fan_out;
  KILN_FAIL("nn::init::{}: mode '{}' is not 'fan_in' or 'fan_out'", op, mode);
}

}  // namespace

double calculate_gain(const std::string& nonlinearity, std::optional<double> param) {
  if (nonlinearity == "linear" || nonlinearity == "conv1d" || nonlinearity == "conv2d" ||
      nonlinearity == "conv3d" || nonlinearity == "conv_transpose1d" || nonlinearity == "conv_transpose2d" ||
      nonlinearity == "conv_transpose3d" || nonlinearity == "sigmoid") {
    return 1;
  }
  if (nonlinearity == "tanh") return 5.0 / 3;
  if (nonlinearity == "relu") return std::sqrt(2.0);
  if (nonlinearity == "leaky_relu") {
    double slope = param.value_or(0.01);
    return std::sqrt(2.0 / (1 + slope * slope));
  }
  if (nonlinearity == "selu") return 3.0 / 4;
  KILN_FAIL("nn::init::calculate_gain: unsupported nonlinearity '{}' (linear, conv*, sigmoid, tanh, relu, "
            "leaky_relu, selu)", nonlinearity);
}

Fans calculate_fan_in_and_fan_out(const Tensor& t) {
  KILN_CHECK(t.dim() >= 2,
             "nn::init: fan in and fan out cannot be computed for a tensor of fewer than 2 dimensions "
             "(shape {})", t.sizes().str());
  int64_t receptive = 1;
  for (int d = 2; d < t.dim(); ++d) receptive *= t.size(d);
  return {t.size(1) * receptive, t.size(0) * receptive};
}

Tensor& uniform_(Tensor& t, double a, double b, Generator* gen) {
  check_floating(t, "uniform_");
  NoGradGuard no_grad;
  // Drawn in float64 and rounded once, so the bounds hold in the tensor's dtype as well.
  Tensor u = rand(t.sizes(), TensorOptions(kFloat64).device(t.device()), gen);
  t.copy_(u * (b - a) + a);
  return t;
}

Tensor& normal_(Tensor& t, double mean, double std, Generator* gen) {
  check_floating(t, "normal_");
  NoGradGuard no_grad;
  t.copy_(randn(t.sizes(), TensorOptions(kFloat64).device(t.device()), gen) * std + mean);
  return t;
}

Tensor& trunc_normal_(Tensor& t, double mean, double std, double a, double b, Generator* gen) {
  check_floating(t, "trunc_normal_");
  KILN_CHECK(a < b && std > 0, "nn::init::trunc_normal_: needs a < b and std > 0, got a={}, b={}, std={}", a,
             b, std);
  double lo = (a - mean) / std, hi = (b - mean) / std;
  KILN_CHECK(hi > -5 && lo < 5,
             "nn::init::trunc_normal_: [a, b] = [{}, {}] lies more than 5 std from the mean {}; redrawing would "
             "take too long", a, b, mean);
  NoGradGuard no_grad;
  TensorOptions f64 = TensorOptions(kFloat64).device(t.device());
  Tensor z = randn(t.sizes(), f64, gen);
  // Redraw the samples outside [lo, hi]: what is kept follows N(0, 1) conditioned on the interval.
  for (;;) {
    Tensor outside = z.lt(lo).logical_or(z.gt(hi));
    if (!outside.any().item<bool>()) break;
    z = where(outside, randn(t.sizes(), f64, gen), z);
  }
  t.copy_((z * std + mean).clamp(a, b));
  return t;
}

Tensor& constant_(Tensor& t, double value) {
  KILN_CHECK(t.defined(), "nn::init::constant_: the tensor is undefined");
  NoGradGuard no_grad;
  t.fill_(value);
  return t;
}
Tensor& zeros_(Tensor& t) { return constant_(t, 0); }
Tensor& ones_(Tensor& t) { return constant_(t, 1); }

Tensor& kaiming_uniform_(Tensor& t, double a, const std::string& mode, const std::string& nonlinearity,
                         Generator* gen) {
  check_floating(t, "kaiming_uniform_");
  double gain = calculate_gain(nonlinearity, a);
  double bound = gain * std::sqrt(3.0 / static_cast<double>(fan(t, mode, "kaiming_uniform_")));
  return uniform_(t, -bound, bound, gen);
}

Tensor& kaiming_normal_(Tensor& t, double a, const std::string& mode, const std::string& nonlinearity,
                        Generator* gen) {
  check_floating(t, "kaiming_normal_");
  double gain = calculate_gain(nonlinearity, a);
  return normal_(t, 0, gain / std::sqrt(static_cast<double>(fan(t, mode, "kaiming_normal_"))), gen);
}

Tensor& xavier_uniform_(Tensor& t, double gain, Generator* gen) {
  check_floating(t, "xavier_uniform_");
  Fans f = calculate_fan_in_and_fan_out(t);
  double bound = gain * std::sqrt(6.0 / static_cast<double>(f.fan_in + f.fan_out));
  return uniform_(t, -bound, bound, gen);
}

Tensor& xavier_normal_(Tensor& t, double gain, Generator* gen) {
  check_floating(t, "xavier_normal_");
  Fans f = calculate_fan_in_and_fan_out(t);
  return normal_(t, 0, gain * std::sqrt(2.0 / static_cast<double>(f.fan_in + f.fan_out)), gen);
}

}  // namespace kiln::nn::init
