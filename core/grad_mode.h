// core/grad_mode.h: whether ops record graphs on this thread (the state behind `no_grad`), and
// inference mode.
#pragma once

namespace kiln {

struct GradMode {
  // Whether ops record: grad mode is on and inference mode is off (in inference mode nothing is
  // recorded, even where AutoGradMode(true) turned grad mode back on, as in PyTorch).
  static bool is_enabled();
  static void set_enabled(bool enabled);
};

// RAII: disables recording for a scope, like `with torch.no_grad():`.
class NoGradGuard {
 public:
  NoGradGuard() : prev_(GradMode::is_enabled()) { GradMode::set_enabled(false); }
  ~NoGradGuard() { GradMode::set_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

// RAII: sets recording on or off for a scope (torch.set_grad_enabled / enable_grad).
class AutoGradMode {
 public:
  explicit AutoGradMode(bool enabled) : prev_(GradMode::is_enabled()) { GradMode::set_enabled(enabled); }
  ~AutoGradMode() { GradMode::set_enabled(prev_); }
  AutoGradMode(const AutoGradMode&) = delete;
  AutoGradMode& operator=(const AutoGradMode&) = delete;

 private:
  bool prev_;
};

// Note [inference mode]
// RAII: inference mode for a scope, as c10::InferenceMode (`with torch.inference_mode():`). Inside,
// grad mode is off and every tensor whose memory is allocated is an *inference tensor*
// (Tensor::is_inference; the flag is on its Storage, so views of an inference tensor are inference
// tensors too, and a view of a normal tensor stays normal). An inference tensor can never take part
// in autograd, so its views are not counted in Storage::live_views (two atomic operations fewer per
// view op, TensorImpl::count_as_view; not measurable on op_overhead, docs/tensors-and-autograd.md
// §3.12: the mode is here for PyTorch's semantics). What it costs, outside inference mode:
// - an in-place op on an inference tensor is an Error (it could not be followed: clone() it first);
// - an inference tensor cannot be saved for backward (w * x, with w requiring grad, saves x);
// - requires_grad_(true) on one is an Error.
// Inside the mode in-place ops on any tensor are allowed and not recorded. InferenceMode(false)
// inside such a scope turns inference mode off and grad mode on, as PyTorch's. Unlike PyTorch's,
// Kiln's inference tensors keep a version counter (bumping it is a plain increment).
class InferenceMode {
 public:
  explicit InferenceMode(bool enabled = true);
  ~InferenceMode();
  InferenceMode(const InferenceMode&) = delete;
  InferenceMode& operator=(const InferenceMode&) = delete;
  static bool is_enabled();

 private:
  bool prev_grad_, prev_inference_;
};

}  // namespace kiln
