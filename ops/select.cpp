// ops/select.cpp: the ops whose output size depends on the values: nonzero, argwhere, where(condition),
// count_nonzero, masked_select, masked_scatter, unique, unique_consecutive, bincount and histc.
//
// One kernel does the selecting: Backend::nonzero, the flat positions of a bool mask's true elements,
// into an output that ops/ sizes first by counting the true elements (one read back to the host; on
// a GPU a synchronization, as PyTorch's nonzero). Everything else here is ops: masked_select is an
// index_select at those positions and masked_scatter a scatter to them, so both differentiate (twice)
// through those ops; unique sorts, marks where a value differs from the one before it, and takes the
// positions of the marks (integers of a narrow range it counts instead: Note [unique by counting]);
// bincount and histc are an index_add of ones. unique, bincount and histc give no gradient, as
// PyTorch's.
#include <algorithm>
#include <cmath>

#include "ops/dispatch.h"
#include "ops/ops.h"

namespace kiln {
namespace {

// The flat (row-major) positions of x's nonzero elements, a 1-D int64 tensor on x's device.
Tensor flat_nonzero(const Tensor& x) {
  NoGradGuard no_grad;
  const Tensor mask = (x.dtype() == kBool ? x : x.ne(0)).contiguous();
  const int64_t count = sum(mask, {}, false, kInt64).item<int64_t>();
  Tensor out = empty_tensor({count}, kInt64, x.device());
  if (count > 0) backend_for(x.device()).nonzero(view_of(mask), view_of(out), stream_for(x.device()));
  return out;
}

// The coordinates in a tensor of shape `sizes` of flat positions: (positions, sizes.size()) int64.
Tensor unravel(const Tensor& flat, const Shape& sizes) {
  if (flat.numel() == 0) return empty_tensor({0, sizes.size()}, kInt64, flat.device());
  std::vector<Tensor> coords(static_cast<size_t>(sizes.size()));
  int64_t stride = 1;
  for (int d = sizes.size() - 1; d >= 0; --d) {
    const Tensor step = stride == 1 ? flat : floor_divide(flat, stride);
    coords[d] = d == 0 ? step : remainder(step, sizes[d]);
    stride *= sizes[d];
  }
  return stack(coords, 1);
}

void check_bool_mask(const Tensor& mask, const char* op) {
  KILN_CHECK(mask.dtype() == kBool, "{}: the mask must be bool, got {}; compare to make one (x.gt(0))", op,
             dtype_name(mask.dtype()));
}

// Sorted or consecutive runs of equal slices: y holds the slices as rows (s, r), already in order.
// new_run[i] says row i differs from row i - 1 (row 0 starts a run; NaN differs from everything).
// Gives (first row of each run, run counts, run of each row).
std::tuple<Tensor, Tensor, Tensor> runs(const Tensor& y) {
  const int64_t s = y.sizes()[0];
  Tensor differs = y.narrow(0, 1, s - 1).ne(y.narrow(0, 0, s - 1));
  if (y.dim() == 2) differs = differs.any(1);
  const Tensor new_run = cat({ones({1}, TensorOptions(kBool).device(y.device())), differs});
  const Tensor starts = flat_nonzero(new_run);
  const int64_t u = starts.numel();
  const Tensor ends = cat({starts.narrow(0, 1, u - 1), full({1}, s, TensorOptions(kInt64).device(y.device()))});
  return {starts, ends - starts, new_run.cumsum(0) - 1};
}

// unique and unique_consecutive: values, inverse (x's shape, or x.size(dim)) and counts.
std::tuple<Tensor, Tensor, Tensor> unique_impl(const Tensor& x, std::optional<int64_t> dim, bool sorted,
                                               const char* op) {
  NoGradGuard no_grad;
  const TensorOptions index_options = TensorOptions(kInt64).device(x.device());
  if (!dim) {
    const Tensor flat = x.reshape({-1});
    const int64_t n = flat.numel();
    if (n == 0) return {flat.clone(), empty_tensor(x.sizes(), kInt64, x.device()), zeros({0}, index_options)};
    if (sorted && !is_floating(x.dtype())) {
      // Note [unique by counting]: integers spanning a range no wider than about their number are
      // counted, not sorted (a counting sort): a bin per value of [low, high], the occupied bins in
      // order are the values and their counts, and a value's index is the number of occupied bins
      // before its own. Two passes over x and one over the bins, where the sort is n log n.
      const Tensor wide = flat.to(kInt64);
      const int64_t low = wide.min().item<int64_t>(), high = wide.max().item<int64_t>();
      const uint64_t span = static_cast<uint64_t>(high) - static_cast<uint64_t>(low);
      if (span < static_cast<uint64_t>(std::max<int64_t>(n, 1 << 16))) {
        const Tensor offset = wide - low;
        const Tensor one = ones({1}, index_options).expand({n});
        const Tensor bins = index_add(zeros({static_cast<int64_t>(span) + 1}, index_options), 0, offset, one);
        const Tensor occupied = bins.gt(0), present = flat_nonzero(occupied);
        const Tensor inverse = (occupied.cumsum(0) - 1).index_select(0, offset).reshape(x.sizes());
        return {(present + low).to(x.dtype()), inverse, bins.index_select(0, present)};
      }
    }
    Tensor line = flat, order;
    if (sorted) std::tie(line, order) = sort(flat);
    auto [starts, counts, run] = runs(line);
    const Tensor inverse = sorted ? empty_tensor({n}, kInt64, x.device()).scatter(0, order, run) : run;
    return {line.index_select(0, starts), inverse.reshape(x.sizes()), counts};
  }
  const int d = wrap_dim(*dim, x.dim(), op);
  Shape to_front;  // dim d first, the others in order
  to_front.push_back(d);
  for (int k = 0; k < x.dim(); ++k) {
    if (k != d) to_front.push_back(k);
  }
  const Tensor moved = x.permute(to_front);
  const int64_t s = moved.sizes()[0];
  if (s == 0) return {x.clone(), zeros({0}, index_options), zeros({0}, index_options)};
  KILN_CHECK(x.numel() > 0,
             "{}: the slices along dim {} of shape {} have no elements, so none differ; pick a dim "
             "of size 0 or a tensor with elements",
             op, d, x.sizes().str());
  Tensor rows = moved.reshape({s, -1});
  Tensor order;
  if (sorted) {
    // Lexicographic order of the rows: stable sorts by each column from the last to the first.
    order = arange(s, kInt64, x.device());
    for (int64_t c = rows.sizes()[1] - 1; c >= 0; --c) {
      order = order.index_select(0, std::get<1>(sort(rows.select(1, c).index_select(0, order))));
    }
    rows = rows.index_select(0, order);
  }
  auto [starts, counts, run] = runs(rows);
  const Tensor inverse = sorted ? empty_tensor({s}, kInt64, x.device()).scatter(0, order, run) : run;
  Shape shape = moved.sizes();
  shape[0] = starts.numel();
  std::vector<int64_t> back(static_cast<size_t>(x.dim()));  // the inverse of to_front
  for (int k = 0; k < x.dim(); ++k) back[static_cast<size_t>(to_front[k])] = k;
  return {rows.index_select(0, starts).reshape(shape).permute(back).contiguous(), inverse, counts};
}

}  // namespace

inline namespace ops {

Tensor nonzero(const Tensor& x) {
  const Tensor flat = flat_nonzero(x);
  if (x.dim() == 0) return empty_tensor({flat.numel(), 0}, kInt64, x.device());
  return unravel(flat, x.sizes());
}

Tensor argwhere(const Tensor& x) { return nonzero(x); }

std::vector<Tensor> where(const Tensor& condition) {
  const Tensor flat = flat_nonzero(condition);
  if (condition.dim() <= 1) return {flat};
  const Tensor coords = unravel(flat, condition.sizes());
  std::vector<Tensor> out;
  for (int d = 0; d < condition.dim(); ++d) out.push_back(coords.select(1, d).contiguous());
  return out;
}

Tensor count_nonzero(const Tensor& x, const Shape& dims) {
  NoGradGuard no_grad;
  return sum(x.dtype() == kBool ? x : x.ne(0), dims, false, kInt64);
}

Tensor masked_select(const Tensor& x, const Tensor& mask) {
  check_bool_mask(mask, "masked_select");
  check_same_device("masked_select", x, mask);
  const Shape shape = broadcast_shapes(x.sizes(), mask.sizes(), "masked_select");
  const Tensor positions = flat_nonzero(mask.expand(shape));
  return x.expand(shape).reshape({-1}).index_select(0, positions);
}

Tensor masked_scatter(const Tensor& x, const Tensor& mask, const Tensor& source) {
  check_bool_mask(mask, "masked_scatter");
  check_same_device("masked_scatter", x, mask);
  check_same_device("masked_scatter", x, source);
  KILN_CHECK(source.dtype() == x.dtype(), "masked_scatter: source ({}) must have the input's dtype ({})",
             dtype_name(source.dtype()), dtype_name(x.dtype()));
  const Shape shape = broadcast_shapes(x.sizes(), mask.sizes(), "masked_scatter");
  const Tensor positions = flat_nonzero(mask.expand(shape));
  const int64_t count = positions.numel();
  KILN_CHECK(source.numel() >= count,
             "masked_scatter: the mask has {} true elements but source only {}; give source at least as many", count,
             source.numel());
  const Tensor taken = source.reshape({-1}).narrow(0, 0, count);
  return x.expand(shape).reshape({-1}).scatter(0, positions, taken).reshape(shape);
}

std::tuple<Tensor, Tensor, Tensor> unique(const Tensor& x, std::optional<int64_t> dim) {
  return unique_impl(x, dim, true, "unique");
}

std::tuple<Tensor, Tensor, Tensor> unique_consecutive(const Tensor& x, std::optional<int64_t> dim) {
  return unique_impl(x, dim, false, "unique_consecutive");
}

Tensor bincount(const Tensor& x, const Tensor& weights, int64_t minlength) {
  NoGradGuard no_grad;
  KILN_CHECK(x.dim() == 1 && !is_floating(x.dtype()) && x.dtype() != kBool,
             "bincount: takes a 1-D tensor of non-negative integers, got {} of shape {}", dtype_name(x.dtype()),
             x.sizes().str());
  KILN_CHECK(minlength >= 0, "bincount: minlength ({}) must be non-negative", minlength);
  if (weights.defined()) {
    KILN_CHECK(weights.dim() == 1 && weights.numel() == x.numel(),
               "bincount: weights (shape {}) must be 1-D with one weight per input element ({})", weights.sizes().str(),
               x.numel());
    check_same_device("bincount", x, weights);
  }
  int64_t bins = minlength;
  if (x.numel() > 0) {
    const int64_t low = x.min().item<int64_t>(), high = x.max().item<int64_t>();
    KILN_CHECK(low >= 0, "bincount: the input holds a negative value ({}); it counts non-negative integers", low);
    bins = std::max(bins, high + 1);
  }
  // PyTorch's dtypes: int64 counts, float32 sums of float32 weights, float64 sums of any other.
  const DType dtype = !weights.defined() ? kInt64 : weights.dtype() == kFloat32 ? kFloat32 : kFloat64;
  const Tensor added =
      weights.defined() ? weights.to(dtype) : ones({1}, TensorOptions(kInt64).device(x.device())).expand({x.numel()});
  return index_add(zeros({bins}, TensorOptions(dtype).device(x.device())), 0, x.to(kInt64), added);
}

// Note [histc's bins]
// As PyTorch's CPU histc: the range is [min, max], or the data's own when min == max (widened by 1
// each way when that is a single value); bins equal parts of it. An element x in range goes to bin
// (x - left) / (right - left) * bins, rounded toward 0, in x's dtype's arithmetic with the edges as
// that dtype's numbers, and right itself to the last bin; elements outside the range and NaN are
// left out (as PyTorch documents; its 1.13 CPU kernel counts NaN in bin 0). The same operations in
// the same order and dtype give PyTorch's bin at the boundaries too: 0.9f of [0, 3] in 10 bins is
// bin 2 (0.9f / 3 * 10 < 3), where 0.9f * 10 / 3 would give 3.
Tensor histc(const Tensor& x_in, int64_t bins, double min, double max) {
  NoGradGuard no_grad;
  KILN_CHECK(is_floating(x_in.dtype()), "histc: takes a floating tensor, got {}; convert it (.to(kFloat32))",
             dtype_name(x_in.dtype()));
  KILN_CHECK(bins > 0, "histc: bins ({}) must be positive", bins);
  const Tensor x = x_in.dtype() == kFloat64 ? x_in : x_in.to(kFloat32);
  double left = min, right = max;
  if (left == right && x.numel() > 0) {
    left = x.min().item<double>();
    right = x.max().item<double>();
  }
  if (left == right) {
    left -= 1;
    right += 1;
  }
  KILN_CHECK(std::isfinite(left) && std::isfinite(right), "histc: the range [{}, {}] is not finite", left, right);
  KILN_CHECK(left < right, "histc: max ({}) must be larger than min ({})", right, left);
  const TensorOptions options = TensorOptions(x.dtype()).device(x.device());
  const Tensor lo = scalar_tensor(left, options), hi = scalar_tensor(right, options);
  const Tensor inside = logical_and(x.ge(lo), x.le(hi));
  const Tensor bin = ((x - lo) / (hi - lo) * scalar_tensor(static_cast<double>(bins), options)).to(kInt64);
  // Elements outside the range go to an extra bin past the last, which is then dropped.
  const Tensor target =
      where(inside, bin.clamp({}, bins - 1), full({}, bins, TensorOptions(kInt64).device(x.device())));
  // Counted in int64 (exact in any order, so the CPU counts in parallel), then in x's dtype.
  const TensorOptions index_options = TensorOptions(kInt64).device(x.device());
  const Tensor one = ones({1}, index_options).expand({x.numel()});
  const Tensor counts = index_add(zeros({bins + 1}, index_options), 0, target.reshape({-1}), one);
  return counts.narrow(0, 0, bins).to(x_in.dtype());
}

}  // namespace ops
}  // namespace kiln
