// nn/activation.cpp: see nn/activation.h.
#include "nn/activation.h"

#include <fmt/format.h>

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

GELU::GELU(GELUOptions options) : approximate(std::move(options.approximate)) {
  KILN_CHECK(approximate == "none" || approximate == "tanh",
             "nn::GELU: approximate must be 'none' or 'tanh', got '{}'", approximate);
}

}  // namespace kiln::nn
