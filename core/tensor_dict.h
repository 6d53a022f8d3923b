// core/tensor_dict.h: an ordered name -> Tensor map, the currency of state dicts (nn::Module,
// optim::Optimizer) and of safetensors files. Insertion order is kept, as in PyTorch's OrderedDict;
// names are unique.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace kiln {

class TensorDict {
 public:
  using Item = std::pair<std::string, Tensor>;

  TensorDict() = default;
  TensorDict(std::initializer_list<Item> items) {
    for (const auto& [name, t] : items) insert(name, t);
  }

  // Adds `name`; an Error when it is already there (use set() to replace).
  void insert(std::string name, Tensor t) {
    KILN_CHECK(find(name) == nullptr, "TensorDict: '{}' is already present; use set() to replace it",
               name);
    items_.emplace_back(std::move(name), std::move(t));
  }
  // Adds or replaces `name`.
  void set(std::string_view name, Tensor t) {
    if (Tensor* slot = find(name)) {
      *slot = std::move(t);
    } else {
      items_.emplace_back(std::string(name), std::move(t));
    }
  }
  Tensor* find(std::string_view name) {
    for (auto& [key, t] : items_) {
      if (key == name) return &t;
    }
    return nullptr;
  }
  const Tensor* find(std::string_view name) const { return const_cast<TensorDict*>(this)->find(name); }
  bool contains(std::string_view name) const { return find(name) != nullptr; }
  const Tensor& at(std::string_view name) const {
    const Tensor* t = find(name);
    KILN_CHECK(t != nullptr, "TensorDict: no entry named '{}' ({} entries); check the name", name,
               items_.size());
    return *t;
  }
  std::vector<std::string> keys() const {
    std::vector<std::string> out;
    out.reserve(items_.size());
    for (const auto& item : items_) out.push_back(item.first);
    return out;
  }

  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  auto begin() { return items_.begin(); }
  auto end() { return items_.end(); }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }

 private:
  std::vector<Item> items_;
};

}  // namespace kiln
