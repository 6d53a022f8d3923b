// nn/container.cpp: see nn/container.h.
#include "nn/container.h"

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

}  // namespace kiln::nn
