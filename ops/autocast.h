// ops/autocast.h: automatic mixed precision (torch.autocast): inside a scope, some ops cast their
// floating inputs to a 16-bit type and others to float32, by one policy table (ops/autocast.cpp).
//
//   {
//     AutocastGuard ac(Device::cpu(), kBFloat16);   // on for CPU tensors on this thread
//     Tensor logits = model.forward(x);              // matmul, linear, conv: bfloat16
//     Tensor loss = nn::cross_entropy(logits, y);    // losses: float32
//   }                                                // off again; the cast cache is dropped
//   loss.backward();                                 // backward ops run in the forward ops' dtypes
//
// What it is not: a dtype for the model. The parameters stay float32 (the casts are recorded, so
// their gradients arrive in float32); for a model kept in 16 bits see optim/master_weights.h.
//
// Note [autocast]
// ~~~~~~~~~~~~~~~
// The state is per thread and per device type (CPU, CUDA): whether autocast is on and to which
// 16-bit dtype. An op on the table begins with
//
//   if (autocast::is_enabled(x.device().type)) {   // one thread-local load when off
//     if (autocast::OpScope ac{autocast::Op::Softmax, x.device()}) return softmax(ac.cast(x), dim);
//   }
//
// OpScope looks the op up for the device type. When the op has a policy, OpScope turns autocast off
// for that device type while the op runs (so the ops it calls inside run as written, as PyTorch's
// autocast kernels exclude their dispatch key) and cast() converts each eligible input: floating,
// not float64, on that device type. Casts go through ops::to, so autograd sees them and a gradient
// comes back in its input's dtype. The autograd engine runs backward with autocast off: a backward
// op runs in the dtype its forward op ran in. An op not on the table that calls a table op inside
// sees autocast at that call, as PyTorch's composite ops do (var passes sum an explicit dtype, so
// its result keeps its input's dtype, as torch.var's).
//
// Note [autocast cache]
// ~~~~~~~~~~~~~~~~~~~~~
// A float32 leaf that requires grad (a parameter) is cast to the 16-bit dtype once per outermost
// autocast scope, not once per use (PyTorch's heuristic, from Apex): a weight read by several ops,
// or by every step of a loop inside the scope, is converted once. The entry is dropped when the
// outermost guard exits, when a backward starts (its cast nodes are freed by that backward), when
// the parameter is modified in place (its version counter moves, e.g. by an optimizer step), and
// when set_data gives it other memory (PyTorch keeps the stale cast then).
// Graphs built in one scope share the cast's node; it saves no tensor, so each of their backwards
// runs it (ops/record.h, FunctionNode::release_saved).
// Only casts made with grad mode on are cached, so a no_grad cast never feeds a graph.
//
// Hook for new ops: an op on PyTorch's lists gets a row in the table of ops/autocast.cpp and an Op
// here, begins as above (scaled_dot_product_attention in ops/attention.cpp is an example with an
// optional mask: ac.cast returns undefined tensors and boolean or integer ones unchanged), and gets a
// case in tests/ops/test_autocast.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace kiln {
namespace autocast {

namespace detail {
// Bit (1 << DeviceType) set: autocast is on for that device type on this thread. constinit lets
// the compiler read it directly, without a call to a thread-local initializer.
extern thread_local constinit uint8_t t_enabled;
}  // namespace detail

// Whether autocast is on for `type` on this thread (off inside an op that applies a policy).
inline bool is_enabled(DeviceType type) {
  return (detail::t_enabled >> static_cast<unsigned>(type)) & 1u;
}
// The 16-bit dtype autocast uses for `type` (bfloat16 for the CPU, float16 for CUDA by default).
DType dtype(DeviceType type);

// What an op does to its inputs inside an autocast scope (PyTorch's cast policies).
enum class Policy : uint8_t {
  None,            // not on the list: runs in its inputs' dtypes
  LowerPrecision,  // casts float32 (and the other 16-bit type) to the autocast dtype
  Float32,         // casts 16-bit inputs to float32
  Promote,         // casts to the widest floating dtype among its inputs
  Banned,          // refuses to run under autocast (an Error that names the safe alternative)
};
const char* policy_name(Policy p);  // "lower_precision_fp", "fp32", "promote", "banned", "none"

// The ops that have a policy on some device type: one row each in ops/autocast.cpp.
enum class Op : uint8_t {
  // lower precision: the ops that tensor cores and 16-bit GEMMs make fast
  Matmul, Mm, Addmm, AddmmGelu, Bmm, Linear, Conv1d, Conv2d, Conv3d, ConvTranspose2d, ScaledDotProductAttention,
  // float32: pointwise ops with a wide range or a large derivative
  Exp, Expm1, Log, Log1p, Reciprocal, Rsqrt, Pow, Softplus, Tan, Asin, Acos, Sinh, Cosh, Log2, Log10, Erfinv,
  // float32: reductions and normalisations
  Sum, Prod, Cumsum, Cumprod, Norm, Logsumexp, Softmax, LogSoftmax, LayerNorm, GroupNorm, CosineSimilarity,
  // float32: losses
  NllLoss, CrossEntropy, MseLoss, L1Loss, SmoothL1Loss, HuberLoss, KlDiv, BinaryCrossEntropyWithLogits,
  BinaryCrossEntropy, SoftMarginLoss, MarginRankingLoss, HingeEmbeddingLoss, CosineEmbeddingLoss,
  MultilabelMarginLoss, MultiMarginLoss, TripletMarginLoss, PoissonNllLoss, CtcLoss,
  // promote
  Cat, Stack, ScatterAdd, Atan2,
  kCount
};

// The policy of `op` for `type`; by name, None for an op not on the table.
Policy policy(Op op, DeviceType type);
Policy policy(std::string_view op_name, DeviceType type);
std::string_view op_name(Op op);  // "softmax"
// Every op name on the table, in table order.
std::vector<std::string_view> op_names();

// Applies `op`'s policy to its inputs (see Note [autocast]). Converts to false when the op has no
// policy for the device type (then it does nothing). While it lives, autocast is off for the
// device type.
class OpScope {
 public:
  OpScope(Op op, Device device);
  // Promote needs the inputs to find the widest dtype (the other policies ignore them); an
  // Error for a banned op.
  OpScope(Op op, Device device, const std::vector<Tensor>& inputs);
  ~OpScope();
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

  explicit operator bool() const { return active_; }
  // t converted to the policy's dtype when eligible (floating, not float64, on the scope's device
  // type, of another dtype); t itself otherwise (integer indices, undefined tensors...).
  Tensor cast(const Tensor& t) const;
  std::vector<Tensor> cast(const std::vector<Tensor>& ts) const;

 private:
  DeviceType type_;
  DType to_ = DType::Float32;
  bool active_ = false;
};

// The cast cache (Note [autocast cache]): its number of entries on this thread, and a way to drop
// it (the autograd engine does at the start of every backward).
size_t cache_size();
void clear_cache();

// Everything the guards save and restore (per thread): for the checkpoint recompute, which must
// run its forward again under the autocast state of the original forward.
struct State {
  uint8_t enabled = 0;                                 // bit (1 << DeviceType)
  DType dtypes[2] = {DType::BFloat16, DType::Float16};  // per DeviceType
  bool cache_enabled = true;
};
State current_state();

// RAII: sets the whole state for a scope (autograd uses it: all off for backward, the forward's
// state for a checkpoint recompute). Counts as a nesting level, like AutocastGuard.
class StateGuard {
 public:
  explicit StateGuard(const State& state);
  ~StateGuard();
  StateGuard(const StateGuard&) = delete;
  StateGuard& operator=(const StateGuard&) = delete;

 private:
  State prev_;
};

}  // namespace autocast

// RAII: torch.autocast(device_type, dtype, enabled, cache_enabled) for one device type on this
// thread. Nestable: the destructor restores what was there before, so an enabled = false guard
// turns autocast off inside an autocast scope. dtype: kBFloat16 or kFloat16 (default: the current
// one, bfloat16 for the CPU and float16 for CUDA). Leaving the outermost guard drops the cast cache.
class AutocastGuard {
 public:
  explicit AutocastGuard(DeviceType type, std::optional<DType> dtype = {}, bool enabled = true,
                         bool cache_enabled = true);
  explicit AutocastGuard(Device device, std::optional<DType> dtype = {}, bool enabled = true,
                         bool cache_enabled = true)
      : AutocastGuard(device.type, dtype, enabled, cache_enabled) {}
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  autocast::State prev_;
};

}  // namespace kiln
