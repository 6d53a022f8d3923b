// optim/optimizer.cpp: parameter groups, zero_grad and the state_dict of every optimizer.
#include "optim/optimizer.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <unordered_set>

#include "core/error.h"
#include "core/grad_mode.h"
#include "ops/ops.h"

namespace kiln::optim {

bool ParamGroup::has(std::string_view name) const {
  for (const auto& [key, value] : options) {
    if (key == name) return true;
  }
  return false;
}

double ParamGroup::get(std::string_view name) const {
  for (const auto& [key, value] : options) {
    if (key == name) return value;
  }
  std::string known;
  for (const auto& [key, value] : options) known += (known.empty() ? "" : ", ") + key;
  KILN_FAIL("param group: no option '{}' (it has: {})", name, known);
}

void ParamGroup::set(std::string_view name, double value) {
  for (auto& [key, v] : options) {
    if (key == name) {
      v = value;
      return;
    }
  }
  options.emplace_back(std::string(name), value);
}

bool Optimizer::wants_fused(const ParamGroup& group) { return group.has("fused") && group.get("fused") != 0; }

bool Optimizer::flag(const ParamGroup& group, std::string_view name) {
  const double value = group.get(name);
  KILN_CHECK(value == 0 || value == 1, "option '{}' is {}, but it is a flag: 0 or 1", name, value);
  return value == 1;
}

void Optimizer::check_group(const ParamGroup&) const {}

bool Optimizer::fusable(const Tensor& p, const Tensor& t) {
  return (p.dtype() == kFloat32 || p.dtype() == kFloat64) && p.is_contiguous() && t.dtype() == p.dtype() &&
         t.device() == p.device();
}

void Optimizer::add_group(std::vector<Tensor> params,
                          std::vector<std::pair<std::string, double>> options) {
  KILN_CHECK(!params.empty(), "{}: got an empty parameter list; pass the tensors to optimize",
             name_);
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    KILN_CHECK(p.defined(), "{}: parameter {} of group {} is an undefined Tensor", name_, i,
               groups_.size());
    KILN_CHECK(p.is_floating_point(),
               "{}: parameter {} of group {} is {}; only floating tensors can be optimized", name_,
               i, groups_.size(), dtype_name(p.dtype()));
    KILN_CHECK(p.is_leaf(),
               "{}: can't optimize a non-leaf Tensor (parameter {} of group {}); pass "
               "leaves, e.g. t.detach().requires_grad_()",
               name_, i, groups_.size());
    for (size_t g = 0; g < groups_.size(); ++g) {
      for (const Tensor& q : groups_[g].params) {
        KILN_CHECK(!q.is_same(p),
                   "{}: parameter {} of the new group is already in group {}; a "
                   "parameter may appear in one group only",
                   name_, i, g);
      }
    }
    for (size_t j = 0; j < i; ++j) {
      KILN_CHECK(!params[j].is_same(p), "{}: parameters {} and {} of group {} are the same tensor",
                 name_, j, i, groups_.size());
    }
  }
  groups_.push_back(ParamGroup{std::move(params), std::move(options)});
}

void Optimizer::zero_grad(bool set_to_none) {
  NoGradGuard no_grad;
  for (ParamGroup& group : groups_) {
    for (Tensor& p : group.params) {
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      if (set_to_none) {
        p.set_grad(Tensor());
      } else {
        // As PyTorch: a grad that is part of a graph (a hook's, or backward with create_graph)
        // is detached before it is zeroed, so later accumulation builds no graph on it.
        if (grad.requires_grad()) p.set_grad(grad.detach());
        p.grad().zero_();
      }
    }
  }
}

std::vector<Tensor> Optimizer::grads() {
  std::vector<Tensor> out;
  for (const ParamGroup& group : groups_) {
    for (const Tensor& p : group.params) {
      Tensor g = p.grad();
      if (g.defined()) out.push_back(g);
    }
  }
  return out;
}

Optimizer::Unscaled Optimizer::unscale_grads_(double factor) {
  NoGradGuard no_grad;
  std::vector<Tensor> gs = grads();
  for (Tensor& g : gs) g.mul_(factor);
  return {.has_grads = !gs.empty(), .found_inf = has_inf_or_nan(gs)};
}

bool has_inf_or_nan(const std::vector<Tensor>& grads) {
  NoGradGuard no_grad;
  // An inf or NaN anywhere makes a sum inf or NaN (inf - inf is NaN).
  Tensor total;
  for (const Tensor& g : grads) {
    Tensor s = sum(g, {}, false, is_reduced_float(g.dtype()) ? kFloat32 : g.dtype());
    s = total.defined() ? s.to(total.device(), kFloat64) : s.to(kFloat64);
    total = total.defined() ? total + s : s;
  }
  if (!total.defined() || std::isfinite(total.item<double>())) return false;
  return std::any_of(grads.begin(), grads.end(), [](const Tensor& g) {
    return g.numel() > 0 && !(std::isfinite(g.max().item<double>()) && std::isfinite(g.min().item<double>()));
  });
}

const ParamState* Optimizer::find_state(const Tensor& param) const {
  auto it = state_.find(param.impl());
  return it == state_.end() ? nullptr : &it->second;
}

TensorDict Optimizer::state_dict() const {
  TensorDict dict;
  int64_t index = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const ParamGroup& group = groups_[g];
    std::vector<int64_t> indices;
    for (size_t i = 0; i < group.params.size(); ++i)
      indices.push_back(index + static_cast<int64_t>(i));
    dict.insert(fmt::format("param_groups.{}.params", g), from_vector(indices));
    for (const auto& [key, value] : group.options) {
      dict.insert(fmt::format("param_groups.{}.{}", g, key), scalar_tensor(value, kFloat64));
    }
    index += static_cast<int64_t>(group.params.size());
  }
  index = 0;
  for (const ParamGroup& group : groups_) {
    for (const Tensor& p : group.params) {
      if (const ParamState* st = find_state(p)) {
        dict.insert(fmt::format("state.{}.step", index), scalar_tensor(st->step, kInt64));
        for (const auto& [key, buffer] : st->buffers) {
          dict.insert(fmt::format("state.{}.{}", index, key), buffer);
        }
      }
      ++index;
    }
  }
  return dict;
}

namespace {

// "<prefix>.<n>.<rest>" -> (n, rest); false when `key` has another form.
bool split_key(std::string_view key, std::string_view prefix, int64_t& n, std::string& rest) {
  if (key.substr(0, prefix.size()) != prefix || key.size() <= prefix.size() ||
      key[prefix.size()] != '.') {
    return false;
  }
  std::string_view tail = key.substr(prefix.size() + 1);
  size_t dot = tail.find('.');
  if (dot == std::string_view::npos || dot + 1 >= tail.size()) return false;
  auto [end, ec] = std::from_chars(tail.data(), tail.data() + dot, n);
  if (ec != std::errc() || end != tail.data() + dot || n < 0) return false;
  rest = std::string(tail.substr(dot + 1));
  return true;
}

// The options that schedulers add to a group (OneCycleLR's max_lr and momenta, CosineAnnealingLR's
// min_lr, every scheduler's initial_lr) are the schedulers' and no optimizer checks them: their
// rule, >= 0, is applied here.
bool scheduler_option(std::string_view key) {
  return key == "initial_lr" || key == "max_lr" || key == "min_lr" || key == "base_momentum" ||
         key == "max_momentum";
}

}  // namespace

std::optional<Optimizer::BufferNames> Optimizer::buffer_names(const ParamGroup&) const { return std::nullopt; }

void Optimizer::check_buffer_names(int64_t index, int64_t step, const TensorDict& buffers, const ParamGroup& group,
                                   size_t g) const {
  const std::optional<BufferNames> names = buffer_names(group);
  if (!names || (step == 0 && buffers.size() == 0)) return;  // a step-0 entry without buffers is no state
  const auto listed = [&] {
    std::string all;
    for (const std::string& n : names->required) all += (all.empty() ? "" : ", ") + n;
    for (const std::string& n : names->optional) all += (all.empty() ? "" : ", ") + n + " (optional)";
    return all.empty() ? std::string("no buffers") : all;
  };
  for (const std::string& name : names->required) {
    KILN_CHECK(buffers.contains(name),
               "{}.load_state_dict: 'state.{}' lacks '{}' (for a parameter of group {}, {} keeps {}); the state "
               "dict is damaged or from another optimizer", name_, index, name, g, name_, listed());
  }
  for (const std::string& name : buffers.keys()) {
    const bool known = std::find(names->required.begin(), names->required.end(), name) != names->required.end() ||
                       std::find(names->optional.begin(), names->optional.end(), name) != names->optional.end();
    KILN_CHECK(known, "{}.load_state_dict: 'state.{}.{}' is not a buffer {} keeps (for a parameter of group {}: "
               "{}); the state dict is from another optimizer or other options", name_, index, name, name_, g,
               listed());
  }
}

void Optimizer::load_state_dict(const TensorDict& dict) {
  // Read everything and check it against this optimizer before changing anything.
  std::map<int64_t, std::vector<std::pair<std::string, double>>> options;
  std::map<int64_t, int64_t> group_sizes;
  std::map<int64_t, std::pair<int64_t, TensorDict>> states;  // index -> (step, buffers)
  for (const auto& [key, t] : dict) {
    int64_t n = 0;
    std::string rest;
    if (split_key(key, "param_groups", n, rest)) {
      KILN_CHECK(n < static_cast<int64_t>(groups_.size()),
                 "{}.load_state_dict: the state dict has a parameter group {} ('{}') but this "
                 "optimizer has {} groups; build the optimizer with the same groups",
                 name_, n, key, groups_.size());
      if (rest == "params") {
        KILN_CHECK(t.dim() == 1, "{}.load_state_dict: '{}' should be 1-d, got shape {}", name_, key,
                   t.sizes().str());
        group_sizes[n] = t.numel();
      } else {
        KILN_CHECK(t.numel() == 1, "{}.load_state_dict: '{}' should hold one number, got shape {}",
                   name_, key, t.sizes().str());
        options[n].emplace_back(rest, t.item<double>());
      }
    } else if (split_key(key, "state", n, rest)) {
      auto& [step, buffers] = states[n];
      if (rest == "step") {
        KILN_CHECK(t.numel() == 1, "{}.load_state_dict: '{}' should hold one number, got shape {}",
                   name_, key, t.sizes().str());
        step = t.item<int64_t>();
      } else {
        buffers.insert(rest, t);
      }
    } else {
      KILN_FAIL(
          "{}.load_state_dict: unexpected entry '{}'; expected param_groups.<g>.<option> or "
          "state.<i>.<name>",
          name_, key);
    }
  }
  KILN_CHECK(group_sizes.size() == groups_.size(),
             "{}.load_state_dict: the state dict has {} parameter groups but this optimizer has {}",
             name_, group_sizes.size(), groups_.size());
  std::vector<const Tensor*> params;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const ParamGroup& group = groups_[g];
    KILN_CHECK(group_sizes[g] == static_cast<int64_t>(group.params.size()),
               "{}.load_state_dict: parameter group {} has {} parameters in the state dict but {} "
               "in this optimizer",
               name_, g, group_sizes[g], group.params.size());
    for (const auto& [key, value] : group.options) {
      bool found = false;
      for (const auto& [k, v] : options[g]) found = found || k == key;
      // "fused" came later than the other options: a state dict saved before it keeps this
      // optimizer's setting, as PyTorch's optimizers do with setdefault('fused', ...). A
      // scheduler's options (initial_lr, ...) are absent from a state dict saved before the
      // scheduler was made: the group keeps the values the scheduler set, as in PyTorch, where
      // the scheduler holds its own copy of them.
      KILN_CHECK(found || key == "fused" || scheduler_option(key),
                 "{}.load_state_dict: the state dict lacks 'param_groups.{}.{}'", name_, g, key);
    }
    for (const Tensor& p : group.params) params.push_back(&p);
  }
  // Every value is checked as the constructor checks it: a damaged or hand-edited file gets an Error
  // here rather than a NaN loss later. The lr only for being finite: a scheduler may have written a
  // negative one (OneCycleLR's linear anneal on its last step, as PyTorch's), and the optimizer's own
  // state dict must load.
  std::vector<ParamGroup> loaded(groups_.size());  // each group's options as they will be (no params)
  for (size_t g = 0; g < groups_.size(); ++g) {
    loaded[g].options = groups_[g].options;
    for (const auto& [key, value] : options[static_cast<int64_t>(g)]) {
      KILN_CHECK(std::isfinite(value) && (value >= 0 || !scheduler_option(key)),
                 "{}.load_state_dict: 'param_groups.{}.{}' is {}, but it must be a finite number{}; the state "
                 "dict is damaged", name_, g, key, value, scheduler_option(key) ? " >= 0" : "");
      loaded[g].set(key, key == "lr" ? std::max(value, 0.0) : value);
    }
    try {
      check_group(loaded[g]);
    } catch (const Error& e) {
      KILN_FAIL("{}.load_state_dict: 'param_groups.{}' holds options that {} refuses ({}); the state dict is damaged",
                name_, g, name_, e.what());
    }
  }
  std::vector<size_t> group_of;  // parameter index -> group
  for (size_t g = 0; g < groups_.size(); ++g) group_of.insert(group_of.end(), groups_[g].params.size(), g);
  for (const auto& [index, entry] : states) {
    KILN_CHECK(entry.first >= 0, "{}.load_state_dict: 'state.{}.step' is {}, but a step count is >= 0; the state "
               "dict is damaged", name_, index, entry.first);
    KILN_CHECK(index < static_cast<int64_t>(params.size()),
               "{}.load_state_dict: state for parameter {} but this optimizer has {} parameters",
               name_, index, params.size());
    const Tensor& p = *params[index];
    for (const auto& [name, buffer] : entry.second) {
      KILN_CHECK(buffer.sizes() == p.sizes(),
                 "{}.load_state_dict: 'state.{}.{}' has shape {} but parameter {} has shape {}",
                 name_, index, name, buffer.sizes().str(), index, p.sizes().str());
    }
    check_buffer_names(index, entry.first, entry.second, loaded[group_of[static_cast<size_t>(index)]],
                       group_of[static_cast<size_t>(index)]);
  }

  for (size_t g = 0; g < groups_.size(); ++g) {
    for (const auto& [key, value] : options[g]) groups_[g].set(key, value);
  }
  state_.clear();
  for (const auto& [index, entry] : states) {
    const Tensor& p = *params[index];
    ParamState& st = state_[p.impl()];
    st.step = entry.first;
    for (const auto& [name, buffer] : entry.second) {
      Tensor copy = buffer.to(p.device(), p.dtype());
      st.buffers.insert(name, copy.is_same(buffer) ? copy.clone() : copy);
    }
  }
}

}  // namespace kiln::optim
