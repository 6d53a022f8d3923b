// nn/container.cpp: see nn/container.h.
#include "nn/container.h"

#include "autograd/autograd.h"

namespace kiln::nn {

Module& ModuleList::operator[](size_t i) const {
  KILN_CHECK(i < items_.size(), "nn::{}: index {} is out of range ({} modules)", name(), i, items_.size());
  return *items_[i];
}

Tensor Sequential::forward(const Tensor& input) {
  Tensor x = input;
  for (const auto& m : items_) x = (*m)(x);
  return x;
}

ModuleDict::ModuleDict(std::initializer_list<std::pair<std::string, std::shared_ptr<Module>>> items) {
  for (const auto& [key, m] : items) insert(key, m);
}

bool ModuleDict::contains(const std::string& key) const {
  for (const auto& item : items_)
    if (item.first == key) return true;
  return false;
}

Module& ModuleDict::operator[](const std::string& key) const {
  for (const auto& item : items_)
    if (item.first == key) return *item.second;
  KILN_FAIL("nn::ModuleDict: no module named '{}' ({} modules); check the key", key, items_.size());
}

std::vector<std::string> ModuleDict::keys() const {
  std::vector<std::string> out;
  for (const auto& item : items_) out.push_back(item.first);
  return out;
}

CheckpointWrapper::CheckpointWrapper(std::shared_ptr<Module> module, bool preserve_rng_state)
    : preserve_rng_state(preserve_rng_state), module_(std::move(module)) {
  KILN_CHECK(module_ != nullptr, "nn::CheckpointWrapper: the module to wrap is null");
  register_wrapped_module("_checkpoint_wrapped_module", module_);
}

Tensor checkpoint_module(Module& module, const Tensor& input, bool preserve_rng_state, bool skip_unread) {
  autograd::CheckpointOptions options;
  options.preserve_rng_state = preserve_rng_state;
  return checkpoint_module(module, input, options, skip_unread);
}

Tensor checkpoint_module(Module& module, const Tensor& input, const autograd::CheckpointOptions& options,
                         bool skip_unread) {
  Module* m = &module;
  const bool whole = !skip_unread || m->has_forward_hooks();  // hooks must see the values
  return autograd::checkpoint(
      [m](const autograd::TensorList& in) { return autograd::TensorList{(*m)(in[0])}; },
      [m, whole](const autograd::TensorList& in) {
        return autograd::TensorList{whole ? (*m)(in[0]) : m->forward_for_recompute(in[0])};
      },
      {input}, options)[0];
}

Tensor CheckpointWrapper::forward(const Tensor& input) {
  return checkpoint_module(*module_, input, preserve_rng_state);
}

}  // namespace kiln::nn
