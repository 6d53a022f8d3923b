// nn/container.cpp: see nn/container.h.
#include "nn/container.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

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

std::shared_ptr<Module> ModuleDict::pop(const std::string& key) {
  auto it = std::find_if(items_.begin(), items_.end(), [&](const auto& item) { return item.first == key; });
  KILN_CHECK(it != items_.end(), "nn::ModuleDict::pop: no module named '{}' ({} modules); check the key", key,
             items_.size());
  std::shared_ptr<Module> out = std::move(it->second);
  items_.erase(it);
  remove_module(key);
  return out;
}

std::vector<std::string> ModuleDict::keys() const {
  std::vector<std::string> out;
  for (const auto& item : items_) out.push_back(item.first);
  return out;
}

namespace {
// PyTorch's line for one parameter of a ParameterList / ParameterDict: "Parameter containing:
// [torch.float32 of size 3x4]" (the list names the dtype, the dict the tensor type, as 1.13's).
std::string parameter_line(const std::string& key, const Tensor& p, bool type_name) {
  std::vector<std::string> sizes;
  for (int64_t s : p.sizes()) sizes.push_back(std::to_string(s));
  std::string type = "torch." + std::string(dtype_name(p.dtype()));
  if (type_name) {
    const char* base = p.dtype() == kFloat64 ? "DoubleTensor"
                       : p.dtype() == kFloat16 ? "HalfTensor"
                       : p.dtype() == kBFloat16 ? "BFloat16Tensor"
                                                : "FloatTensor";
    type = std::string(p.is_cuda() ? "torch.cuda." : "torch.") + base;
  }
  return fmt::format("  ({}): Parameter containing: [{} of size {}{}]", key, type, fmt::join(sizes, "x"),
                     p.is_cuda() ? fmt::format(" (GPU {})", p.device().index) : "");
}
}  // namespace

ParameterList::ParameterList(std::initializer_list<Tensor> params) {
  for (const Tensor& p : params) append(p);
}

Tensor ParameterList::append(Tensor param) {
  KILN_CHECK(param.defined(), "nn::ParameterList: the parameter to append is undefined; give it a tensor");
  Tensor handle = register_parameter(std::to_string(count_), std::move(param));
  ++count_;
  return handle;
}

void ParameterList::extend(const std::vector<Tensor>& params) {
  for (const Tensor& p : params) append(p);
}

Tensor ParameterList::operator[](int64_t i) const {
  const int64_t n = static_cast<int64_t>(count_);
  KILN_CHECK(i >= -n && i < n, "nn::ParameterList: index {} is out of range ({} parameters)", i, n);
  return own_parameter(std::to_string(i < 0 ? i + n : i));
}

std::vector<Tensor> ParameterList::values() const {
  std::vector<Tensor> out;
  for (size_t i = 0; i < count_; ++i) out.push_back(own_parameter(std::to_string(i)));
  return out;
}

std::string ParameterList::extra_repr() const {
  std::vector<std::string> lines;
  for (size_t i = 0; i < count_; ++i) lines.push_back(parameter_line(std::to_string(i), (*this)[i], false));
  return fmt::format("{}", fmt::join(lines, "\n"));
}

ParameterDict::ParameterDict(std::initializer_list<std::pair<std::string, Tensor>> items) {
  for (const auto& [key, p] : items) insert(key, p);
}

Tensor ParameterDict::insert(const std::string& key, Tensor param) {
  KILN_CHECK(param.defined(), "nn::ParameterDict: the parameter for '{}' is undefined; give it a tensor", key);
  if (contains(key)) return set_parameter(key, std::move(param));
  Tensor handle = register_parameter(key, std::move(param));
  keys_.push_back(key);
  return handle;
}

bool ParameterDict::contains(const std::string& key) const {
  return std::find(keys_.begin(), keys_.end(), key) != keys_.end();
}

Tensor ParameterDict::operator[](const std::string& key) const {
  KILN_CHECK(contains(key), "nn::ParameterDict: no parameter named '{}' ({} parameters); check the key", key,
             keys_.size());
  return own_parameter(key);
}

std::string ParameterDict::extra_repr() const {
  std::vector<std::string> lines;
  for (const std::string& key : keys_) lines.push_back(parameter_line(key, own_parameter(key), true));
  return fmt::format("{}", fmt::join(lines, "\n"));
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
