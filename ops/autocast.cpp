// ops/autocast.cpp: the autocast policy table, the per-thread state, the cast cache and the guards.
// See Note [autocast] and Note [autocast cache] in ops/autocast.h; the ops that read the table
// begin with an OpScope (ops/linalg.cpp, conv.cpp, elementwise.cpp, reduce.cpp, softmax.cpp,
// norm.cpp, shape_ops.cpp, index.cpp, attention.cpp; linear in nn/functional.cpp, the losses and
// cosine_similarity in nn/loss.cpp).
#include "ops/autocast.h"

#include <iterator>
#include <memory>
#include <unordered_map>

#include "core/error.h"
#include "core/grad_mode.h"
#include "ops/ops.h"

namespace kiln {
namespace autocast {

namespace detail {
thread_local constinit uint8_t t_enabled = 0;
}  // namespace detail

namespace {

constexpr Policy kLower = Policy::LowerPrecision;
constexpr Policy kFp32 = Policy::Float32;
constexpr Policy kPromote = Policy::Promote;
constexpr Policy kBanned = Policy::Banned;
constexpr Policy kNone = Policy::None;

struct Row {
  Op op;
  std::string_view name;
  Policy cpu, cuda;
};

// The policy table: PyTorch's autocast lists (aten/src/ATen/autocast_mode.{h,cpp}, PyTorch 2.x),
// restricted to the ops Kiln has. The two devices differ because their kernels differ: PyTorch's
// CPU kernels for bfloat16 already accumulate softmax, norms and sums in float32, so on the CPU
// only the losses (and prod) are forced to float32; its CUDA list also covers the pointwise ops
// whose outputs leave the 16-bit range (exp), or whose inputs lose too much in it (log, pow).
// Kiln's own 16-bit kernels compute in float32 and round the result (cpu/matmul.cpp, ops/norm.cpp).
// Not on any list, so they run in their inputs' dtypes: the elementwise arithmetic (add, mul...,
// which promote mixed dtypes by themselves), activations (relu, gelu, tanh...), mean, var,
// batch_norm, rms_norm, pooling, embedding, dropout, and the losses PyTorch composes in Python
// (gaussian_nll_loss, multilabel_soft_margin_loss, triplet_margin_with_distance_loss), whose inner
// ops follow their own rows.
constexpr Row kTable[] = {
    // op                                name                                 CPU       CUDA
    {Op::Matmul,                       "matmul",                            kLower,   kLower},
    {Op::Mm,                           "mm",                                kLower,   kLower},
    {Op::Addmm,                        "addmm",                             kLower,   kLower},
    {Op::AddmmGelu,                    "addmm_gelu",                        kLower,   kLower},
    {Op::Bmm,                          "bmm",                               kLower,   kLower},
    {Op::Linear,                       "linear",                            kLower,   kLower},
    {Op::Conv1d,                       "conv1d",                            kLower,   kLower},
    {Op::Conv2d,                       "conv2d",                            kLower,   kLower},
    {Op::Conv3d,                       "conv3d",                            kLower,   kLower},
    {Op::ConvTranspose2d,              "conv_transpose2d",                  kLower,   kLower},
    {Op::ScaledDotProductAttention,    "scaled_dot_product_attention",      kLower,   kLower},
    {Op::Exp,                          "exp",                               kNone,    kFp32},
    {Op::Expm1,                        "expm1",                             kNone,    kFp32},
    {Op::Log,                          "log",                               kNone,    kFp32},
    {Op::Log1p,                        "log1p",                             kNone,    kFp32},
    {Op::Reciprocal,                   "reciprocal",                        kNone,    kFp32},
    {Op::Rsqrt,                        "rsqrt",                             kNone,    kFp32},
    {Op::Pow,                          "pow",                               kNone,    kFp32},
    {Op::Softplus,                     "softplus",                          kNone,    kFp32},
    {Op::Tan,                          "tan",                               kNone,    kFp32},
    {Op::Asin,                         "asin",                              kNone,    kFp32},
    {Op::Acos,                         "acos",                              kNone,    kFp32},
    {Op::Sinh,                         "sinh",                              kNone,    kFp32},
    {Op::Cosh,                         "cosh",                              kNone,    kFp32},
    {Op::Log2,                         "log2",                              kNone,    kFp32},
    {Op::Log10,                        "log10",                             kNone,    kFp32},
    {Op::Erfinv,                       "erfinv",                            kNone,    kFp32},
    {Op::Sum,                          "sum",                               kNone,    kFp32},  // without a dtype
    {Op::Prod,                         "prod",                              kFp32,    kFp32},
    {Op::Cumsum,                       "cumsum",                            kNone,    kFp32},  // without a dtype
    {Op::Cumprod,                      "cumprod",                           kNone,    kFp32},  // without a dtype
    {Op::Norm,                         "norm",                              kNone,    kFp32},
    {Op::Logsumexp,                    "logsumexp",                         kNone,    kFp32},
    {Op::Softmax,                      "softmax",                           kNone,    kFp32},
    {Op::LogSoftmax,                   "log_softmax",                       kNone,    kFp32},
    {Op::LayerNorm,                    "layer_norm",                        kNone,    kFp32},
    {Op::GroupNorm,                    "group_norm",                        kNone,    kFp32},
    {Op::CosineSimilarity,             "cosine_similarity",                 kNone,    kFp32},
    {Op::NllLoss,                      "nll_loss",                          kFp32,    kFp32},
    {Op::CrossEntropy,                 "cross_entropy",                     kFp32,    kFp32},
    {Op::MseLoss,                      "mse_loss",                          kFp32,    kFp32},
    {Op::L1Loss,                       "l1_loss",                           kFp32,    kFp32},
    {Op::SmoothL1Loss,                 "smooth_l1_loss",                    kFp32,    kFp32},
    {Op::HuberLoss,                    "huber_loss",                        kFp32,    kFp32},
    {Op::KlDiv,                        "kl_div",                            kFp32,    kFp32},
    {Op::BinaryCrossEntropyWithLogits, "binary_cross_entropy_with_logits",  kFp32,    kFp32},
    {Op::BinaryCrossEntropy,           "binary_cross_entropy",              kFp32,    kBanned},
    {Op::SoftMarginLoss,               "soft_margin_loss",                  kFp32,    kFp32},
    {Op::MarginRankingLoss,            "margin_ranking_loss",               kFp32,    kFp32},
    {Op::HingeEmbeddingLoss,           "hinge_embedding_loss",              kFp32,    kFp32},
    {Op::CosineEmbeddingLoss,          "cosine_embedding_loss",             kFp32,    kFp32},
    {Op::MultilabelMarginLoss,         "multilabel_margin_loss",            kFp32,    kFp32},
    {Op::MultiMarginLoss,              "multi_margin_loss",                 kFp32,    kFp32},
    {Op::TripletMarginLoss,            "triplet_margin_loss",               kFp32,    kFp32},
    {Op::PoissonNllLoss,               "poisson_nll_loss",                  kFp32,    kFp32},
    {Op::CtcLoss,                      "ctc_loss",                          kFp32,    kNone},
    {Op::Cat,                          "cat",                               kPromote, kNone},
    {Op::Stack,                        "stack",                             kPromote, kNone},
    {Op::ScatterAdd,                   "scatter_add",                       kNone,    kPromote},
    {Op::Atan2,                        "atan2",                             kNone,    kPromote},
};
static_assert(std::size(kTable) == static_cast<size_t>(Op::kCount), "one row per autocast::Op");

constexpr bool rows_in_enum_order() {
  for (size_t i = 0; i < std::size(kTable); ++i)
    if (static_cast<size_t>(kTable[i].op) != i) return false;
  return true;
}
static_assert(rows_in_enum_order(), "the rows of kTable follow the order of autocast::Op");

const Row& row(Op op) { return kTable[static_cast<size_t>(op)]; }

Policy policy_of(const Row& r, DeviceType type) { return type == DeviceType::CUDA ? r.cuda : r.cpu; }

uint8_t bit(DeviceType type) { return static_cast<uint8_t>(1u << static_cast<unsigned>(type)); }

// One cached cast (Note [autocast cache]). `source` keeps the parameter's TensorImpl from being
// freed while it is a key, so its address cannot be reused by another tensor; `storage`, `offset`
// and `sizes` are the memory it read, which set_data replaces without moving the version (ZeRO
// stage 3 swaps its parameters' data in and out so).
struct CacheEntry {
  std::weak_ptr<TensorImpl> source;
  uint64_t version;
  std::weak_ptr<Storage> storage;
  int64_t offset;
  Shape sizes;
  Tensor cast;
};

// The part of the state that only the slow path reads (the enabled bits live in detail::t_enabled).
struct ThreadState {
  DType dtypes[2] = {DType::BFloat16, DType::Float16};
  bool cache_enabled = true;
  int nesting = 0;  // live guards (AutocastGuard, StateGuard) on this thread
  std::unordered_map<const TensorImpl*, CacheEntry> cache;
};
thread_local ThreadState t_state;

bool eligible(const Tensor& t, DeviceType type) {
  return t.defined() && is_floating(t.dtype()) && t.dtype() != DType::Float64 && t.device().type == type;
}

Tensor cached_cast(const Tensor& t, DType to) {
  auto& cache = t_state.cache;
  auto it = cache.find(t.impl());
  if (it != cache.end()) {
    const CacheEntry& e = it->second;
    const TensorImpl* impl = t.impl();
    if (e.source.lock().get() == impl && e.version == t._version() && e.storage.lock() == impl->storage &&
        e.offset == impl->offset && e.sizes == impl->sizes && e.cast.dtype() == to) {
      return e.cast;
    }
  }
  Tensor cast = ops::to(t, t.device(), to);
  cache[t.impl()] = CacheEntry{t.impl_ptr(), t._version(), t.impl()->storage, t.impl()->offset, t.impl()->sizes, cast};
  return cast;
}

void leave_scope() {
  if (--t_state.nesting == 0) t_state.cache.clear();
}

}  // namespace

DType dtype(DeviceType type) { return t_state.dtypes[static_cast<size_t>(type)]; }

const char* policy_name(Policy p) {
  switch (p) {
    case Policy::LowerPrecision: return "lower_precision_fp";
    case Policy::Float32: return "fp32";
    case Policy::Promote: return "promote";
    case Policy::Banned: return "banned";
    case Policy::None: break;
  }
  return "none";
}

Policy policy(Op op, DeviceType type) { return policy_of(row(op), type); }

Policy policy(std::string_view op_name, DeviceType type) {
  for (const Row& r : kTable)
    if (r.name == op_name) return policy_of(r, type);
  return Policy::None;
}

std::string_view op_name(Op op) { return row(op).name; }

std::vector<std::string_view> op_names() {
  std::vector<std::string_view> names;
  for (const Row& r : kTable) names.push_back(r.name);
  return names;
}

// ---- OpScope ----

OpScope::OpScope(Op op, Device device) : OpScope(op, device, {}) {}

OpScope::OpScope(Op op, Device device, const std::vector<Tensor>& inputs) : type_(device.type) {
  if (!is_enabled(type_)) return;  // inactive: nothing to cast, and nothing to turn back on at the end
  switch (policy(op, type_)) {
    case Policy::None: return;
    case Policy::LowerPrecision: to_ = dtype(type_); break;
    case Policy::Float32: to_ = DType::Float32; break;
    case Policy::Promote: {  // the widest eligible input; nothing to do without one
      bool any = false;
      for (const Tensor& t : inputs) {
        if (!eligible(t, type_)) continue;
        to_ = any ? promote_types(to_, t.dtype()) : t.dtype();
        any = true;
      }
      if (!any) return;
      break;
    }
    case Policy::Banned:
      // PyTorch's reason, which holds for Kiln too.
      KILN_FAIL("{} is unsafe to autocast on {}: many models put a sigmoid right before it, and the "
                "sigmoid's 16-bit output rounds to 0 or 1, where the log is -inf. Combine the two: use "
                "binary_cross_entropy_with_logits, which is safe to autocast",
                op_name(op), device.str());
  }
  active_ = true;
  detail::t_enabled &= static_cast<uint8_t>(~bit(type_));
}

OpScope::~OpScope() {
  if (active_) detail::t_enabled |= bit(type_);
}

Tensor OpScope::cast(const Tensor& t) const {
  if (!active_ || !eligible(t, type_) || t.dtype() == to_) return t;
  const bool cacheable = to_ == dtype(type_) && t.dtype() == DType::Float32 && t.requires_grad() &&
                         t.is_leaf() && !t.impl()->is_view && t_state.cache_enabled &&
                         GradMode::is_enabled();
  return cacheable ? cached_cast(t, to_) : ops::to(t, t.device(), to_);
}

std::vector<Tensor> OpScope::cast(const std::vector<Tensor>& ts) const {
  std::vector<Tensor> out;
  out.reserve(ts.size());
  for (const Tensor& t : ts) out.push_back(cast(t));
  return out;
}

// ---- cache, state and guards ----

size_t cache_size() { return t_state.cache.size(); }
void clear_cache() { t_state.cache.clear(); }

State current_state() {
  return State{detail::t_enabled, {t_state.dtypes[0], t_state.dtypes[1]}, t_state.cache_enabled};
}

namespace {
void set_state(const State& s) {
  detail::t_enabled = s.enabled;
  t_state.dtypes[0] = s.dtypes[0];
  t_state.dtypes[1] = s.dtypes[1];
  t_state.cache_enabled = s.cache_enabled;
}
}  // namespace

StateGuard::StateGuard(const State& state) : prev_(current_state()) {
  for (DType dt : state.dtypes) {
    KILN_CHECK(is_reduced_float(dt), "autocast::StateGuard: each device type's dtype must be kBFloat16 or "
               "kFloat16, got {}", dtype_name(dt));
  }
  set_state(state);
  ++t_state.nesting;
}

StateGuard::~StateGuard() {
  set_state(prev_);
  leave_scope();
}

}  // namespace autocast

AutocastGuard::AutocastGuard(DeviceType type, std::optional<DType> dtype, bool enabled, bool cache_enabled)
    : prev_(autocast::current_state()) {
  const char* device = type == DeviceType::CUDA ? "cuda" : "cpu";
  KILN_CHECK(!dtype || is_reduced_float(*dtype),
             "AutocastGuard({}): dtype must be a 16-bit floating type, kBFloat16 or kFloat16 (the type that "
             "matmul and convolution cast to), got {}",
             device, dtype_name(dtype.value_or(DType::Float32)));
  autocast::State s = prev_;
  const auto i = static_cast<size_t>(type);
  if (dtype) s.dtypes[i] = *dtype;
  s.cache_enabled = cache_enabled;
  const uint8_t b = autocast::bit(type);
  s.enabled = enabled ? (s.enabled | b) : (s.enabled & static_cast<uint8_t>(~b));
  autocast::set_state(s);
  ++autocast::t_state.nesting;
}

AutocastGuard::~AutocastGuard() {
  autocast::set_state(prev_);
  autocast::leave_scope();
}

}  // namespace kiln
