// nn/activation.h: the activation layers (ReLU, GELU, SiLU, Tanh, Sigmoid, Softmax): modules around
// the elementwise ops of ops/ops.h, so they can sit in an nn::Sequential.
#pragma once

#include <string>

#include "nn/module.h"
#include "ops/ops.h"

namespace kiln::nn {

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& input) override { return relu(input); }
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
