// nn/module.cpp: registration, traversal, state dicts, placement, hooks and printing of nn::Module.
#include "nn/module.h"

#include <cxxabi.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <ostream>
#include <set>
#include <typeinfo>

#include "core/grad_mode.h"
#include "nn/container.h"
#include "ops/ops.h"

namespace kiln::nn {

namespace {

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "\"" : ", \"") + n + "\"";
  return out;
}

}  // namespace

Module::Module() : hooks_(std::make_shared<Hooks>()) {}

// Checked before anything is moved, so a refused move leaves `other` intact.
static Module& check_movable(Module& other, const std::vector<std::pair<std::string, bool>>& borrowed) {
  for (const auto& [name, is_borrowed] : borrowed) {
    KILN_CHECK(!is_borrowed,
               "nn::Module: cannot move a {} that registers submodule '{}' by reference: the moved "
               "module would point at the old one's members. Keep the module in place (or hold it in a "
               "std::shared_ptr), or register owned children: register_module(name, std::make_shared<M>(...))",
               other.name(), name);
  }
  return other;
}

std::vector<std::pair<std::string, bool>> Module::borrowed_children() const {
  std::vector<std::pair<std::string, bool>> out;
  for (const Child& c : children_) out.emplace_back(c.name, c.owned == nullptr);
  return out;
}

Module::Module(Module&& other)
    : parameters_(std::move(check_movable(other, other.borrowed_children()).parameters_)),
      buffers_(std::move(other.buffers_)),
      children_(std::move(other.children_)),
      training_(other.training_),
      hooks_(std::exchange(other.hooks_, std::make_shared<Hooks>())) {
  other.parameters_.clear();
  other.buffers_.clear();
  other.children_.clear();
}

std::string Module::name() const {
  const char* mangled = typeid(*this).name();
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string full = status == 0 && demangled ? demangled : mangled;
  std::free(demangled);
  size_t colon = full.rfind("::");
  return colon == std::string::npos ? full : full.substr(colon + 2);
}

Tensor Module::forward(const Tensor&) {
  KILN_FAIL("nn::Module: {} has no forward(const Tensor&); define `Tensor forward(const Tensor& x)` in it",
            name());
}

Tensor Module::operator()(const Tensor& input) {
  if (hooks_->pre.empty() && hooks_->post.empty()) return forward(input);  // the hot path
  Tensor x = input;
  auto pre = hooks_->pre;  // copies: a hook may remove itself
  for (auto& [id, hook] : pre) {
    Tensor replaced = hook(*this, x);
    if (replaced.defined()) x = replaced;
  }
  Tensor y = forward(x);
  auto post = hooks_->post;
  for (auto& [id, hook] : post) {
    Tensor replaced = hook(*this, x, y);
    if (replaced.defined()) y = replaced;
  }
  return y;
}

// ---- registration ----

void Module::check_new_name(const std::string& name, const char* what) const {
  KILN_CHECK(!name.empty() && name.find('.') == std::string::npos,
             "nn::Module: {} name '{}' must be non-empty and contain no '.'", what, name);
  auto taken = [&](const auto& list) {
    return std::any_of(list.begin(), list.end(), [&](const auto& s) { return s.name == name; });
  };
  KILN_CHECK(!taken(parameters_) && !taken(buffers_) && !taken(children_),
             "nn::Module: {} already has an attribute '{}'; choose another {} name", this->name(), name, what);
}

Tensor Module::register_parameter(const std::string& name, Tensor t, bool requires_grad) {
  check_new_name(name, "parameter");
  if (t.defined()) {
    KILN_CHECK(t.is_floating_point(), "nn::Module: parameter '{}' must be floating, not {}", name,
               dtype_name(t.dtype()));
    KILN_CHECK(t.is_leaf(), "nn::Module: parameter '{}' must be a leaf tensor; pass t.detach()", name);
    t.requires_grad_(requires_grad);
  }
  parameters_.push_back({name, std::move(t), true});
  return parameters_.back().tensor;
}

Tensor Module::set_parameter(const std::string& name, Tensor t) {
  for (Slot& p : parameters_) {
    if (p.name != name) continue;
    KILN_CHECK(!t.defined() || !p.tensor.defined() || t.sizes() == p.tensor.sizes(),
               "nn::Module::set_parameter: '{}' of {} has shape {}; the new tensor has {}", name, this->name(),
               p.tensor.sizes().str(), t.sizes().str());
    if (t.defined()) {  // what register_parameter asks of a parameter
      KILN_CHECK(t.is_floating_point(), "nn::Module::set_parameter: parameter '{}' must be floating, not {}", name,
                 dtype_name(t.dtype()));
      KILN_CHECK(t.is_leaf(), "nn::Module::set_parameter: parameter '{}' must be a leaf tensor; pass t.detach()",
                 name);
    }
    p.tensor = std::move(t);
    return p.tensor;
  }
  KILN_FAIL("nn::Module::set_parameter: {} has no parameter '{}'; use register_parameter to add one", this->name(),
            name);
}

Tensor Module::register_buffer(const std::string& name, Tensor t, bool persistent) {
  check_new_name(name, "buffer");
  buffers_.push_back({name, std::move(t), persistent});
  return buffers_.back().tensor;
}

namespace {
// The names of a slot list, for an Error: "'weight', 'bias'" or "none".
template <class Slots>
std::string slot_names(const Slots& slots) {
  std::string out;
  for (const auto& s : slots) out += (out.empty() ? "'" : ", '") + s.name + "'";
  return out.empty() ? "none" : out;
}
}  // namespace

Tensor Module::remove_parameter(const std::string& name) {
  auto it = std::find_if(parameters_.begin(), parameters_.end(), [&](const Slot& s) { return s.name == name; });
  KILN_CHECK(it != parameters_.end(), "nn::Module::remove_parameter: {} has no parameter '{}' (its own are {})",
             this->name(), name, slot_names(parameters_));
  Tensor t = std::move(it->tensor);
  parameters_.erase(it);
  return t;
}

Tensor Module::remove_buffer(const std::string& name) {
  auto it = std::find_if(buffers_.begin(), buffers_.end(), [&](const Slot& s) { return s.name == name; });
  KILN_CHECK(it != buffers_.end(), "nn::Module::remove_buffer: {} has no buffer '{}' (its own are {})", this->name(),
             name, slot_names(buffers_));
  Tensor t = std::move(it->tensor);
  buffers_.erase(it);
  return t;
}

std::shared_ptr<Module> Module::remove_module(const std::string& name) {
  auto it = std::find_if(children_.begin(), children_.end(), [&](const Child& c) { return c.name == name; });
  KILN_CHECK(it != children_.end(), "nn::Module::remove_module: {} has no submodule '{}' (its own are {})",
             this->name(), name, slot_names(children_));
  std::shared_ptr<Module> owned = std::move(it->owned);
  children_.erase(it);
  return owned;
}

void Module::throw_null_module(const std::string& name) const {
  KILN_FAIL("nn::Module: the submodule '{}' given to {} is a null pointer; make it first, e.g. "
            "std::make_shared<nn::Linear>(4, 2)",
            name, this->name());
}

void Module::add_child(const std::string& name, Module* module, std::shared_ptr<Module> owned, bool wrapped) {
  if (module == nullptr) throw_null_module(name);
  check_new_name(name, "submodule");
  KILN_CHECK(module != this, "nn::Module: {} cannot register itself as its submodule '{}'", this->name(), name);
  // The tree stays a tree (every add is checked, so the walk below ends): a module that holds this
  // one would make parameters() and every other walk recurse forever.
  std::vector<const Module*> todo{module};
  while (!todo.empty()) {
    const Module* m = todo.back();
    todo.pop_back();
    KILN_CHECK(m != this, "nn::Module: {} cannot register submodule '{}': that {} already holds it, and modules "
               "form a tree, not a cycle", this->name(), name, module->name());
    for (const Child& c : m->children_) todo.push_back(c.module);
  }
  children_.push_back({name, module, std::move(owned), wrapped});
}

void Module::register_modules(std::initializer_list<NamedRef> modules) {
  for (const NamedRef& m : modules) add_child(m.name, &m.module, nullptr);
}

// ---- traversal ----

void Module::collect_parameters(const std::string& prefix,
                                std::vector<std::pair<std::string, Tensor>>& out) const {
  for (const Slot& p : parameters_) {
    if (p.tensor.defined()) out.emplace_back(prefix + p.name, p.tensor);
  }
  for (const Child& c : children_) c.module->collect_parameters(c.prefix(prefix), out);
}

void Module::collect_buffers(const std::string& prefix, bool persistent_only,
                             std::vector<std::pair<std::string, Tensor>>& out) const {
  for (const Slot& b : buffers_) {
    if (b.tensor.defined() && (b.persistent || !persistent_only)) out.emplace_back(prefix + b.name, b.tensor);
  }
  for (const Child& c : children_) c.module->collect_buffers(c.prefix(prefix), persistent_only, out);
}

Tensor Module::own_parameter(const std::string& name) const {
  for (const Slot& slot : parameters_) {
    if (slot.name == name) return slot.tensor;
  }
  return {};
}

namespace {
// PyTorch lists a tensor shared by two modules once, under its first name.
std::vector<std::pair<std::string, Tensor>> unique(std::vector<std::pair<std::string, Tensor>> all) {
  std::set<const TensorImpl*> seen;
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& item : all) {
    if (seen.insert(item.second.impl()).second) out.push_back(std::move(item));
  }
  return out;
}
std::vector<Tensor> values(const std::vector<std::pair<std::string, Tensor>>& named) {
  std::vector<Tensor> out;
  out.reserve(named.size());
  for (const auto& item : named) out.push_back(item.second);
  return out;
}
}  // namespace

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> all;
  if (recurse) {
    collect_parameters("", all);
  } else {
    for (const Slot& p : parameters_)
      if (p.tensor.defined()) all.emplace_back(p.name, p.tensor);
  }
  return unique(std::move(all));
}
std::vector<Tensor> Module::parameters(bool recurse) const { return values(named_parameters(recurse)); }

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> all;
  if (recurse) {
    collect_buffers("", false, all);
  } else {
    for (const Slot& b : buffers_)
      if (b.tensor.defined()) all.emplace_back(b.name, b.tensor);
  }
  return unique(std::move(all));
}
std::vector<Tensor> Module::buffers(bool recurse) const { return values(named_buffers(recurse)); }

std::vector<std::pair<std::string, Module*>> Module::named_children() const {
  std::vector<std::pair<std::string, Module*>> out;
  for (const Child& c : children_) out.emplace_back(c.name, c.module);
  return out;
}
std::vector<Module*> Module::children() const {
  std::vector<Module*> out;
  for (const Child& c : children_) out.push_back(c.module);
  return out;
}

void Module::collect_modules(const std::string& prefix, std::vector<std::pair<std::string, Module*>>& out) {
  out.emplace_back(prefix, this);
  for (const Child& c : children_) c.module->collect_modules(prefix.empty() ? c.name : prefix + "." + c.name, out);
}
std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> all, out;
  collect_modules("", all);
  std::set<const Module*> seen;
  for (auto& item : all)
    if (seen.insert(item.second).second) out.push_back(item);
  return out;
}
std::vector<Module*> Module::modules() {
  std::vector<Module*> out;
  for (auto& item : named_modules()) out.push_back(item.second);
  return out;
}

Module& Module::apply(const std::function<void(Module&)>& fn) {
  KILN_CHECK(fn != nullptr, "nn::Module::apply: the function is empty; pass a callable");
  for (const Child& c : children_) c.module->apply(fn);
  fn(*this);
  return *this;
}

// ---- mode, placement, gradients ----

Module& Module::get_submodule(const std::string& target) {
  Module* at = this;
  std::string path;  // the part found so far
  size_t begin = 0;
  while (!target.empty() && begin <= target.size()) {
    const size_t dot = target.find('.', begin);
    const std::string part = target.substr(begin, dot == std::string::npos ? std::string::npos : dot - begin);
    Module* next = nullptr;
    for (const auto& [name, child] : at->named_children()) {
      if (name == part) next = child;
    }
    KILN_CHECK(next != nullptr, "nn::Module::get_submodule: {} has no submodule '{}' (looking for '{}')",
               path.empty() ? name() : fmt::format("{} ('{}')", at->name(), path), part, target);
    path += (path.empty() ? "" : ".") + part;
    at = next;
    if (dot == std::string::npos) break;
    begin = dot + 1;
  }
  return *at;
}

Tensor Module::get_parameter(const std::string& target) const {
  std::vector<std::pair<std::string, Tensor>> all;
  collect_parameters("", all);  // every name, a tied parameter's second one too
  for (const auto& [name, t] : all) {
    if (name == target) return t;
  }
  KILN_FAIL("nn::Module::get_parameter: {} has no parameter '{}'", name(), target);
}

Tensor Module::get_buffer(const std::string& target) const {
  std::vector<std::pair<std::string, Tensor>> all;
  collect_buffers("", false, all);
  for (const auto& [name, t] : all) {
    if (name == target) return t;
  }
  KILN_FAIL("nn::Module::get_buffer: {} has no buffer '{}'", name(), target);
}

Module& Module::requires_grad_(bool requires_grad) {
  for (Tensor& p : parameters()) p.requires_grad_(requires_grad);
  return *this;
}

Module& Module::train(bool on) {
  training_ = on;
  for (const Child& c : children_) c.module->train(on);
  return *this;
}

void Module::convert(const std::function<Tensor(const Tensor&)>& fn) {
  NoGradGuard no_grad;
  for (auto& [name, t] : named_parameters()) {
    Tensor moved = fn(t);
    if (moved.is_same(t)) continue;
    Tensor grad = t.grad();
    t.set_data(moved);
    if (grad.defined()) {
      Tensor g = fn(grad);
      if (!g.is_same(grad)) t.set_grad(g.detach());
    }
  }
  for (auto& [name, t] : named_buffers()) {
    Tensor moved = fn(t);
    if (!moved.is_same(t)) t.set_data(moved);
  }
}

Module& Module::to(Device device) {
  convert([&](const Tensor& t) { return t.to(device); });
  return *this;
}
Module& Module::to(DType dtype) {
  KILN_CHECK(is_floating(dtype), "nn::Module::to: only floating dtypes are allowed, not {}", dtype_name(dtype));
  convert([&](const Tensor& t) { return t.is_floating_point() ? t.to(dtype) : t; });
  return *this;
}
Module& Module::to(Device device, DType dtype) {
  KILN_CHECK(is_floating(dtype), "nn::Module::to: only floating dtypes are allowed, not {}", dtype_name(dtype));
  convert([&](const Tensor& t) { return t.is_floating_point() ? t.to(device, dtype) : t.to(device); });
  return *this;
}

void Module::zero_grad(bool set_to_none) {
  NoGradGuard no_grad;
  for (Tensor& p : parameters()) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (set_to_none) {
      p.set_grad(Tensor());
    } else {
      if (g.requires_grad()) p.set_grad(g.detach());  // as Optimizer::zero_grad
      p.grad().zero_();
    }
  }
}

// ---- state ----

void Module::collect_state(const std::string& prefix, TensorDict& out) const {
  for (const Slot& p : parameters_)
    if (p.tensor.defined()) out.insert(prefix + p.name, p.tensor.detach());
  for (const Slot& b : buffers_)
    if (b.tensor.defined() && b.persistent) out.insert(prefix + b.name, b.tensor.detach());
  for (const Child& c : children_) c.module->collect_state(c.prefix(prefix), out);
}

void Module::collect_zero_when_missing(const std::string& prefix, std::vector<std::string>& out) const {
  for (const Slot& b : buffers_)
    if (b.tensor.defined() && b.persistent && zero_when_missing(b.name)) out.push_back(prefix + b.name);
  for (const Child& c : children_) c.module->collect_zero_when_missing(c.prefix(prefix), out);
}

TensorDict Module::state_dict() const {
  TensorDict out;
  collect_state("", out);
  return out;
}

void Module::load_state_dict(const TensorDict& state, bool strict) {
  TensorDict own;
  collect_state("", own);
  std::vector<std::string> missing, unexpected, zeroed;
  collect_zero_when_missing("", zeroed);
  auto zero_if_missing = [&zeroed](const std::string& key) {
    return std::find(zeroed.begin(), zeroed.end(), key) != zeroed.end();
  };
  for (const auto& [key, t] : own)
    if (!state.contains(key) && !zero_if_missing(key)) missing.push_back(key);
  for (const auto& [key, src] : state) {
    const Tensor* dst = own.find(key);
    if (dst == nullptr) {
      unexpected.push_back(key);
      continue;
    }
    KILN_CHECK(src.defined(), "load_state_dict: the state dict's entry '{}' is an undefined tensor; the model's is {}",
               key, dst->sizes().str());
    KILN_CHECK(src.sizes() == dst->sizes(),
               "load_state_dict: size mismatch for '{}': the checkpoint has shape {}, the model has {}",
               key, src.sizes().str(), dst->sizes().str());
    // Checked before anything is copied, as the shapes: a model made in inference mode holds
    // inference tensors, which only an inference-mode scope may write (PyTorch refuses it too).
    KILN_CHECK(!dst->is_inference() || InferenceMode::is_enabled(),
               "load_state_dict: the model's '{}' is an inference tensor (the model was made under InferenceMode); "
               "make the model outside InferenceMode, or load the state dict inside one", key);
  }
  if (strict && (!missing.empty() || !unexpected.empty())) {
    std::string msg = fmt::format("load_state_dict: error(s) loading the state dict into {}:", name());
    if (!missing.empty()) msg += " missing key(s): " + join(missing) + ".";
    if (!unexpected.empty()) msg += " unexpected key(s): " + join(unexpected) + ".";
    KILN_FAIL("{} Pass strict=false to load only the matching keys", msg);
  }
  NoGradGuard no_grad;
  for (auto& [key, dst] : own) {
    Tensor target = dst;
    if (const Tensor* src = state.find(key)) {
      target.copy_(*src);
    } else if (zero_if_missing(key)) {
      target.zero_();
    }
  }
}

// ---- hooks ----

RemovableHandle Module::register_forward_pre_hook(ForwardPreHook hook) {
  KILN_CHECK(hook != nullptr, "nn::Module::register_forward_pre_hook: the hook is empty; pass a callable");
  uint64_t id = hooks_->next_id++;
  hooks_->pre.emplace_back(id, std::move(hook));
  std::weak_ptr<Hooks> weak = hooks_;
  return RemovableHandle([weak, id] {
    if (auto h = weak.lock()) std::erase_if(h->pre, [id](const auto& e) { return e.first == id; });
  });
}

RemovableHandle Module::register_forward_hook(ForwardHook hook) {
  KILN_CHECK(hook != nullptr, "nn::Module::register_forward_hook: the hook is empty; pass a callable");
  uint64_t id = hooks_->next_id++;
  hooks_->post.emplace_back(id, std::move(hook));
  std::weak_ptr<Hooks> weak = hooks_;
  return RemovableHandle([weak, id] {
    if (auto h = weak.lock()) std::erase_if(h->post, [id](const auto& e) { return e.first == id; });
  });
}

// ---- printing ----

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const Tensor& p : parameters()) n += p.numel();
  return n;
}

// PyTorch's repr: "Name(extra)" for a leaf; otherwise "Name(\n  (child): ...\n)" with the extra
// representation on its own first line when there is one.
void Module::print(std::string& out, int indent) const {
  std::string pad(indent, ' ');
  // A module with parametrized tensors (nn/parametrize.h) prints as PyTorch's injected class does.
  const bool parametrized = std::any_of(children_.begin(), children_.end(), [](const Child& c) {
    return c.name == "parametrizations" && dynamic_cast<const ModuleDict*>(c.module) != nullptr;
  });
  out += (parametrized ? "Parametrized" : "") + name() + "(";
  const std::string extra = extra_repr();
  if (children_.empty() && extra.find('\n') == std::string::npos) {
    out += extra + ")";
    return;
  }
  out += "\n";
  // Each line of extra_repr indented as a child's (a ParameterList's lines), as PyTorch's repr.
  for (size_t begin = 0; !extra.empty() && begin <= extra.size();) {
    const size_t end = std::min(extra.find('\n', begin), extra.size());
    out += pad + "  " + extra.substr(begin, end - begin) + "\n";
    begin = end + 1;
  }
  for (const Child& c : children_) {
    out += pad + "  (" + c.name + "): ";
    c.module->print(out, indent + 2);
    out += "\n";
  }
  out += pad + ")";
}

std::string Module::to_string() const {
  std::string out;
  print(out, 0);
  int64_t trainable = 0;
  for (const Tensor& p : parameters())
    if (p.requires_grad()) trainable += p.numel();
  out += fmt::format("\nParameters: {} ({} trainable)", num_parameters(), trainable);
  return out;
}

std::ostream& operator<<(std::ostream& os, const Module& m) { return os << m.to_string(); }

}  // namespace kiln::nn
