// nn/container.h: Sequential, ModuleList, ModuleDict and CheckpointWrapper (and the options of
// DeepSpeed's "activation_checkpointing" that checkpointing models take), and ParameterList and
// ParameterDict. Unlike the members of a user's module, the modules' children are owned (see Note
// [module ownership] in nn/module.h): they are moved in or shared.
//
//   nn::Sequential seq{nn::Linear(4, 8), nn::ReLU(), nn::Linear(8, 2)};   // children "0", "1", "2"
//   nn::ModuleList blocks{std::make_shared<Block>(), std::make_shared<Block>()};
//   blocks.push_back(nn::Linear(8, 8));
//   nn::ModuleDict heads;   heads.insert("cls", nn::Linear(8, 10));
//   nn::Sequential deep{nn::CheckpointWrapper(Block()), nn::CheckpointWrapper(Block()), nn::Linear(8, 2)};
//
// A Sequential given a single Sequential rvalue is moved (the move constructor), not nested; nest with
// push_back(std::make_shared<nn::Sequential>(...)).
#pragma once

#include <concepts>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "nn/module.h"

namespace kiln::autograd {
struct CheckpointOptions;  // autograd/autograd.h
struct CheckpointProfile;  // autograd/autograd.h
}

namespace kiln::nn {

template <class M>
concept ModuleValue = std::derived_from<std::remove_cvref_t<M>, Module> && !std::is_lvalue_reference_v<M>;
// What a container's constructor takes: a module moved in, or a std::shared_ptr to one (shared).
template <class M>
concept ModuleItem = ModuleValue<M> || requires(M m) {
  { std::shared_ptr<Module>(m) };
};

// An ordered list of owned modules named "0", "1", ...
class ModuleList : public Module {
 public:
  ModuleList() = default;
  template <ModuleItem... Ms>
    requires(sizeof...(Ms) >= 1)
  explicit ModuleList(Ms&&... modules) {
    (push_back(std::forward<Ms>(modules)), ...);
  }
  ModuleList(ModuleList&&) = default;

  template <ModuleValue M> std::remove_cvref_t<M>& push_back(M&& module) {
    return push_back(std::make_shared<std::remove_cvref_t<M>>(std::move(module)));
  }
  template <class M> M& push_back(std::shared_ptr<M> module) {
    M& ref = register_module(std::to_string(items_.size()), module);
    items_.push_back(std::move(module));
    return ref;
  }

  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  Module& operator[](size_t i) const;
  template <class M> M& at(size_t i) const {
    M* m = dynamic_cast<M*>(&(*this)[i]);
    KILN_CHECK(m != nullptr, "nn::{}: element {} is a {}, not the type asked for", name(), i, (*this)[i].name());
    return *m;
  }
  auto begin() const { return items_.begin(); }  // iterates std::shared_ptr<Module>
  auto end() const { return items_.end(); }

 protected:
  std::vector<std::shared_ptr<Module>> items_;
};

// Applies its children in order: forward(x) = ..._1(_0(x)), each through its hooks.
class Sequential : public ModuleList {
 public:
  using ModuleList::ModuleList;
  Sequential() = default;
  Sequential(Sequential&&) = default;
  Tensor forward(const Tensor& input) override;
};

// Owned modules by name, in insertion order.
class ModuleDict : public Module {
 public:
  ModuleDict() = default;
  ModuleDict(std::initializer_list<std::pair<std::string, std::shared_ptr<Module>>> items);
  ModuleDict(ModuleDict&&) = default;

  template <ModuleValue M> std::remove_cvref_t<M>& insert(const std::string& key, M&& module) {
    return insert(key, std::make_shared<std::remove_cvref_t<M>>(std::move(module)));
  }
  template <class M> M& insert(const std::string& key, std::shared_ptr<M> module) {
    M& ref = register_module(key, module);
    items_.emplace_back(key, std::move(module));
    return ref;
  }
  bool contains(const std::string& key) const;
  Module& operator[](const std::string& key) const;
  // Removes the module `key` and returns it (PyTorch's pop); an Error when there is none.
  std::shared_ptr<Module> pop(const std::string& key);
  std::vector<std::string> keys() const;
  size_t size() const { return items_.size(); }
  auto begin() const { return items_.begin(); }  // iterates (name, std::shared_ptr<Module>)
  auto end() const { return items_.end(); }

 private:
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> items_;
};

// Parameters kept in a list named "0", "1", ... (torch.nn.ParameterList); like any parameter, each is a
// floating leaf and requires grad. They sit in parameters() and state_dict() ("scales.0") and print as
// PyTorch's. Indexing looks the parameter up by name, so it sees what set_parameter or load_state_dict
// put there. It has no forward.
//   nn::ParameterList scales{ones({4}), ones({4})};
//   scales.append(zeros({4}));   x = x * scales[i];
class ParameterList : public Module {
 public:
  ParameterList() = default;
  ParameterList(std::initializer_list<Tensor> params);
  ParameterList(ParameterList&&) = default;

  Tensor append(Tensor param);  // registered as parameter size(); returns its handle
  void extend(const std::vector<Tensor>& params);
  Tensor operator[](int64_t i) const;  // i < 0 counts from the end, as Python's
  size_t size() const { return count_; }
  std::vector<Tensor> values() const;
  std::string extra_repr() const override;

 private:
  size_t count_ = 0;
};

// Parameters kept by name (torch.nn.ParameterDict), in insertion order (PyTorch's order for an
// OrderedDict; a plain Python dict it sorts first). Inserting an existing key replaces that parameter.
//   nn::ParameterDict table{{"scale", ones({4})}, {"shift", zeros({4})}};
//   table.insert("gate", zeros({1}));   y = x * table["scale"] + table["shift"];
class ParameterDict : public Module {
 public:
  ParameterDict() = default;
  ParameterDict(std::initializer_list<std::pair<std::string, Tensor>> items);
  ParameterDict(ParameterDict&&) = default;

  Tensor insert(const std::string& key, Tensor param);  // returns its handle
  bool contains(const std::string& key) const;
  Tensor operator[](const std::string& key) const;
  std::vector<std::string> keys() const { return keys_; }
  size_t size() const { return keys_.size(); }
  std::string extra_repr() const override;

 private:
  std::vector<std::string> keys_;
};

// input through module under autograd::checkpoint, as CheckpointWrapper and GPT's checkpointed
// blocks run it: the recompute in backward is module.forward_for_recompute(input), or the module
// whole (through operator(), so its hooks run again) while it has hooks or when skip_unread is
// false. See Note [a recompute computes what backward reads] in autograd/checkpoint.cpp.
Tensor checkpoint_module(Module& module, const Tensor& input, bool preserve_rng_state = true,
                         bool skip_unread = true);
// The same, keeping the input as options.keep_input says (autograd::CheckpointOptions).
Tensor checkpoint_module(Module& module, const Tensor& input, const autograd::CheckpointOptions& options,
                         bool skip_unread = true);

// DeepSpeed's "activation_checkpointing" section (what deepspeed.checkpointing.configure takes):
// how the blocks that a model checkpoints keep their inputs. It does not itself turn checkpointing
// on (GPT::set_checkpointing, train_gpt --checkpoint-activations do). kiln::initialize hands it to
// each module it trains (the model, or each pipeline chunk) that implements
// ConfiguresCheckpointing: models::GPT and models::ParallelGPT.
struct ActivationCheckpointing {
  // Each rank of the tensor-parallel group keeps 1/size of a checkpointed block's input, which
  // every rank of the group holds whole, and backward all-gathers it (Megatron-LM's
  // --distribute-saved-activations). Without a tensor-parallel group (size 1) it changes nothing.
  bool partition_activations = false;
  // What is kept goes to host memory (pinned) and comes back in backward; on the CPU, nothing moves.
  bool cpu_checkpointing = false;
  // Each block's forward and backward wait for the device at both ends
  // (autograd::CheckpointOptions::synchronize); on the CPU, nothing is queued to wait for.
  bool synchronize_checkpoint_boundary = false;
  // Where set, each checkpointed block adds the time of its forward, recompute and backward to it
  // (autograd::CheckpointOptions::profile). kiln::initialize makes one for "profile": true and
  // prints it every steps_per_print steps.
  std::shared_ptr<autograd::CheckpointProfile> profile = nullptr;
};
class ConfiguresCheckpointing {
 public:
  virtual ~ConfiguresCheckpointing() = default;
  virtual void configure_checkpointing(const ActivationCheckpointing& options) = 0;
};

// Activation checkpointing of one module (PyTorch's checkpoint_wrapper, CheckpointWrapper): forward
// runs the wrapped module through autograd::checkpoint, so that only its input is kept for backward,
// which runs it again (its forward_for_recompute, or the whole module with hooks while it has any).
// The wrapped module is the child "_checkpoint_wrapped_module", but its parameters and buffers keep
// their own names, as in PyTorch: a state dict saved with or without the wrapper loads into either.
class CheckpointWrapper : public Module {
 public:
  template <ModuleItem M>
  explicit CheckpointWrapper(M&& module, bool preserve_rng_state = true)
      : CheckpointWrapper(std::shared_ptr<Module>(as_shared(std::forward<M>(module))), preserve_rng_state) {}
  CheckpointWrapper(std::shared_ptr<Module> module, bool preserve_rng_state);
  CheckpointWrapper(CheckpointWrapper&&) = default;
  Tensor forward(const Tensor& input) override;
  Module& module() const { return *module_; }

  bool preserve_rng_state;  // dropout inside draws the same masks when run again (autograd::checkpoint)

 private:
  template <class M> static auto as_shared(M&& module) {
    if constexpr (ModuleValue<M>) {
      return std::make_shared<std::remove_cvref_t<M>>(std::move(module));
    } else {
      return module;
    }
  }
  std::shared_ptr<Module> module_;
};

}  // namespace kiln::nn
