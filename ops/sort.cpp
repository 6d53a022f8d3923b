// ops/sort.cpp: sorting and running reductions along one dim: sort, argsort, msort, topk and
// nanmedian (Backend::sort), kthvalue and median (Backend::kthvalue: one rank selected, not a sort),
// cumsum, cumprod, cummax, cummin, logcumsumexp (Backend::scan), searchsorted and bucketize
// (Backend::searchsorted), and quantile and nanquantile (a sort and a lerp). The order is stable (ties
// keep their order; NaN counts as the largest value, as PyTorch's). The gradients are ops, so each
// differentiates again; logcumsumexp's takes the log of the gradient's positive and negative parts,
// so its own derivative is not finite where a part is 0.
#include <cmath>
#include <string_view>

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

// The first k elements of x's lines along d in sorted order, and their positions. The gradient goes
// back to the positions it came from (a scatter: the positions of a line are distinct).
std::tuple<Tensor, Tensor> sorted_prefix(const Tensor& x, int d, int64_t k, bool descending,
                                         const char* backward_name) {
  Shape shape = x.sizes();
  shape[d] = k;
  Tensor values = empty_tensor(shape, x.dtype(), x.device());
  Tensor indices = empty_tensor(shape, kInt64, x.device());
  if (values.numel() > 0) {
    backend_for(x.device()).sort(view_of(x), d, descending, view_of(values), view_of(indices), stream_for(x.device()));
  }
  if (should_record(x)) {
    record(backward_name, {x}, {values},
           [d, backward_name, shape = x.sizes(), ix = SavedTensor(indices, false)](const Grads& g) -> TensorList {
             return {zeros(shape, g[0].options()).scatter(d, ix.unpack(backward_name), g[0])};
           });
  }
  return {values, indices};
}

// The positions of the elements of rank k - 1 of x's lines along d (keepdim shape), without gradient.
Tensor rank_positions(const Tensor& x, int d, int64_t k) {
  Shape shape = x.sizes();
  shape[d] = 1;
  Tensor values = empty_tensor(shape, x.dtype(), x.device()), indices = empty_tensor(shape, kInt64, x.device());
  backend_for(x.device()).kthvalue(view_of(x), d, k, view_of(values), view_of(indices), stream_for(x.device()));
  return indices;
}

// A 0-d tensor sorts and scans as a 1-element 1-d one, and gives 0-d results (PyTorch's rule).
Tensor as_line(const Tensor& x) { return x.dim() == 0 ? x.reshape({1}) : x; }
Tensor like_input(const Tensor& t, const Tensor& x) { return x.dim() == 0 ? t.reshape({}) : t; }

// cumsum and cumprod take integers and bool as int64, as PyTorch's, or the dtype asked for.
Tensor scan_input(const Tensor& x, std::optional<DType> dtype) {
  if (dtype) return x.to(*dtype);
  return is_floating(x.dtype()) ? x : x.to(kInt64);
}

// The running reduction of x along d (kind's indices too for Max and Min), with no gradient.
std::tuple<Tensor, Tensor> raw_scan(ScanKind kind, const Tensor& x, int d) {
  Tensor out = empty_tensor(x.sizes(), x.dtype(), x.device());
  Tensor indices;
  if (kind == ScanKind::Max || kind == ScanKind::Min) indices = empty_tensor(x.sizes(), kInt64, x.device());
  if (x.numel() > 0) {
    backend_for(x.device()).scan(kind, view_of(x), d, view_of(out), view_or_none(indices), stream_for(x.device()));
  }
  return {out, indices};
}

// sum_{j >= i} t_j along d: the sum from the other end.
Tensor reverse_cumsum(const Tensor& t, int64_t d) { return t.flip({d}).cumsum(d).flip({d}); }

// Note [cumprod's gradient with zeros]
// dx_k = sum_{j >= k} g_j prod_{i <= j, i != k} x_i. Without zeros that is sum_{j >= k} g_j y_j / x_k,
// taken after one host check (x == 0 anywhere; PyTorch's cumprod_backward checks too). With zeros,
// before a line's first zero z it is still that; at z, whose own factor is left out, it is G(x')_z,
// where x' is x with x_z made 1 and G(x') this same gradient for x' (whose products leave nothing out
// but x_z); after z every product holds x_z, so dx_k = x_z G(x')_k, which is 0 but whose derivative by
// x_z is not. The backward of a backward (create_graph) needs that derivative, so there G(x') is this
// function again on x' (one zero fewer in each line: the recursion ends when none are left); a plain
// backward takes 0 after z and G(x')_z = sum_{j >= z} g_j cumprod(x')_j, with no recursion. All of
// it ops, with no division by zero, so it differentiates again.
Tensor cumprod_grad(const Tensor& x, const Tensor& y, const Tensor& g, int d) {
  Tensor zero;
  {
    NoGradGuard no_grad;
    zero = x.eq(0);
    if (!zero.any().item<bool>()) zero = Tensor();
  }
  if (!zero.defined()) return reverse_cumsum(g * y, d) / x;
  Tensor before, first;
  {
    NoGradGuard no_grad;
    const Tensor zeros_so_far = zero.to(kInt64).cumsum(d);
    before = zeros_so_far.eq(0);
    first = logical_and(zero, zeros_so_far.eq(1));
  }
  const Tensor one = ones({}, x.options()), nothing = zeros({}, x.options());
  const Tensor grad_before = reverse_cumsum(g * y, d) / where(before, x, one);
  const Tensor x1 = where(first, one, x);  // each line's first zero made 1
  Tensor rest;
  if (GradMode::is_enabled()) {  // create_graph: exact derivatives
    const Tensor g1 = cumprod_grad(x1, x1.cumprod(d), g, d);
    const Tensor x_first = sum(where(first, x, nothing), {d}, true);  // x_z, 0, kept differentiable
    rest = where(first, g1, x_first * g1);
  } else {
    rest = where(first, reverse_cumsum(g * x1.cumprod(d), d), nothing);
  }
  return where(before, grad_before, rest);
}

std::tuple<Tensor, Tensor> running_extreme(const Tensor& x_in, int64_t dim, bool is_max) {
  const char* op = is_max ? "cummax" : "cummin";
  const Tensor x = as_line(x_in);
  const int d = wrap_dim(dim, x.dim(), op);
  auto [values, indices] = raw_scan(is_max ? ScanKind::Max : ScanKind::Min, x, d);
  if (should_record(x)) {
    // The gradient of each output goes to the position its value came from; positions repeat.
    const char* name = is_max ? "CummaxBackward" : "CumminBackward";
    record(name, {x}, {values},
           [d, name, shape = x.sizes(), ix = SavedTensor(indices, false)](const Grads& g) -> TensorList {
             return {zeros(shape, g[0].options()).scatter_add(d, ix.unpack(name), g[0])};
           });
  }
  return {like_input(values, x_in), like_input(indices, x_in)};
}

// The median of x's lines along d: the element of rank (n - 1) / 2, or the first NaN where a line holds
// one (median); nanmedian takes the lower middle of the numbers, from a full sort (NaN sorts last), or
// a NaN where the whole line is NaN. The value is gathered at the position, which carries the gradient.
std::tuple<Tensor, Tensor> middle(const Tensor& x_in, int64_t dim, bool keepdim, bool skip_nan, const char* op) {
  const Tensor x = as_line(x_in);
  const int d = wrap_dim(dim, x.dim(), op);
  const int64_t n = x.sizes()[d];
  KILN_CHECK(n > 0, "{}: cannot take the median of an empty dim {} (shape {})", op, d, x.sizes().str());
  Tensor pos;
  {
    NoGradGuard no_grad;
    const bool floating = is_floating(x.dtype());
    if (skip_nan && floating) {
      auto [values, indices] = sorted_prefix(x, d, n, false, "SortBackward");
      const Tensor numbers = sum(values.isnan().logical_not(), {d}, true, kInt64);
      pos = indices.gather(d, floor_divide((numbers - 1).clamp(0), 2));
    } else {
      pos = rank_positions(x, d, (n - 1) / 2 + 1);
      if (floating) {
        const Tensor nan = x.isnan();
        pos = where(nan.any(d, true), nan.to(kInt32).argmax(d, true), pos);  // argmax: the first NaN
      }
    }
  }
  Tensor v = x.gather(d, pos), i = pos;
  if (!keepdim) {
    v = v.squeeze(d);
    i = i.squeeze(d);
  }
  return {like_input(v, x_in), like_input(i, x_in)};
}

// Note [quantile as a sort and a lerp]
// PyTorch's quantile, step for step, in ops (so it differentiates through sort's scatter and gather):
// each line sorted (NaN last), q's rank q (n - 1) in it, or q (c - 1) among the c numbers of a line
// for nanquantile (0 for a line of NaN), or the last rank where quantile's line holds a NaN (so the
// result is NaN); the rank taken down, up or to the nearest integer (halves to even) for "lower",
// "higher" and "nearest", and for "linear" and "midpoint" the values at the ranks below and above
// lerped by the rank's fraction, or by 1/2. Ranks are computed in x's dtype, as PyTorch's, and carry
// q's gradient through that fraction.
Tensor quantile_impl(const Tensor& x_in, const Tensor& q_in, std::optional<int64_t> dim, bool keepdim,
                     std::string_view interpolation, bool skip_nan, const char* op) {
  KILN_CHECK(x_in.dtype() == kFloat32 || x_in.dtype() == kFloat64, "{}: the input must be float32 or float64, got {}",
             op, dtype_name(x_in.dtype()));
  KILN_CHECK(q_in.dtype() == x_in.dtype(), "{}: q ({}) must have the input's dtype ({})", op, dtype_name(q_in.dtype()),
             dtype_name(x_in.dtype()));
  KILN_CHECK(q_in.dim() <= 1, "{}: q must be a number, 0-d or 1-D, got shape {}", op, q_in.sizes().str());
  KILN_CHECK(x_in.numel() > 0, "{}: the input (shape {}) has no elements", op, x_in.sizes().str());
  const bool lower = interpolation == "lower", higher = interpolation == "higher", nearest = interpolation == "nearest";
  const bool midpoint = interpolation == "midpoint";
  KILN_CHECK(lower || higher || nearest || midpoint || interpolation == "linear",
             "{}: interpolation must be linear, lower, higher, midpoint or nearest, got '{}'", op, interpolation);
  check_same_device(op, x_in, q_in);
  const Tensor q = q_in.reshape({-1, 1});  // (Q, 1)
  {
    NoGradGuard no_grad;
    KILN_CHECK(logical_and(q.ge(0), q.le(1)).all().item<bool>(), "{}: q values must be in [0, 1]", op);
  }
  // The lines along the last dim: x flattened, or dim moved last (the other dims keep their order).
  Tensor lines;
  Shape kept;  // the output's dims after q's
  if (!dim || x_in.dim() == 0) {
    if (dim) wrap_dim(*dim, x_in.dim(), op);
    lines = x_in.reshape({-1});
    if (keepdim) kept = Shape(std::vector<int64_t>(static_cast<size_t>(x_in.dim()), 1));
  } else {
    const int d = wrap_dim(*dim, x_in.dim(), op);
    Shape order;
    for (int k = 0; k < x_in.dim(); ++k) {
      if (k != d) order.push_back(k);
    }
    order.push_back(d);
    lines = x_in.permute(order);
    for (int k = 0; k < x_in.dim(); ++k) {
      if (k != d || keepdim) kept.push_back(k == d ? 1 : x_in.sizes()[k]);
    }
  }
  const int64_t n = lines.sizes()[lines.dim() - 1];
  const Tensor sorted = std::get<0>(sort(lines, -1)).unsqueeze(-2);  // (..., 1, n)
  Tensor ranks;  // differentiable in q, as PyTorch's: the weight of "linear" is a rank's fraction
  if (skip_nan) {
    ranks = q * (sum(sorted.isnan().logical_not(), {-1}, true, kInt64) - 1);
    ranks = ranks.masked_fill(ranks.lt(0), 0);
  } else {
    ranks = where(sorted.isnan().any(-1, true), full({}, n - 1, q.options()), q * (n - 1));
  }
  if (lower) ranks = ranks.floor();
  if (higher) ranks = ranks.ceil();
  if (nearest) ranks = ranks.round();
  Shape wide = ranks.sizes();  // (..., Q, 1)
  wide[wide.size() - 1] = n;
  const Tensor all_lines = sorted.expand(wide);
  const Tensor below = ranks.to(kInt64);
  Tensor result = all_lines.gather(-1, below);
  if (midpoint || interpolation == "linear") {
    const Tensor weight = midpoint ? full_like(ranks, 0.5) : ranks - below.to(ranks.dtype());
    result = result.lerp(all_lines.gather(-1, ranks.ceil().to(kInt64)), weight);
  }
  result = result.squeeze(-1);  // (..., Q): Q first, then the kept dims (and q's dim only for a 1-D q)
  Shape q_first{result.dim() - 1};
  for (int k = 0; k + 1 < result.dim(); ++k) q_first.push_back(k);
  Shape shape = kept;
  if (q_in.dim() == 1) shape.insert(0, q_in.numel());
  return result.permute(q_first).reshape(shape);
}

}  // namespace

inline namespace ops {

std::tuple<Tensor, Tensor> sort(const Tensor& x_in, int64_t dim, bool descending) {
  const Tensor x = as_line(x_in);
  const int d = wrap_dim(dim, x.dim(), "sort");
  auto [values, indices] = sorted_prefix(x, d, x.sizes()[d], descending, "SortBackward");
  return {like_input(values, x_in), like_input(indices, x_in)};
}

Tensor argsort(const Tensor& x, int64_t dim, bool descending) {
  NoGradGuard no_grad;  // positions have no gradient
  return std::get<1>(sort(x, dim, descending));
}

std::tuple<Tensor, Tensor> topk(const Tensor& x_in, int64_t k, int64_t dim, bool largest) {
  const Tensor x = as_line(x_in);
  const int d = wrap_dim(dim, x.dim(), "topk");
  KILN_CHECK(k >= 0 && k <= x.sizes()[d], "topk: k ({}) must be in [0, {}], the size of dim {} of shape {}", k,
             x.sizes()[d], d, x_in.sizes().str());
  auto [values, indices] = sorted_prefix(x, d, k, largest, "TopkBackward");
  return {like_input(values, x_in), like_input(indices, x_in)};
}

std::tuple<Tensor, Tensor> kthvalue(const Tensor& x_in, int64_t k, int64_t dim, bool keepdim) {
  const Tensor x = as_line(x_in);
  const int d = wrap_dim(dim, x.dim(), "kthvalue");
  KILN_CHECK(k >= 1 && k <= x.sizes()[d], "kthvalue: k ({}) must be in [1, {}], the size of dim {} of shape {}", k,
             x.sizes()[d], d, x_in.sizes().str());
  Tensor i;
  {
    NoGradGuard no_grad;
    i = rank_positions(x, d, k);
  }
  Tensor v = x.gather(d, i);  // gather carries the gradient
  if (!keepdim) {
    v = v.squeeze(d);
    i = i.squeeze(d);
  }
  return {like_input(v, x_in), like_input(i, x_in)};
}

std::tuple<Tensor, Tensor> median(const Tensor& x, int64_t dim, bool keepdim) {
  return middle(x, dim, keepdim, false, "median");
}
Tensor median(const Tensor& x) { return std::get<0>(middle(x.reshape({-1}), 0, false, false, "median")); }
std::tuple<Tensor, Tensor> nanmedian(const Tensor& x, int64_t dim, bool keepdim) {
  return middle(x, dim, keepdim, true, "nanmedian");
}
Tensor nanmedian(const Tensor& x) { return std::get<0>(middle(x.reshape({-1}), 0, false, true, "nanmedian")); }

Tensor cumsum(const Tensor& x_in, int64_t dim, std::optional<DType> dtype) {
  // See Note [autocast] in ops/autocast.h; given a dtype, not autocast (PyTorch's fp32_set_opt_dtype).
  if (!dtype && autocast::is_enabled(x_in.device().type)) {
    if (autocast::OpScope ac{autocast::Op::Cumsum, x_in.device()}) return cumsum(ac.cast(x_in), dim);
  }
  const Tensor x = scan_input(as_line(x_in), dtype);
  const int d = wrap_dim(dim, x.dim(), "cumsum");
  KILN_CHECK(x.dtype() != kBool, "cumsum: cannot accumulate in bool; pass an integer or floating dtype");
  Tensor out = std::get<0>(raw_scan(ScanKind::Sum, x, d));
  if (should_record(x)) {
    record("CumsumBackward", {x}, {out}, [d](const Grads& g) -> TensorList { return {reverse_cumsum(g[0], d)}; });
  }
  return like_input(out, x_in);
}

Tensor cumprod(const Tensor& x_in, int64_t dim, std::optional<DType> dtype) {
  if (!dtype && autocast::is_enabled(x_in.device().type)) {
    if (autocast::OpScope ac{autocast::Op::Cumprod, x_in.device()}) return cumprod(ac.cast(x_in), dim);
  }
  const Tensor x = scan_input(as_line(x_in), dtype);
  const int d = wrap_dim(dim, x.dim(), "cumprod");
  KILN_CHECK(x.dtype() != kBool, "cumprod: cannot accumulate in bool; pass an integer or floating dtype");
  Tensor out = std::get<0>(raw_scan(ScanKind::Prod, x, d));
  if (should_record(x)) {
    record("CumprodBackward", {x}, {out},
           [d, xs = SavedTensor(x, false), ys = SavedTensor(out, true)](const Grads& g) -> TensorList {
             return {cumprod_grad(xs.unpack("CumprodBackward"), ys.unpack("CumprodBackward"), g[0], d)};
           });
  }
  return like_input(out, x_in);
}

std::tuple<Tensor, Tensor> cummax(const Tensor& x, int64_t dim) { return running_extreme(x, dim, true); }
std::tuple<Tensor, Tensor> cummin(const Tensor& x, int64_t dim) { return running_extreme(x, dim, false); }

Tensor logcumsumexp(const Tensor& x_in, int64_t dim) {
  const Tensor x = as_line(x_in);
  const int d = wrap_dim(dim, x.dim(), "logcumsumexp");
  KILN_CHECK(is_floating(x.dtype()), "logcumsumexp: takes a floating dtype, got {}", dtype_name(x.dtype()));
  Tensor out = std::get<0>(raw_scan(ScanKind::LogSumExp, x, d));
  if (should_record(x)) {
    // dx_k = sum_{j >= k} g_j exp(x_k - y_j), summed in log space for g's positive and negative parts
    // apart: exp(x_k + L(log g+ - y)_k) - exp(x_k + L(log g- - y)_k), L the logcumsumexp from the
    // end, so no exp(-y) overflows.
    record("LogcumsumexpBackward", {x}, {out},
           [d, xs = SavedTensor(x, false), ys = SavedTensor(out, true)](const Grads& g) -> TensorList {
             const Tensor x = xs.unpack("LogcumsumexpBackward"), y = ys.unpack("LogcumsumexpBackward");
             const auto from_end = [d](const Tensor& t) { return t.flip({d}).logcumsumexp(d).flip({d}); };
             const Tensor zero = zeros({}, g[0].options());
             const Tensor up = from_end(maximum(g[0], zero).log() - y), down = from_end(maximum(-g[0], zero).log() - y);
             return {(x + up).exp() - (x + down).exp()};
           });
  }
  return like_input(out, x_in);
}

Tensor msort(const Tensor& x) { return std::get<0>(sort(x, 0)); }

Tensor searchsorted(const Tensor& sorted_sequence, const Tensor& values, bool out_int32, bool right,
                    const Tensor& sorter) {
  NoGradGuard no_grad;  // positions have no gradient
  const Tensor& seq_in = sorted_sequence;
  KILN_CHECK(seq_in.dim() >= 1, "searchsorted: sorted_sequence must have at least 1 dim, got a 0-d tensor");
  check_same_device("searchsorted", seq_in, values);
  const int64_t m = seq_in.sizes()[seq_in.dim() - 1];
  const bool one_row = seq_in.dim() == 1;
  if (!one_row) {
    bool match = values.dim() == seq_in.dim();
    for (int d = 0; match && d + 1 < seq_in.dim(); ++d) match = values.sizes()[d] == seq_in.sizes()[d];
    KILN_CHECK(match,
               "searchsorted: values (shape {}) must have sorted_sequence's leading dims (shape {}) and any "
               "last dim, or give a 1-D sorted_sequence",
               values.sizes().str(), seq_in.sizes().str());
  }
  Tensor seq = seq_in;
  if (sorter.defined()) {
    KILN_CHECK(sorter.sizes() == seq_in.sizes() && (sorter.dtype() == kInt64 || sorter.dtype() == kInt32),
               "searchsorted: sorter must be int64 or int32 of sorted_sequence's shape {}, got {} of shape {}",
               seq_in.sizes().str(), dtype_name(sorter.dtype()), sorter.sizes().str());
    seq = seq.gather(-1, sorter.to(kInt64));
  }
  const DType dtype = promote_types(seq.dtype(), values.dtype());
  KILN_CHECK(dtype != kBool, "searchsorted: cannot search bool values; convert them to an integer dtype");
  int64_t rows = 1;  // the leading dims' count: 1 for a 1-D sequence, whose one row every value searches
  for (int d = 0; d + 1 < seq.dim(); ++d) rows *= seq.sizes()[d];
  const int64_t n = one_row ? values.numel() : values.sizes()[values.dim() - 1];
  const Tensor rows_seq = seq.to(dtype).reshape({rows, m}).contiguous();
  const Tensor rows_values = values.to(dtype).reshape({rows, n}).contiguous();
  Tensor out = empty_tensor(rows_values.sizes(), out_int32 ? kInt32 : kInt64, values.device());
  if (out.numel() > 0) {
    backend_for(values.device())
        .searchsorted(view_of(rows_seq), view_of(rows_values), right, view_of(out), stream_for(values.device()));
  }
  return out.reshape(values.sizes());
}

Tensor searchsorted(const Tensor& sorted_sequence, const Scalar& value, bool out_int32, bool right,
                    const Tensor& sorter) {
  // A number takes the sequence's dtype, or float32 for a floating one in integers (PyTorch's
  // promotion of a wrapped number).
  const DType seq = sorted_sequence.dtype();
  const DType dtype = value.is_floating() && !is_floating(seq) ? kFloat32 : seq;
  const Tensor v = scalar_tensor(value, TensorOptions(dtype).device(sorted_sequence.device()));
  return searchsorted(sorted_sequence, v, out_int32, right, sorter);
}

Tensor bucketize(const Tensor& input, const Tensor& boundaries, bool out_int32, bool right) {
  KILN_CHECK(boundaries.dim() == 1, "bucketize: boundaries must be 1-D, got shape {}", boundaries.sizes().str());
  return searchsorted(boundaries, input, out_int32, right);
}

Tensor quantile(const Tensor& x, const Tensor& q, std::optional<int64_t> dim, bool keepdim,
                std::string_view interpolation) {
  return quantile_impl(x, q, dim, keepdim, interpolation, false, "quantile");
}
Tensor quantile(const Tensor& x, double q, std::optional<int64_t> dim, bool keepdim, std::string_view interpolation) {
  return quantile(x, scalar_tensor(q, x.options()), dim, keepdim, interpolation);
}
Tensor nanquantile(const Tensor& x, const Tensor& q, std::optional<int64_t> dim, bool keepdim,
                   std::string_view interpolation) {
  return quantile_impl(x, q, dim, keepdim, interpolation, true, "nanquantile");
}
Tensor nanquantile(const Tensor& x, double q, std::optional<int64_t> dim, bool keepdim,
                   std::string_view interpolation) {
  return nanquantile(x, scalar_tensor(q, x.options()), dim, keepdim, interpolation);
}

}  // namespace ops
}  // namespace kiln
