// ops/views.cpp: views: new shapes and strides over the same storage, no data copied (but for a
// reshape that no strides can express, which copies). Each records a backward that maps the gradient
// back to the input's shape (reshape, permute back, pad out a slice, sum over expanded dims).
//
// Note [views and in-place ops]
// A view made with grad mode on is a differentiable view: it holds its base (TensorImpl::view_base,
// the root of its chain of views), as PyTorch's views do, and this is what lets autograd follow
// in-place changes through shared storage:
// - An in-place op on the view (`h.narrow(1, 0, 2).mul_(w)`) is recorded as usual, and the view
//   takes the result's place in the graph (rebase_history, ops/record.cpp). The base's history then
//   gets one more node, CopySlices: the base's new value is its old one with the view's elements
//   replaced by the result. Its backward passes the base's gradient outside the view to the old
//   base, and the part inside the view to the result, from where it reaches the view's old value
//   (so the old base again) and the op's other inputs. PyTorch's CopySlices does the same with one
//   node fewer, by calling the op's backward itself.
// - An in-place op on the base or on another of its views bumps the storage's version. A view whose
//   grad_fn was set at an older version gets a new one on its next use (Tensor::grad_fn and the other
//   autograd accessors): AsStridedBackward, from the base's current grad_fn to the view's elements.
// Both backwards work on the storage's element numbering, so they serve every view the same way:
// each element's storage index comes from an arange laid out with the tensor's sizes, strides and
// offset, the gradient is scattered into a flat buffer by the source's indices and gathered back by
// the destination's. They are made of differentiable ops, so double backward goes through them.
// A view made under no_grad (and what ops::alias returns) is not differentiable: it is counted in
// Storage::live_views instead, and check_inplace refuses what it cannot follow (ops/record.cpp).
#include <algorithm>
#include <numeric>
#include <string>

#include "ops/dispatch.h"
#include "ops/ops.h"
#include "ops/record.h"

namespace kiln {

using autograd::Grads;
using autograd::record;
using autograd::should_record;
using autograd::TensorList;

namespace {

Tensor make_view(const Tensor& base, const Shape& sizes, const Shape& strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.impl()->storage;
  impl->sizes = sizes;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = base.dtype();
  autograd::detail::mark_view(*impl, base);
  return Tensor(std::move(impl));
}

// Where a tensor's elements lie in its storage.
struct Geometry {
  Shape sizes, strides;
  int64_t offset;
  explicit Geometry(const Tensor& t) : sizes(t.sizes()), strides(t.strides()), offset(t.storage_offset()) {}
  std::pair<int64_t, int64_t> span() const { return element_span(sizes, strides, offset); }
};

// The storage index, counted from a common origin, of each element (in row-major order) of a source
// and a destination tensor: flat int64 tensors, and the length of the storage range both lie in.
struct StorageIndices {
  Tensor source, destination;
  int64_t extent;
};
StorageIndices storage_indices(const Geometry& source, const Geometry& destination, Device device) {
  auto [s_lo, s_hi] = source.span();
  auto [d_lo, d_hi] = destination.span();
  const int64_t lo = std::min(s_lo, d_lo), extent = std::max(s_hi, d_hi) - lo + 1;
  NoGradGuard no_grad;
  Tensor numbers = arange(extent, kInt64, device);
  return {as_strided(numbers, source.sizes, source.strides, source.offset - lo).reshape({-1}),
          as_strided(numbers, destination.sizes, destination.strides, destination.offset - lo).reshape({-1}),
          extent};
}

// x's elements summed into a zero buffer of `extent` storage elements at their storage indices.
Tensor to_storage(const Tensor& x, const Tensor& indices, int64_t extent) {
  return zeros({extent}, x.options()).scatter_add(0, indices, x.reshape({-1}));
}

// The gradient for `base` of a view of it laid out as `view`: each element of base gets the sum of g
// over the view's elements at its storage location (none outside the view, several where the view
// is expanded). AsStridedBackward: of as_strided, and of a view remade after an in-place change.
Tensor view_grad_to_base(const Tensor& g, const Geometry& base, const Geometry& view) {
  if (!g.defined()) return {};
  if (g.numel() == 0) return zeros(base.sizes, g.options());
  StorageIndices at = storage_indices(view, base, g.device());
  return to_storage(g, at.source, at.extent).index_select(0, at.destination).view(base.sizes);
}

void record_as_strided(const Tensor& in, const Tensor& out) {
  autograd::record_no_tensors("AsStridedBackward", {in}, {out},
                              [base = Geometry(in), view = Geometry(out)](const Grads& g) -> TensorList {
                                return {view_grad_to_base(g[0], base, view)};
                              });
}

// A differentiable view whose storage changed since its grad_fn was set gets AsStridedBackward from
// its base's current history (Note [views and in-place ops]). Installed as make_view_grad_fn.
void make_view_grad_fn(const Tensor& view) {
  TensorImpl& v = *view.impl();
  v.view_version = v.storage->version;
  if (v.requires_grad) return;  // made a leaf by requires_grad_(): it stays one
  v.grad_fn.reset();
  v.output_nr = 0;
  const Tensor base(v.view_base);
  if (!base.requires_grad()) return;
  record_as_strided(base, view);
  if (v.retains_grad) autograd::add_retain_grad_hook(view);
}

[[maybe_unused]] const bool view_grad_fn_installed = [] {
  autograd::detail::make_view_grad_fn = &make_view_grad_fn;
  return true;
}();

// Resolves one -1 and checks the element count.
Shape infer_shape(const Shape& shape, int64_t numel, const char* op) {
  Shape out = shape;
  int infer = -1;
  int64_t known = 1;
  bool any_zero = false;  // then the product is 0, whatever the others multiply to
  for (int i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      KILN_CHECK(infer < 0, "{}: only one dimension can be -1, got {}", op, shape.str());
      infer = i;
    } else {
      KILN_CHECK(out[i] >= 0, "{}: invalid size {} in shape {}", op, out[i], shape.str());
      any_zero = any_zero || out[i] == 0;
    }
  }
  // Multiplied with a check: a product that wraps past 2^63 (2^62 x 4 is 0 modulo 2^64) must not pass
  // for the element count of an empty tensor.
  for (int i = 0; i < out.size() && !any_zero; ++i) {
    KILN_CHECK(i == infer || !__builtin_mul_overflow(known, out[i], &known),
               "{}: shape {} has more elements than fit in 64 bits", op, shape.str());
  }
  if (any_zero) known = 0;
  if (infer >= 0) {
    KILN_CHECK(known != 0 && numel % known == 0, "{}: shape {} is invalid for input of size {}", op,
               shape.str(), numel);
    out[infer] = numel / known;
  }
  KILN_CHECK(out.numel() == numel, "{}: shape {} is invalid for input of size {}", op, shape.str(), numel);
  return out;
}

// Strides that read `old` data in row-major order of `shape`, if any exist without copying.
// Groups of old dims that are contiguous among themselves can be split or merged freely.
std::optional<Shape> view_strides(Shape old_sizes, Shape old_strides, const Shape& shape) {
  if (old_sizes.numel() == 0 || shape.size() == 0) return contiguous_strides(shape);
  if (old_sizes.size() == 0) {
    old_sizes = {1};
    old_strides = {1};
  }
  Shape strides = Shape::filled(shape.size(), 0);
  int view_d = shape.size() - 1;
  int64_t chunk_stride = old_strides.back(), tensor_numel = 1, view_numel = 1;
  for (int d = old_sizes.size() - 1; d >= 0; --d) {
    tensor_numel *= old_sizes[d];
    bool chunk_ends = d == 0 || (old_sizes[d - 1] != 1 && old_strides[d - 1] != tensor_numel * chunk_stride);
    if (!chunk_ends) continue;
    while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
      strides[view_d] = view_numel * chunk_stride;
      view_numel *= shape[view_d];
      --view_d;
    }
    if (view_numel != tensor_numel) return std::nullopt;
    if (d > 0) {
      chunk_stride = old_strides[d - 1];
      tensor_numel = view_numel = 1;
    }
  }
  if (view_d != -1) return std::nullopt;
  return strides;
}

void record_reshape_back(const Tensor& in, const Tensor& out, const char* name) {
  if (!should_record(in)) return;
  Shape shape = in.sizes();
  record(name, {in}, {out}, [shape](const Grads& g) -> TensorList { return {g[0].reshape(shape)}; });
}

// The gradient of a slice: zeros of the input's shape with g written into the slice.
Tensor slice_backward(const Tensor& g, const Shape& input_shape, int dim, int64_t start, int64_t end,
                      int64_t step) {
  Tensor out = zeros(input_shape, g.options());
  Tensor window = out.slice(dim, start, end, step);
  {
    NoGradGuard no_grad;
    window.copy_(g);
  }
  if (should_record(g)) {
    record("SliceBackwardBackward", {g}, {out}, [dim, start, end, step](const Grads& gg) -> TensorList {
      return {gg[0].slice(dim, start, end, step)};
    });
  }
  return out;
}

}  // namespace

namespace autograd {

namespace detail {
void mark_view(TensorImpl& view, const Tensor& base) {
  view.is_view = true;
  if (GradMode::is_enabled()) {
    view.uncount_view();  // made under no_grad first (split's pieces)
    const TensorImpl& b = *base.impl();
    view.view_base = b.view_base ? b.view_base : base.impl_ptr();
    view.view_version = view.storage->version;
  } else {
    view.count_as_view();
  }
}
}  // namespace detail

void record_copy_slices(const Tensor& view, const Tensor& result) {
  const Tensor base(view.impl()->view_base);
  record_no_tensors(
      "CopySlices", {base, result}, {base},
      [base_at = Geometry(base), view_at = Geometry(view)](const Grads& g) -> TensorList {
        if (!g[0].defined()) return {};
        if (g[0].numel() == 0 || view_at.sizes.numel() == 0) return {g[0], zeros(view_at.sizes, g[0].options())};
        // The base's gradient laid out as its storage; the view's elements go to the result.
        StorageIndices at = storage_indices(base_at, view_at, g[0].device());
        Tensor flat = to_storage(g[0], at.source, at.extent);
        Tensor to_result = flat.index_select(0, at.destination).view(view_at.sizes);
        if (!g.needs_grad(0)) return {Tensor(), to_result};
        Tensor in_view;
        {
          NoGradGuard no_grad;
          in_view = to_storage(ones({at.destination.numel()}, g[0].options()), at.destination, at.extent).ne(0);
        }
        return {flat.masked_fill(in_view, 0).index_select(0, at.source).view(base_at.sizes), to_result};
      });
  if (base.retains_grad()) add_retain_grad_hook(base);
}

}  // namespace autograd

inline namespace ops {

// detach(t), counted as a live view made without autograd: t cannot change in place under autograd
// while the alias lives, and may again once it is gone.
Tensor alias(const Tensor& t) {
  Tensor a = detach(t);
  if (!a.impl()->counts_as_view) a.impl()->count_as_view();  // detach of a counted view counts already
  return a;
}

Tensor view(const Tensor& t, const Shape& shape) {
  Shape sizes = infer_shape(shape, t.numel(), "view");
  auto strides = view_strides(t.sizes(), t.strides(), sizes);
  KILN_CHECK(strides.has_value(),
             "view: shape {} is not compatible with the input's sizes {} and strides {} (at least "
             "one dimension spans across two contiguous subspaces); use reshape() instead",
             sizes.str(), t.sizes().str(), t.strides().str());
  Tensor out = make_view(t, sizes, *strides, t.storage_offset());
  record_reshape_back(t, out, "ViewBackward");
  return out;
}

Tensor reshape(const Tensor& t, const Shape& shape) {
  Shape sizes = infer_shape(shape, t.numel(), "reshape");
  if (auto strides = view_strides(t.sizes(), t.strides(), sizes)) {
    Tensor out = make_view(t, sizes, *strides, t.storage_offset());
    record_reshape_back(t, out, "ReshapeBackward");
    return out;
  }
  // A copy (PyTorch's _unsafe_view of a clone): the result owns its storage and is no view, so
  // in-place ops may change it.
  Tensor out;
  {
    NoGradGuard no_grad;
    out = t.contiguous();
  }
  out.impl()->sizes = sizes;
  set_contiguous_strides(sizes, out.impl()->strides);
  record_reshape_back(t, out, "UnsafeViewBackward");
  return out;
}

Tensor permute(const Tensor& t, const Shape& dims) {
  const int nd = t.dim();
  KILN_CHECK(dims.size() == nd, "permute: got {} dims {} for a tensor of {} dimensions", dims.size(),
             dims.str(), nd);
  Shape sizes = t.sizes(), strides = t.strides(), inverse = Shape::filled(nd, 0);
  bool seen[kMaxDims] = {};
  for (int i = 0; i < nd; ++i) {
    int d = wrap_dim(dims[i], nd, "permute");
    KILN_CHECK(!seen[d], "permute: dim {} appears twice in {}", d, dims.str());
    seen[d] = true;
    sizes[i] = t.sizes()[d];
    strides[i] = t.strides()[d];
    inverse[d] = i;
  }
  Tensor out = make_view(t, sizes, strides, t.storage_offset());
  if (should_record(t)) {
    record("PermuteBackward", {t}, {out}, [inverse](const Grads& g) -> TensorList { return {g[0].permute(inverse)}; });
  }
  return out;
}

Tensor transpose(const Tensor& t, int64_t dim0, int64_t dim1) {
  const int nd = t.dim();
  Shape dims = Shape::filled(nd, 0);
  for (int i = 0; i < nd; ++i) dims[i] = i;
  const int a = wrap_dim(dim0, nd, "transpose"), b = wrap_dim(dim1, nd, "transpose");  // a 0-d tensor: -1 or 0
  if (nd > 0) std::swap(dims[a], dims[b]);
  return permute(t, dims);  // a view, also of a 0-d tensor, as PyTorch
}

Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length) {
  KILN_CHECK(t.dim() > 0, "narrow: cannot narrow a 0-dimensional tensor");
  int d = wrap_dim(dim, t.dim(), "narrow");
  const int64_t size = t.sizes()[d], given = start;
  if (start < 0 && start >= -size) start += size;
  KILN_CHECK(start >= 0 && start <= size && length >= 0 && length <= size - start,
             "narrow: start {} and length {} are out of range for dim {} of size {}", given, length, d, size);
  return slice(t, d, start, start + length, 1);
}

Tensor slice(const Tensor& t, int64_t dim, std::optional<int64_t> start_opt,
             std::optional<int64_t> end_opt, int64_t step) {
  KILN_CHECK(t.dim() > 0, "slice: cannot slice a 0-dimensional tensor");
  KILN_CHECK(step > 0, "slice: step must be positive, got {}", step);
  int d = wrap_dim(dim, t.dim(), "slice");
  int64_t size = t.sizes()[d];
  auto clampi = [size](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + size : v, 0, size); };
  int64_t start = clampi(start_opt.value_or(0)), end = clampi(end_opt.value_or(size));
  if (end < start) end = start;
  Shape sizes = t.sizes(), strides = t.strides();
  sizes[d] = end == start ? 0 : 1 + (end - start - 1) / step;  // no overflow for a step near INT64_MAX
  // A dim of one element may keep any stride; the others' stride * step stays inside the storage.
  if (__builtin_mul_overflow(strides[d], step, &strides[d])) strides[d] = t.strides()[d];
  // An empty view keeps its base's offset: start * stride may pass 2^63 where the base has no elements.
  const int64_t offset = sizes.numel() == 0 ? t.storage_offset() : t.storage_offset() + start * t.strides()[d];
  Tensor out = make_view(t, sizes, strides, offset);
  if (should_record(t)) {
    Shape shape = t.sizes();
    record("SliceBackward", {t}, {out}, [shape, d, start, end, step](const Grads& g) -> TensorList {
      return {slice_backward(g[0], shape, d, start, end, step)};
    });
  }
  return out;
}

Tensor select(const Tensor& t, int64_t dim, int64_t index) {
  KILN_CHECK(t.dim() > 0, "select: cannot index a 0-dimensional tensor");
  int d = wrap_dim(dim, t.dim(), "select");
  int64_t size = t.sizes()[d];
  KILN_CHECK(index >= -size && index < size, "select: index {} is out of range for dim {} of size {}",
             index, d, size);
  if (index < 0) index += size;
  Shape sizes = t.sizes(), strides = t.strides();
  sizes.erase(d);
  strides.erase(d);
  const int64_t offset = sizes.numel() == 0 ? t.storage_offset() : t.storage_offset() + index * t.strides()[d];
  Tensor out = make_view(t, sizes, strides, offset);  // an empty view keeps its base's offset, as slice's
  if (should_record(t)) {
    Shape shape = t.sizes();
    record("SelectBackward", {t}, {out}, [shape, d, index](const Grads& g) -> TensorList {
      return {slice_backward(g[0].unsqueeze(d), shape, d, index, index + 1, 1)};
    });
  }
  return out;
}

// diagonal and diag_embed are each other's gradients: diagonal a view, diag_embed a zero tensor with
// the input written along a diagonal (a view of it, written under no_grad, then recorded as a whole).
static Tensor diagonal_scatter_zeros(const Tensor& src, const Shape& shape, int64_t offset, int64_t dim1, int64_t dim2);
Tensor diagonal(const Tensor& t, int64_t offset, int64_t dim1, int64_t dim2) {
  const char* op = "diagonal";
  KILN_CHECK(t.dim() >= 2, "{}: needs at least 2 dims, got shape {}", op, t.sizes().str());
  const int d1 = wrap_dim(dim1, t.dim(), op), d2 = wrap_dim(dim2, t.dim(), op);
  KILN_CHECK(d1 != d2, "{}: dim1 and dim2 must differ, both are {}", op, d1);
  const int64_t n1 = t.sizes()[d1], n2 = t.sizes()[d2];
  // Diagonal offset k starts at (0, k) above the main one, at (-k, 0) below it.
  const int64_t length = std::max<int64_t>(
      0, offset >= 0 ? std::min(n1, n2 - std::min(offset, n2)) : std::min(n1 + std::max(offset, -n1), n2));
  Shape sizes, strides;
  for (int d = 0; d < t.dim(); ++d) {
    if (d == d1 || d == d2) continue;
    sizes.push_back(t.sizes()[d]), strides.push_back(t.strides()[d]);
  }
  sizes.push_back(length), strides.push_back(t.strides()[d1] + t.strides()[d2]);
  int64_t start = t.storage_offset();
  if (sizes.numel() > 0) start += offset >= 0 ? offset * t.strides()[d2] : -offset * t.strides()[d1];
  Tensor out = make_view(t, sizes, strides, start);
  if (should_record(t)) {
    Shape shape = t.sizes();
    record("DiagonalBackward", {t}, {out}, [shape, offset, d1, d2](const Grads& g) -> TensorList {
      return {diagonal_scatter_zeros(g[0], shape, offset, d1, d2)};
    });
  }
  return out;
}

// A zero tensor of `shape` with src along its diagonal (offset, dim1, dim2); its gradient is that diagonal.
static Tensor diagonal_scatter_zeros(const Tensor& src, const Shape& shape, int64_t offset, int64_t dim1,
                                     int64_t dim2) {
  Tensor out = zeros(shape, src.options());
  {
    NoGradGuard no_grad;
    Tensor band = diagonal(out, offset, dim1, dim2);
    KILN_CHECK(band.sizes() == src.sizes(),
               "diag_embed: the diagonal {} of a {} tensor has shape {}, not the input's {}", offset, shape.str(),
               band.sizes().str(), src.sizes().str());
    band.copy_(src);
  }
  if (should_record(src)) {
    record("DiagEmbedBackward", {src}, {out},
           [offset, dim1, dim2](const Grads& g) -> TensorList { return {diagonal(g[0], offset, dim1, dim2)}; });
  }
  return out;
}

Tensor diag_embed(const Tensor& x, int64_t offset, int64_t dim1, int64_t dim2) {
  const char* op = "diag_embed";
  KILN_CHECK(x.dim() >= 1, "{}: needs at least a 1-D input (its last dim becomes the diagonal), got a 0-d tensor", op);
  const int nd = x.dim() + 1;
  const int d1 = wrap_dim(dim1, nd, op), d2 = wrap_dim(dim2, nd, op);
  KILN_CHECK(d1 != d2, "{}: dim1 and dim2 must differ, both are {}", op, d1);
  const int64_t n = x.sizes().back() + (offset < 0 ? -offset : offset);
  Shape shape;
  int next = 0;  // x's batch dims fill the output's dims other than d1 and d2, in order
  for (int d = 0; d < nd; ++d) shape.push_back(d == d1 || d == d2 ? n : x.sizes()[next++]);
  return diagonal_scatter_zeros(x, shape, offset, d1, d2);
}

Tensor expand(const Tensor& t, const Shape& shape) {
  const int nd = shape.size(), lead = nd - t.dim();
  KILN_CHECK(lead >= 0, "expand: the target shape {} has fewer dims than the tensor's {}", shape.str(),
             t.sizes().str());
  Shape sizes = shape, strides = Shape::filled(nd, 0);
  for (int i = 0; i < nd; ++i) {
    int j = i - lead;  // the tensor's dim, if any
    if (j < 0) {
      KILN_CHECK(shape[i] >= 0, "expand: -1 is not allowed for a new leading dim ({})", shape.str());
      continue;
    }
    int64_t have = t.sizes()[j];
    if (shape[i] == -1 || shape[i] == have) {
      sizes[i] = have;
      strides[i] = t.strides()[j];
    } else {
      KILN_CHECK(shape[i] >= 0, "expand: invalid size {} in the target shape {}", shape[i], shape.str());
      KILN_CHECK(have == 1,
                 "expand: the size of dim {} ({}) must match the target size ({}) unless it is 1; "
                 "tensor shape {}, target {}",
                 j, have, shape[i], t.sizes().str(), shape.str());
    }
  }
  (void)checked_numel(sizes, "expand");
  Tensor out = make_view(t, sizes, strides, t.storage_offset());
  if (should_record(t)) {
    Shape from = t.sizes();
    record("ExpandBackward", {t}, {out}, [from](const Grads& g) -> TensorList { return {sum_to(g[0], from)}; });
  }
  return out;
}

Tensor squeeze(const Tensor& t, std::optional<int64_t> dim) {
  Shape sizes, strides;
  const int only = dim ? wrap_dim(*dim, t.dim(), "squeeze") : -1;  // a 0-d tensor: dim -1 or 0, nothing to drop
  for (int d = 0; d < t.dim(); ++d) {
    bool drop = t.sizes()[d] == 1 && (!dim || d == only);
    if (!drop) {
      sizes.push_back(t.sizes()[d]);
      strides.push_back(t.strides()[d]);
    }
  }
  Tensor out = make_view(t, sizes, strides, t.storage_offset());
  record_reshape_back(t, out, "SqueezeBackward");
  return out;
}

Tensor unsqueeze(const Tensor& t, int64_t dim) {
  int d = wrap_dim(dim, t.dim() + 1, "unsqueeze");
  Shape sizes = t.sizes(), strides = t.strides();
  int64_t stride = d < t.dim() ? t.sizes()[d] * t.strides()[d] : 1;
  sizes.insert(d, 1);
  strides.insert(d, stride);
  Tensor out = make_view(t, sizes, strides, t.storage_offset());
  record_reshape_back(t, out, "UnsqueezeBackward");
  return out;
}

Tensor flatten(const Tensor& t, int64_t start_dim, int64_t end_dim) {
  if (t.dim() == 0) {  // its dims are checked as a 1-D tensor's, as PyTorch's
    (void)wrap_dim(start_dim, 1, "flatten");
    (void)wrap_dim(end_dim, 1, "flatten");
    return t.reshape({1});
  }
  int s = wrap_dim(start_dim, t.dim(), "flatten"), e = wrap_dim(end_dim, t.dim(), "flatten");
  KILN_CHECK(s <= e, "flatten: start_dim {} comes after end_dim {}", start_dim, end_dim);
  Shape shape;
  int64_t merged = 1;
  for (int d = 0; d < t.dim(); ++d) {
    if (d < s || d > e) shape.push_back(t.sizes()[d]);
    else {
      merged *= t.sizes()[d];
      if (d == e) shape.push_back(merged);
    }
  }
  return t.reshape(shape);
}

Tensor unflatten(const Tensor& t, int64_t dim, const Shape& sizes) {
  KILN_CHECK(t.dim() > 0, "unflatten: a 0-dimensional tensor has no dim to unflatten");
  int d = wrap_dim(dim, t.dim(), "unflatten");
  Shape inner = infer_shape(sizes, t.sizes()[d], "unflatten");
  Shape shape;
  for (int i = 0; i < t.dim(); ++i) {
    if (i == d) for (int64_t s : inner) shape.push_back(s);
    else shape.push_back(t.sizes()[i]);
  }
  return t.view(shape);
}

namespace {

// The positions along the unfolded dim of every window's elements, window by window: w step + k.
Tensor window_positions(int64_t windows, int64_t size, int64_t step, Device device) {
  Tensor at = empty({windows * size}, kInt64);  // as many as the gradient has elements
  int64_t* next = at.data_ptr<int64_t>();
  for (int64_t w = 0; w < windows; ++w) {
    for (int64_t k = 0; k < size; ++k) *next++ = w * step + k;
  }
  return at.to(device);
}

}  // namespace

Tensor unfold(const Tensor& t, int64_t dimension, int64_t size, int64_t step) {
  if (t.dim() == 0) {  // PyTorch's: the one element, as a window along dim 0, without that dim
    KILN_CHECK(dimension == 0 || dimension == -1, "unfold: dimension {} is out of range for a 0-d tensor (0 or -1)",
               dimension);
    KILN_CHECK(size >= 0 && size <= 1, "unfold: size {} is not in [0, 1], the sizes a 0-d tensor's window can have",
               size);
    return unfold(t.reshape({1}), 0, size, step).select(0, 0);
  }
  const int d = wrap_dim(dimension, t.dim(), "unfold");
  const int64_t length = t.size(d);
  KILN_CHECK(size >= 0 && size <= length, "unfold: size {} must be in [0, {}], the size of dimension {}", size,
             length, d);
  KILN_CHECK(step > 0, "unfold: step must be > 0, got {}", step);
  const int64_t windows = (length - size) / step + 1;
  Shape sizes = t.sizes(), strides = t.strides();
  sizes[d] = windows;
  // A dim of one window may keep any stride; the others' stride * step stays inside the storage.
  if (__builtin_mul_overflow(strides[d], step, &strides[d])) strides[d] = t.strides()[d];
  sizes.push_back(size);
  strides.push_back(t.strides()[d]);
  Tensor out = make_view(t, sizes, strides, t.storage_offset());
  if (should_record(t)) {
    const Shape shape = t.sizes();
    record("UnfoldBackward", {t}, {out}, [shape, d, size, step, windows](const Grads& g) -> TensorList {
      if (g[0].numel() == 0) return {zeros(shape, g[0].options())};  // no positions to list
      // g (..., windows at d, ..., size): each window's elements next to each other at d, then
      // summed into their positions.
      Shape order;
      const int nd = g[0].dim();
      for (int i = 0; i < nd - 1; ++i) {
        order.push_back(i);
        if (i == d) order.push_back(nd - 1);
      }
      const Tensor windowed = g[0].permute(order).flatten(d, d + 1);
      return {index_add(zeros(shape, g[0].options()), d, window_positions(windows, size, step, g[0].device()),
                        windowed)};
    });
  }
  return out;
}

Tensor as_strided(const Tensor& t, const Shape& sizes, const Shape& strides, int64_t offset) {
  const bool grad = should_record(t);
  const int expanded = grad ? first_expanded_dim(t) : -1;
  KILN_CHECK(expanded < 0,
             "as_strided: with autograd its input must not be expanded (dim {} has stride 0), as its "
             "gradient could not tell the repeated elements apart; call it on contiguous() of the input",
             expanded);
  KILN_CHECK(sizes.size() == strides.size(), "as_strided: {} sizes but {} strides", sizes.size(), strides.size());
  // Every element it can address must lie inside the storage.
  // The reach is computed in 128 bits: huge strides must not wrap around into the storage.
  __int128 lo = offset, hi = offset;
  const bool empty = checked_numel(sizes, "as_strided") == 0;
  for (int i = 0; i < sizes.size() && !empty; ++i) {
    (strides[i] < 0 ? lo : hi) += static_cast<__int128>(sizes[i] - 1) * strides[i];
  }
  const int64_t capacity = static_cast<int64_t>(t.impl()->storage->nbytes) / t.element_size();
  auto element = [](__int128 v) {
    return v > INT64_MAX ? std::string("2^63 and beyond") : v < INT64_MIN ? std::string("below -2^63")
                                                                          : std::to_string(static_cast<int64_t>(v));
  };
  KILN_CHECK(empty || (lo >= 0 && hi < capacity),
             "as_strided: sizes {}, strides {} and offset {} reach elements {}..{}, outside the storage's {}",
             sizes.str(), strides.str(), offset, element(lo), element(hi), capacity);
  Tensor out = make_view(t, sizes, strides, offset);
  if (grad) record_as_strided(t, out);
  return out;
}

}  // namespace ops

Tensor Tensor::view(const Shape& shape) const { return ops::view(*this, shape); }
Tensor Tensor::reshape(const Shape& shape) const { return ops::reshape(*this, shape); }
Tensor Tensor::permute(const Shape& dims) const { return ops::permute(*this, dims); }
Tensor Tensor::transpose(int64_t d0, int64_t d1) const { return ops::transpose(*this, d0, d1); }
Tensor Tensor::t() const {
  KILN_CHECK(dim() <= 2, "t: expects a tensor of at most 2 dims, got shape {}; use transpose()", sizes().str());
  return dim() < 2 ? *this : ops::transpose(*this, 0, 1);
}
Tensor Tensor::mT() const {
  KILN_CHECK(dim() >= 2, "mT: expects at least 2 dims, got shape {}", sizes().str());
  return ops::transpose(*this, -2, -1);
}
Tensor Tensor::narrow(int64_t dim, int64_t start, int64_t length) const {
  return ops::narrow(*this, dim, start, length);
}
Tensor Tensor::slice(int64_t dim, std::optional<int64_t> start, std::optional<int64_t> end, int64_t step) const {
  return ops::slice(*this, dim, start, end, step);
}
Tensor Tensor::select(int64_t dim, int64_t index) const { return ops::select(*this, dim, index); }
Tensor Tensor::expand(const Shape& shape) const { return ops::expand(*this, shape); }
Tensor Tensor::diagonal(int64_t offset, int64_t dim1, int64_t dim2) const {
  return ops::diagonal(*this, offset, dim1, dim2);
}
Tensor Tensor::squeeze() const { return ops::squeeze(*this); }
Tensor Tensor::squeeze(int64_t dim) const { return ops::squeeze(*this, dim); }
Tensor Tensor::unsqueeze(int64_t dim) const { return ops::unsqueeze(*this, dim); }
Tensor Tensor::flatten(int64_t s, int64_t e) const { return ops::flatten(*this, s, e); }
Tensor Tensor::unflatten(int64_t dim, const Shape& sizes) const { return ops::unflatten(*this, dim, sizes); }
Tensor Tensor::unfold(int64_t dimension, int64_t size, int64_t step) const {
  return ops::unfold(*this, dimension, size, step);
}

}  // namespace kiln
