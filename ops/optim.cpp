// ops/optim.cpp: fused_adam_, the fused optimizer step behind optim::Adam's `fused` option: checks
// the lists, then one Backend::adam_step over them (cpu/optim.cpp, cuda/optim.cu).
#include "core/error.h"
#include "ops/dispatch.h"
#include "ops/ops.h"

namespace kiln {

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
  const Device device = params[0].device();
  const DType dtype = params[0].dtype();
  KILN_CHECK(dtype == kFloat32 || dtype == kFloat64, "{}: takes float32 or float64 tensors, got {}", op,
             dtype_name(dtype));
  std::vector<View> p, g, m, v, vmax;
  auto add = [&](std::vector<View>& list, const Tensor& t, size_t i, const char* what) {
    KILN_CHECK(t.defined() && t.device() == device && t.dtype() == dtype && t.sizes() == params[i].sizes() &&
                   t.is_contiguous(),
               "{}: {}[{}] must be a contiguous {} tensor of shape {} on {}, like params[0] and params[{}]; got {}",
               op, what, i, dtype_name(dtype), params[i].sizes().str(), device.str(), i,
               t.defined() ? fmt::format("{} {} on {}{}", dtype_name(t.dtype()), t.sizes().str(), t.device().str(),
                                         t.is_contiguous() ? "" : ", not contiguous")
                           : std::string("an undefined tensor"));
    list.push_back(view_of(t));
  };
  for (size_t i = 0; i < n; ++i) {
    add(p, params[i], i, "params");
    add(g, grads[i], i, "grads");
    add(m, exp_avgs[i], i, "exp_avgs");
    add(v, exp_avg_sqs[i], i, "exp_avg_sqs");
    if (args.amsgrad) add(vmax, max_exp_avg_sqs[i], i, "max_exp_avg_sqs");
  }
  backend_for(device).adam_step(p, g, m, v, vmax, args, stream_for(device));
  // In place, as the unfused step's add_/mul_: a saved tensor of a param now reads as modified.
  for (size_t i = 0; i < n; ++i) {
    params[i].bump_version();
    exp_avgs[i].bump_version();
    exp_avg_sqs[i].bump_version();
    if (args.amsgrad) max_exp_avg_sqs[i].bump_version();
  }
}

}  // namespace kiln
