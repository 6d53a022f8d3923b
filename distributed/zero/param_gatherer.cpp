// distributed/zero/param_gatherer.cpp: stage 3's gathering and dropping of weights (see
// param_gatherer.h).
#include "distributed/zero/param_gatherer.h"

#include <exception>
#include <unordered_map>

#include "core/grad_mode.h"
#include "ops/ops.h"

namespace kiln::distributed {

ParamGatherer::ParamGatherer(Communicator& comm, const FlatLayout& layout, std::vector<Tensor> params, Tensor shard,
                             nn::Module& model)
    : comm_(comm),
      layout_(layout),
      params_(std::move(params)),
      gathered_(params_.size(), true),
      users_(params_.size(), 0),
      shard_(std::move(shard)) {
  std::unordered_map<const TensorImpl*, size_t> index;
  for (size_t k = 0; k < params_.size(); ++k) {
    shapes_.push_back(params_[k].sizes());
    index.emplace(params_[k].impl(), k);
  }
  // Every module that owns trainable parameters gathers them around its forward. A tied parameter
  // is owned by each module that registered it.
  for (nn::Module* m : model.modules()) {
    std::vector<size_t> owned;
    for (const Tensor& p : m->parameters(/*recurse=*/false)) {
      if (auto it = index.find(p.impl()); it != index.end()) owned.push_back(it->second);
    }
    if (!owned.empty()) hook_module(*m, std::move(owned));
  }
  for (size_t k = 0; k < params_.size(); ++k) {
    grad_hooks_.push_back(params_[k].register_post_accumulate_grad_hook([this, k](const Tensor&) {
      if (users_[k] == 0) release(k);
    }));
  }
  release_all();
}

ParamGatherer::~ParamGatherer() {
  for (auto& h : module_hooks_) h.remove();
  for (size_t k = 0; k < params_.size(); ++k) params_[k].remove_post_accumulate_grad_hook(grad_hooks_[k]);
  // Leave the model usable without ZeRO, unless this rank is unwinding from an Error the others may
  // not share: they would never join the all-gathers (the weights then stay dropped).
  if (std::uncaught_exceptions() == 0) gather_all();
}

void ParamGatherer::hook_module(nn::Module& module, std::vector<size_t> owned) {
  auto ks = std::make_shared<std::vector<size_t>>(std::move(owned));
  owned_.emplace_back(&module, ks);
  module_hooks_.push_back(module.register_forward_pre_hook([this, ks](nn::Module&, const Tensor&) {
    for (size_t k : *ks) ++users_[k];
    gather(*ks);
    return Tensor();
  }));
  module_hooks_.push_back(module.register_forward_hook([this, ks](nn::Module&, const Tensor&, const Tensor& output) {
    // A parameter that an enclosing module's forward still reads (GPT's tied head reads the
    // embedding's weight after the embedding has run) stays until that forward ends too.
    for (size_t k : *ks) {
      if (--users_[k] == 0) release(k);
    }
    // The gradient of the output arrives just before backward enters this module's nodes, which
    // read the weights: gather them then.
    if (output.defined() && output.requires_grad()) {
      output.register_hook([this, ks](const Tensor&) {
        gather(*ks);
        return Tensor();
      });
    }
    return Tensor();
  }));
}

void ParamGatherer::register_external_parameter(nn::Module& module, const Tensor& param) {
  const size_t k = index_of(param);
  for (auto& [m, ks] : owned_) {
    if (m != &module) continue;
    if (std::find(ks->begin(), ks->end(), k) == ks->end()) ks->push_back(k);
    return;
  }
  hook_module(module, {k});
}

size_t ParamGatherer::index_of(const Tensor& param) const {
  for (size_t k = 0; k < params_.size(); ++k)
    if (params_[k].is_same(param)) return k;
  KILN_FAIL("ZeRO stage 3: register_external_parameter: the tensor is not one of the trainable parameters this "
            "optimizer partitions; pass a parameter of the model it was built over");
}

void ParamGatherer::gather(const std::vector<size_t>& ks) {
  for (size_t k : ks) gather(k);
}

void ParamGatherer::gather(size_t k) {
  if (gathered_[k]) return;
  NoGradGuard no_grad;
  const FlatRange range = layout_.param(static_cast<int64_t>(k));
  const FlatRange part = layout_.partition(comm_.rank());
  Tensor full = empty({range.size()}, shard_.options());
  std::vector<Tensor> outputs;
  for (int r = 0; r < comm_.size(); ++r) {
    const FlatRange piece = intersect(range, layout_.partition(r));
    outputs.push_back(full.narrow(0, piece.begin - range.begin, piece.size()));
  }
  const FlatRange mine = intersect(range, part);
  comm_.all_gather(outputs, mine.empty() ? shard_.narrow(0, 0, 0) : shard_.narrow(0, mine.begin - part.begin, mine.size()));
  params_[k].set_data(full.view(shapes_[k]));
  gathered_[k] = true;
}

void ParamGatherer::release(size_t k) {
  if (!gathered_[k]) return;
  params_[k].set_data(empty({0}, shard_.options()));
  gathered_[k] = false;
}

void ParamGatherer::gather_all() {
  for (size_t k = 0; k < params_.size(); ++k) gather(k);
}

void ParamGatherer::release_all() {
  std::fill(users_.begin(), users_.end(), 0);  // after a forward that threw, say
  for (size_t k = 0; k < params_.size(); ++k) release(k);
}

}  // namespace kiln::distributed

namespace kiln::distributed {

void ParamGatherer::pin_all() {
  for (size_t k = 0; k < params_.size(); ++k) {
    ++users_[k];
    gather(k);
  }
}

void ParamGatherer::unpin_all() {
  for (size_t k = 0; k < params_.size(); ++k) {
    if (users_[k] > 0 && --users_[k] == 0) release(k);
  }
}

}  // namespace kiln::distributed
