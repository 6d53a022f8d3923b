// nn/fractional_pool.cpp: nn::functional::fractional_max_pool2d / 3d and the FractionalMaxPool2d / 3d
// layers of nn/conv.h.
//
// Note [fractional max pooling is a gather]
// Fractional max pooling (Graham, "Fractional Max-Pooling", 2014) takes the maximum of kernel-sized
// windows whose starts advance by steps of floor or ceil of (in - k) / (out - 1), in a pseudo-random
// order fixed by one sample u in [0, 1) per (sample, channel, dim): window i starts at
// floor((i + u) a) - floor(u a) with a = (in - k) / (out - 1), the last at in - k (PyTorch's
// sequence, computed here as PyTorch does, in the input's precision). The starts are worked out on the
// host, and every window's elements become int64 indices into the flattened (n, c) plane, laid out
// (window element, output position). A pass over the window elements keeps, per position, the index
// of the maximum by PyTorch's rule (a later element replaces the kept one when it is larger or NaN:
// the first of equal maxima, the last NaN), and one gather of the input at those indices gives the
// values: its gradient is a scatter_add of the output's gradient into those positions, as PyTorch's
// backward. Built from ops, it runs on any device and is differentiable again.
#include <fmt/format.h>

#include <array>
#include <cmath>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/grad_mode.h"
#include "core/half.h"
#include "nn/conv.h"
#include "nn/functional.h"
#include "ops/dispatch.h"

namespace kiln::nn {
inline namespace functional {

namespace {

// x rounded to dtype's precision: the arithmetic of PyTorch's kernel for that scalar type. Each step
// is computed in double and rounded once, which gives float's (and half's) correctly rounded +, -, *
// and / exactly (double has more than twice their significand bits).
double in_precision(double x, DType dtype) {
  switch (dtype) {
    case kFloat32:
      return static_cast<float>(x);
    case kFloat16:
      return static_cast<float>(Half(static_cast<float>(x)));
    case kBFloat16:
      return static_cast<float>(BFloat16(static_cast<float>(x)));
    default:
      return x;
  }
}

// PyTorch's window starts along one dim of size `in` for `out` windows of `k`.
std::vector<int64_t> window_starts(double u, int64_t in, int64_t out, int64_t k, DType dtype) {
  std::vector<int64_t> starts(out);
  if (out > 1) {
    auto r = [dtype](double x) { return in_precision(x, dtype); };
    const double alpha = r(r(static_cast<double>(in - k)) / r(static_cast<double>(out - 1)));
    const auto first = static_cast<int64_t>(r(u * alpha));
    for (int64_t i = 0; i + 1 < out; ++i) starts[i] = static_cast<int64_t>(r(r(i + u) * alpha)) - first;
  }
  starts[out - 1] = in - k;
  return starts;
}

// output_ratio: one ratio for every dim or one per dim (a Python float or tuple), each in (0, 1).
std::vector<double> ratio_per_dim(const std::vector<double>& r, int dims, const char* op) {
  KILN_CHECK(r.size() == 1 || r.size() == static_cast<size_t>(dims),
             "{}: output_ratio must be one number or {}, got {}", op, dims, r.size());
  for (double v : r) {
    KILN_CHECK(v > 0 && v < 1, "{}: output_ratio must be between 0 and 1 (exclusive), got {}", op, v);
  }
  return r.size() == 1 ? std::vector<double>(dims, r[0]) : r;
}

constexpr const char* kDimNames[3][3] = {{}, {"height", "width"}, {"depth", "height", "width"}};

std::tuple<Tensor, Tensor> fractional_max_pool(const Tensor& input, const Shape& kernel_size, const Shape& output_size,
                                               const std::vector<double>& output_ratio, const Tensor& random_samples,
                                               Generator* gen, int dims, const char* op) {
  const char* const* names = kDimNames[dims - 1];
  KILN_CHECK(input.dim() == dims + 1 || input.dim() == dims + 2,
             "{}: expected a {}-D (unbatched C, {}) or {}-D (batched N, C, {}) input, got shape {}", op, dims + 1,
             dims == 2 ? "H, W" : "D, H, W", dims + 2, dims == 2 ? "H, W" : "D, H, W", input.sizes().str());
  KILN_CHECK(is_floating(input.dtype()), "{}: expected a floating input, got {}", op, dtype_name(input.dtype()));
  const bool batched = input.dim() == dims + 2;
  const Tensor x = batched ? input : input.unsqueeze(0);
  for (int64_t d = 1; d < x.dim(); ++d) {
    KILN_CHECK(x.size(d) > 0, "{}: expected an input with non-zero sizes in its non-batch dims, got shape {}", op,
               input.sizes().str());
  }
  const int64_t N = x.size(0), C = x.size(1);
  const std::vector<int64_t> k = dims_arg(kernel_size, dims, op, "kernel_size", 1);
  KILN_CHECK(output_size.size() > 0 || !output_ratio.empty(),
             "{}: requires either an output_size or an output_ratio; pass one of them", op);
  KILN_CHECK(output_size.size() == 0 || output_ratio.empty(),
             "{}: only one of output_size and output_ratio may be given, got both", op);
  std::vector<int64_t> in(dims), out(dims);
  for (int i = 0; i < dims; ++i) in[i] = x.size(2 + i);
  if (output_size.size() > 0) {
    out = dims_arg(output_size, dims, op, "output_size", 1);
  } else {
    const std::vector<double> ratio = ratio_per_dim(output_ratio, dims, op);
    for (int i = 0; i < dims; ++i) {
      out[i] = static_cast<int64_t>(static_cast<double>(in[i]) * ratio[i]);  // Python's int(): toward zero
    }
  }
  for (int i = 0; i < dims; ++i) {
    KILN_CHECK(out[i] > 0, "{}: the output {} is {}; it must be at least 1 (a larger output_size or output_ratio)", op,
               names[i], out[i]);
    KILN_CHECK(out[i] + k[i] - 1 <= in[i],
               "{}: pool {} {} too large relative to input {} {}: {} windows of {} need at least {}; pass a smaller "
               "kernel_size or output",
               op, names[i], k[i], names[i], in[i], out[i], k[i], out[i] + k[i] - 1);
  }

  // The samples: (N, C, dims) in [0, 1), read on the host in the input's precision.
  Tensor samples = random_samples;
  if (samples.defined()) {
    KILN_CHECK(samples.dim() == 3 && samples.size(0) == N && samples.size(1) == C && samples.size(2) == dims,
               "{}: _random_samples must have shape ({}, {}, {}) (batch, channels, {} pooled dims), got {}", op, N, C,
               dims, dims, samples.sizes().str());
    KILN_CHECK(is_floating(samples.dtype()), "{}: _random_samples must be floating, got {}", op,
               dtype_name(samples.dtype()));
  } else {
    samples = rand({N, C, dims}, TensorOptions(input.dtype()), gen);
  }
  const std::vector<double> u = samples.detach().to(Device::cpu()).to(input.dtype()).to_vector<double>();
  for (double v : u) {
    KILN_CHECK(v >= 0 && v < 1, "{}: _random_samples must lie in [0, 1), got {}", op, v);
  }

  // Every window's elements as indices into the (n, c) plane, laid out (window element, position), so
  // that each step of the max below reads whole rows.
  int64_t positions = 1, window = 1, plane = 1;
  for (int i = 0; i < dims; ++i) positions *= out[i], window *= k[i], plane *= in[i];
  const int64_t kd = dims == 3 ? k[0] : 1, kh = k[dims - 2], kw = k[dims - 1];
  const int64_t H = in[dims - 2], W = in[dims - 1];
  std::vector<int64_t> offsets;  // of each window element from its window's first
  for (int64_t i = 0; i < kd; ++i) {
    for (int64_t j = 0; j < kh; ++j) {
      for (int64_t l = 0; l < kw; ++l) offsets.push_back((i * H + j) * W + l);
    }
  }
  std::vector<int64_t> index(static_cast<size_t>(N * C * window * positions)), first(static_cast<size_t>(positions));
  for (int64_t nc = 0; nc < N * C; ++nc) {
    // PyTorch's order of the samples: W then H for 2-D, D, H, W for 3-D.
    std::array<std::vector<int64_t>, 3> starts;
    for (int i = 0; i < dims; ++i) {
      const int sample = dims == 2 ? 1 - i : i;
      starts[i] = window_starts(u[nc * dims + sample], in[i], out[i], k[i], input.dtype());
    }
    const int64_t od = dims == 3 ? out[0] : 1, oh = out[dims - 2], ow = out[dims - 1];
    int64_t* f = first.data();
    for (int64_t a = 0; a < od; ++a) {
      const int64_t d0 = dims == 3 ? starts[0][a] : 0;
      for (int64_t b = 0; b < oh; ++b) {
        for (int64_t c = 0; c < ow; ++c) *f++ = (d0 * H + starts[dims - 2][b]) * W + starts[dims - 1][c];
      }
    }
    int64_t* to = index.data() + nc * window * positions;
    for (int64_t e = 0; e < window; ++e, to += positions) {
      for (int64_t p = 0; p < positions; ++p) to[p] = first[p] + offsets[e];
    }
  }
  const Tensor at = from_vector(index, {N, C, window, positions}).to(x.device());
  const Tensor flat = x.reshape({N, C, plane});
  // Which element of each window is its maximum, by PyTorch's rule: a later element replaces the one
  // kept when it is larger or NaN (the first of equal maxima, the last NaN). Then one gather of the
  // values, whose backward is PyTorch's: the output's gradient added in at the indices.
  Tensor indices;
  {
    NoGradGuard no_grad;
    const Tensor elements =
        flat.detach().gather(2, at.view({N, C, window * positions})).view({N, C, window, positions});
    Tensor best = elements.select(2, 0);
    indices = at.select(2, 0);
    for (int64_t e = 1; e < window; ++e) {
      const Tensor candidate = elements.select(2, e);
      const Tensor take = candidate.gt(best).logical_or(candidate.isnan());
      best = where(take, candidate, best);
      indices = where(take, at.select(2, e), indices);
    }
  }
  Tensor values = flat.gather(2, indices);
  Shape shape{N, C};
  for (int i = 0; i < dims; ++i) shape.push_back(out[i]);
  values = values.view(shape);
  indices = indices.view(shape);
  if (!batched) return {values.squeeze(0), indices.squeeze(0)};
  return {values, indices};
}

}  // namespace

std::tuple<Tensor, Tensor> fractional_max_pool2d_with_indices(const Tensor& input, const Shape& kernel_size,
                                                              const Shape& output_size,
                                                              const std::vector<double>& output_ratio,
                                                              const Tensor& random_samples, Generator* gen) {
  return fractional_max_pool(input, kernel_size, output_size, output_ratio, random_samples, gen, 2,
                             "fractional_max_pool2d");
}

Tensor fractional_max_pool2d(const Tensor& input, const Shape& kernel_size, const Shape& output_size,
                             const std::vector<double>& output_ratio, const Tensor& random_samples, Generator* gen) {
  return std::get<0>(
      fractional_max_pool2d_with_indices(input, kernel_size, output_size, output_ratio, random_samples, gen));
}

std::tuple<Tensor, Tensor> fractional_max_pool3d_with_indices(const Tensor& input, const Shape& kernel_size,
                                                              const Shape& output_size,
                                                              const std::vector<double>& output_ratio,
                                                              const Tensor& random_samples, Generator* gen) {
  return fractional_max_pool(input, kernel_size, output_size, output_ratio, random_samples, gen, 3,
                             "fractional_max_pool3d");
}

Tensor fractional_max_pool3d(const Tensor& input, const Shape& kernel_size, const Shape& output_size,
                             const std::vector<double>& output_ratio, const Tensor& random_samples, Generator* gen) {
  return std::get<0>(
      fractional_max_pool3d_with_indices(input, kernel_size, output_size, output_ratio, random_samples, gen));
}

}  // namespace functional

namespace {

// PyTorch's checks in the layers' constructors; given samples become the buffer `_random_samples`.
void set_up(Module& layer, bool has_size, const std::vector<double>& ratio, const Tensor& samples, const char* name) {
  KILN_CHECK(has_size || !ratio.empty(), "{} requires specifying either an output size, or a pooling ratio", name);
  KILN_CHECK(!has_size || ratio.empty(), "{}: only one of output_size and output_ratio may be specified", name);
  for (double r : ratio) {
    KILN_CHECK(r > 0 && r < 1, "{}: output_ratio must be between 0 and 1 (got {})", name, r);
  }
  if (samples.defined()) layer.register_buffer("_random_samples", samples);
}

}  // namespace

FractionalMaxPool2d::FractionalMaxPool2d(Size2 kernel_size, FractionalMaxPool2dOptions options)
    : kernel_size(kernel_size), options(std::move(options)) {
  set_up(*this, this->options.output_size.has_value(), this->options.output_ratio, this->options._random_samples,
         "FractionalMaxPool2d");
}
Tensor FractionalMaxPool2d::forward(const Tensor& input) { return std::get<0>(forward_with_indices(input)); }
std::tuple<Tensor, Tensor> FractionalMaxPool2d::forward_with_indices(const Tensor& input) {
  return fractional_max_pool2d_with_indices(input, kernel_size.shape(),
                                            options.output_size.has_value() ? options.output_size.shape() : Shape{},
                                            options.output_ratio, options._random_samples);
}

FractionalMaxPool3d::FractionalMaxPool3d(Size3 kernel_size, FractionalMaxPool3dOptions options)
    : kernel_size(kernel_size), options(std::move(options)) {
  set_up(*this, this->options.output_size.has_value(), this->options.output_ratio, this->options._random_samples,
         "FractionalMaxPool3d");
}
Tensor FractionalMaxPool3d::forward(const Tensor& input) { return std::get<0>(forward_with_indices(input)); }
std::tuple<Tensor, Tensor> FractionalMaxPool3d::forward_with_indices(const Tensor& input) {
  return fractional_max_pool3d_with_indices(input, kernel_size.shape(),
                                            options.output_size ? options.output_size->shape() : Shape{},
                                            options.output_ratio, options._random_samples);
}

}  // namespace kiln::nn
