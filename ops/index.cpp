// ops/index.cpp: indexing ops: index_select, index_add, gather, scatter(_add), embedding, one_hot.
// Their gradients pair up: index_select <-> index_add, gather <-> scatter_add.
#include <limits>

#include "ops/autocast.h"
#include "ops/dispatch.h"
#include "ops/ops.h"
#include "ops/record.h"

namespace kiln {

using autograd::Grads;
using autograd::record;
using autograd::SavedTensor;
using autograd::should_record;
using autograd::TensorList;

namespace {

Tensor as_index(const Tensor& index, const Tensor& x, const char* op) {
  KILN_CHECK(index.dtype() == kInt64 || index.dtype() == kInt32,
             "{}: indices must be int64 or int32, got {}", op, dtype_name(index.dtype()));
  check_same_device(op, x, index);
  if (index.dtype() == kInt64) return index.detach();
  NoGradGuard no_grad;
  return index.to(kInt64);
}

// gather/scatter: index has the input's rank, and no larger than `other` outside `dim`.
void check_gather_shapes(const Tensor& x, int d, const Tensor& index, const Tensor* src, const char* op) {
  KILN_CHECK(index.dim() == x.dim(), "{}: index must have as many dims as the input ({}), got shape {}", op,
             x.dim(), index.sizes().str());
  KILN_CHECK(!src || src->dim() == x.dim(), "{}: the source must have as many dims as the input ({}), got shape {}",
             op, x.dim(), src->sizes().str());
  for (int k = 0; k < x.dim(); ++k) {
    KILN_CHECK(k == d || index.sizes()[k] <= x.sizes()[k],
               "{}: index shape {} is larger than the input shape {} in dim {}", op, index.sizes().str(),
               x.sizes().str(), k);
    if (src) {
      KILN_CHECK(index.sizes()[k] <= src->sizes()[k], "{}: index shape {} is larger than the source shape {} in dim {}",
                 op, index.sizes().str(), src->sizes().str(), k);
    }
  }
}

}  // namespace

inline namespace ops {

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index_in) {
  Tensor index = as_index(index_in, x, "index_select");
  KILN_CHECK(index.dim() <= 1, "index_select: the index must be 1-D, got shape {}", index.sizes().str());
  int d = wrap_dim(dim, x.dim(), "index_select");
  Tensor src = x.dim() == 0 ? x.reshape({1}) : x;
  Shape shape = src.sizes();
  shape[d] = index.numel();
  Tensor out = empty_tensor(shape, x.dtype(), x.device());
  backend_for(x.device()).index_select(view_of(src), d, view_of(index.reshape({-1})), view_of(out), stream_for(x.device()));
  if (x.dim() == 0) out = out.reshape({});
  if (should_record(x)) {
    record("IndexSelectBackward", {x}, {out}, [d, shape = x.sizes(), ix = SavedTensor(index, false)](const Grads& g) -> TensorList {
      return {index_add(zeros(shape, g[0].options()), d, ix.unpack("IndexSelectBackward"), g[0])};
    });
  }
  return out;
}

Tensor index_add(const Tensor& x, int64_t dim, const Tensor& index_in, const Tensor& source) {
  Tensor index = as_index(index_in, x, "index_add");
  int d = wrap_dim(dim, x.dim(), "index_add");
  if (x.dim() == 0 || (x.dim() == 1 && source.dim() == 0)) {
    // As PyTorch: a 0-d tensor adds as a 1-element 1-d one, from a 0-d or 1-d source; a 0-d source
    // into a 1-d tensor is one slice.
    KILN_CHECK(source.dim() <= 1, "index_add: a {}-d tensor takes a 0-d or 1-d source, got shape {}", x.dim(),
               source.sizes().str());
    const Tensor y = index_add(x.reshape({-1}), 0, index.reshape({-1}), source.reshape({-1}));
    return x.dim() == 0 ? y.reshape({}) : y;
  }
  KILN_CHECK(index.dim() <= 1 && source.dim() == x.dim() && source.sizes()[d] == index.numel(),
             "index_add: expects a 1-D index with one entry per slice of the source along dim {}; got index {} "
             "and source {}",
             d, index.sizes().str(), source.sizes().str());
  for (int k = 0; k < x.dim(); ++k) {
    KILN_CHECK(k == d || source.sizes()[k] == x.sizes()[k],
               "index_add: the source's shape {} must match the tensor's {} outside dim {}", source.sizes().str(),
               x.sizes().str(), d);
  }
  KILN_CHECK(source.dtype() == x.dtype(), "index_add: source dtype {} must match the tensor's {}",
             dtype_name(source.dtype()), dtype_name(x.dtype()));
  Tensor out = x.detach().clone();
  if (source.numel() > 0) {  // nothing to add otherwise (and the tensor's other dims may hold 2^62 rows to visit)
    backend_for(x.device()).index_add(view_of(out), d, view_of(index.reshape({-1})), view_of(source),
                                      stream_for(x.device()));
  }
  if (should_record(x, source)) {
    record("IndexAddBackward", {x, source}, {out}, [d, ix = SavedTensor(index, false)](const Grads& g) -> TensorList {
      return {g[0], g.needs_grad(1) ? g[0].index_select(d, ix.unpack("IndexAddBackward")) : Tensor()};
    });
  }
  return out;
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index_in) {
  Tensor index = as_index(index_in, x, "gather");
  int d = wrap_dim(dim, x.dim(), "gather");
  if (x.dim() == 0 && index.dim() == 0) {  // as PyTorch: 0-d gathers as 1-element 1-d
    return gather(x.reshape({1}), 0, index.reshape({1})).reshape({});
  }
  check_gather_shapes(x, d, index, nullptr, "gather");
  Tensor out = empty_tensor(index.sizes(), x.dtype(), x.device());
  if (index.numel() > 0) {  // nothing to gather (and the index's other dims may hold 2^62 rows to visit)
    backend_for(x.device()).gather(view_of(x), d, view_of(index), view_of(out), stream_for(x.device()));
  }
  if (should_record(x)) {
    record("GatherBackward", {x}, {out}, [d, shape = x.sizes(), ix = SavedTensor(index, false)](const Grads& g) -> TensorList {
      return {scatter_add(zeros(shape, g[0].options()), d, ix.unpack("GatherBackward"), g[0])};
    });
  }
  return out;
}

static Tensor scatter_impl(const Tensor& x, int64_t dim, const Tensor& index_in, const Tensor& src, bool add) {
  const char* name = add ? "scatter_add" : "scatter";
  Tensor index = as_index(index_in, x, name);
  int d = wrap_dim(dim, x.dim(), name);
  if (x.dim() == 0 && index.dim() == 0 && src.dim() == 0) {  // as gather
    return scatter_impl(x.reshape({1}), 0, index.reshape({1}), src.reshape({1}), add).reshape({});
  }
  check_gather_shapes(x, d, index, &src, name);
  KILN_CHECK(src.dtype() == x.dtype(), "{}: source dtype {} must match the tensor's {}", name,
             dtype_name(src.dtype()), dtype_name(x.dtype()));
  Tensor out = x.detach().clone();
  if (index.numel() > 0) {  // as gather
    backend_for(x.device()).scatter(view_of(out), d, view_of(index), view_of(src), add, stream_for(x.device()));
  }
  if (should_record(x, src)) {
    record(add ? "ScatterAddBackward" : "ScatterBackward", {x, src}, {out},
           [d, add, ix = SavedTensor(index, false)](const Grads& g) -> TensorList {
             Tensor idx = ix.unpack("ScatterBackward");
             Tensor gx = add ? g[0] : g[0].scatter(d, idx, zeros(idx.sizes(), g[0].options()));
             return {g.needs_grad(0) ? gx : Tensor(), g.needs_grad(1) ? g[0].gather(d, idx) : Tensor()};
           });
  }
  return out;
}
Tensor scatter(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  return scatter_impl(x, dim, index, src, false);
}
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  if (autocast::is_enabled(x.device().type)) {  // See Note [autocast] in ops/autocast.h
    if (autocast::OpScope ac{autocast::Op::ScatterAdd, x.device(), {x, src}})
      return scatter_add(ac.cast(x), dim, index, ac.cast(src));
  }
  return scatter_impl(x, dim, index, src, true);
}

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  KILN_CHECK(weight.dim() == 2, "embedding: the weight must be 2-D (num_embeddings, dim), got shape {}",
             weight.sizes().str());
  Shape shape = indices.sizes();
  shape.push_back(weight.sizes()[1]);
  return index_select(weight, 0, indices.reshape({-1})).view(shape);
}

Tensor one_hot(const Tensor& indices, int64_t num_classes) {
  KILN_CHECK(indices.dtype() == kInt64, "one_hot: indices must be int64, got {}", dtype_name(indices.dtype()));
  KILN_CHECK(num_classes >= -1, "one_hot: num_classes must be -1 (one more than the largest index) or "
             "non-negative, got {}", num_classes);
  if (indices.numel() > 0) {
    int64_t lo = indices.min().item<int64_t>(), hi = indices.max().item<int64_t>();
    if (num_classes < 0) {  // one more than the largest, which must have a successor
      KILN_CHECK(lo >= 0 && hi < std::numeric_limits<int64_t>::max(),
                 "one_hot: class values must be in [0, 2^63 - 1) to infer num_classes, got values in [{}, {}]", lo, hi);
      num_classes = hi + 1;
    }
    KILN_CHECK(lo >= 0 && hi < num_classes, "one_hot: class values must be in [0, {}), got values in [{}, {}]",
               num_classes, lo, hi);
  }
  KILN_CHECK(num_classes >= 0, "one_hot: cannot infer the number of classes from an empty tensor; pass it");
  return indices.unsqueeze(-1).eq(arange(num_classes, kInt64, indices.device())).to(kInt64);
}

}  // namespace ops
}  // namespace kiln
