// optim/clip_grad.h: gradient clipping, torch.nn.utils.clip_grad_norm_ / clip_grad_value_.
// They keep PyTorch's names and namespace (kiln::nn::utils) but live in the optim target, beside
// the optimizers whose step they precede.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace kiln::nn::utils {

// Scales the grads of `parameters` in place so that their total norm (the norm of all grads viewed
// as one vector) is at most max_norm: each grad is multiplied by min(1, max_norm / (total + 1e-6)).
// norm_type is any p (negative ones too, as PyTorch's vector_norm), infinity (the largest |g|),
// -infinity (the smallest), or 0, which PyTorch computes as the number of grads that hold a nonzero
// element, and so does Kiln; NaN is an Error. Parameters without a grad are skipped. Returns
// the total norm before clipping (a 0-d tensor; 0 when no parameter has a grad). The norms of
// float16 and bfloat16 grads are taken in float32, and the total is float32 then (PyTorch's is
// float16, inf past 65504, which scaled every grad to 0). With error_if_nonfinite, a nan or
// infinite total norm is an Error and the grads are left unchanged.
Tensor clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm, double norm_type = 2,
                       bool error_if_nonfinite = false);

// Clamps every grad of `parameters` in place to [-clip_value, clip_value]; a NaN clip_value is an
// Error.
void clip_grad_value_(const std::vector<Tensor>& parameters, double clip_value);

}  // namespace kiln::nn::utils
