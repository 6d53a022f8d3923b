// nn/activation.cpp: see nn/activation.h.
#include "nn/activation.h"

#include <cmath>

#include <fmt/format.h>

#include "nn/init.h"
#include "nn/linear.h"  // py_float

namespace kiln::nn {

// PyTorch's reprs: LeakyReLU(negative_slope=0.01), ELU(alpha=1.0), Hardtanh(min_val=-1.0, max_val=1.0),
// Softplus(beta=1, threshold=20) (ints there by default, so printed without a ".0").
std::string LeakyReLU::extra_repr() const { return "negative_slope=" + py_float(negative_slope); }
std::string ELU::extra_repr() const { return "alpha=" + py_float(alpha); }
std::string Softplus::extra_repr() const { return fmt::format("beta={}, threshold={}", beta, threshold); }
std::string Hardtanh::extra_repr() const {
  return "min_val=" + py_float(min_val) + ", max_val=" + py_float(max_val);
}

Hardtanh::Hardtanh(double min_val, double max_val) : min_val(min_val), max_val(max_val) {
  KILN_CHECK(min_val <= max_val, "nn::Hardtanh: min_val ({}) must be <= max_val ({})", min_val, max_val);
}

// CELU(alpha=1.0), Threshold(threshold=0.1, value=20.0), Hardshrink(0.5), RReLU(lower=0.125,
// upper=0.3333333333333333): floats as Python prints them (PyTorch prints a Threshold value given as
// an int without ".0"; Kiln's are doubles).
std::string CELU::extra_repr() const { return "alpha=" + py_float(alpha); }
std::string Threshold::extra_repr() const {
  return "threshold=" + py_float(threshold) + ", value=" + py_float(value);
}
std::string Hardshrink::extra_repr() const { return py_float(lambd); }
std::string Softshrink::extra_repr() const { return py_float(lambd); }
std::string RReLU::extra_repr() const { return "lower=" + py_float(lower) + ", upper=" + py_float(upper); }

CELU::CELU(double alpha) : alpha(alpha) {
  KILN_CHECK(alpha != 0, "nn::CELU: alpha must not be 0 (it divides x)");
}

Softshrink::Softshrink(double lambd) : lambd(lambd) {
  KILN_CHECK(lambd >= 0, "nn::Softshrink: lambd must be >= 0, got {}", lambd);
}

RReLU::RReLU(double lower, double upper) : lower(lower), upper(upper) {
  KILN_CHECK(std::isfinite(lower) && std::isfinite(upper) && lower <= upper,
             "nn::RReLU: lower ({}) must be <= upper ({}), both finite", lower, upper);
}

PReLU::PReLU(PReLUOptions options) : num_parameters(options.num_parameters), init(options.init) {
  KILN_CHECK(num_parameters >= 1, "nn::PReLU: num_parameters must be >= 1 (1, or the channel count), got {}",
             num_parameters);
  weight = register_parameter("weight", empty({num_parameters}));
  reset_parameters();
}

void PReLU::reset_parameters() { init::constant_(weight, init); }

Tensor Softmax2d::forward(const Tensor& input) {
  KILN_CHECK(input.dim() == 3 || input.dim() == 4,
             "nn::Softmax2d: needs a (C, H, W) or (N, C, H, W) input, got {}-D {}", input.dim(),
             input.sizes().str());
  return softmax(input, -3);
}

GELU::GELU(GELUOptions options) : approximate(std::move(options.approximate)) {
  KILN_CHECK(approximate == "none" || approximate == "tanh",
             "nn::GELU: approximate must be 'none' or 'tanh', got '{}'", approximate);
}

}  // namespace kiln::nn
