// core/tensor.h: Tensor, the cheap shared handle users hold (copying it shares the data).
//
// This header declares the whole method surface, but core/ defines only the parts that need no
// backend (shape, dtype, autograd fields). The methods that compute are thin forwards to the free
// functions of ops/ (ops/tensor_methods.cpp), and backward() is the autograd engine's
// (autograd/engine.cpp): link kiln::kiln to get them all. See docs/tensors-and-autograd.md.
#pragma once

#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "core/node.h"
#include "core/scalar.h"
#include "core/tensor_impl.h"
#include "core/tensor_options.h"

namespace kiln {

class Tensor {
 public:
  Tensor() = default;  // undefined: holds nothing
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- identity and layout (core/tensor.cpp) ----
  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }

  const Shape& sizes() const { return get().sizes; }
  const Shape& shape() const { return get().sizes; }
  const Shape& strides() const { return get().strides; }
  int64_t size(int64_t dim) const;
  int64_t stride(int64_t dim) const;
  int dim() const { return get().sizes.size(); }
  int64_t numel() const { return get().numel(); }
  int64_t storage_offset() const { return get().offset; }
  DType dtype() const { return get().dtype; }
  Device device() const { return get().device(); }
  TensorOptions options() const { return TensorOptions(dtype()).device(device()); }
  bool is_cpu() const { return device().is_cpu(); }
  bool is_cuda() const { return device().is_cuda(); }
  bool is_floating_point() const { return is_floating(dtype()); }
  bool is_contiguous() const { return get().is_contiguous(); }
  // Lives in pinned (page-locked) host memory, from pin_memory() or TensorOptions::pinned_memory.
  bool is_pinned() const {
    const auto& st = get().storage;
    return st != nullptr && st->allocator != nullptr && st->allocator->is_pinned();
  }
  int64_t element_size() const { return itemsize(dtype()); }
  int64_t nbytes() const { return numel() * element_size(); }
  void* data_ptr() const { return get().data(); }
  template <typename T> T* data_ptr() const;  // checks that T matches dtype()

  // ---- autograd fields (core/tensor.cpp) ----
  // These four first bring a view's grad_fn up to date after an in-place change of its base or of
  // another view of it (Note [views and in-place ops] in ops/views.cpp).
  bool requires_grad() const {
    const TensorImpl& t = autograd_fields();
    return t.requires_grad || t.grad_fn != nullptr;
  }
  Tensor& requires_grad_(bool requires_grad = true);  // leaves only; floating dtypes only
  bool is_leaf() const { return autograd_fields().grad_fn == nullptr; }
  Tensor grad() const;  // undefined until a backward reaches this leaf
  void set_grad(const Tensor& grad);
  // Makes this tensor read new_data's storage, shape, strides and dtype (LibTorch's set_data,
  // Python's `param.data = new_data`): every holder of this handle sees the new data, and its
  // autograd fields (requires_grad, grad, hooks) stay. nn::Module::to moves parameters this way;
  // ZeRO stage 3 swaps a parameter between its gathered weights and nothing. A change of dtype or
  // device starts a new gradient accumulator (graphs recorded before keep the old one).
  void set_data(const Tensor& new_data) const;
  const std::shared_ptr<autograd::Node>& grad_fn() const { return autograd_fields().grad_fn; }
  uint32_t output_nr() const { return autograd_fields().output_nr; }
  // PyTorch's _is_view and _base: whether this tensor is a view made with grad mode on, whose
  // in-place changes autograd carries to its base, and that base (undefined for other tensors).
  bool _is_view() const { return get().view_base != nullptr; }
  Tensor _base() const { return get().view_base ? Tensor(get().view_base) : Tensor(); }
  // Made in inference mode, or a view of such a tensor (Note [inference mode] in core/grad_mode.h).
  bool is_inference() const { return get().storage->inference; }
  uint64_t _version() const { return get().storage->version; }
  void bump_version() const { ++get().storage->version; }

  // ---- autograd engine (autograd/engine.cpp) ----
  // gradient: required unless this is a single element (then it defaults to 1). inputs (PyTorch's
  // argument of that name): when not empty, these tensors get their gradient accumulated into .grad()
  // (non-leaves included) and no other leaf does; only the part of the graph that leads to them runs.
  void backward(const Tensor& gradient = {}, bool retain_graph = false, bool create_graph = false,
                const std::vector<Tensor>& inputs = {}) const;
  // fn(grad) -> replacement grad (or an undefined Tensor to keep it); runs when this tensor's
  // gradient is computed. Returns a handle for remove_hook (LibTorch returns the hook's position).
  uint64_t register_hook(TensorHook fn) const;
  // Removes a hook that register_hook registered on this tensor; an unknown handle does nothing (nor
  // does the handle of a non-leaf's hook registered before an in-place op moved the tensor to a new
  // grad_fn: that hook stays with the old value's node).
  void remove_hook(uint64_t handle) const;
  // fn(leaf) runs after a backward has accumulated into this leaf's .grad() (leaves only).
  // Returns a handle for remove_post_accumulate_grad_hook. DistributedDataParallel starts its
  // gradient all-reduce from these.
  uint64_t register_post_accumulate_grad_hook(PostAccumulateGradHook fn) const;
  void remove_post_accumulate_grad_hook(uint64_t handle) const;
  void retain_grad() const;  // keep .grad() on a non-leaf
  bool retains_grad() const { return get().retains_grad; }

  // ---- conversions and copies (ops/) ----
  Tensor contiguous() const;
  Tensor clone() const;
  Tensor to(DType dtype) const;
  Tensor to(Device device) const;
  Tensor to(Device device, DType dtype, bool non_blocking = false) const;
  // non_blocking (as PyTorch's): a copy between pinned host memory and a CUDA device is queued on
  // the device's current stream and not waited for; a CUDA tensor copied to the CPU this way lands
  // in pinned memory, and its values may be read only after a synchronize (of the stream, an event
  // recorded after the copy, or the device). Other copies are synchronous as before.
  Tensor to(Device device, bool non_blocking) const { return to(device, dtype(), non_blocking); }
  // A copy in pinned host memory (this tensor itself if it is pinned already); CPU tensors only, and
  // only where a CUDA device is usable. Differentiable, as a copy.
  Tensor pin_memory() const;
  Tensor cpu() const { return to(Device::cpu()); }
  Tensor cuda(int index = 0) const { return to(Device::cuda(index)); }
  Tensor detach() const;  // same data, no history
  Tensor& detach_();
  Scalar item() const;    // one element only
  template <typename T> T item() const { return item().to<T>(); }
  template <typename T> std::vector<T> to_vector() const;  // converts to T, row-major
  std::string str() const;  // as PyTorch prints it

  // ---- views: share storage (ops/views.cpp) ----
  Tensor view(const Shape& shape) const;  // strides must allow it; see reshape
  Tensor view_as(const Tensor& other) const { return view(other.sizes()); }
  Tensor reshape(const Shape& shape) const;  // a view when possible, else a copy
  Tensor permute(const Shape& dims) const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor t() const;   // 2-D transpose
  Tensor mT() const;  // transpose of the last two dims
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor slice(int64_t dim, std::optional<int64_t> start = {}, std::optional<int64_t> end = {},
               int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor operator[](int64_t index) const { return select(0, index); }
  Tensor expand(const Shape& shape) const;  // -1 keeps a size
  Tensor expand_as(const Tensor& other) const { return expand(other.sizes()); }
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor unflatten(int64_t dim, const Shape& sizes) const;
  // The windows of `size` elements every `step` along `dimension`, as a new last dim (a view).
  Tensor unfold(int64_t dimension, int64_t size, int64_t step) const;
  Tensor diagonal(int64_t offset = 0, int64_t dim1 = 0, int64_t dim2 = 1) const;  // a view
  Tensor movedim(const Shape& source, const Shape& destination) const;
  Tensor swapaxes(int64_t axis0, int64_t axis1) const;

  // ---- elementwise (ops/elementwise.cpp) ----
  Tensor neg() const;
  Tensor abs() const;
  Tensor sign() const;
  Tensor exp() const;
  Tensor log() const;
  Tensor log1p() const;
  Tensor expm1() const;
  Tensor sqrt() const;
  Tensor rsqrt() const;
  Tensor reciprocal() const;
  Tensor sin() const;
  Tensor cos() const;
  Tensor tanh() const;
  Tensor sigmoid() const;
  Tensor relu() const;
  Tensor square() const;
  Tensor tan() const;
  Tensor asin() const;
  Tensor acos() const;
  Tensor atan() const;
  Tensor sinh() const;
  Tensor cosh() const;
  Tensor asinh() const;
  Tensor acosh() const;
  Tensor atanh() const;
  Tensor log2() const;
  Tensor log10() const;
  Tensor exp2() const;
  Tensor erf() const;
  Tensor erfc() const;
  Tensor erfinv() const;
  Tensor lgamma() const;
  Tensor digamma() const;
  Tensor logit(std::optional<double> eps = {}) const;
  Tensor nan_to_num(std::optional<double> nan = 0.0, std::optional<double> posinf = {},
                    std::optional<double> neginf = {}) const;
  Tensor atan2(const Tensor& other) const;
  Tensor hypot(const Tensor& other) const;
  Tensor logaddexp(const Tensor& other) const;
  Tensor copysign(const Tensor& other) const;
  Tensor xlogy(const Tensor& other) const;
  Tensor isclose(const Tensor& other, double rtol = 1e-5, double atol = 1e-8, bool equal_nan = false) const;
  bool allclose(const Tensor& other, double rtol = 1e-5, double atol = 1e-8, bool equal_nan = false) const;
  Tensor pow(const Scalar& exponent) const;
  Tensor pow(const Tensor& exponent) const;
  Tensor clamp(std::optional<Scalar> min, std::optional<Scalar> max = {}) const;
  Tensor add(const Tensor& other, const Scalar& alpha = 1) const;
  Tensor add(const Scalar& other) const;
  Tensor sub(const Tensor& other, const Scalar& alpha = 1) const;
  Tensor sub(const Scalar& other) const;
  Tensor mul(const Tensor& other) const;
  Tensor mul(const Scalar& other) const;
  Tensor div(const Tensor& other) const;
  Tensor div(const Scalar& other) const;
  Tensor maximum(const Tensor& other) const;
  Tensor minimum(const Tensor& other) const;
  Tensor eq(const Tensor& other) const;
  Tensor eq(const Scalar& other) const;
  Tensor ne(const Tensor& other) const;
  Tensor ne(const Scalar& other) const;
  Tensor isnan() const;
  Tensor isinf() const;
  Tensor isfinite() const;
  Tensor lt(const Tensor& other) const;
  Tensor lt(const Scalar& other) const;
  Tensor le(const Tensor& other) const;
  Tensor le(const Scalar& other) const;
  Tensor gt(const Tensor& other) const;
  Tensor gt(const Scalar& other) const;
  Tensor ge(const Tensor& other) const;
  Tensor ge(const Scalar& other) const;
  Tensor logical_and(const Tensor& other) const;
  Tensor logical_or(const Tensor& other) const;
  Tensor logical_not() const;
  Tensor floor() const;
  Tensor ceil() const;
  Tensor trunc() const;
  Tensor round() const;
  Tensor remainder(const Tensor& other) const;
  Tensor remainder(const Scalar& other) const;
  Tensor fmod(const Tensor& other) const;
  Tensor fmod(const Scalar& other) const;
  Tensor floor_divide(const Tensor& other) const;
  Tensor floor_divide(const Scalar& other) const;
  Tensor masked_fill(const Tensor& mask, const Scalar& value) const;
  Tensor addcmul(const Tensor& tensor1, const Tensor& tensor2, const Scalar& value = 1) const;
  Tensor addcdiv(const Tensor& tensor1, const Tensor& tensor2, const Scalar& value = 1) const;
  Tensor lerp(const Tensor& end, const Tensor& weight) const;
  Tensor lerp(const Tensor& end, const Scalar& weight) const;

  // ---- in place: bump the version counter (ops/elementwise.cpp, ops/copy.cpp) ----
  Tensor& add_(const Tensor& other, const Scalar& alpha = 1);
  Tensor& add_(const Scalar& other);
  Tensor& sub_(const Tensor& other, const Scalar& alpha = 1);
  Tensor& sub_(const Scalar& other);
  Tensor& mul_(const Tensor& other);
  Tensor& mul_(const Scalar& other);
  Tensor& div_(const Tensor& other);
  Tensor& div_(const Scalar& other);
  Tensor& clamp_(std::optional<Scalar> min, std::optional<Scalar> max = {});
  Tensor& relu_();
  Tensor& neg_();
  Tensor& exp_();
  Tensor& sqrt_();
  Tensor& pow_(const Scalar& exponent);
  Tensor& masked_fill_(const Tensor& mask, const Scalar& value);
  Tensor& addcmul_(const Tensor& tensor1, const Tensor& tensor2, const Scalar& value = 1);
  Tensor& addcdiv_(const Tensor& tensor1, const Tensor& tensor2, const Scalar& value = 1);
  Tensor& lerp_(const Tensor& end, const Tensor& weight);
  Tensor& lerp_(const Tensor& end, const Scalar& weight);
  Tensor& fill_(const Scalar& value);
  Tensor& zero_();
  // src broadcasts to this; any dtype and device. non_blocking: as for to().
  Tensor& copy_(const Tensor& src, bool non_blocking = false);

  // ---- reductions (ops/reduce.cpp): dims may be negative; {} means all ----
  Tensor sum(std::optional<DType> dtype = {}) const;
  Tensor sum(const Shape& dims, bool keepdim = false) const;
  Tensor mean() const;
  Tensor mean(const Shape& dims, bool keepdim = false) const;
  Tensor prod() const;
  Tensor prod(int64_t dim, bool keepdim = false) const;
  Tensor max() const;
  std::tuple<Tensor, Tensor> max(int64_t dim, bool keepdim = false) const;
  Tensor min() const;
  std::tuple<Tensor, Tensor> min(int64_t dim, bool keepdim = false) const;
  Tensor amax(const Shape& dims, bool keepdim = false) const;
  Tensor amin(const Shape& dims, bool keepdim = false) const;
  Tensor argmax(std::optional<int64_t> dim = {}, bool keepdim = false) const;
  Tensor argmin(std::optional<int64_t> dim = {}, bool keepdim = false) const;
  Tensor var(const Shape& dims = {}, int64_t correction = 1, bool keepdim = false) const;
  Tensor std(const Shape& dims = {}, int64_t correction = 1, bool keepdim = false) const;
  Tensor norm(double p = 2, const Shape& dims = {}, bool keepdim = false) const;
  Tensor logsumexp(const Shape& dims, bool keepdim = false) const;
  // ---- sorting and running reductions (ops/sort.cpp) ----
  std::tuple<Tensor, Tensor> sort(int64_t dim = -1, bool descending = false) const;
  Tensor argsort(int64_t dim = -1, bool descending = false) const;
  std::tuple<Tensor, Tensor> topk(int64_t k, int64_t dim = -1, bool largest = true) const;
  std::tuple<Tensor, Tensor> kthvalue(int64_t k, int64_t dim = -1, bool keepdim = false) const;
  Tensor median() const;
  std::tuple<Tensor, Tensor> median(int64_t dim, bool keepdim = false) const;
  Tensor cumsum(int64_t dim, std::optional<DType> dtype = {}) const;
  Tensor cumprod(int64_t dim, std::optional<DType> dtype = {}) const;
  std::tuple<Tensor, Tensor> cummax(int64_t dim) const;
  std::tuple<Tensor, Tensor> cummin(int64_t dim) const;
  Tensor logcumsumexp(int64_t dim) const;
  Tensor msort() const;
  Tensor quantile(double q, std::optional<int64_t> dim = {}, bool keepdim = false,
                  const std::string& interpolation = "linear") const;
  Tensor nanquantile(double q, std::optional<int64_t> dim = {}, bool keepdim = false,
                     const std::string& interpolation = "linear") const;
  // ---- selection (ops/select.cpp) ----
  Tensor nonzero() const;
  Tensor argwhere() const;
  Tensor count_nonzero(const Shape& dims = {}) const;
  Tensor masked_select(const Tensor& mask) const;
  Tensor masked_scatter(const Tensor& mask, const Tensor& source) const;
  std::tuple<Tensor, Tensor, Tensor> unique(std::optional<int64_t> dim = {}) const;
  Tensor bincount(const Tensor& weights = {}, int64_t minlength = 0) const;
  Tensor histc(int64_t bins = 100, double min = 0, double max = 0) const;
  Tensor all() const;
  Tensor all(int64_t dim, bool keepdim = false) const;
  Tensor any() const;
  Tensor any(int64_t dim, bool keepdim = false) const;

  // ---- linear algebra, softmax, shape and index ops (ops/) ----
  Tensor matmul(const Tensor& other) const;
  Tensor mm(const Tensor& other) const;
  Tensor bmm(const Tensor& other) const;
  Tensor softmax(int64_t dim) const;
  Tensor log_softmax(int64_t dim) const;
  std::vector<Tensor> split(int64_t split_size, int64_t dim = 0) const;
  std::vector<Tensor> chunk(int64_t chunks, int64_t dim = 0) const;
  Tensor flip(const Shape& dims) const;
  Tensor roll(const Shape& shifts, const Shape& dims = {}) const;
  Tensor tile(const Shape& reps) const;
  Tensor repeat_interleave(int64_t repeats, std::optional<int64_t> dim = {}) const;
  Tensor diag(int64_t diagonal = 0) const;
  Tensor trace() const;
  Tensor outer(const Tensor& other) const;
  Tensor dot(const Tensor& other) const;
  Tensor mv(const Tensor& vec) const;
  Tensor kron(const Tensor& other) const;
  Tensor take_along_dim(const Tensor& indices, std::optional<int64_t> dim = {}) const;
  Tensor repeat(const Shape& repeats) const;
  Tensor tril(int64_t diagonal = 0) const;
  Tensor triu(int64_t diagonal = 0) const;
  Tensor index_select(int64_t dim, const Tensor& index) const;
  Tensor gather(int64_t dim, const Tensor& index) const;
  Tensor scatter(int64_t dim, const Tensor& index, const Tensor& src) const;
  Tensor scatter_add(int64_t dim, const Tensor& index, const Tensor& src) const;

 private:
  // The TensorImpl, for every accessor: an undefined Tensor used where a tensor is needed is an
  // Error (LibTorch's "undefined Tensor"), not a null dereference. One predictable branch.
  TensorImpl& get() const {
    if (impl_ == nullptr) [[unlikely]] throw_undefined_tensor();
    return *impl_;
  }
  [[noreturn]] static void throw_undefined_tensor();
  // get(), after making a differentiable view's grad_fn anew if its storage changed since it was set.
  TensorImpl& autograd_fields() const {
    TensorImpl& t = get();
    if (t.view_base != nullptr && t.view_version != t.storage->version) [[unlikely]] refresh_view_grad_fn();
    return t;
  }
  void refresh_view_grad_fn() const;  // core/tensor.cpp

  std::shared_ptr<TensorImpl> impl_;
};

// Operators, as in LibTorch (ops/tensor_methods.cpp).
Tensor operator-(const Tensor& a);
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, const Scalar& b);
Tensor operator-(const Tensor& a, const Scalar& b);
Tensor operator*(const Tensor& a, const Scalar& b);
Tensor operator/(const Tensor& a, const Scalar& b);
Tensor operator+(const Scalar& a, const Tensor& b);
Tensor operator-(const Scalar& a, const Tensor& b);
Tensor operator*(const Scalar& a, const Tensor& b);
Tensor operator/(const Scalar& a, const Tensor& b);
Tensor operator%(const Tensor& a, const Tensor& b);  // remainder (Python's %, as LibTorch's)
Tensor operator%(const Tensor& a, const Scalar& b);
Tensor operator&(const Tensor& a, const Tensor& b);  // bitwise_and (integers and bools)
Tensor operator&(const Tensor& a, const Scalar& b);
Tensor operator|(const Tensor& a, const Tensor& b);
Tensor operator|(const Tensor& a, const Scalar& b);
Tensor operator^(const Tensor& a, const Tensor& b);
Tensor operator^(const Tensor& a, const Scalar& b);
Tensor operator~(const Tensor& a);  // bitwise_not
Tensor& operator+=(Tensor& a, const Tensor& b);
Tensor& operator-=(Tensor& a, const Tensor& b);
Tensor& operator*=(Tensor& a, const Tensor& b);
Tensor& operator/=(Tensor& a, const Tensor& b);
Tensor& operator+=(Tensor& a, const Scalar& b);
Tensor& operator-=(Tensor& a, const Scalar& b);
Tensor& operator*=(Tensor& a, const Scalar& b);
Tensor& operator/=(Tensor& a, const Scalar& b);

std::ostream& operator<<(std::ostream& os, const Tensor& t);  // ops/print.cpp

template <> std::vector<bool> Tensor::to_vector() const;  // ops/copy.cpp

namespace autograd::detail {
// Gives a differentiable view whose storage changed a grad_fn made from its base's current one.
// core cannot record a node, so ops/views.cpp sets this when it is linked in, as it is in any
// program that has made a view.
extern void (*make_view_grad_fn)(const Tensor& view);
}  // namespace autograd::detail

template <typename T> T* Tensor::data_ptr() const {
  KILN_CHECK(dtype_of<T>() == dtype(), "data_ptr: the tensor holds {}, not {}", dtype_name(dtype()),
             dtype_name(dtype_of<T>()));
  return static_cast<T*>(data_ptr());
}

}  // namespace kiln
