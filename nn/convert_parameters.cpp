// nn/convert_parameters.cpp: see nn/convert_parameters.h.
#include "nn/convert_parameters.h"

#include <fmt/format.h>

#include "ops/ops.h"

namespace kiln::nn::utils {

namespace {

// The parameters' common device, checked as PyTorch's _check_param_device.
void check_device(const std::vector<Tensor>& parameters, const char* op) {
  for (size_t i = 0; i < parameters.size(); ++i) {
    const Tensor& p = parameters[i];
    KILN_CHECK(p.defined(), "{}: parameter {} is undefined", op, i);
    KILN_CHECK(p.device() == parameters[0].device(),
               "{}: parameter {} is on {} but parameter 0 on {}; the parameters must share a device", op, i,
               p.device().str(), parameters[0].device().str());
  }
}

}  // namespace

Tensor parameters_to_vector(const std::vector<Tensor>& parameters) {
  KILN_CHECK(!parameters.empty(), "parameters_to_vector: no parameters given");
  check_device(parameters, "parameters_to_vector");
  std::vector<Tensor> flat;
  flat.reserve(parameters.size());
  for (const Tensor& p : parameters) flat.push_back(p.reshape({-1}));
  return cat(flat, 0);
}

void vector_to_parameters(const Tensor& vec, const std::vector<Tensor>& parameters) {
  const char* op = "vector_to_parameters";
  check_device(parameters, op);
  int64_t total = 0;
  for (const Tensor& p : parameters) total += p.numel();
  KILN_CHECK(vec.defined() && vec.dim() == 1 && vec.numel() == total,
             "{}: vec must be 1-D with the parameters' {} elements, got {}", op, total,
             vec.defined() ? vec.sizes().str() : std::string("an undefined tensor"));
  if (parameters.empty()) return;
  KILN_CHECK(vec.device() == parameters[0].device(),
             "{}: vec is on {}, the parameters on {}; move it with .to() (they would move with it)", op,
             vec.device().str(), parameters[0].device().str());
  const Tensor data = vec.detach();
  int64_t offset = 0;
  for (const Tensor& p : parameters) {
    p.set_data(data.narrow(0, offset, p.numel()).view(p.sizes()));
    offset += p.numel();
  }
}

}  // namespace kiln::nn::utils
