// ops/factories.cpp: tensors made from nothing: empty, zeros, ones, full, arange, linspace, eye, the
// random factories (Philox, core/generator.h) and dropout, and tensors made from C++ data.
#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/dispatch.h"
#include "ops/flops.h"
#include "ops/ops.h"

namespace kiln {
inline namespace ops {

static Tensor finish(Tensor t, const TensorOptions& options) {
  if (options.requires_grad()) t.requires_grad_(true);
  return t;
}

// For the factories that build on the CPU and move the result: pinned when options ask for it
// (checked first, with the other factories' Errors, by check_pinned_memory).
static Tensor pinned_if_asked(const Tensor& t, const TensorOptions& options) {
  return options.pinned_memory() ? pin_memory(t) : t;
}

Tensor empty(const Shape& shape, TensorOptions options) {
  return finish(empty_tensor(shape, options), options);
}

Tensor full(const Shape& shape, const Scalar& value, TensorOptions options) {
  Tensor t = empty_tensor(shape, options);
  backend_for(t.device()).fill(view_of(t), value, stream_for(t.device()));
  return finish(t, options);
}
Tensor zeros(const Shape& shape, TensorOptions options) { return full(shape, 0, options); }
Tensor ones(const Shape& shape, TensorOptions options) { return full(shape, 1, options); }
Tensor scalar_tensor(const Scalar& value, TensorOptions options) { return full({}, value, options); }

Tensor arange(const Scalar& end, std::optional<DType> dtype, Device device) {
  return arange(0, end, 1, dtype, device);
}

Tensor arange(const Scalar& start, const Scalar& end, const Scalar& step, std::optional<DType> dtype,
              Device device) {
  double s = start.to_double(), e = end.to_double(), st = step.to_double();
  KILN_CHECK(std::isfinite(s) && std::isfinite(e) && std::isfinite(st),
             "arange: start, end and step must be finite, got {}, {} and {}", s, e, st);
  KILN_CHECK(st != 0, "arange: step must be nonzero");
  KILN_CHECK((st > 0 && e >= s) || (st < 0 && e <= s),
             "arange: the range [{}, {}) cannot be walked with step {}", s, e, st);
  // As PyTorch: integer arguments give int64, any float argument gives the default float.
  const bool integers = !start.is_floating() && !end.is_floating() && !step.is_floating();
  DType dt = dtype.value_or(integers ? kInt64 : kFloat32);
  // The count, ceil((end - start) / step): for integer arguments in 128 bits, so that no range
  // overflows. The backend computes start + i * step in double, exact for integers below 2^53.
  __int128 count = 0;
  bool exact_in_double = true;
  if (!integers) {
    count = static_cast<__int128>(std::min(std::ceil((e - s) / st), 0x1p63));
  } else {
    const __int128 first = start.to_int(), diff = static_cast<__int128>(end.to_int()) - first, by = step.to_int();
    count = (diff + by - (by > 0 ? 1 : -1)) / by;
    const __int128 last = first + (count > 0 ? count - 1 : 0) * by;
    if (is_integral(dt)) {
      const __int128 lo = dt == kUInt8 ? 0 : dt == kInt8 ? INT8_MIN : dt == kInt32 ? INT32_MIN : INT64_MIN;
      const __int128 hi = dt == kUInt8 ? UINT8_MAX : dt == kInt8 ? INT8_MAX : dt == kInt32 ? INT32_MAX : INT64_MAX;
      KILN_CHECK(last >= lo && last <= hi, "arange: the values from {} with step {} reach {}, beyond {}; use a wider "
                 "dtype", start.to_int(), step.to_int(), static_cast<double>(last), dtype_name(dt));
      constexpr __int128 kExact = __int128{1} << 53;
      exact_in_double = first > -kExact && first < kExact && last > -kExact && last < kExact;
    }
  }
  KILN_CHECK(count < (__int128{1} << 62), "arange: [{}, {}) with step {} has {} elements, too many for a tensor", s,
             e, st, static_cast<double>(count));
  const auto n = static_cast<int64_t>(count);
  if (exact_in_double) {
    Tensor t = empty_tensor({n}, dt, device);
    backend_for(device).arange(view_of(t), s, st, stream_for(device));
    return t;
  }
  // int64 values beyond 2^53: computed here in 64-bit integers (unsigned, so that i * step may wrap
  // on the way to a value that fits), then moved to the device.
  Tensor t = empty_tensor({n}, kInt64, Device::cpu());
  auto* out = static_cast<int64_t*>(t.data_ptr());
  const auto from = static_cast<uint64_t>(start.to_int()), by_u = static_cast<uint64_t>(step.to_int());
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int64_t>(from + static_cast<uint64_t>(i) * by_u);
  return t.to(device);
}

Tensor linspace(double start, double end, int64_t steps, TensorOptions options) {
  KILN_CHECK(steps >= 0, "linspace: steps must be non-negative, got {}", steps);
  Tensor t = empty_tensor({steps}, options);
  double step = steps > 1 ? (end - start) / static_cast<double>(steps - 1) : 0;
  backend_for(t.device()).arange(view_of(t), start, step, stream_for(t.device()));
  return finish(t, options);
}

Tensor eye(int64_t n, std::optional<int64_t> m, TensorOptions options) {
  int64_t cols = m.value_or(n);
  KILN_CHECK(n >= 0 && cols >= 0, "eye: sizes must be non-negative, got {} x {}", n, cols);
  Tensor t = zeros({n, cols}, options.requires_grad(false));
  Tensor diag = as_strided(t, {std::min(n, cols)}, {cols + 1}, 0);
  backend_for(t.device()).fill(view_of(diag), 1, stream_for(t.device()));
  return finish(t, options);
}

static Tensor random_tensor(RandomKind kind, const Shape& shape, const RandomArgs& args,
                            TensorOptions options, Generator* gen) {
  Tensor t = empty_tensor(shape, options);
  auto state = (gen ? *gen : default_generator()).reserve(t.numel());
  backend_for(t.device()).random(kind, view_of(t), state.seed, state.offset, args, stream_for(t.device()));
  return finish(t, options);
}

Tensor rand(const Shape& shape, TensorOptions options, Generator* gen) {
  KILN_CHECK(is_floating(options.dtype()), "rand: needs a floating dtype, got {}", dtype_name(options.dtype()));
  return random_tensor(RandomKind::Uniform, shape, {.a = 0, .b = 1}, options, gen);
}
Tensor randn(const Shape& shape, TensorOptions options, Generator* gen) {
  KILN_CHECK(is_floating(options.dtype()), "randn: needs a floating dtype, got {}", dtype_name(options.dtype()));
  return random_tensor(RandomKind::Normal, shape, {.a = 0, .b = 1}, options, gen);
}
Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions options, Generator* gen) {
  KILN_CHECK(high > low, "randint: expected low < high, got low={} high={}", low, high);
  // Draws are computed in integers (core/philox.h), so any int64 range is exact; every value in
  // [low, high) must also fit the dtype exactly (PyTorch's "out of bounds" rule).
  const DType dt = options.dtype();
  int64_t lowest = std::numeric_limits<int64_t>::min(), highest = std::numeric_limits<int64_t>::max();
  switch (dt) {
    case kBool: lowest = 0, highest = 1; break;
    case kUInt8: lowest = 0, highest = 255; break;
    case kInt8: lowest = -128, highest = 127; break;
    case kInt32: lowest = std::numeric_limits<int32_t>::min(), highest = std::numeric_limits<int32_t>::max(); break;
    case kFloat16: highest = int64_t{1} << 11; break;
    case kBFloat16: highest = int64_t{1} << 8; break;
    case kFloat32: highest = int64_t{1} << 24; break;
    case kFloat64: highest = int64_t{1} << 53; break;
    case kInt64: break;
  }
  if (is_floating(dt)) lowest = -highest;
  KILN_CHECK(low >= lowest && high - 1 <= highest,
             "randint: [{}, {}) is out of bounds for {}, which holds every integer only in [{}, {}]; choose a "
             "narrower range or another dtype", low, high, dtype_name(dt), lowest, highest);
  const uint64_t range = static_cast<uint64_t>(high) - static_cast<uint64_t>(low);
  return random_tensor(RandomKind::Randint, shape, {.low = low, .range = range}, options, gen);
}
Tensor bernoulli(const Shape& shape, double p, TensorOptions options, Generator* gen) {
  KILN_CHECK(p >= 0 && p <= 1, "bernoulli: p must be in [0, 1], got {}", p);
  return random_tensor(RandomKind::Bernoulli, shape, {.a = p}, options, gen);
}

Tensor dropout(const Tensor& input, double p, bool train, Generator* gen) {
  flops::Op uncounted(0, 0);  // dropout counts nothing (ops/flops.h), its mask's product neither
  KILN_CHECK(p >= 0 && p <= 1, "dropout: probability p must be in [0, 1], got {}", p);
  if (!train || p == 0) return input;
  KILN_CHECK(is_floating(input.dtype()), "dropout: needs a floating-point input, got {}", dtype_name(input.dtype()));
  if (p == 1) return input * zeros_like(input);  // as PyTorch: zeros that still carry autograd
  // The mask is scaled first, then multiplied (PyTorch's order): out == input * (mask / (1 - p)).
  Tensor mask = bernoulli(input.sizes(), 1 - p, input.options(), gen);
  mask.div_(1 - p);
  return input * mask;
}

Tensor dropout_part(const Tensor& input, double p, bool train, int64_t dim, int64_t start, int64_t whole,
                    Generator* gen) {
  flops::Op uncounted(0, 0);  // as dropout
  // The cut is checked in evaluation too, so that a wrong one shows before training does.
  KILN_CHECK(p >= 0 && p <= 1, "dropout_part: probability p must be in [0, 1], got {}", p);
  KILN_CHECK(input.dim() > 0, "dropout_part: needs a dim to cut along; a scalar has none (use dropout)");
  const int64_t d = wrap_dim(dim, static_cast<int>(input.dim()), "dropout_part");
  const int64_t part = input.size(d);
  KILN_CHECK(start >= 0 && whole >= 0 && start <= whole - part,
             "dropout_part: indices [{}, {}) of dim {} do not fit a whole tensor {} long there; start must be "
             "in [0, whole - {}]", start, static_cast<__int128>(start) + part, d, whole, part);
  if (!train || p == 0) return input;
  KILN_CHECK(is_floating(input.dtype()), "dropout_part: needs a floating-point input, got {}",
             dtype_name(input.dtype()));
  if (p == 1) return input * zeros_like(input);
  // The whole tensor is outer x whole x inner; for each outer index o, this part is one run of
  // part x inner consecutive elements of the whole draw, from element (o whole + start) inner.
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < d; ++i) outer *= input.size(i);
  for (int64_t i = d + 1; i < input.dim(); ++i) inner *= input.size(i);
  int64_t draws = 0;  // the whole tensor's elements
  KILN_CHECK(!__builtin_mul_overflow(outer, whole, &draws) && !__builtin_mul_overflow(draws, inner, &draws),
             "dropout_part: a whole tensor {} long in dim {} of a part {} has more elements than fit in 64 bits", whole,
             d, input.sizes().str());
  const Generator::State state = (gen ? *gen : default_generator()).reserve(draws);
  Tensor mask = empty_tensor(input.sizes(), input.dtype(), input.device());
  if (mask.numel() > 0) {
    RandomArgs args{.a = 1 - p};
    args.first = static_cast<uint64_t>(start * inner);
    args.run = static_cast<uint64_t>(part * inner);
    args.stride = static_cast<uint64_t>(whole * inner);
    backend_for(mask.device()).random(RandomKind::Bernoulli, view_of(mask), state.seed, state.offset, args,
                                      stream_for(mask.device()));
  }
  mask.div_(1 - p);
  return input * mask;
}

Tensor randperm(int64_t n, TensorOptions options, Generator* gen) {
  KILN_CHECK(n >= 0, "randperm: n must be non-negative, got {}", n);
  const DType dt = options.dtype();
  KILN_CHECK(dt != kBool, "randperm: not defined for bool; use kInt64 (the default)");
  // Every value 0..n-1 must be exact in the dtype, as PyTorch checks ("n cannot be greater than 2049
  // for Half").
  const int digits = dt == kFloat16 ? 11 : dt == kBFloat16 ? 8 : dt == kFloat32 ? 24 : dt == kInt32 ? 31
                     : dt == kUInt8 ? 8 : dt == kInt8 ? 7 : 62;
  KILN_CHECK(n <= (int64_t{1} << digits) + (is_floating(dt) ? 1 : 0),
             "randperm: n = {} is more than {} holds exactly; use kInt64 (the default)", n, dtype_name(dt));
  check_pinned_memory(options);
  // Fisher-Yates on the host, drawing one Philox word pair per swap; the result is then moved. The
  // keys span 63 bits, so the bias of `key mod (i + 1)` is below (i + 1) / 2^63 for every n.
  Tensor keys = randint(0, std::numeric_limits<int64_t>::max(), {n}, kInt64, gen);
  const int64_t* k = keys.data_ptr<int64_t>();
  std::vector<int64_t> perm(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) perm[i] = i;
  for (int64_t i = n - 1; i > 0; --i) std::swap(perm[i], perm[k[i] % (i + 1)]);
  return pinned_if_asked(from_vector(perm, {n}).to(options.device(), options.dtype()), options);
}

Tensor empty_like(const Tensor& t) { return empty(t.sizes(), t.options()); }
Tensor zeros_like(const Tensor& t) { return zeros(t.sizes(), t.options()); }
Tensor ones_like(const Tensor& t) { return ones(t.sizes(), t.options()); }
Tensor full_like(const Tensor& t, const Scalar& value) { return full(t.sizes(), value, t.options()); }
Tensor rand_like(const Tensor& t, Generator* gen) { return rand(t.sizes(), t.options(), gen); }
Tensor randn_like(const Tensor& t, Generator* gen) { return randn(t.sizes(), t.options(), gen); }
Tensor randint_like(const Tensor& t, int64_t low, int64_t high, Generator* gen) {
  return randint(low, high, t.sizes(), t.options(), gen);
}

Tensor tensor(std::initializer_list<double> values, TensorOptions options) {
  check_pinned_memory(options);
  std::vector<double> v(values);
  Tensor t = from_vector(v, {static_cast<int64_t>(v.size())}).to(options.device(), options.dtype());
  return finish(pinned_if_asked(t, options), options);
}

Tensor tensor(std::initializer_list<std::initializer_list<double>> rows, TensorOptions options) {
  check_pinned_memory(options);
  std::vector<double> v;
  const int64_t cols = rows.size() ? static_cast<int64_t>(rows.begin()->size()) : 0;
  for (const auto& row : rows) {
    KILN_CHECK(static_cast<int64_t>(row.size()) == cols,
               "tensor: every row must have the same length; got {} and {}", cols, row.size());
    v.insert(v.end(), row.begin(), row.end());
  }
  Tensor t = from_vector(v, {static_cast<int64_t>(rows.size()), cols}).to(options.device(), options.dtype());
  return finish(pinned_if_asked(t, options), options);
}

template <typename T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, Device device) {
  const int64_t numel = checked_numel(shape, "from_vector");  // negative or overflowing sizes, named
  KILN_CHECK(numel == static_cast<int64_t>(values.size()), "from_vector: {} values cannot fill shape {} ({} elements)",
             values.size(), shape.str(), numel);
  Tensor t = empty_tensor(shape, dtype_of<T>(), Device::cpu());
  if constexpr (std::is_same_v<T, bool>) {
    for (size_t i = 0; i < values.size(); ++i) t.data_ptr<bool>()[i] = values[i];
  } else {
    std::copy(values.begin(), values.end(), t.data_ptr<T>());
  }
  return device.is_cpu() ? t : t.to(device);
}
template Tensor from_vector(const std::vector<float>&, const Shape&, Device);
template Tensor from_vector(const std::vector<double>&, const Shape&, Device);
template Tensor from_vector(const std::vector<int32_t>&, const Shape&, Device);
template Tensor from_vector(const std::vector<int64_t>&, const Shape&, Device);
template Tensor from_vector(const std::vector<uint8_t>&, const Shape&, Device);
template Tensor from_vector(const std::vector<int8_t>&, const Shape&, Device);
template Tensor from_vector(const std::vector<bool>&, const Shape&, Device);
template Tensor from_vector(const std::vector<Half>&, const Shape&, Device);
template Tensor from_vector(const std::vector<BFloat16>&, const Shape&, Device);

Tensor from_blob(void* data, const Shape& shape, DType dtype, Device device) {
  const int64_t numel = checked_numel(shape, "from_blob");
  KILN_CHECK(data != nullptr || numel == 0, "from_blob: data is null for a tensor of {} elements; pass the "
             "address of the memory to wrap", numel);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(data, static_cast<size_t>(numel * itemsize(dtype)),
                                            device, nullptr);
  impl->sizes = shape;
  set_contiguous_strides(shape, impl->strides);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

}  // namespace ops
}  // namespace kiln
