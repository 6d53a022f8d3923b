// nn/weight_norm.cpp: see nn/weight_norm.h.
//
// Note [a weight recomputed into the layer's handle]
// PyTorch's weight_norm deletes the Parameter `weight` and, before each forward, assigns the module
// attribute `weight` a new tensor computed from weight_g and weight_v. A Kiln layer reads its weight
// through a member handle that only the layer can reassign, so the pre-hook here rebinds what that
// handle points to instead (core/rebind.h): the member is then the computed tensor, with its graph
// back to weight_g and weight_v, and autograd sends the layer's gradient through it. This is why
//  - the parameter must have no other holder when weight_norm is applied: a tied module, an optimizer
//    or a wrapper holding it would see the computed tensor too (and an optimizer would step a tensor
//    that no longer receives gradients). That is checked by counting the handles on it.
//  - only module(x) recomputes (Kiln's hooks run there); a forward with several inputs reads the weight
//    of the last module(x). After a backward has consumed that weight's graph, a second backward
//    through it is the engine's "backward through the graph a second time" Error, not a silent reuse.
//  - a layer run twice before one backward (an RNN cell over time steps, a GAN's discriminator on
//    the real and the fake batch) gives each forward's graph its own weight: rebind marks the handle, and
//    a graph saves an alias of what a marked handle holds, its data and history (core/tensor.cpp,
//    SavedTensor), not the handle, and spectral_norm's second power iteration changes sigma.
#include "nn/weight_norm.h"

#include <fmt/format.h>

#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "core/grad_mode.h"
#include "core/rebind.h"
#include "nn/functional.h"
#include "nn/parametrize.h"
#include "ops/ops.h"

namespace kiln::nn::utils {

namespace {

enum class Kind { kWeightNorm, kSpectralNorm };
const char* kind_name(Kind kind) { return kind == Kind::kWeightNorm ? "weight_norm" : "spectral_norm"; }

// One weight_norm or spectral_norm on one parameter of one module. The module's pre-hook owns it.
struct Reparametrization {
  Kind kind;
  std::string name;
  Tensor weight;               // the layer's own handle, which each forward rebinds
  Tensor source;               // weight_norm: name_g (then name_v); spectral_norm: name_orig
  Tensor v;                    // weight_norm: the direction name_v; spectral_norm: the buffer name_v
  Tensor u;                    // spectral_norm: the buffer name_u
  std::optional<int64_t> dim;  // weight_norm: nullopt for the whole weight
  int64_t n_power_iterations = 0;
  double eps = 0;
  RemovableHandle hook;
};

// Found again by remove_* through the tensor that replaced the weight (name_g or name_orig), which
// stays the same when the module is moved; a record whose module is gone has expired.
std::mutex registry_mutex;
std::map<const TensorImpl*, std::weak_ptr<Reparametrization>> registry;

std::shared_ptr<Reparametrization> find(const Module& module, Kind kind, const std::string& name) {
  const std::string source = name + (kind == Kind::kWeightNorm ? "_g" : "_orig");
  std::lock_guard lock(registry_mutex);
  std::erase_if(registry, [](const auto& entry) { return entry.second.expired(); });
  for (const auto& [key, p] : module.named_parameters(/*recurse=*/false)) {
    if (key != source) continue;
    auto it = registry.find(p.impl());
    if (it == registry.end()) return nullptr;
    auto r = it->second.lock();
    return r && r->kind == kind && r->name == name ? r : nullptr;
  }
  return nullptr;
}

// The module's own parameter `name`, which the caller may replace: checked to have no other holder.
Tensor replaceable_parameter(const Module& module, Kind kind, const std::string& name) {
  const char* op = kind_name(kind);
  KILN_CHECK(find(module, kind, name) == nullptr, "{}: cannot register two {} hooks on the same parameter {} of {}", op,
             op, name, module.name());
  auto [weight, is_parameter] = detail::own_tensor(module, name);
  KILN_CHECK(weight.defined() && is_parameter,
             "{}: {} has no parameter '{}'; pass the name of one of its own parameters", op, module.name(), name);
  detail::check_replaceable(module, name, weight, 1, op);
  return weight;
}

void add_to_registry(const std::shared_ptr<Reparametrization>& r) {
  std::lock_guard lock(registry_mutex);
  registry[r->source.impl()] = r;
}

// ---- weight_norm ----

Tensor weight_norm_weight(const Reparametrization& r) {
  return r.v * (r.source / detail::norm_except_dim(r.v, r.dim));  // PyTorch's _weight_norm, term for term
}

// ---- spectral_norm ----

Tensor spectral_norm_weight(const Reparametrization& r, bool power_iteration) {
  const Tensor w = detail::as_matrix(r.source, *r.dim);
  Tensor u = r.u, v = r.v;
  if (power_iteration) {
    NoGradGuard no_grad;
    const functional::NormalizeOptions unit{.p = 2, .dim = 0, .eps = r.eps};
    for (int64_t i = 0; i < r.n_power_iterations; ++i) {
      v.copy_(functional::normalize(w.t().matmul(u), unit));
      u.copy_(functional::normalize(w.matmul(v), unit));
    }
    // Copies for the graph: the next forward's iteration writes the buffers in place.
    u = u.clone();
    v = v.clone();
  }
  const Tensor sigma = (u * w.matmul(v)).sum();  // u . W v
  return r.source / sigma;
}

Tensor compute(const Reparametrization& r, bool training) {
  return r.kind == Kind::kWeightNorm ? weight_norm_weight(r) : spectral_norm_weight(r, training);
}

// The weight computed before each module(x) (and now, if `now`); the hook owns the record.
void install_hook(Module& module, const std::shared_ptr<Reparametrization>& r, bool now) {
  r->hook = detail::recompute_before_forward(
      module, r->weight, [r](bool training) { return compute(*r, training); }, now);
  add_to_registry(r);
}

// What remove_* leaves: a plain parameter `name` holding the current weight, in the layer's handle.
void restore(Module& module, Reparametrization& r, std::initializer_list<const char*> parameters,
             std::initializer_list<const char*> buffers) {
  Tensor weight;
  {
    NoGradGuard no_grad;
    weight = compute(r, /*training=*/false);
  }
  r.hook.remove();
  for (const char* suffix : parameters) module.remove_parameter(r.name + suffix);
  for (const char* suffix : buffers) module.remove_buffer(r.name + suffix);
  {
    std::lock_guard lock(registry_mutex);
    registry.erase(r.source.impl());
  }
  rebind(r.weight, weight);
  module.register_parameter(r.name, r.weight);
}

std::shared_ptr<Reparametrization> find_to_remove(Module& module, Kind kind, const std::string& name) {
  auto r = find(module, kind, name);
  KILN_CHECK(r != nullptr, "remove_{}: {} of '{}' not found in {}", kind_name(kind), kind_name(kind), name,
             module.name());
  return r;
}

}  // namespace

Module& weight_norm(Module& module, const std::string& name, std::optional<int64_t> dim) {
  Tensor weight = replaceable_parameter(module, Kind::kWeightNorm, name);
  auto r = std::make_shared<Reparametrization>();
  r->kind = Kind::kWeightNorm;
  r->name = name;
  r->weight = weight;
  if (dim && *dim != -1) {  // -1 is PyTorch's "the whole weight", as nullopt
    const int64_t rank = weight.dim();
    KILN_CHECK(*dim >= -rank && *dim < rank,
               "weight_norm: dim {} is out of range for '{}' of {}, a {}-d weight; pass a dim in [{}, {}], or "
               "nullopt (or -1) for one norm over the whole weight",
               *dim, name, module.name(), rank, -rank, rank - 1);
    r->dim = *dim < 0 ? *dim + rank : *dim;
  }
  module.remove_parameter(name);
  // PyTorch's order: name_g, then name_v; both new leaves, v on the weight's data.
  Tensor v = weight.detach();
  Tensor g;
  {
    NoGradGuard no_grad;
    g = detail::norm_except_dim(v, r->dim);
  }
  r->source = module.register_parameter(name + "_g", g);
  r->v = module.register_parameter(name + "_v", v);
  install_hook(module, r, /*now=*/true);
  return module;
}

Module& remove_weight_norm(Module& module, const std::string& name) {
  auto r = find_to_remove(module, Kind::kWeightNorm, name);
  restore(module, *r, {"_g", "_v"}, {});
  return module;
}

Module& spectral_norm(Module& module, const std::string& name, int64_t n_power_iterations, double eps,
                      std::optional<int64_t> dim) {
  KILN_CHECK(n_power_iterations > 0,
             "spectral_norm: expected n_power_iterations to be positive, but got n_power_iterations={}",
             n_power_iterations);
  KILN_CHECK(eps > 0, "spectral_norm: eps must be positive, not {}", eps);
  if (!dim) dim = detail::default_spectral_norm_dim(module);
  Tensor weight = replaceable_parameter(module, Kind::kSpectralNorm, name);
  const int64_t rank = weight.dim();
  KILN_CHECK(rank > 0 && *dim >= -rank && *dim < rank,
             "spectral_norm: dim {} is out of range for '{}' of {}, a {}-d weight; pass a dim in [{}, {}]", *dim, name,
             module.name(), rank, -rank, rank - 1);
  module.remove_parameter(name);
  auto r = std::make_shared<Reparametrization>();
  r->kind = Kind::kSpectralNorm;
  r->name = name;
  r->weight = weight;
  r->dim = *dim < 0 ? *dim + rank : *dim;
  r->n_power_iterations = n_power_iterations;
  r->eps = eps;
  const Tensor orig = weight.detach();
  const int64_t rows = orig.size(*r->dim), cols = orig.numel() / std::max<int64_t>(rows, 1);
  Tensor u, v;
  {
    NoGradGuard no_grad;
    const functional::NormalizeOptions unit{.p = 2, .dim = 0, .eps = eps};
    const TensorOptions like = TensorOptions().dtype(orig.dtype()).device(orig.device());
    u = functional::normalize(randn({rows}, like), unit);
    v = functional::normalize(randn({cols}, like), unit);
  }
  // PyTorch's order: name_orig, then the buffers name_u and name_v; the layer reads the raw weight
  // until its first forward.
  r->source = module.register_parameter(name + "_orig", orig);
  r->u = module.register_buffer(name + "_u", u);
  r->v = module.register_buffer(name + "_v", v);
  rebind(weight, orig.detach());
  install_hook(module, r, /*now=*/false);
  return module;
}

Module& remove_spectral_norm(Module& module, const std::string& name) {
  auto r = find_to_remove(module, Kind::kSpectralNorm, name);
  restore(module, *r, {"_orig"}, {"_u", "_v"});
  return module;
}

}  // namespace kiln::nn::utils
