// ops/ctc.cpp: ctc_nll, CTC's negative log-likelihood of each sample as one fused kernel each way
// (Backend::ctc_loss and ctc_loss_backward in core/backend.h; kernels: cpu/ctc.cpp, cuda/ctc.cu). The
// forward keeps log_alpha (N, T, 2 S + 1) for the backward, which runs the beta pass and writes the
// gradient of every frame in one go, where the composition (Note [ctc as ops] in nn/loss.cpp) runs a
// dozen small ops per frame each way. nn::ctc_loss lays out its targets and calls this while fusion
// is on.
#include "core/grad_mode.h"
#include "ops/dispatch.h"
#include "ops/flops.h"
#include "ops/ops.h"
#include "ops/record.h"

namespace kiln {

using autograd::Grads;
using autograd::record;
using autograd::SavedTensor;
using autograd::should_record;
using autograd::TensorList;

namespace ops {

namespace {

void check_lengths(const Tensor& lengths, int64_t samples, const char* what) {
  KILN_CHECK(lengths.defined() && lengths.dim() == 1 && lengths.size(0) == samples && lengths.dtype() == kInt64,
             "ctc_loss: {} must be int64 of shape ({}), one entry per sample, got {}", what, samples,
             lengths.defined() ? fmt::format("{} {}", dtype_name(lengths.dtype()), lengths.sizes().str())
                               : std::string("an undefined tensor"));
}

// A CUDA kernel cannot throw, so the lengths and labels of a CUDA call are checked here (a sync); the
// CPU kernel checks them as it reads them.
void check_on_device(const Tensor& targets, const Tensor& input_lengths, const Tensor& target_lengths, int64_t frames,
                     int64_t classes) {
  NoGradGuard no_grad;
  const int64_t longest = targets.size(1);
  KILN_CHECK(!input_lengths.lt(0).logical_or(input_lengths.gt(frames)).any().item<bool>(),
             "ctc_loss: an input length is outside [0, {}], the frames of log_probs", frames);
  KILN_CHECK(!target_lengths.lt(0).logical_or(target_lengths.gt(longest)).any().item<bool>(),
             "ctc_loss: a target length is outside [0, {}], the targets' columns", longest);
  const Tensor listed = arange(longest, kInt64, targets.device()).lt(target_lengths.unsqueeze(1));
  KILN_CHECK(!listed.logical_and(targets.lt(0).logical_or(targets.ge(classes))).any().item<bool>(),
             "ctc_loss: a target is not a class index in [0, {})", classes);
}

}  // namespace

Tensor ctc_nll(const Tensor& log_probs, const Tensor& targets, const Tensor& input_lengths,
               const Tensor& target_lengths, int64_t blank) {
  const char* op = "ctc_loss";
  KILN_CHECK(
      log_probs.defined() && log_probs.dim() == 3 && (log_probs.dtype() == kFloat32 || log_probs.dtype() == kFloat64),
      "{}: log_probs must be float32 or float64 (T, N, C) (frames, samples, classes), got {}", op,
      log_probs.defined() ? fmt::format("{} {}", dtype_name(log_probs.dtype()), log_probs.sizes().str())
                          : std::string("an undefined tensor"));
  const int64_t frames = log_probs.size(0), samples = log_probs.size(1), classes = log_probs.size(2);
  KILN_CHECK(targets.defined() && targets.dim() == 2 && targets.size(0) == samples && targets.dtype() == kInt64,
             "{}: targets must be int64 of shape ({}, S), each sample's labels padded to S columns, got {}", op,
             samples,
             targets.defined() ? fmt::format("{} {}", dtype_name(targets.dtype()), targets.sizes().str())
                               : std::string("an undefined tensor"));
  check_lengths(input_lengths, samples, "input_lengths");
  check_lengths(target_lengths, samples, "target_lengths");
  for (const Tensor* t : {&targets, &input_lengths, &target_lengths}) check_same_device(op, log_probs, *t);
  KILN_CHECK(blank >= 0 && blank < classes, "{}: blank {} is not a class index in [0, {})", op, blank, classes);
  const Device device = log_probs.device();
  if (!device.is_cpu()) check_on_device(targets, input_lengths, target_lengths, frames, classes);

  const Tensor lp = log_probs.contiguous(), labels = targets.contiguous();
  const Tensor in_len = input_lengths.contiguous(), tgt_len = target_lengths.contiguous();
  const int64_t states = 2 * labels.size(1) + 1;
  flops::Op count(0, 4 * frames * samples * states);  // the recursion's three-term log-sum-exp and add
  Tensor nll = empty_tensor({samples}, lp.dtype(), device);
  Tensor log_alpha = empty_tensor({samples, frames, states}, lp.dtype(), device);
  if (samples > 0) {
    backend_for(device).ctc_loss(view_of(lp), view_of(labels), view_of(in_len), view_of(tgt_len), view_of(nll),
                                 view_of(log_alpha), blank, stream_for(device));
  }
  if (should_record(lp)) {
    record("CtcLossBackward", {lp}, {nll},
           [lps = SavedTensor(lp, false), nlls = SavedTensor(nll, true), labels, in_len, tgt_len, log_alpha,
            blank](const Grads& g) -> TensorList {
             KILN_CHECK(!GradMode::is_enabled(),
                        "ctc_loss: the gradient of the fused CTC kernel cannot be differentiated again "
                        "(create_graph), as in PyTorch; call set_fusion(false) before the forward to compose "
                        "ctc_loss from ops, whose gradient can");
             const Tensor x = lps.unpack("CtcLossBackward"), loss = nlls.unpack("CtcLossBackward");
             const Tensor grad_nll = g[0].to(x.dtype()).contiguous();
             Tensor grad = empty_tensor(x.sizes(), x.dtype(), x.device());
             if (x.numel() > 0) {
               Tensor log_beta = empty_tensor(log_alpha.sizes(), x.dtype(), x.device());
               backend_for(x.device())
                   .ctc_loss_backward(view_of(grad_nll), view_of(x), view_of(labels), view_of(in_len), view_of(tgt_len),
                                      view_of(loss), view_of(log_alpha), view_of(log_beta), view_of(grad), blank,
                                      stream_for(x.device()));
             }
             return {grad};
           });
  }
  return nll;
}

}  // namespace ops

}  // namespace kiln
