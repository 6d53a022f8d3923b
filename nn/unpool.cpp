// nn/unpool.cpp: nn::functional::max_unpool1d/2d/3d and the MaxUnpool1d/2d/3d layers of nn/conv.h.
//
// Note [max unpooling is a scatter]
// Max pooling with indices names, for each of its outputs, the element of its (n, c) plane that it
// took. Unpooling puts each value back at that element of a zero plane of the size the pooling's input
// had: one scatter along the flattened plane, whose backward for the values gathers the gradient at the
// same indices (as PyTorch's max_unpool backward). Built from ops, it runs on any device and is
// differentiable again.
#include <fmt/format.h>

#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "nn/conv.h"
#include "nn/functional.h"
#include "ops/dispatch.h"

namespace kiln::nn {
inline namespace functional {

namespace {

constexpr const char* kSpatial[] = {"", "L", "H, W", "D, H, W"};

// A 128-bit size in decimal: exact within 2^53, rounded beyond (only Errors print them).
std::string decimal(__int128 v) { return fmt::format("{:.0f}", static_cast<double>(v)); }


Tensor max_unpool(const Tensor& input, const Tensor& indices, int dims, const Shape& kernel_size,
                  const Shape& stride_in, const Shape& padding_in, const Shape& output_size, const char* op) {
  KILN_CHECK(input.dim() == dims + 1 || input.dim() == dims + 2,
             "{}: expects an input (N, C, {}) or unbatched (C, {}), of {} or {} dims, got shape {}", op, kSpatial[dims],
             kSpatial[dims], dims + 1, dims + 2, input.sizes().str());
  KILN_CHECK(indices.dtype() == kInt64, "{}: indices must be int64, as max_pool{}d_with_indices gives them, got {}", op,
             dims, dtype_name(indices.dtype()));
  KILN_CHECK(indices.sizes() == input.sizes(), "{}: indices must have the input's shape {}, got {}", op,
             input.sizes().str(), indices.sizes().str());
  KILN_CHECK(indices.device() == input.device(), "{}: indices are on {} but the input is on {}; move them together", op,
             indices.device().str(), input.device().str());
  for (int d = 1; d < input.dim(); ++d) {  // PyTorch's check: only the first dim may be empty
    KILN_CHECK(input.size(d) > 0, "{}: expected an input with no empty dim but the first, got shape {} (dim {} is empty)",
               op, input.sizes().str(), d);
  }
  const std::vector<int64_t> kernel = dims_arg(kernel_size, dims, op, "kernel_size", 1);
  const std::vector<int64_t> stride = stride_in.empty() ? kernel : dims_arg(stride_in, dims, op, "stride", 1);
  const std::vector<int64_t> padding = dims_arg(padding_in, dims, op, "padding", 0);
  KILN_CHECK(output_size.empty() || output_size.size() == dims || output_size.size() == dims + 2,
             "{}: output_size must give the {} spatial sizes or {} sizes (N, C, {}), got {}", op, dims, dims + 2,
             kSpatial[dims], output_size.str());
  const int skip = output_size.size() == dims + 2 ? 2 : 0;
  const int first = input.dim() - dims;  // the first spatial dim
  Shape out_shape = input.sizes();
  for (int d = 0; d < dims; ++d) {
    // In 128 bits: no huge stride or padding may wrap around into a plausible size.
    const __int128 in = input.size(first + d);
    const __int128 natural = (in - 1) * stride[d] - 2 * static_cast<__int128>(padding[d]) + kernel[d];
    __int128 size = natural;
    if (!output_size.empty()) {
      size = output_size[skip + d];
      KILN_CHECK(natural - stride[d] < size && size < natural + stride[d],
                 "{}: invalid output_size {}: dim {} must be strictly between {} and {} (the default size {} minus "
                 "and plus the stride {})",
                 op, output_size.str(), d, decimal(natural - stride[d]), decimal(natural + stride[d]), decimal(natural),
                 stride[d]);
    }
    KILN_CHECK(size >= 0 && size < (static_cast<__int128>(1) << 62),
               "{}: the output's dim {} would have size {} (input size {}, kernel_size {}, stride {}, padding {}); "
               "check these arguments",
               op, first + d, decimal(size), input.size(first + d), kernel[d], stride[d], padding[d]);
    out_shape[first + d] = static_cast<int64_t>(size);
  }
  if (input.dim() == dims + 1) {  // unbatched: one sample
    return max_unpool(input.unsqueeze(0), indices.unsqueeze(0), dims, kernel_size, stride_in, padding_in,
                      Shape(std::span<const int64_t>(out_shape.begin() + first, static_cast<size_t>(dims))), op)
        .squeeze(0);
  }
  const int64_t n = input.size(0), c = input.size(1);
  __int128 plane = 1, in_plane = 1;
  for (int d = 0; d < dims; ++d) {
    plane *= out_shape[first + d];
    in_plane *= input.size(first + d);
    KILN_CHECK(plane < (static_cast<__int128>(1) << 62), "{}: the output plane {} is too large to index", op,
               out_shape.str());
  }
  if (input.numel() > 0) {  // every index in its plane; else a clear Error rather than the scatter's
    const int64_t lo = indices.min().item<int64_t>(), hi = indices.max().item<int64_t>();
    const int64_t bad = lo < 0 ? lo : hi;
    KILN_CHECK(lo >= 0 && hi < plane,
               "{}: index {} is outside the output plane of {} elements (output shape {}); the indices must come "
               "from max_pool{}d_with_indices of an input of that size with the same kernel_size, stride and "
               "padding",
               op, bad, static_cast<int64_t>(plane), out_shape.str(), dims);
  }
  const Tensor flat_in = input.reshape({n, c, static_cast<int64_t>(in_plane)});
  const Tensor flat_ix = indices.reshape({n, c, static_cast<int64_t>(in_plane)});
  return scatter(zeros({n, c, static_cast<int64_t>(plane)}, input.options()), 2, flat_ix, flat_in).view(out_shape);
}

}  // namespace

Tensor max_unpool1d(const Tensor& input, const Tensor& indices, int64_t kernel_size, std::optional<int64_t> stride,
                    int64_t padding, const Shape& output_size) {
  return max_unpool(input, indices, 1, {kernel_size}, stride ? Shape{*stride} : Shape{}, {padding}, output_size,
                    "max_unpool1d");
}

Tensor max_unpool2d(const Tensor& input, const Tensor& indices, const Shape& kernel_size, const Shape& stride,
                    const Shape& padding, const Shape& output_size) {
  return max_unpool(input, indices, 2, kernel_size, stride, padding, output_size, "max_unpool2d");
}

Tensor max_unpool3d(const Tensor& input, const Tensor& indices, const Shape& kernel_size, const Shape& stride,
                    const Shape& padding, const Shape& output_size) {
  return max_unpool(input, indices, 3, kernel_size, stride, padding, output_size, "max_unpool3d");
}

}  // namespace functional

namespace {

[[noreturn]] void needs_indices(const char* layer) {
  KILN_FAIL(
      "nn::{}: forward needs the pooling's indices too: call forward(input, indices) or forward(input, "
      "indices, output_size)",
      layer);
}

}  // namespace

MaxUnpool1d::MaxUnpool1d(int64_t kernel_size, MaxUnpool1dOptions options) : kernel_size(kernel_size), options(options) {
  if (!this->options.stride) this->options.stride = kernel_size;
}
Tensor MaxUnpool1d::forward(const Tensor&) { needs_indices("MaxUnpool1d"); }
Tensor MaxUnpool1d::forward(const Tensor& input, const Tensor& indices, const Shape& output_size) {
  return max_unpool1d(input, indices, kernel_size, options.stride, options.padding, output_size);
}
// PyTorch keeps the sizes as 1-tuples, and prints them so.
std::string MaxUnpool1d::extra_repr() const {
  return fmt::format("kernel_size=({},), stride=({},), padding=({},)", kernel_size, *options.stride, options.padding);
}

MaxUnpool2d::MaxUnpool2d(Size2 kernel_size, MaxUnpool2dOptions options) : kernel_size(kernel_size), options(options) {
  if (!this->options.stride.has_value()) this->options.stride = kernel_size;
}
Tensor MaxUnpool2d::forward(const Tensor&) { needs_indices("MaxUnpool2d"); }
Tensor MaxUnpool2d::forward(const Tensor& input, const Tensor& indices, const Shape& output_size) {
  return max_unpool2d(input, indices, kernel_size.shape(), options.stride.shape(), options.padding.shape(),
                      output_size);
}
std::string MaxUnpool2d::extra_repr() const {  // always pairs, as PyTorch's
  return fmt::format("kernel_size={}, stride={}, padding={}", kernel_size.str(), options.stride.str(),
                     options.padding.str());
}

MaxUnpool3d::MaxUnpool3d(Size3 kernel_size, MaxUnpool3dOptions options) : kernel_size(kernel_size), options(options) {
  if (!this->options.stride) this->options.stride = kernel_size;
}
Tensor MaxUnpool3d::forward(const Tensor&) { needs_indices("MaxUnpool3d"); }
Tensor MaxUnpool3d::forward(const Tensor& input, const Tensor& indices, const Shape& output_size) {
  return max_unpool3d(input, indices, kernel_size.shape(), options.stride->shape(), options.padding.shape(),
                      output_size);
}
std::string MaxUnpool3d::extra_repr() const {  // always triples, as PyTorch's
  return fmt::format("kernel_size={}, stride={}, padding={}", kernel_size.str(), options.stride->str(),
                     options.padding.str());
}

}  // namespace kiln::nn
