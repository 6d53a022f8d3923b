// cpu/optim.cpp: the fused optimizer steps of the CPU backend (Backend::adam_step): one pass over
// each tensor, elements split over the pool of cpu/parallel.h, the math of core/scalar_math.h's
// adam_update (shared with cuda/optim.cu).
#include "core/error.h"
#include "core/scalar_math.h"
#include "cpu/kernels.h"
#include "cpu/parallel.h"

namespace kiln::cpu {
namespace {

template <typename T>
void adam_one(const View& p, const View& g, const View& m, const View& v, const View* vmax,
              const math::AdamCoefficients<T>& c) {
  T* pp = p.ptr<T>();
  const T* gp = g.ptr<T>();
  T* mp = m.ptr<T>();
  T* vp = v.ptr<T>();
  T* xp = vmax ? vmax->ptr<T>() : nullptr;
  parallel_for(0, p.numel(), 1 << 14, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) math::adam_update(pp[i], gp[i], mp[i], vp[i], xp ? xp + i : nullptr, c);
  });
}

}  // namespace

void adam_step_kernel(const std::vector<View>& params, const std::vector<View>& grads,
                      const std::vector<View>& exp_avgs, const std::vector<View>& exp_avg_sqs,
                      const std::vector<View>& max_exp_avg_sqs, const AdamStepArgs& args) {
  for (size_t i = 0; i < params.size(); ++i) {
    const View* vmax = args.amsgrad ? &max_exp_avg_sqs.at(i) : nullptr;
    KILN_DISPATCH_F32_F64(params[i].dtype, "adam_step", [&] {
      adam_one<scalar_t>(params[i], grads[i], exp_avgs[i], exp_avg_sqs[i], vmax, math::adam_coefficients<scalar_t>(args));
    });
  }
}

}  // namespace kiln::cpu
