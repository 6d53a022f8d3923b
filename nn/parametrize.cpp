// nn/parametrize.cpp: see nn/parametrize.h. How the recomputed tensor reaches the layer, and why the
// tensor may have no other holder: Note [a weight recomputed into the layer's handle] in
// nn/weight_norm.cpp.
#include "nn/parametrize.h"

#include <fmt/format.h>

#include <utility>

#include "core/grad_mode.h"
#include "core/rebind.h"
#include "nn/conv.h"
#include "nn/functional.h"
#include "ops/ops.h"

namespace kiln::nn::utils {

namespace detail {

void check_replaceable(const Module& module, const std::string& name, const Tensor& t, long own, const char* op) {
  // Holders besides the caller's: the module's registry and the layer's member.
  const long others = t.impl_ptr().use_count() - own;
  KILN_CHECK(others >= 2,
             "{}: {} keeps no member handle on its tensor '{}' but looks it up by name on each use (as the recurrent "
             "layers and ParameterList do), so there is no tensor to recompute it into; {} applies to layers that "
             "hold their tensors, as Linear, the convolutions and Embedding",
             op, module.name(), name, op);
  KILN_CHECK(others <= 2,
             "{}: '{}' of {} is held elsewhere as well ({} handles on it): tied to another module's parameter, given "
             "to an optimizer, DDP or another wrapper, or saved by a graph not yet run backward. {} replaces it and "
             "recomputes this tensor before each forward, which those holders would see too; apply {} first, before "
             "tying weights or making the optimizer",
             op, name, module.name(), others + own, op, op);
}

RemovableHandle recompute_before_forward(Module& module, Tensor target, std::function<Tensor(bool)> compute, bool now) {
  if (now) {
    if (Tensor value = compute(module.is_training()); value.defined()) rebind(target, value);
  }
  return module.register_forward_pre_hook([target, compute = std::move(compute)](Module& m, const Tensor&) {
    if (Tensor value = compute(m.is_training()); value.defined()) rebind(target, value);
    return Tensor();
  });
}

Tensor norm_except_dim(const Tensor& v, std::optional<int64_t> dim) {
  if (!dim) return v.norm(2);
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < v.dim(); ++d) {
    if (d != *dim) dims.push_back(d);
  }
  if (dims.empty()) return v.abs();  // a 1-d v: each element is its own row (no dims would mean all of them)
  return v.norm(2, Shape(dims), /*keepdim=*/true);
}

Tensor as_matrix(const Tensor& w, int64_t dim) {
  Tensor m = w;
  if (dim != 0) {
    std::vector<int64_t> order = {dim};
    for (int64_t d = 0; d < w.dim(); ++d) {
      if (d != dim) order.push_back(d);
    }
    m = w.permute(Shape(order));
  }
  return m.reshape({m.size(0), -1});
}

std::pair<Tensor, bool> own_tensor(const Module& module, const std::string& name) {
  for (const auto& [key, p] : module.named_parameters(/*recurse=*/false)) {
    if (key == name) return {p, true};
  }
  for (const auto& [key, b] : module.named_buffers(/*recurse=*/false)) {
    if (key == name) return {b, false};
  }
  return {Tensor(), false};
}

int64_t default_spectral_norm_dim(const Module& module) {
  // PyTorch's default: the output channels, dim 1 of a transposed convolution's weight.
  const bool transposed = dynamic_cast<const ConvTranspose1d*>(&module) ||
                          dynamic_cast<const ConvTranspose2d*>(&module) ||
                          dynamic_cast<const ConvTranspose3d*>(&module);
  return transposed ? 1 : 0;
}

}  // namespace detail

namespace parametrize {

namespace {

ModuleDict* parametrizations_of(const Module& module) {
  for (const auto& [name, child] : module.named_children()) {
    if (name == "parametrizations") return dynamic_cast<ModuleDict*>(child);
  }
  return nullptr;
}

ParametrizationList& list_of(const Module& module, const std::string& name) {
  return dynamic_cast<ParametrizationList&>((*parametrizations_of(module))[name]);
}

// PyTorch's checks of a parametrization's result against the tensor it parametrizes.
void check_same_kind(const Tensor& before, const Tensor& after, const std::string& what) {
  KILN_CHECK(after.defined(), "register_parametrization: a parametrization must return a tensor, not an undefined one");
  KILN_CHECK(after.dtype() == before.dtype(),
             "register_parametrization: {} may not change the dtype of the tensor, unless `unsafe` is true: {} "
             "before, {} after",
             what, dtype_name(before.dtype()), dtype_name(after.dtype()));
  KILN_CHECK(after.sizes() == before.sizes(),
             "register_parametrization: {} may not change the shape of the tensor, unless `unsafe` is true: {} "
             "before, {} after",
             what, before.sizes().str(), after.sizes().str());
}

}  // namespace

Tensor Parametrization::forward_originals(const std::vector<Tensor>& originals) {
  KILN_FAIL(
      "nn::utils::parametrize: {}'s right_inverse gives {} tensors, so it must override forward_originals to "
      "make the parametrized tensor from them",
      name(), originals.size());
}

ParametrizationList::ParametrizationList(std::vector<Tensor> originals, bool are_parameters, bool unsafe)
    : unsafe(unsafe), originals_(std::move(originals)) {
  for (size_t i = 0; i < originals_.size(); ++i) {
    const std::string key = originals_.size() == 1 ? "original" : fmt::format("original{}", i);
    originals_[i] = are_parameters ? register_parameter(key, originals_[i], originals_[i].requires_grad())
                                   : register_buffer(key, originals_[i]);
  }
}

Tensor ParametrizationList::evaluate() {
  KILN_CHECK(size() > 0, "nn::utils::parametrize: a ParametrizationList without parametrizations");
  Tensor x;
  if (originals_.size() == 1) {
    x = (*this)[0](originals_[0]);
  } else {
    auto* first = dynamic_cast<Parametrization*>(&(*this)[0]);
    KILN_CHECK(first != nullptr, "nn::utils::parametrize: {} originals need a Parametrization first",
               originals_.size());
    x = first->forward_originals(originals_);
  }
  for (size_t i = 1; i < size(); ++i) x = (*this)[i](x);
  return x;
}

namespace {
// The Cached scopes of this thread: how deep, and which outermost one (numbered from 1) is open.
thread_local int cache_depth = 0;
thread_local uint64_t cache_scope = 0, scopes_opened = 0;
}  // namespace

Cached::Cached() {
  if (cache_depth++ == 0) cache_scope = ++scopes_opened;
}
Cached::~Cached() {
  if (--cache_depth == 0) cache_scope = 0;
}

void ParametrizationList::attach_to(Module& module, Tensor target) {
  target_ = target;
  hook_ = detail::recompute_before_forward(module, std::move(target), [this](bool) {
    if (cache_scope != 0 && cached_in_ == cache_scope) return Tensor();  // computed in this scope already
    cached_in_ = cache_scope;
    return evaluate();
  });
}

Tensor ParametrizationList::release_target() {
  hook_.remove();
  return std::exchange(target_, Tensor());
}

bool is_parametrized(const Module& module, const std::string& name) {
  const ModuleDict* dict = parametrizations_of(module);
  if (dict == nullptr) return false;
  return name.empty() ? dict->size() > 0 : dict->contains(name);
}

Module& register_parametrization(Module& module, const std::string& name, std::shared_ptr<Module> parametrization,
                                 bool unsafe) {
  KILN_CHECK(parametrization != nullptr, "register_parametrization: the parametrization is null; pass a module");
  parametrization->train(module.is_training());
  auto* inverse = dynamic_cast<Parametrization*>(parametrization.get());
  if (is_parametrized(module, name)) {
    ParametrizationList& list = list_of(module, name);
    if (!unsafe) {
      NoGradGuard no_grad;
      const Tensor y = list.evaluate();
      check_same_kind(y, (*parametrization)(y), "a parametrization");
      if (inverse != nullptr) {
        const std::vector<Tensor> z = inverse->right_inverse(y);
        KILN_CHECK(z.size() == 1,
                   "register_parametrization: the right_inverse of a parametrization that is not the "
                   "first must return one tensor, not {}",
                   z.size());
        check_same_kind(y, z[0], "the right_inverse of a parametrization");
      }
    }
    list.push_back(std::move(parametrization));
    list.unsafe = list.unsafe || unsafe;
    return module;
  }
  auto [original, is_parameter] = detail::own_tensor(module, name);
  KILN_CHECK(original.defined(),
             "register_parametrization: {} does not have a parameter, a buffer, or a parametrized "
             "element with name '{}'",
             module.name(), name);
  detail::check_replaceable(module, name, original, 1, "register_parametrization");

  // The list first, checked, and only then the module changed (PyTorch's order, so an Error leaves it as it was).
  std::vector<Tensor> originals;
  {
    NoGradGuard no_grad;
    originals = inverse != nullptr ? inverse->right_inverse(original.detach()) : std::vector<Tensor>{original.detach()};
  }
  KILN_CHECK(!originals.empty(),
             "register_parametrization: right_inverse returned no tensor; it must return one or more");
  if (originals.size() == 1) {
    KILN_CHECK(originals[0].defined() && originals[0].dtype() == original.dtype(),
               "register_parametrization: when right_inverse returns one tensor, it may not change the dtype ({} "
               "before)",
               dtype_name(original.dtype()));
  }
  for (Tensor& t : originals) {
    KILN_CHECK(t.defined(), "register_parametrization: right_inverse returned an undefined tensor");
    t = t.detach();
    if (is_parameter) t.requires_grad_(original.requires_grad());
  }
  auto list = std::make_shared<ParametrizationList>(std::move(originals), is_parameter, unsafe);
  list->push_back(std::move(parametrization));
  {
    NoGradGuard no_grad;
    const Tensor value = list->evaluate();  // an Error of the parametrization's here, unsafe or not
    if (!unsafe) check_same_kind(original, value, "registering a parametrization");
  }

  if (is_parameter) {
    module.remove_parameter(name);
  } else {
    module.remove_buffer(name);
  }
  ModuleDict* dict = parametrizations_of(module);
  if (dict == nullptr) dict = &module.register_module("parametrizations", std::make_shared<ModuleDict>());
  dict->insert(name, list);
  list->attach_to(module, original);
  return module;
}

Module& remove_parametrizations(Module& module, const std::string& name, bool leave_parametrized) {
  KILN_CHECK(is_parametrized(module, name), "remove_parametrizations: module {} does not have a parametrization on {}",
             module.name(), name);
  ModuleDict& dict = *parametrizations_of(module);
  ParametrizationList& list = list_of(module, name);
  const bool is_parameter = !list.parameters(/*recurse=*/false).empty();
  KILN_CHECK(leave_parametrized || list.originals().size() == 1,
             "remove_parametrizations: cannot leave unparametrized (leave_parametrized = false) a tensor that is "
             "parametrized in terms of a sequence of tensors");
  Tensor value;
  if (leave_parametrized) {
    NoGradGuard no_grad;
    value = list.evaluate();
  } else {
    value = list.originals()[0].detach();
  }
  const bool requires_grad = list.originals()[0].requires_grad();
  Tensor target = list.release_target();
  rebind(target, value);
  if (is_parameter) {
    module.register_parameter(name, target, requires_grad);
  } else {
    module.register_buffer(name, target);
  }
  dict.pop(name);
  if (dict.size() == 0) module.remove_module("parametrizations");
  return module;
}

}  // namespace parametrize

namespace detail {

Tensor tensor_of(const Module& module, const std::string& name, const char* op) {
  if (parametrize::is_parametrized(module, name)) {
    NoGradGuard no_grad;
    return parametrize::list_of(module, name).evaluate();
  }
  Tensor t = own_tensor(module, name).first;
  KILN_CHECK(t.defined(), "{}: module {} has no parameter or buffer with name '{}'", op, module.name(), name);
  return t;
}

}  // namespace detail

namespace parametrizations {

namespace {

// PyTorch's _SpectralNorm: buffers _u and _v, unit vectors of the weight's matrix's rows and columns.
class SpectralNorm final : public parametrize::Parametrization {
 public:
  SpectralNorm(const Tensor& weight, int64_t n_power_iterations, int64_t dim, double eps)
      : n_power_iterations_(n_power_iterations), dim_(dim), eps_(eps) {
    if (weight.dim() < 2) return;  // a vector is normalised, with no iteration
    NoGradGuard no_grad;
    const Tensor w = as_matrix(weight);
    const TensorOptions like = TensorOptions().dtype(w.dtype()).device(w.device());
    u_ = register_buffer("_u", normalized(randn({w.size(0)}, like)));
    v_ = register_buffer("_v", normalized(randn({w.size(1)}, like)));
    power_method(w, 15);
  }
  std::string name() const override { return "_SpectralNorm"; }

  Tensor forward(const Tensor& weight) override {
    if (weight.dim() == 1) return normalized(weight);
    const Tensor w = as_matrix(weight);
    if (is_training()) power_method(w, n_power_iterations_);
    const Tensor u = u_.clone(), v = v_.clone();  // the next forward's iteration writes the buffers in place
    return weight / (u * w.matmul(v)).sum();      // sigma = u . W v
  }
  std::vector<Tensor> right_inverse(const Tensor& value) override { return {value}; }

 private:
  Tensor normalized(const Tensor& x) const { return functional::normalize(x, {.p = 2, .dim = 0, .eps = eps_}); }
  Tensor as_matrix(const Tensor& weight) const { return detail::as_matrix(weight, dim_); }
  // PyTorch's order here (u, then v), the other way round from the older nn::utils::spectral_norm.
  void power_method(const Tensor& w, int64_t iterations) {
    NoGradGuard no_grad;
    const Tensor wd = w.detach();
    for (int64_t i = 0; i < iterations; ++i) {
      u_.copy_(normalized(wd.matmul(v_)));
      v_.copy_(normalized(wd.t().matmul(u_)));
    }
  }

  int64_t n_power_iterations_;
  int64_t dim_;
  double eps_;
  Tensor u_, v_;
};

// PyTorch 2.1's _WeightNorm: originals g (original0) and v (original1).
class WeightNorm final : public parametrize::Parametrization {
 public:
  explicit WeightNorm(std::optional<int64_t> dim) : dim_(dim) {}
  std::string name() const override { return "_WeightNorm"; }
  std::vector<Tensor> right_inverse(const Tensor& weight) override { return {norm_except(weight), weight}; }
  Tensor forward_originals(const std::vector<Tensor>& gv) override {
    return gv[1] * (gv[0] / norm_except(gv[1]));  // PyTorch's _weight_norm(v, g, dim)
  }

 private:
  Tensor norm_except(const Tensor& v) const { return detail::norm_except_dim(v, dim_); }
  std::optional<int64_t> dim_;
};

}  // namespace

Module& spectral_norm(Module& module, const std::string& name, int64_t n_power_iterations, double eps,
                      std::optional<int64_t> dim) {
  Tensor weight = detail::tensor_of(module, name, "parametrizations::spectral_norm");
  if (!dim) dim = detail::default_spectral_norm_dim(module);
  const int64_t rank = weight.dim();
  KILN_CHECK(*dim >= -rank && *dim < rank,
             "parametrizations::spectral_norm: dim {} is out of range for '{}', a {}-d tensor; pass a dim in [{}, {}]",
             *dim, name, rank, -rank, rank - 1);
  KILN_CHECK(n_power_iterations > 0,
             "parametrizations::spectral_norm: expected n_power_iterations to be positive, but got "
             "n_power_iterations={}",
             n_power_iterations);
  KILN_CHECK(eps > 0, "parametrizations::spectral_norm: eps must be positive, not {}", eps);
  auto parametrization = std::make_shared<SpectralNorm>(weight, n_power_iterations, *dim < 0 ? *dim + rank : *dim, eps);
  weight = Tensor();  // no handle of ours while register_parametrization counts them
  return parametrize::register_parametrization(module, name, std::move(parametrization));
}

Module& weight_norm(Module& module, const std::string& name, std::optional<int64_t> dim) {
  const int64_t rank = detail::tensor_of(module, name, "parametrizations::weight_norm").dim();
  if (dim && *dim != -1) {  // -1 is PyTorch's "the whole tensor", as nullopt
    KILN_CHECK(*dim >= -rank && *dim < rank,
               "parametrizations::weight_norm: dim {} is out of range for '{}', a {}-d tensor; pass a dim in [{}, {}], "
               "or nullopt (or -1) for one norm over the whole tensor",
               *dim, name, rank, -rank, rank - 1);
    dim = *dim < 0 ? *dim + rank : *dim;
  } else {
    dim = std::nullopt;
  }
  return parametrize::register_parametrization(module, name, std::make_shared<WeightNorm>(dim), /*unsafe=*/true);
}

}  // namespace parametrizations

}  // namespace kiln::nn::utils
