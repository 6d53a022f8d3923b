// nn/parametrize.h: torch.nn.utils.parametrize and torch.nn.utils.parametrizations: a parameter or
// buffer of a module recomputed, before each call, by modules applied to tensors that train instead.
//
//   struct Symmetric : nn::Module {
//     Tensor forward(const Tensor& x) override { return x.triu() + x.triu(1).transpose(0, 1); }
//   };
//   nn::Linear linear(3, 3);
//   nn::utils::parametrize::register_parametrization(linear, "weight", std::make_shared<Symmetric>());
//   // linear.weight is now symmetric in every forward; the state dict holds
//   // "parametrizations.weight.original", as PyTorch's
//   nn::utils::parametrizations::spectral_norm(conv);   // or weight_norm(conv), orthogonal(linear): PyTorch's
//
// As in PyTorch, the tensor `name` leaves the module and `module.parametrizations[name]` (a
// ModuleDict of ParametrizationList, a ModuleList of the parametrizations) holds what replaces it,
// `original` (or `original0`, `original1`, ... when the first parametrization's right_inverse gives
// several), as parameters when the tensor was one, else as buffers; the module prints as
// "Parametrized<Name>". PyTorch recomputes on every read of `module.weight` (a property); Kiln
// recomputes in a forward pre-hook, into the layer's own handle (kiln::rebind), so the weight is that
// of the last module(x) and, as with nn::utils::weight_norm (nn/weight_norm.h), the tensor must have
// no other holder when it is parametrized, and the layer must keep a member handle on it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "nn/container.h"

namespace kiln::nn::utils::parametrize {

// A parametrization may be any Module whose forward(x) gives the tensor; deriving from this one
// adds what PyTorch's parametrizations may define besides forward.
class Parametrization : public Module {
 public:
  // The tensors to keep as the original(s) for a value of the parametrized tensor (PyTorch's
  // right_inverse); the default keeps the value itself, as PyTorch does for a parametrization without
  // one. Only the first parametrization's counts; several tensors become original0, original1, ...
  virtual std::vector<Tensor> right_inverse(const Tensor& value) { return {value}; }
  // The tensor from several originals (what PyTorch's forward(*originals) does): called instead of
  // forward when right_inverse gave more than one. The default is an Error.
  virtual Tensor forward_originals(const std::vector<Tensor>& originals);
};

// module.parametrizations[name]: the parametrizations "0", "1", ... applied in that order to the
// original(s). Made by register_parametrization, not by hand.
class ParametrizationList : public ModuleList {
 public:
  ParametrizationList(std::vector<Tensor> originals, bool are_parameters, bool unsafe);
  // The parametrized tensor from the originals as they are now (PyTorch's forward()).
  Tensor evaluate();
  const std::vector<Tensor>& originals() const { return originals_; }
  bool unsafe = false;
  // Rebinds `target`, the module's own handle, to evaluate() now and before each module(x) of `module`
  // (once per Cached scope while one lives); release_target stops that and returns the handle.
  void attach_to(Module& module, Tensor target);
  Tensor release_target();

 private:
  std::vector<Tensor> originals_;
  Tensor target_;
  RemovableHandle hook_;
  uint64_t cached_in_ = 0;  // the Cached scope whose value target_ holds (0: none)
};

// PyTorch's parametrize.cached(): while one lives on this thread, each parametrized tensor is computed
// at the first module(x) that needs it and kept for the later calls, which then share its graph (an
// RNN cell's weight over the time steps: one computation, one backward through it), instead of once
// per call. Scopes nest; the outermost one's end lets the next call compute afresh. A change of the
// originals inside the scope (an optimizer step) is not seen until it ends, as in PyTorch.
class Cached {
 public:
  Cached();
  ~Cached();
  Cached(const Cached&) = delete;
  Cached& operator=(const Cached&) = delete;
};

// Parametrizes the parameter or buffer `name` of `module` by `parametrization`, or appends it to the
// tensor's parametrizations when it has some. Unless unsafe, the parametrization (and a first one's
// right_inverse) may not change the tensor's shape or dtype.
Module& register_parametrization(Module& module, const std::string& name, std::shared_ptr<Module> parametrization,
                                 bool unsafe = false);
// Whether `name` (any tensor, for "") of module is parametrized.
bool is_parametrized(const Module& module, const std::string& name = "");
// Removes every parametrization of `name`: the module gets back a parameter (or buffer) `name` that
// holds the current parametrized value (leave_parametrized) or the original, which needs a single one.
Module& remove_parametrizations(Module& module, const std::string& name, bool leave_parametrized = true);

}  // namespace kiln::nn::utils::parametrize

namespace kiln::nn::utils::parametrizations {

// PyTorch's parametrizations.spectral_norm: `name` divided by its largest singular value, estimated
// by a power iteration on the buffers _u and _v of the parametrization (15 iterations at the start,
// n_power_iterations per training-mode forward); a 1-d tensor is normalised instead. dim: the rows of
// the matrix the tensor is seen as, 0 by default, 1 for the transposed convolutions.
Module& spectral_norm(Module& module, const std::string& name = "weight", int64_t n_power_iterations = 1,
                      double eps = 1e-12, std::optional<int64_t> dim = std::nullopt);
// PyTorch 2.1's parametrizations.weight_norm: g v / ||v||, the norm over every dim but dim (nullopt or
// -1: the whole tensor), kept as original0 (g) and original1 (v).
Module& weight_norm(Module& module, const std::string& name = "weight", std::optional<int64_t> dim = 0);
// PyTorch's parametrizations.orthogonal: `name`, a matrix or a batch of them (..., n, k), kept with
// orthonormal columns (n >= k) or rows, from an unconstrained original (Note [orthogonal
// parametrization], nn/orthogonal.cpp). orthogonal_map: "matrix_exp" (the default for a square
// matrix), "cayley" or "householder" (the default otherwise). With use_trivialization, the buffer
// `base` holds the orthogonalized tensor as it was when registered, and the original starts at -I.
Module& orthogonal(Module& module, const std::string& name = "weight",
                   std::optional<std::string> orthogonal_map = std::nullopt, bool use_trivialization = true);

}  // namespace kiln::nn::utils::parametrizations

namespace kiln::nn::utils::detail {
// Checks that `t`, module's parameter or buffer `name` that `op` is about to replace, is held only by
// the module's registry, the layer's member and `own` handles of the caller: an Error that says why
// otherwise (tied, given to an optimizer, looked up by name by the layer).
void check_replaceable(const Module& module, const std::string& name, const Tensor& t, long own, const char* op);
// Before each module(x) of `module`, and now if `now`, target is rebound to compute(module's training
// mode), unless that is undefined: then target keeps what it holds (Note [a weight recomputed into the
// layer's handle] in nn/weight_norm.cpp).
RemovableHandle recompute_before_forward(Module& module, Tensor target, std::function<Tensor(bool training)> compute,
                                         bool now = true);
// The module's own (not its children's) parameter `name` with true, or buffer `name` with false;
// an undefined tensor if it has neither.
std::pair<Tensor, bool> own_tensor(const Module& module, const std::string& name);
// The module's own parameter or buffer `name`, or its parametrized value (PyTorch's getattr); an Error
// from `op` naming what is missing.
Tensor tensor_of(const Module& module, const std::string& name, const char* op);
// spectral_norm's dim when none is given: 1 for a transposed convolution's weight (its output
// channels), 0 for any other.
int64_t default_spectral_norm_dim(const Module& module);
// ||v|| over every dim but `dim` (keepdim), or over all of v for nullopt: PyTorch's norm_except_dim.
Tensor norm_except_dim(const Tensor& v, std::optional<int64_t> dim);
// w seen as a matrix of (w.size(dim), the rest): dim moved to the front, the rest flattened.
Tensor as_matrix(const Tensor& w, int64_t dim);
}  // namespace kiln::nn::utils::detail
