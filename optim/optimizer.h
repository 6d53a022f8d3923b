// optim/optimizer.h: Optimizer, the base of SGD, Adam, AdamW, RMSprop and Adagrad, and ParamGroup.
//
// As in PyTorch, an optimizer holds parameter groups (each its own parameters and hyperparameters)
// and per-parameter state. Parameters are leaf Tensors that require grad; step() reads p.grad() and
// updates p in place under NoGradGuard, skipping parameters whose grad is undefined. State is held
// as Tensors per parameter (ParamState) so that a sharded optimizer (ZeRO) can partition it. The
// concrete optimizers live in sgd.h, adam.h, rmsprop.h, adagrad.h; schedulers in lr_scheduler.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "core/tensor_dict.h"

namespace kiln::optim {

// One parameter group: its parameters and its hyperparameters, by PyTorch's names ("lr",
// "momentum", "weight_decay"...; Adam's betas are "beta1" and "beta2"; flags are 0 or 1).
// Schedulers read and write "lr" (and "momentum"/"beta1" for OneCycleLR) through get/set.
struct ParamGroup {
  std::vector<Tensor> params;
  std::vector<std::pair<std::string, double>> options;

  bool has(std::string_view name) const;
  double get(std::string_view name) const;        // an Error naming the known options when absent
  void set(std::string_view name, double value);  // adds the option when absent (e.g. initial_lr)
  double lr() const { return get("lr"); }
  void set_lr(double lr) { set("lr", lr); }
};

// The state of one parameter: how many steps it has taken and its buffers (exp_avg,
// momentum_buffer...), each shaped like the parameter.
struct ParamState {
  int64_t step = 0;
  TensorDict buffers;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a grad.
  virtual void step() = 0;
  // Clears every grad: drops it (set_to_none, PyTorch's default) or fills it with zeros.
  virtual void zero_grad(bool set_to_none = true);
  // The gradients step() reads, one per parameter that has one: the parameters' grads here.
  // GradScaler unscales these in place and checks them for inf/NaN; MasterWeights
  // (optim/master_weights.h) gives the float32 copies that its step reads instead.
  virtual std::vector<Tensor> grads();
  // Multiplies the gradients step() reads by `factor` (GradScaler::unscale_ passes 1 / scale) and
  // says whether there were any and whether one holds an inf or a NaN after it. Here: grads(), in
  // place. ZeroOptimizer, whose step converts its gradients to float32 a sub-group at a time, keeps
  // the factor for then and checks its 16-bit gradients as they will be.
  struct Unscaled {
    bool has_grads = false, found_inf = false;
  };
  virtual Unscaled unscale_grads_(double factor);

  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  const std::string& name() const { return name_; }

  // The state of `param` (created empty on first use); find_state gives nullptr when it has none.
  ParamState& state(const Tensor& param) { return state_[param.impl()]; }
  const ParamState* find_state(const Tensor& param) const;

  // Everything needed to resume bit-identically. Parameters are numbered across groups in order
  // (PyTorch's indices) and the entries are:
  //   "param_groups.<g>.params"   int64 (n): the indices of group g's parameters
  //   "param_groups.<g>.<option>" float64 0-d: each hyperparameter (lr, betas, flags as 0/1...)
  //   "state.<i>.step"            int64 0-d: steps taken by parameter i (only for those with state)
  //   "state.<i>.<buffer>"        the buffers, shared with the optimizer (as PyTorch's)
  virtual TensorDict state_dict() const;
  // Restores a state_dict() of an optimizer built over the same parameters: an Error when the group
  // count, a group's parameter count or a buffer's shape differs, an entry is unknown, or a
  // parameter's buffers are not the ones step() keeps (buffer_names). Buffers are copied, cast to
  // their parameter's dtype and device.
  virtual void load_state_dict(const TensorDict& dict);
  // The constructor's checks applied to a group's options, as load_state_dict applies them to the
  // values a state dict brings: an Error for one the constructor would refuse. Read the options
  // with group.get and the 0/1 ones with flag(). The default checks nothing (for optimizers of
  // one's own); Kiln's optimizers override it.
  virtual void check_group(const ParamGroup& group) const;
  // The buffers step() keeps for a parameter of `group`: those it reads once the parameter has
  // state (`required`) and those it makes itself when they are absent (`optional`: SGD's
  // momentum_buffer, which then restarts from the next gradient, as PyTorch's). load_state_dict
  // refuses a parameter's state that lacks a required buffer or holds one of another name, before
  // it changes anything, so that no step stops halfway. The default (nullopt, for optimizers of
  // one's own) checks no names.
  struct BufferNames {
    std::vector<std::string> required, optional;
  };
  virtual std::optional<BufferNames> buffer_names(const ParamGroup& group) const;

 protected:
  explicit Optimizer(std::string name) : name_(std::move(name)) {}
  // Checks the parameters (defined, floating, leaves, not already in a group) and appends a group.
  void add_group(std::vector<Tensor> params, std::vector<std::pair<std::string, double>> options);
  // Whether the group asks for the fused step (its "fused" option; a state dict saved before that
  // option existed has none: false).
  static bool wants_fused(const ParamGroup& group);
  // A 0/1 option (a flag: nesterov, amsgrad, maximize...) as a bool; any other value is an Error.
  static bool flag(const ParamGroup& group, std::string_view name);
  // Whether p and t (its gradient or a state buffer) can go through a fused step (ops::fused_adam_,
  // fused_sgd_): p float32 or float64 and contiguous, t of p's dtype and device. The others take the
  // unfused step.
  static bool fusable(const Tensor& p, const Tensor& t);
  // load_state_dict's check of parameter `index`'s buffers against buffer_names(group) (group g).
  void check_buffer_names(int64_t index, int64_t step, const TensorDict& buffers, const ParamGroup& group,
                          size_t g) const;

  std::string name_;
  std::vector<ParamGroup> groups_;
  std::unordered_map<const TensorImpl*, ParamState> state_;
};

// Whether any element of `grads` is an inf or a NaN: one sum per tensor (in float32 at least) and
// one read of their total; a total that is not finite, which finite elements can also reach past
// float32's 3.4e38, is confirmed by each tensor's max and min (NaN wins both), so that only a true
// inf or NaN counts, as PyTorch checks every element.
bool has_inf_or_nan(const std::vector<Tensor>& grads);

// Parameters and options of one group, for constructors that take several groups:
//   optim::SGD opt({{net.body.parameters(), {.lr = 0.1}}, {net.head.parameters(), {.lr = 0.01}}});
template <typename Options>
struct GroupSpec {
  std::vector<Tensor> params;
  Options options;
};

}  // namespace kiln::optim
