// nn/weight_norm.h: torch.nn.utils.weight_norm and spectral_norm: a layer's weight recomputed before
// each forward from parameters that train instead of it.
//
//   nn::Conv1d conv(80, 256, nn::Conv1dOptions().kernel_size(7));
//   nn::utils::weight_norm(conv);          // conv.weight = weight_g * weight_v / ||weight_v|| per channel
//   nn::utils::spectral_norm(linear);      // linear.weight = weight_orig / sigma(weight_orig)
//
// As PyTorch's, each removes the parameter `name` from the module and registers what replaces it
// (weight_norm: parameters name_g and name_v; spectral_norm: the parameter name_orig and the buffers
// name_u and name_v), so state dicts have PyTorch's keys, and a forward pre-hook recomputes the weight
// into the layer's own handle (`conv.weight`) before each call `conv(x)`. The hook runs where Kiln's
// hooks run: in module(x), not in a direct call of forward(...), so not in the forwards that take
// several inputs (LSTM's forward(x, hx), MultiheadAttention's (q, k, v), Bilinear's); those would read
// the weight of the last module(x) (Note [a weight recomputed into the layer's handle] in
// nn/weight_norm.cpp). Apply them before making the optimizer (which must hold the new parameters),
// and not to a tied weight (it would change in both modules): both are Errors.
// remove_weight_norm / remove_spectral_norm put a plain parameter `name` back, of the current weight.
// PyTorch's newer forms, with the state dict keys of torch.nn.utils.parametrize, are in nn/parametrize.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "nn/module.h"

namespace kiln::nn::utils {

// w = g v / ||v||, the norm over every dim of v but `dim` (Salimans and Kingma, 2016): g has v's shape
// with size 1 in every other dim. dim = nullopt, or -1 as in PyTorch, takes one norm over the whole
// weight (g a 0-dim tensor); other negative dims count from the end.
Module& weight_norm(Module& module, const std::string& name = "weight", std::optional<int64_t> dim = 0);
Module& remove_weight_norm(Module& module, const std::string& name = "weight");

// w = w_orig / sigma, sigma the largest singular value of w_orig seen as a matrix with dim's size rows
// (Miyato et al., 2018), estimated by n_power_iterations power iterations on the buffers u and v per
// forward in training mode (none in evaluation mode, which uses u and v as they are). dim defaults to
// 0, or 1 for the transposed convolutions; eps bounds the norms of u and v from below.
Module& spectral_norm(Module& module, const std::string& name = "weight", int64_t n_power_iterations = 1,
                      double eps = 1e-12, std::optional<int64_t> dim = std::nullopt);
Module& remove_spectral_norm(Module& module, const std::string& name = "weight");

}  // namespace kiln::nn::utils
