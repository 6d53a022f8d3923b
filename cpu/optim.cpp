// cpu/optim.cpp: the fused optimizer steps of the CPU backend (Backend::adam_step, sgd_step): one
// pass over each tensor, elements split over the pool of cpu/parallel.h, the math of
// core/scalar_math.h's adam_update and sgd_update (shared with cuda/optim.cu).
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

// The flags are template arguments and the coefficients a local copy (stores to p cannot change
// them), so the loop has no branch but on maximize and weight decay, which are the same for every
// element, and vectorizes.
template <typename T, bool kMomentum, bool kNesterov, bool kFirstStep>
void sgd_one(const View& p, const View& g, const View* buf,
             const math::SgdCoefficients<T>& coefficients) {
  T* pp = p.ptr<T>();
  const T* gp = g.ptr<T>();
  T* bp = kMomentum ? buf->ptr<T>() : nullptr;
  parallel_for(0, p.numel(), 1 << 14, [&](int64_t begin, int64_t end) {
    const math::SgdCoefficients<T> c = coefficients;
    for (int64_t i = begin; i < end; ++i) {
      math::sgd_update<kMomentum, kNesterov, kFirstStep>(pp[i], gp[i],
                                                         kMomentum ? bp + i : nullptr, c);
    }
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

void sgd_step_kernel(const std::vector<View>& params, const std::vector<View>& grads,
                     const std::vector<View>& momentum_buffers, const SgdStepArgs& args) {
  for (size_t i = 0; i < params.size(); ++i) {
    const View* buf = args.momentum != 0 ? &momentum_buffers.at(i) : nullptr;
    KILN_DISPATCH_F32_F64(params[i].dtype, "sgd_step", [&] {
      math::with_sgd_flags(args, [&](auto momentum, auto nesterov, auto first_step) {
        sgd_one<scalar_t, decltype(momentum)::value, decltype(nesterov)::value,
                decltype(first_step)::value>(params[i], grads[i], buf,
                                             math::sgd_coefficients<scalar_t>(args));
      });
    });
  }
}

}  // namespace kiln::cpu
