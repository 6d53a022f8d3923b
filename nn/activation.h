// nn/activation.h: the activation layers (ReLU, LeakyReLU, ELU, Hardtanh, Softplus, GELU, SiLU, Tanh,
// Sigmoid, Softmax): modules around the elementwise ops of ops/ops.h and nn/functional.h, so they can
// sit in an nn::Sequential.
#pragma once

#include <string>

#include "nn/functional.h"
#include "nn/module.h"
#include "ops/ops.h"

namespace kiln::nn {

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& input) override { return relu(input); }
};

class LeakyReLU : public Module {
 public:
  explicit LeakyReLU(double negative_slope = 0.01) : negative_slope(negative_slope) {}
  Tensor forward(const Tensor& input) override { return functional::leaky_relu(input, negative_slope); }
  std::string extra_repr() const override;

  double negative_slope;
};

class ELU : public Module {
 public:
  explicit ELU(double alpha = 1.0) : alpha(alpha) {}
  Tensor forward(const Tensor& input) override { return functional::elu(input, alpha); }
  std::string extra_repr() const override;

  double alpha;
};

class Hardtanh : public Module {
 public:
  explicit Hardtanh(double min_val = -1.0, double max_val = 1.0);
  Tensor forward(const Tensor& input) override { return functional::hardtanh(input, min_val, max_val); }
  std::string extra_repr() const override;

  double min_val, max_val;
};

class Softplus : public Module {
 public:
  explicit Softplus(double beta = 1.0, double threshold = 20.0) : beta(beta), threshold(threshold) {}
  Tensor forward(const Tensor& input) override { return functional::softplus(input, beta, threshold); }
  std::string extra_repr() const override;

  double beta, threshold;
};

struct GELUOptions {
  std::string approximate = "none";  // "none" (erf) or "tanh"
};
class GELU : public Module {
 public:
  explicit GELU(GELUOptions options = {});
  Tensor forward(const Tensor& input) override { return gelu(input, approximate); }
  std::string extra_repr() const override { return "approximate='" + approximate + "'"; }

  std::string approximate;
};

class SiLU : public Module {
 public:
  Tensor forward(const Tensor& input) override { return silu(input); }
};

class Tanh : public Module {
 public:
  Tensor forward(const Tensor& input) override { return tanh(input); }
};

class Sigmoid : public Module {
 public:
  Tensor forward(const Tensor& input) override { return sigmoid(input); }
};

class Softmax : public Module {
 public:
  explicit Softmax(int64_t dim) : dim(dim) {}
  Tensor forward(const Tensor& input) override { return softmax(input, dim); }
  std::string extra_repr() const override { return "dim=" + std::to_string(dim); }

  int64_t dim;
};

}  // namespace kiln::nn
