// nn/convert_parameters.h: torch.nn.utils.parameters_to_vector and vector_to_parameters, for methods
// that treat a model's parameters as one vector (line searches, evolution strategies, second-order steps):
//   Tensor flat = nn::utils::parameters_to_vector(model.parameters());
//   nn::utils::vector_to_parameters(flat * 0.5, model.parameters());
#pragma once

#include <vector>

#include "core/tensor.h"

namespace kiln::nn::utils {

// Every parameter flattened and concatenated in order, as one 1-D tensor (a graph-connected cat, so it
// differentiates back to the parameters; mixed dtypes promote, as cat's). The parameters must share a
// device.
Tensor parameters_to_vector(const std::vector<Tensor>& parameters);

// The inverse: each parameter's data becomes its slice of vec, viewed in the parameter's shape (as
// PyTorch's `param.data = ...`: the parameters then share vec's storage and take its dtype; no gradient
// is recorded). vec must be 1-D with exactly as many elements as the parameters, on their device
// (PyTorch would move them to vec's).
void vector_to_parameters(const Tensor& vec, const std::vector<Tensor>& parameters);

}  // namespace kiln::nn::utils
