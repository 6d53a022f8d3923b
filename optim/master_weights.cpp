// optim/master_weights.cpp: MasterWeights (see master_weights.h): float32 copies of 16-bit
// parameters, stepped by an inner optimizer and copied back rounded.
#include "optim/master_weights.h"

#include <charconv>
#include <string>
#include <string_view>
#include <unordered_map>

#include "core/error.h"
#include "core/grad_mode.h"
#include "ops/ops.h"

namespace kiln::optim {

MasterWeights::MasterWeights(std::vector<Tensor> params, const MakeOptimizer& make_optimizer)
    : Optimizer("MasterWeights") {
  KILN_CHECK(make_optimizer != nullptr, "MasterWeights: the function that makes the inner optimizer is empty");
  KILN_CHECK(!params.empty(), "MasterWeights: got an empty parameter list; pass the model's parameters");
  std::vector<Tensor> masters;
  std::unordered_map<const TensorImpl*, Tensor> param_of;  // master -> model parameter
  {
    NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      const Tensor& p = params[i];
      KILN_CHECK(p.defined() && p.is_floating_point(),
                 "MasterWeights: parameter {} is {}; only floating tensors can be optimized", i,
                 p.defined() ? dtype_name(p.dtype()) : "undefined");
      Tensor m = is_reduced_float(p.dtype()) ? p.detach().to(kFloat32).contiguous().requires_grad_() : p;
      param_of.emplace(m.impl(), p);
      masters.push_back(m);
    }
  }
  inner_ = make_optimizer(masters);
  KILN_CHECK(inner_ != nullptr, "MasterWeights: the function that makes the inner optimizer returned null");
  name_ = "MasterWeights(" + inner_->name() + ")";
  // The groups mirror the inner optimizer's, with the model's parameters in place of the masters.
  size_t used = 0;
  for (const ParamGroup& group : inner_->param_groups()) {
    std::vector<Tensor> model_params;
    for (const Tensor& m : group.params) {
      auto it = param_of.find(m.impl());
      KILN_CHECK(it != param_of.end(),
                 "MasterWeights: the inner optimizer ({}) holds a tensor that is not one of the masters it was "
                 "given; build it from the `masters` argument only",
                 inner_->name());
      model_params.push_back(it->second);
      pairs_.push_back(Pair{.param = it->second, .master = m, .copied_from = {}, .copied_version = 0});
      ++used;
    }
    add_group(std::move(model_params), group.options);
  }
  KILN_CHECK(used == masters.size(),
             "MasterWeights: the inner optimizer ({}) holds {} of the {} masters it was given; give it all of them",
             inner_->name(), used, masters.size());
}

const Tensor& MasterWeights::master(const Tensor& param) const {
  for (const Pair& pr : pairs_)
    if (pr.param.is_same(param)) return pr.master;
  KILN_FAIL("{}.master: the tensor is not one of this optimizer's parameters", name_);
}

std::vector<Tensor> MasterWeights::master_params() const {
  std::vector<Tensor> out;
  for (const Pair& pr : pairs_) out.push_back(pr.master);
  return out;
}

void MasterWeights::copy_grads() {
  NoGradGuard no_grad;
  for (size_t i = 0; i < pairs_.size(); ++i) {
    Pair& pr = pairs_[i];
    if (pr.own()) continue;
    KILN_CHECK(pr.param.sizes() == pr.master.sizes(),
               "{}: parameter {} has shape {} but its float32 master {}: its data was replaced (set_data) with "
               "another shape after the {} was made; make it after the model has its final shapes",
               name_, i, pr.param.sizes().str(), pr.master.sizes().str(), name_);
    Tensor g = pr.param.grad();
    if (g.is_same(pr.copied_from) && (!g.defined() || g._version() == pr.copied_version)) continue;  // current
    pr.master.set_grad(g.defined() ? g.to(kFloat32) : Tensor());
    pr.copied_from = g;
    pr.copied_version = g.defined() ? g._version() : 0;
  }
}

std::vector<Tensor> MasterWeights::grads() {
  copy_grads();
  std::vector<Tensor> out;
  for (const Pair& pr : pairs_) {
    Tensor g = pr.master.grad();
    if (g.defined()) out.push_back(g);
  }
  return out;
}

void MasterWeights::step() {
  copy_grads();
  std::vector<ParamGroup>& inner_groups = inner_->param_groups();
  KILN_CHECK(inner_groups.size() == groups_.size(),
             "{}.step: the inner optimizer has {} parameter groups but this one has {}; add groups to the "
             "MasterWeights' inner optimizer only at construction",
             name_, inner_groups.size(), groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) inner_groups[g].options = groups_[g].options;  // schedulers
  inner_->step();
  NoGradGuard no_grad;
  for (Pair& pr : pairs_) {
    if (pr.own() || !pr.master.grad().defined()) continue;
    pr.param.copy_(pr.master);  // rounded to the model's dtype (nearest even)
    pr.master.set_grad(Tensor());  // the float32 grads live only during the step
  }
  for (Pair& pr : pairs_) pr.copied_from = Tensor();  // the next grads() copies afresh
}

void MasterWeights::zero_grad(bool set_to_none) {
  Optimizer::zero_grad(set_to_none);
  for (Pair& pr : pairs_) {
    if (!pr.own()) pr.master.set_grad(Tensor());
    pr.copied_from = Tensor();
  }
}

TensorDict MasterWeights::state_dict() const {
  TensorDict dict = Optimizer::state_dict();  // param_groups.*: this optimizer's options
  for (const auto& [key, t] : inner_->state_dict()) {
    if (key.rfind("state.", 0) == 0) dict.insert(key, t);
  }
  for (size_t i = 0; i < pairs_.size(); ++i) {
    if (!pairs_[i].own()) dict.insert(fmt::format("master.{}", i), pairs_[i].master);
  }
  return dict;
}

void MasterWeights::load_state_dict(const TensorDict& dict) {
  TensorDict groups_only, for_inner;
  std::vector<const Tensor*> masters(pairs_.size(), nullptr);
  for (const auto& [key, t] : dict) {
    if (key.rfind("master.", 0) == 0) {
      std::string_view digits = std::string_view(key).substr(7);
      size_t i = 0;
      auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), i);
      KILN_CHECK(ec == std::errc() && end == digits.data() + digits.size() && i < pairs_.size() &&
                     !pairs_[i].own(),
                 "{}.load_state_dict: unexpected entry '{}'; masters are 'master.<i>' for the 16-bit parameters "
                 "i among the {}",
                 name_, key, pairs_.size());
      KILN_CHECK(t.sizes() == pairs_[i].master.sizes(),
                 "{}.load_state_dict: '{}' has shape {} but parameter {} has shape {}", name_, key,
                 t.sizes().str(), i, pairs_[i].master.sizes().str());
      masters[i] = &t;
      continue;
    }
    if (key.rfind("param_groups.", 0) == 0) groups_only.insert(key, t);
    for_inner.insert(key, t);
  }
  for (size_t i = 0; i < pairs_.size(); ++i) {
    KILN_CHECK(pairs_[i].own() || masters[i] != nullptr,
               "{}.load_state_dict: the state dict lacks 'master.{}', the float32 copy of a 16-bit parameter",
               name_, i);
  }
  inner_->load_state_dict(for_inner);  // checks the groups and the state, then loads them
  Optimizer::load_state_dict(groups_only);
  NoGradGuard no_grad;
  for (size_t i = 0; i < pairs_.size(); ++i) {
    if (!masters[i]) continue;
    pairs_[i].master.copy_(*masters[i]);
    pairs_[i].param.copy_(pairs_[i].master);  // the model resumes from the rounded masters
  }
  for (Pair& pr : pairs_) pr.copied_from = Tensor();
}

}  // namespace kiln::optim
