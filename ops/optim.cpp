// ops/optim.cpp: fused_adam_ and fused_sgd_, the fused optimizer steps behind the `fused` option of
// optim::Adam and optim::SGD: check the lists, then one Backend::adam_step or sgd_step over them
// (cpu/optim.cpp, cuda/optim.cu).
#include "core/error.h"
#include "ops/dispatch.h"
#include "ops/ops.h"

namespace kiln {

namespace {

// The lists of one fused step: every tensor has params[0]'s device and dtype (float32 or float64),
// params[i]'s shape, and is contiguous. add() checks list[i] and appends its view.
class StepLists {
 public:
  StepLists(const char* op, const std::vector<Tensor>& params)
      : op_(op), params_(params), device_(params.at(0).device()), dtype_(params.at(0).dtype()) {
    KILN_CHECK(dtype_ == kFloat32 || dtype_ == kFloat64,
               "{}: takes float32 or float64 tensors, got {}", op_, dtype_name(dtype_));
  }

  Device device() const { return device_; }

  void add(std::vector<View>& list, const Tensor& t, size_t i, const char* what) const {
    const Tensor& p = params_[i];
    KILN_CHECK(t.defined() && t.device() == device_ && t.dtype() == dtype_ &&
                   t.sizes() == p.sizes() && t.is_contiguous(),
               "{}: {}[{}] must be a contiguous {} tensor of shape {} on {}, like params[0] and "
               "params[{}]; got {}",
               op_, what, i, dtype_name(dtype_), p.sizes().str(), device_.str(), i,
               t.defined()
                   ? fmt::format("{} {} on {}{}", dtype_name(t.dtype()), t.sizes().str(),
                                 t.device().str(), t.is_contiguous() ? "" : ", not contiguous")
                   : std::string("an undefined tensor"));
    list.push_back(view_of(t));
  }
  // add() for a list the step writes into.
  void add_written(std::vector<View>& list, const Tensor& t, size_t i, const char* what) const {
    add(list, t, i, what);
    check_inference_write(t, op_);
  }

 private:
  const char* op_;
  const std::vector<Tensor>& params_;
  Device device_;
  DType dtype_;
};

}  // namespace

void fused_adam_(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                 const std::vector<Tensor>& exp_avgs, const std::vector<Tensor>& exp_avg_sqs,
                 const std::vector<Tensor>& max_exp_avg_sqs, const AdamStepArgs& args) {
  const char* op = "fused_adam_";
  const size_t n = params.size();
  KILN_CHECK(grads.size() == n && exp_avgs.size() == n && exp_avg_sqs.size() == n &&
                 (args.amsgrad ? max_exp_avg_sqs.size() == n : max_exp_avg_sqs.empty()),
             "{}: got {} params, {} grads, {} exp_avgs, {} exp_avg_sqs and {} max_exp_avg_sqs (amsgrad {}); "
             "give one of each per param (max_exp_avg_sqs only with amsgrad)",
             op, n, grads.size(), exp_avgs.size(), exp_avg_sqs.size(), max_exp_avg_sqs.size(), args.amsgrad);
  if (n == 0) return;
  const StepLists lists(op, params);
  std::vector<View> p, g, m, v, vmax;
  for (size_t i = 0; i < n; ++i) {
    lists.add_written(p, params[i], i, "params");
    lists.add(g, grads[i], i, "grads");
    lists.add_written(m, exp_avgs[i], i, "exp_avgs");
    lists.add_written(v, exp_avg_sqs[i], i, "exp_avg_sqs");
    if (args.amsgrad) lists.add_written(vmax, max_exp_avg_sqs[i], i, "max_exp_avg_sqs");
  }
  backend_for(lists.device()).adam_step(p, g, m, v, vmax, args, stream_for(lists.device()));
  // In place, as the unfused step's add_/mul_: a saved tensor of a param now reads as modified.
  for (size_t i = 0; i < n; ++i) {
    params[i].bump_version();
    exp_avgs[i].bump_version();
    exp_avg_sqs[i].bump_version();
    if (args.amsgrad) max_exp_avg_sqs[i].bump_version();
  }
}

void fused_sgd_(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                const std::vector<Tensor>& momentum_buffers, const SgdStepArgs& args) {
  const char* op = "fused_sgd_";
  const size_t n = params.size();
  const bool momentum = args.momentum != 0;
  KILN_CHECK(
      grads.size() == n && (momentum ? momentum_buffers.size() == n : momentum_buffers.empty()),
      "{}: got {} params, {} grads and {} momentum_buffers (momentum {}); give one of each per "
      "param (momentum_buffers only with a nonzero momentum)",
      op, n, grads.size(), momentum_buffers.size(), args.momentum);
  if (n == 0) return;
  const StepLists lists(op, params);
  std::vector<View> p, g, buf;
  for (size_t i = 0; i < n; ++i) {
    lists.add_written(p, params[i], i, "params");
    lists.add(g, grads[i], i, "grads");
    if (momentum) lists.add_written(buf, momentum_buffers[i], i, "momentum_buffers");
  }
  backend_for(lists.device()).sgd_step(p, g, buf, args, stream_for(lists.device()));
  for (size_t i = 0; i < n; ++i) {  // in place, as fused_adam_
    params[i].bump_version();
    if (momentum) momentum_buffers[i].bump_version();
  }
}

}  // namespace kiln
