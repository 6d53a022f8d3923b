// nn/module.h: nn::Module, the base of every layer and model: a tree of named parameters, buffers and
// submodules, as PyTorch's torch.nn.Module.
//
//   struct Net : nn::Module {
//     nn::Linear f1{784, 128};  nn::Linear f2{128, 10};
//     Net() { register_modules({{"f1", f1}, {"f2", f2}}); }
//     Tensor forward(const Tensor& x) override { return f2(relu(f1(x))); }
//   };
//
// Note [module ownership]
// A submodule registered by reference (register_module(name, member)) is borrowed: the parent holds a
// pointer to its own member. A submodule given by value or shared_ptr (containers, register_module
// with a shared_ptr) is owned. Modules are never copied (copy is deleted: a copy would share or lose
// its parameters silently). A module may be moved (that is how `nn::Sequential{nn::Linear(4, 8)}` takes
// its children) unless it borrows submodules: their pointers would dangle, so that move throws an Error.
//
// Note [parameter identity]
// A parameter is a Tensor handle shared by the member (`weight`) and the registry. to(device|dtype)
// replaces the data behind that same handle (as PyTorch's `param.data = ...`), so every holder sees the
// moved tensor; an optimizer is built afterwards, as in PyTorch.
//
// Layers are in nn/linear.h, nn/conv.h, nn/norm.h (with the dropouts), nn/activation.h, nn/container.h
// (with CheckpointWrapper), nn/resample.h, nn/rnn.h, nn/transformer.h.
#pragma once

#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "core/tensor_dict.h"

namespace kiln::nn {

class Module;

// Returned by register_forward_pre_hook / register_forward_hook; remove() unregisters the hook (safe
// to call twice, or after the module is gone).
class RemovableHandle {
 public:
  RemovableHandle() = default;
  explicit RemovableHandle(std::function<void()> remover) : remove_(std::move(remover)) {}
  void remove() {
    if (remove_) remove_();
    remove_ = nullptr;
  }

 private:
  std::function<void()> remove_;
};

// fn(module, input) -> a replacement input, or an undefined Tensor to keep it.
using ForwardPreHook = std::function<Tensor(Module&, const Tensor&)>;
// fn(module, input, output) -> a replacement output, or an undefined Tensor to keep it.
using ForwardHook = std::function<Tensor(Module&, const Tensor&, const Tensor&)>;

class Module {
 public:
  Module();
  virtual ~Module() = default;
  Module(const Module&) = delete;  // See Note [module ownership]
  Module& operator=(const Module&) = delete;
  Module(Module&& other);  // throws when `other` borrows submodules
  Module& operator=(Module&&) = delete;

  // The computation; layers override it. operator() runs it between the forward hooks.
  virtual Tensor forward(const Tensor& input);
  Tensor operator()(const Tensor& input);
  // What a checkpoint's recompute runs (nn::CheckpointWrapper, GPT's blocks): forward's graph with
  // every value that backward reads. Its output is only differentiated, never read, so a layer whose
  // last ops do not read their own outputs in backward may leave them uncomputed (nn::TransformerBlock
  // does; see Note [a recompute computes what backward reads] in autograd/checkpoint.cpp). Runs no
  // hooks: a caller runs operator() instead while the module has any.
  virtual Tensor forward_for_recompute(const Tensor& input) { return forward(input); }

  // The name printed in the module tree: the class name without namespaces ("Linear", "Net").
  virtual std::string name() const;
  // What goes between the parentheses of this module's line: "in_features=4, out_features=8, bias=True".
  virtual std::string extra_repr() const { return ""; }

  // ---- registration ----
  // A parameter: a floating tensor that requires grad (set here). An undefined tensor registers nothing.
  // Returns the handle to keep in a member: `weight = register_parameter("weight", empty({4, 3}));`.
  Tensor register_parameter(const std::string& name, Tensor t, bool requires_grad = true);
  // Replaces the registered parameter `name` (weight tying: both modules then hold one tensor, which
  // parameters() lists once and state_dict() under both names, as PyTorch). Assign the member too:
  //   head.weight = head.set_parameter("weight", embedding.weight);
  Tensor set_parameter(const std::string& name, Tensor t);
  // A buffer: state that is not trained (running statistics); persistent ones go into state_dict().
  Tensor register_buffer(const std::string& name, Tensor t, bool persistent = true);
  // Unregisters this module's own parameter or buffer `name` (Python's `del module.name`): it leaves
  // parameters(), buffers() and state_dict(), while the tensor itself, which is returned, and the layer's
  // member stay. An Error when there is none of that name. (nn::utils::weight_norm and
  // nn::utils::parametrize use these.)
  Tensor remove_parameter(const std::string& name);
  Tensor remove_buffer(const std::string& name);
  // Unregisters the submodule `name` (`del module.name`); returns it when this module owned it, else
  // null (a borrowed one is the caller's member). An Error when there is none of that name.
  std::shared_ptr<Module> remove_module(const std::string& name);
  // Borrowed (see Note [module ownership]); returns the module.
  template <class M> M& register_module(const std::string& name, M& module) {
    add_child(name, &module, nullptr);
    return module;
  }
  template <class M> M& register_module(const std::string& name, std::shared_ptr<M> module) {
    if (module == nullptr) throw_null_module(name);
    M& ref = *module;
    add_child(name, &ref, std::move(module));
    return ref;
  }
  struct NamedRef {
    std::string name;
    Module& module;
    template <class M>
    NamedRef(std::string n, M& m) : name(std::move(n)), module(m) {}  // NOLINT: {"c1", c1}
  };
  void register_modules(std::initializer_list<NamedRef> modules);
  [[noreturn]] void throw_null_module(const std::string& name) const;

  // ---- traversal (PyTorch's order: registration order, depth first, parent before children) ----
  // Parameter and buffer names (and state_dict keys) are dotted paths of child names, except that a
  // child registered with register_wrapped_module adds nothing to them.
  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true) const;
  std::vector<Module*> children() const;
  std::vector<std::pair<std::string, Module*>> named_children() const;
  std::vector<Module*> modules();  // this one first
  std::vector<std::pair<std::string, Module*>> named_modules();  // this one is named ""
  // fn on every submodule (children first), then on this one, as PyTorch's apply; returns *this.
  Module& apply(const std::function<void(Module&)>& fn);
  // By dotted name, as PyTorch's get_submodule / get_parameter / get_buffer: "" is this module,
  // "blocks.1.conv" a child of a child; a parameter or buffer by the name named_parameters() or
  // named_buffers() gives it (a tied parameter under either of its names). An Error names the part that
  // is missing.
  Module& get_submodule(const std::string& target);
  Tensor get_parameter(const std::string& target) const;
  Tensor get_buffer(const std::string& target) const;

  // ---- mode, placement, gradients ----
  Module& train(bool on = true);
  Module& eval() { return train(false); }
  bool is_training() const { return training_; }
  Module& to(Device device);
  Module& to(DType dtype);  // floating parameters and buffers only (int64 counters keep their dtype)
  Module& to(Device device, DType dtype);
  // PyTorch's shorthands: to(Device::cpu()), to(Device::cuda(index)), to(kFloat16), to(kBFloat16).
  // (float() and double() are C++ keywords: to(kFloat32), to(kFloat64).)
  Module& cpu() { return to(Device::cpu()); }
  Module& cuda(int index = 0) { return to(Device::cuda(index)); }
  Module& half() { return to(kFloat16); }
  Module& bfloat16() { return to(kBFloat16); }
  // Sets requires_grad of every parameter (freezing a part: `backbone.requires_grad_(false)`).
  Module& requires_grad_(bool requires_grad = true);
  void zero_grad(bool set_to_none = true);

  // ---- state ----
  // Parameters then persistent buffers of each module, recursively, with dotted names ("layer1.0.weight").
  // The tensors are detached handles on the module's data (no copy), as PyTorch's state_dict().
  TensorDict state_dict() const;
  // Copies each entry into the existing tensor of that name (under no_grad). strict: missing and
  // unexpected keys are an Error that lists them, but a buffer that zero_when_missing() names is set to
  // zero instead (an older format). A shape mismatch is always an Error.
  void load_state_dict(const TensorDict& state, bool strict = true);

  // ---- hooks ----
  RemovableHandle register_forward_pre_hook(ForwardPreHook hook);
  RemovableHandle register_forward_hook(ForwardHook hook);
  // Whether any forward hook is registered: a layer that fuses a child's computation into its own
  // (nn::TransformerBlock, nn::GeluMLP) calls the child instead while it has hooks.
  bool has_forward_hooks() const { return !hooks_->pre.empty() || !hooks_->post.empty(); }

  // ---- printing: the module tree as PyTorch's repr, with the parameter counts ----
  std::string to_string() const;
  int64_t num_parameters() const;  // elements over all parameters, recursively

 protected:
  // A buffer of this module that a state dict may lack, which load_state_dict then sets to zero:
  // BatchNorm's and InstanceNorm's num_batches_tracked, as PyTorch's _NormBase does for state dicts
  // saved before the counter existed (and for those converted from elsewhere).
  virtual bool zero_when_missing(const std::string& buffer) const { return false; }

  // This module's own parameter `name` (undefined when it has none), found even when it is the same
  // tensor as another of its parameters (which named_parameters lists once).
  Tensor own_parameter(const std::string& name) const;

  // An owned child whose parameters and buffers are named as this module's own ("weight", not
  // "name.weight"), so that wrapping a module leaves its state_dict keys alone (nn::CheckpointWrapper,
  // as PyTorch's CheckpointWrapper strips its "_checkpoint_wrapped_module." prefix). It keeps its name
  // in the module tree and in named_modules().
  template <class M> M& register_wrapped_module(const std::string& name, std::shared_ptr<M> module) {
    M& ref = *module;
    add_child(name, &ref, std::move(module), /*wrapped=*/true);
    return ref;
  }

 private:
  struct Slot {
    std::string name;
    Tensor tensor;
    bool persistent = true;  // buffers only
  };
  struct Child {
    std::string name;
    Module* module;
    std::shared_ptr<Module> owned;  // null: borrowed
    bool wrapped = false;           // register_wrapped_module: adds nothing to its tensors' names
    std::string prefix(const std::string& outer) const { return wrapped ? outer : outer + name + "."; }
  };

  void add_child(const std::string& name, Module* module, std::shared_ptr<Module> owned, bool wrapped = false);
  std::vector<std::pair<std::string, bool>> borrowed_children() const;  // (name, is borrowed)
  void check_new_name(const std::string& name, const char* what) const;
  void collect_parameters(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out) const;
  void collect_buffers(const std::string& prefix, bool persistent_only,
                       std::vector<std::pair<std::string, Tensor>>& out) const;
  void collect_state(const std::string& prefix, TensorDict& out) const;
  void collect_zero_when_missing(const std::string& prefix, std::vector<std::string>& out) const;
  void collect_modules(const std::string& prefix, std::vector<std::pair<std::string, Module*>>& out);
  void convert(const std::function<Tensor(const Tensor&)>& fn);
  void print(std::string& out, int indent) const;

  std::vector<Slot> parameters_;
  std::vector<Slot> buffers_;
  std::vector<Child> children_;
  bool training_ = true;

  // Hooks live behind a shared_ptr so a RemovableHandle can outlive the module (it holds a weak_ptr).
  struct Hooks {
    std::vector<std::pair<uint64_t, ForwardPreHook>> pre;
    std::vector<std::pair<uint64_t, ForwardHook>> post;
    uint64_t next_id = 0;
  };
  std::shared_ptr<Hooks> hooks_;
};

std::ostream& operator<<(std::ostream& os, const Module& m);

}  // namespace kiln::nn
