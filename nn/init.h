// nn/init.h: in-place initialisers, as torch.nn.init. Each writes into its tensor under no_grad (so it
// works on parameters) and draws from `gen` (default: the process-wide generator). Kiln's generator is
// Philox (core/generator.h), so the numbers differ from PyTorch's; the distributions are the same.
#pragma once

#include <optional>
#include <string>

#include "core/generator.h"
#include "core/tensor.h"

namespace kiln::nn::init {

// The recommended gain for a nonlinearity: linear/conv*/sigmoid 1, tanh 5/3, relu sqrt(2),
// leaky_relu sqrt(2 / (1 + param^2)) (param defaults to 0.01), selu 3/4.
double calculate_gain(const std::string& nonlinearity, std::optional<double> param = {});

// fan_in = size(1) * receptive field, fan_out = size(0) * receptive field (a tensor of >= 2 dims).
struct Fans {
  int64_t fan_in, fan_out;
};
Fans calculate_fan_in_and_fan_out(const Tensor& t);

Tensor& uniform_(Tensor& t, double a = 0, double b = 1, Generator* gen = nullptr);
Tensor& normal_(Tensor& t, double mean = 0, double std = 1, Generator* gen = nullptr);
// N(mean, std) restricted to [a, b], drawn by the inverse CDF in float64 (PyTorch's method), one draw
// per element whatever the interval.
Tensor& trunc_normal_(Tensor& t, double mean = 0, double std = 1, double a = -2, double b = 2,
                      Generator* gen = nullptr);
Tensor& constant_(Tensor& t, double value);
Tensor& zeros_(Tensor& t);
Tensor& ones_(Tensor& t);

// U(-bound, bound), bound = gain * sqrt(3 / fan); mode "fan_in" or "fan_out".
Tensor& kaiming_uniform_(Tensor& t, double a = 0, const std::string& mode = "fan_in",
                         const std::string& nonlinearity = "leaky_relu", Generator* gen = nullptr);
// N(0, std^2), std = gain / sqrt(fan).
Tensor& kaiming_normal_(Tensor& t, double a = 0, const std::string& mode = "fan_in",
                        const std::string& nonlinearity = "leaky_relu", Generator* gen = nullptr);
// U(-a, a), a = gain * sqrt(6 / (fan_in + fan_out)).
Tensor& xavier_uniform_(Tensor& t, double gain = 1, Generator* gen = nullptr);
// N(0, std^2), std = gain * sqrt(2 / (fan_in + fan_out)).
Tensor& xavier_normal_(Tensor& t, double gain = 1, Generator* gen = nullptr);

// The identity matrix's values in a 2-D tensor (ones on the diagonal of a rectangular one).
Tensor& eye_(Tensor& t);
// A convolution weight (3-D, 4-D or 5-D: out, in, *kernel) that passes its input through: in each of
// `groups` groups of out / groups output channels, channel d takes input channel d at the kernel's
// centre, for d < min(out / groups, in); zeros elsewhere.
Tensor& dirac_(Tensor& t, int64_t groups = 1);
// A (semi-)orthogonal matrix times gain, as PyTorch: a tensor of >= 2 dims seen as rows = size(0) by
// cols = numel / rows, filled with N(0, 1), and replaced by the Q of its QR decomposition (of its
// transpose when rows < cols) with R's diagonal made positive, so its rows or its columns are
// orthonormal. The QR runs in float64 on the host, O(rows * cols * min(rows, cols)).
Tensor& orthogonal_(Tensor& t, double gain = 1, Generator* gen = nullptr);

}  // namespace kiln::nn::init
