// optim/clip_grad.cpp: clip_grad_norm_ and clip_grad_value_ (see clip_grad.h).
#include "optim/clip_grad.h"

#include <cmath>

#include "core/error.h"
#include "core/grad_mode.h"
#include "ops/ops.h"

namespace kiln::nn::utils {

Tensor clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm, double norm_type,
                       bool error_if_nonfinite) {
  NoGradGuard no_grad;
  // Any p-norm, negative p and -inf too (the smallest |g|), as PyTorch's vector_norm; not NaN.
  KILN_CHECK(!std::isnan(norm_type), "clip_grad_norm_: norm_type must be a number (a p-norm's p, or inf), got NaN");
  std::vector<Tensor> grads;
  for (const Tensor& p : parameters) {
    Tensor g = p.grad();
    if (g.defined()) grads.push_back(g);
  }
  if (grads.empty()) return scalar_tensor(0.0);
  const Device device = grads[0].device();
  // The norm of the per-tensor norms is the norm of the concatenation (and max of maxes for inf).
  // Not for order 0, the count of nonzeros: there PyTorch's same composition counts the grads that
  // hold a nonzero, and Kiln does as PyTorch (so one grad gives 1, not its count of nonzeros).
  std::vector<Tensor> norms;
  norms.reserve(grads.size());
  // 16-bit grads are measured in float32: their total norm passes float16's 65504 long before the
  // grads themselves overflow, and an inf norm would clip every grad to 0.
  for (const Tensor& g : grads) {
    norms.push_back(norm(is_reduced_float(g.dtype()) ? g.to(kFloat32) : g, norm_type).to(device));
  }
  Tensor total = norms.size() == 1 && norm_type != 0 ? norms[0] : norm(stack(norms), norm_type);
  if (error_if_nonfinite) {
    const double value = total.item<double>();
    KILN_CHECK(
        std::isfinite(value),
        "clip_grad_norm_: the total norm of order {} of the gradients is non-finite ({}), so "
        "it cannot be clipped; to scale the gradients by it anyway, pass "
        "error_if_nonfinite = false",
        norm_type, value);
  }
  // Multiplying by the clamped coefficient even when it is 1 avoids reading the norm back from the
  // device (as PyTorch does).
  Tensor coef = clamp(rdiv(max_norm, total + 1e-6), std::nullopt, 1.0);
  for (Tensor& g : grads) g.mul_(coef.to(g.device(), g.dtype()));
  return total;
}

void clip_grad_value_(const std::vector<Tensor>& parameters, double clip_value) {
  NoGradGuard no_grad;
  // NaN clipped nothing (every comparison with it is false); the grads were left as they were.
  KILN_CHECK(!std::isnan(clip_value), "clip_grad_value_: clip_value must be a number, got NaN");
  for (const Tensor& p : parameters) {
    Tensor g = p.grad();
    if (g.defined()) g.clamp_(-clip_value, clip_value);
  }
}

}  // namespace kiln::nn::utils
