// nn/activation.h: the activation layers of torch.nn (ReLU, LeakyReLU, ELU, Hardtanh, Softplus, GELU,
// SiLU, Tanh, Sigmoid, Softmax, and ReLU6, SELU, CELU, Mish, Hardswish, Hardsigmoid, Softsign,
// Tanhshrink, Threshold, LogSigmoid, Hardshrink, Softshrink, PReLU, GLU, Softmin, LogSoftmax,
// Softmax2d, RReLU): modules around the ops of ops/ops.h and nn/functional.h, so they can sit in an
// nn::Sequential. They print as PyTorch 1.13's.
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

class Softmin : public Module {
 public:
  explicit Softmin(int64_t dim) : dim(dim) {}
  Tensor forward(const Tensor& input) override { return functional::softmin(input, dim); }
  std::string extra_repr() const override { return "dim=" + std::to_string(dim); }

  int64_t dim;
};

class LogSoftmax : public Module {
 public:
  explicit LogSoftmax(int64_t dim) : dim(dim) {}
  Tensor forward(const Tensor& input) override { return log_softmax(input, dim); }
  std::string extra_repr() const override { return "dim=" + std::to_string(dim); }

  int64_t dim;
};

// Softmax over the channels (dim -3) of a (C, H, W) or (N, C, H, W) input.
class Softmax2d : public Module {
 public:
  Tensor forward(const Tensor& input) override;
};

class ReLU6 : public Module {
 public:
  Tensor forward(const Tensor& input) override { return functional::relu6(input); }
};

class SELU : public Module {
 public:
  Tensor forward(const Tensor& input) override { return functional::selu(input); }
};

class CELU : public Module {
 public:
  explicit CELU(double alpha = 1.0);
  Tensor forward(const Tensor& input) override { return functional::celu(input, alpha); }
  std::string extra_repr() const override;

  double alpha;
};

class Mish : public Module {
 public:
  Tensor forward(const Tensor& input) override { return functional::mish(input); }
};

class Hardswish : public Module {
 public:
  Tensor forward(const Tensor& input) override { return functional::hardswish(input); }
};

class Hardsigmoid : public Module {
 public:
  Tensor forward(const Tensor& input) override { return functional::hardsigmoid(input); }
};

class Softsign : public Module {
 public:
  Tensor forward(const Tensor& input) override { return functional::softsign(input); }
};

class Tanhshrink : public Module {
 public:
  Tensor forward(const Tensor& input) override { return functional::tanhshrink(input); }
};

class LogSigmoid : public Module {
 public:
  Tensor forward(const Tensor& input) override { return functional::logsigmoid(input); }
};

// value where x <= threshold, x elsewhere.
class Threshold : public Module {
 public:
  Threshold(double threshold, double value) : threshold(threshold), value(value) {}
  Tensor forward(const Tensor& input) override { return functional::threshold(input, threshold, value); }
  std::string extra_repr() const override;

  double threshold, value;
};

class Hardshrink : public Module {
 public:
  explicit Hardshrink(double lambd = 0.5) : lambd(lambd) {}
  Tensor forward(const Tensor& input) override { return functional::hardshrink(input, lambd); }
  std::string extra_repr() const override;

  double lambd;
};

class Softshrink : public Module {
 public:
  explicit Softshrink(double lambd = 0.5);
  Tensor forward(const Tensor& input) override { return functional::softshrink(input, lambd); }
  std::string extra_repr() const override;

  double lambd;
};

struct PReLUOptions {
  int64_t num_parameters = 1;  // 1 (one slope for all) or the input's channel count (its dim 1)
  double init = 0.25;          // every slope's initial value
};
// x for x > 0, weight * x otherwise, with a learned slope (weight, (num_parameters)).
class PReLU : public Module {
 public:
  explicit PReLU(PReLUOptions options = {});
  Tensor forward(const Tensor& input) override { return functional::prelu(input, weight); }
  std::string extra_repr() const override { return "num_parameters=" + std::to_string(num_parameters); }
  void reset_parameters();

  int64_t num_parameters;
  double init;
  Tensor weight;  // (num_parameters)
};

// The first half of the input along dim times the sigmoid of the second half.
class GLU : public Module {
 public:
  explicit GLU(int64_t dim = -1) : dim(dim) {}
  Tensor forward(const Tensor& input) override { return functional::glu(input, dim); }
  std::string extra_repr() const override { return "dim=" + std::to_string(dim); }

  int64_t dim;
};

// Randomized leaky ReLU: a random slope in [lower, upper) per negative element while training,
// (lower + upper) / 2 in evaluation.
class RReLU : public Module {
 public:
  explicit RReLU(double lower = 1.0 / 8, double upper = 1.0 / 3);
  Tensor forward(const Tensor& input) override {
    return functional::rrelu(input, lower, upper, is_training());
  }
  std::string extra_repr() const override;

  double lower, upper;
};

}  // namespace kiln::nn
