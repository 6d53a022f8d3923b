// ops/pool.cpp: max, average, adaptive average and adaptive max 2-D pooling over the last two dims of
// an (N, C, H, W) or unbatched (C, H, W) input, with PyTorch's output sizes (ceil_mode included) and
// checks (kernels: cpu/pool.cpp); the 1-D poolings are these over a height-1 image. Each backward is a
// private op that records its own backward, so double backward works: max pooling's backward scatters
// the gradient to the saved indices (its own backward gathers at them), and so does adaptive max
// pooling's; the average poolings' backward is the transpose of a linear map (its backward is the
// forward). 16-bit floats run in float32, except max and adaptive max pooling on the CPU, whose kernels
// take them as they are (the maxima are the same values; a gradient is summed in float32 there).
// The 3-D poolings are two 2-D ones (Note [3-D pooling is separable]).

#include <array>
#include <optional>
#include <tuple>

#include "core/grad_mode.h"
#include "ops/dispatch.h"
#include "ops/flops.h"
#include "ops/ops.h"
#include "ops/record.h"

namespace kiln {

using autograd::Grads;
using autograd::record;
using autograd::SavedTensor;
using autograd::should_record;
using autograd::TensorList;

namespace {

bool is_half(DType t) { return t == kFloat16 || t == kBFloat16; }

// Whether a max pooling of x runs on a float32 copy: 16-bit floats on CUDA, whose kernels take float32
// and float64 only.
bool max_pool_through_float32(const Tensor& x) { return is_half(x.dtype()) && !x.device().is_cpu(); }

Pool2dArgs pool_args(const Shape& kernel_size, const Shape& stride, const Shape& padding, const Shape& dilation,
                     const char* op) {
  Pool2dArgs a;
  pair_arg(kernel_size, op, "kernel_size", 1, a.kernel_h, a.kernel_w);
  pair_arg(stride.empty() ? kernel_size : stride, op, "stride", 1, a.stride_h, a.stride_w);
  pair_arg(padding, op, "padding", 0, a.pad_h, a.pad_w);
  pair_arg(dilation, op, "dilation", 1, a.dilation_h, a.dilation_w);
  KILN_CHECK(a.pad_h <= a.kernel_h / 2 && a.pad_w <= a.kernel_w / 2,
             "{}: padding {} must be at most half of the kernel size {}", op, padding.str(), kernel_size.str());
  return a;
}

// PyTorch's pooling output size: floor (or ceil) division, and with ceil_mode the last window must start
// inside the input or its left padding. In 128 bits: kernels, strides and paddings near INT64_MAX do
// not overflow (a non-positive result is refused by the caller).
int64_t pool_out_size(int64_t in, int64_t k, int64_t pad, int64_t stride, int64_t dil, bool ceil_mode) {
  using i128 = __int128;
  const i128 num = i128{in} + 2 * i128{pad} - i128{dil} * (k - 1) - 1 + (ceil_mode ? i128{stride} - 1 : 0);
  i128 out = (num >= 0 ? num / stride : -((-num + stride - 1) / stride)) + 1;
  if (ceil_mode && (out - 1) * stride >= i128{in} + pad) --out;
  return out > 0 ? static_cast<int64_t>(out) : 0;  // pad <= k / 2 keeps out <= in + 2
}

void check_pool_input(const Tensor& x, const char* op) {
  KILN_CHECK(x.dim() == 3 || x.dim() == 4,
             "{}: expected a 3-D (unbatched C, H, W) or 4-D (batched N, C, H, W) input, got shape {}", op,
             x.sizes().str());
  for (int d = x.dim() - 3; d < x.dim(); ++d) {
    KILN_CHECK(x.sizes()[d] > 0, "{}: expected non-empty channel, height and width dims, got shape {}", op,
               x.sizes().str());
  }
  KILN_CHECK(is_floating(x.dtype()), "{}: needs a floating-point input, got {}", op, dtype_name(x.dtype()));
}

Shape pool_output_shape(const Tensor& x, const Pool2dArgs& a, bool ceil_mode, const char* op) {
  const int64_t H = x.sizes()[2], W = x.sizes()[3];
  const int64_t Ho = pool_out_size(H, a.kernel_h, a.pad_h, a.stride_h, a.dilation_h, ceil_mode);
  const int64_t Wo = pool_out_size(W, a.kernel_w, a.pad_w, a.stride_w, a.dilation_w, ceil_mode);
  KILN_CHECK(Ho > 0 && Wo > 0,
             "{}: the output would be empty ({} x {}): the input {} is too small for kernel {} x {} with padding "
             "{} x {} and dilation {} x {}",
             op, Ho, Wo, x.sizes().str(), a.kernel_h, a.kernel_w, a.pad_h, a.pad_w, a.dilation_h, a.dilation_w);
  return {x.sizes()[0], x.sizes()[1], Ho, Wo};
}

Tensor batched(const Tensor& x) { return x.dim() == 3 ? x.unsqueeze(0) : x; }
Tensor unbatched_like(const Tensor& out, const Tensor& x) { return x.dim() == 3 ? out.squeeze(0) : out; }

// grad_in (input_shape) = scatter of grad_out to indices; backward: gather at indices.
Tensor max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Shape& input_shape) {
  Tensor g = grad_out.contiguous();
  Tensor gx = empty_tensor(input_shape, g.dtype(), g.device());
  backend_for(g.device()).max_pool2d_backward(view_of(g), view_of(indices), view_of(gx), stream_for(g.device()));
  if (should_record(grad_out)) {
    record("MaxPool2DBackwardBackward", {grad_out}, {gx}, [indices](const Grads& gg) -> TensorList {
      const Shape& s = indices.sizes();
      Tensor flat = gg[0].reshape({s[0], s[1], -1});
      return {flat.gather(2, indices.reshape({s[0], s[1], -1})).reshape(s)};
    });
  }
  return gx;
}

Tensor avg_pool2d_forward(const Tensor& x, const Pool2dArgs& a, const Shape& out_shape);

Tensor avg_pool2d_backward(const Tensor& grad_out, const Shape& input_shape, const Pool2dArgs& a) {
  Tensor g = grad_out.contiguous();
  Tensor gx = empty_tensor(input_shape, g.dtype(), g.device());
  backend_for(g.device()).avg_pool2d_backward(view_of(g), view_of(gx), a, stream_for(g.device()));
  if (should_record(grad_out)) {
    record("AvgPool2DBackwardBackward", {grad_out}, {gx}, [a, out_shape = g.sizes()](const Grads& gg) -> TensorList {
      return {avg_pool2d_forward(gg[0], a, out_shape)};
    });
  }
  return gx;
}

Tensor avg_pool2d_forward(const Tensor& input, const Pool2dArgs& a, const Shape& out_shape) {
  Tensor x = input.contiguous();
  Tensor out = empty_tensor(out_shape, x.dtype(), x.device());
  backend_for(x.device()).avg_pool2d(view_of(x), view_of(out), a, stream_for(x.device()));
  if (should_record(input)) {
    record("AvgPool2DBackward", {input}, {out}, [a, in_shape = x.sizes()](const Grads& g) -> TensorList {
      return {avg_pool2d_backward(g[0], in_shape, a)};
    });
  }
  return out;
}

Tensor adaptive_forward(const Tensor& input, const Shape& out_shape);

Tensor adaptive_backward(const Tensor& grad_out, const Shape& input_shape) {
  Tensor g = grad_out.contiguous();
  Tensor gx = empty_tensor(input_shape, g.dtype(), g.device());
  backend_for(g.device()).adaptive_avg_pool2d_backward(view_of(g), view_of(gx), stream_for(g.device()));
  if (should_record(grad_out)) {
    record("AdaptiveAvgPool2DBackwardBackward", {grad_out}, {gx},
           [out_shape = g.sizes()](const Grads& gg) -> TensorList { return {adaptive_forward(gg[0], out_shape)}; });
  }
  return gx;
}

Tensor adaptive_forward(const Tensor& input, const Shape& out_shape) {
  Tensor x = input.contiguous();
  Tensor out = empty_tensor(out_shape, x.dtype(), x.device());
  backend_for(x.device()).adaptive_avg_pool2d(view_of(x), view_of(out), stream_for(x.device()));
  if (should_record(input)) {
    record("AdaptiveAvgPool2DBackward", {input}, {out},
           [in_shape = x.sizes()](const Grads& g) -> TensorList { return {adaptive_backward(g[0], in_shape)}; });
  }
  return out;
}

// An adaptive pooling's output_size: one number for both dims, or two, each non-negative.
std::pair<int64_t, int64_t> adaptive_output_size(const Shape& output_size, const char* op) {
  KILN_CHECK(output_size.size() == 1 || output_size.size() == 2,
             "{}: output_size must have one or two elements, got {}", op, output_size.str());
  const int64_t Ho = output_size[0], Wo = output_size.size() == 2 ? output_size[1] : output_size[0];
  KILN_CHECK(Ho >= 0 && Wo >= 0, "{}: output_size must be non-negative, got {}", op, output_size.str());
  return {Ho, Wo};
}

// The 1-D poolings are the 2-D ones over a height-1 image (kernel 1 x k). Their input, arguments and
// output length are checked here, so that the messages speak of L and k rather than of an image.
void check_pool1d(const Tensor& x, int64_t kernel_size, int64_t stride, int64_t padding, int64_t dilation,
                  bool ceil_mode, const char* op) {
  KILN_CHECK(x.dim() == 2 || x.dim() == 3,
             "{}: expected a 2-D (unbatched C, L) or 3-D (batched N, C, L) input, got shape {}", op,
             x.sizes().str());
  KILN_CHECK(x.size(-2) > 0 && x.size(-1) > 0, "{}: expected non-empty channel and length dims, got shape {}", op,
             x.sizes().str());
  KILN_CHECK(is_floating(x.dtype()), "{}: needs a floating-point input, got {}", op, dtype_name(x.dtype()));
  KILN_CHECK(kernel_size >= 1 && stride >= 1 && dilation >= 1 && padding >= 0,
             "{}: kernel_size ({}), stride ({}) and dilation ({}) must be positive and padding ({}) non-negative",
             op, kernel_size, stride, dilation, padding);
  KILN_CHECK(padding <= kernel_size / 2, "{}: padding {} must be at most half of the kernel size {}", op, padding,
             kernel_size);
  const int64_t L = x.size(-1);
  KILN_CHECK(pool_out_size(L, kernel_size, padding, stride, dilation, ceil_mode) > 0,
             "{}: the output would be empty: the input {} is too short for kernel {} with padding {} and dilation {}",
             op, x.sizes().str(), kernel_size, padding, dilation);
}

}  // namespace

inline namespace ops {

std::tuple<Tensor, Tensor> max_pool1d_with_indices(const Tensor& x, int64_t kernel_size,
                                                   std::optional<int64_t> stride, int64_t padding, int64_t dilation,
                                                   bool ceil_mode) {
  const int64_t s = stride.value_or(kernel_size);
  check_pool1d(x, kernel_size, s, padding, dilation, ceil_mode, "max_pool1d");
  auto [out, indices] =
      max_pool2d_with_indices(x.unsqueeze(-2), {1, kernel_size}, {1, s}, {0, padding}, {1, dilation}, ceil_mode);
  return {out.squeeze(-2), indices.squeeze(-2)};  // indices into 1 x L are indices into L
}

Tensor max_pool1d(const Tensor& x, int64_t kernel_size, std::optional<int64_t> stride, int64_t padding,
                  int64_t dilation, bool ceil_mode) {
  return std::get<0>(max_pool1d_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode));
}

Tensor avg_pool1d(const Tensor& x, int64_t kernel_size, std::optional<int64_t> stride, int64_t padding,
                  bool ceil_mode, bool count_include_pad) {
  const int64_t s = stride.value_or(kernel_size);
  check_pool1d(x, kernel_size, s, padding, 1, ceil_mode, "avg_pool1d");
  return avg_pool2d(x.unsqueeze(-2), {1, kernel_size}, {1, s}, {0, padding}, ceil_mode, count_include_pad)
      .squeeze(-2);
}

Tensor adaptive_avg_pool1d(const Tensor& x, int64_t output_size) {
  const char* op = "adaptive_avg_pool1d";
  KILN_CHECK(x.dim() == 2 || x.dim() == 3,
             "{}: expected a 2-D (unbatched C, L) or 3-D (batched N, C, L) input, got shape {}", op,
             x.sizes().str());
  KILN_CHECK(x.size(-2) > 0 && x.size(-1) > 0, "{}: expected non-empty channel and length dims, got shape {}", op,
             x.sizes().str());
  KILN_CHECK(output_size >= 0, "{}: output_size must be non-negative, got {}", op, output_size);
  return adaptive_avg_pool2d(x.unsqueeze(-2), {1, output_size}).squeeze(-2);
}

std::tuple<Tensor, Tensor> max_pool2d_with_indices(const Tensor& x, const Shape& kernel_size, const Shape& stride,
                                                   const Shape& padding, const Shape& dilation, bool ceil_mode) {
  const char* op = "max_pool2d";
  flops::Op count(0, x.numel());
  check_pool_input(x, op);
  Pool2dArgs a = pool_args(kernel_size, stride, padding, dilation, op);
  if (max_pool_through_float32(x)) {
    auto [out, indices] = max_pool2d_with_indices(x.to(kFloat32), kernel_size, stride, padding, dilation, ceil_mode);
    return {out.to(x.dtype()), indices};
  }
  Tensor input = batched(x).contiguous();
  Shape out_shape = pool_output_shape(input, a, ceil_mode, op);
  Tensor out = empty_tensor(out_shape, input.dtype(), input.device());
  Tensor indices = empty_tensor(out_shape, kInt64, input.device());
  backend_for(input.device()).max_pool2d(view_of(input), view_of(out), view_of(indices), a,
                                         stream_for(input.device()));
  if (should_record(x)) {
    // The indices are saved (version-checked): they are also returned, and a caller may change them.
    record("MaxPool2DBackward", {input}, {out},
           [saved = SavedTensor(indices, false), in_shape = input.sizes()](const Grads& g) -> TensorList {
             return {max_pool2d_backward(g[0], saved.unpack("MaxPool2DBackward"), in_shape)};
           });
  }
  // The input recorded is batched(x).contiguous(), so autograd reaches x through those ops.
  if (x.dim() == 3) return {out.squeeze(0), indices.squeeze(0)};
  return {out, indices};
}

Tensor max_pool2d(const Tensor& x, const Shape& kernel_size, const Shape& stride, const Shape& padding,
                  const Shape& dilation, bool ceil_mode) {
  return std::get<0>(max_pool2d_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode));
}

Tensor avg_pool2d(const Tensor& x, const Shape& kernel_size, const Shape& stride, const Shape& padding,
                  bool ceil_mode, bool count_include_pad, std::optional<int64_t> divisor_override) {
  const char* op = "avg_pool2d";
  flops::Op count(0, x.numel());
  check_pool_input(x, op);
  Pool2dArgs a = pool_args(kernel_size, stride, padding, {1, 1}, op);
  a.count_include_pad = count_include_pad;
  if (divisor_override) {
    KILN_CHECK(*divisor_override != 0, "avg_pool2d: divisor_override must be nonzero");
    a.divisor = *divisor_override;
  }
  if (is_half(x.dtype())) {
    return avg_pool2d(x.to(kFloat32), kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
        .to(x.dtype());
  }
  Tensor input = batched(x);
  Shape out_shape = pool_output_shape(input, a, ceil_mode, op);
  return unbatched_like(avg_pool2d_forward(input, a, out_shape), x);
}

std::tuple<Tensor, Tensor> adaptive_max_pool2d_with_indices(const Tensor& x, const Shape& output_size) {
  const char* op = "adaptive_max_pool2d";
  check_pool_input(x, op);
  const auto [Ho, Wo] = adaptive_output_size(output_size, op);
  if (max_pool_through_float32(x)) {
    auto [out, indices] = adaptive_max_pool2d_with_indices(x.to(kFloat32), output_size);
    return {out.to(x.dtype()), indices};
  }
  Tensor input = batched(x).contiguous();
  const Shape out_shape{input.size(0), input.size(1), Ho, Wo};
  Tensor out = empty_tensor(out_shape, input.dtype(), input.device());
  Tensor indices = empty_tensor(out_shape, kInt64, input.device());
  backend_for(input.device()).adaptive_max_pool2d(view_of(input), view_of(out), view_of(indices),
                                                  stream_for(input.device()));
  if (should_record(x)) {  // the indices say where each gradient goes, as for max_pool2d
    record("AdaptiveMaxPool2DBackward", {input}, {out},
           [saved = SavedTensor(indices, false), in_shape = input.sizes()](const Grads& g) -> TensorList {
             return {max_pool2d_backward(g[0], saved.unpack("AdaptiveMaxPool2DBackward"), in_shape)};
           });
  }
  return {unbatched_like(out, x), unbatched_like(indices, x)};
}

Tensor adaptive_max_pool2d(const Tensor& x, const Shape& output_size) {
  return std::get<0>(adaptive_max_pool2d_with_indices(x, output_size));
}

std::tuple<Tensor, Tensor> adaptive_max_pool1d_with_indices(const Tensor& x, int64_t output_size) {
  const char* op = "adaptive_max_pool1d";
  KILN_CHECK(x.dim() == 2 || x.dim() == 3,
             "{}: expected a 2-D (unbatched C, L) or 3-D (batched N, C, L) input, got shape {}", op,
             x.sizes().str());
  KILN_CHECK(output_size >= 0, "{}: output_size must be non-negative, got {}", op, output_size);
  auto [out, indices] = adaptive_max_pool2d_with_indices(x.unsqueeze(-2), {1, output_size});
  return {out.squeeze(-2), indices.squeeze(-2)};  // an index h * L + w with h = 0 indexes L
}

Tensor adaptive_max_pool1d(const Tensor& x, int64_t output_size) {
  return std::get<0>(adaptive_max_pool1d_with_indices(x, output_size));
}

Tensor adaptive_avg_pool2d(const Tensor& x, const Shape& output_size) {
  const char* op = "adaptive_avg_pool2d";
  check_pool_input(x, op);
  const auto [Ho, Wo] = adaptive_output_size(output_size, op);
  if (is_half(x.dtype())) return adaptive_avg_pool2d(x.to(kFloat32), output_size).to(x.dtype());
  Tensor input = batched(x);
  return unbatched_like(adaptive_forward(input, {input.sizes()[0], input.sizes()[1], Ho, Wo}), x);
}

// Note [3-D pooling is separable]
// A 3-D window is a 2-D window (h, w) at each of the depths the window's d range covers, and max,
// sum and the count of cells all split that way: max over the window = max over d of the 2-D
// maxima, and an average's divisor is the product of the per-dim counts (PyTorch's, with or without
// the padding, with ceil_mode's clipped last windows). So a 3-D pooling is the 2-D pooling of every
// depth slice ((N C, D, H, W): the depths as channels), then the 2-D pooling of the result viewed as
// a (D, Ho Wo) image with a (kd, 1) kernel. Ties and NaNs resolve as PyTorch's scan in (d, h, w)
// order does: the first maximum wins in each step, so the first depth and within it the first
// (h, w); the last NaN wins in each step (a NaN replaces the maximum so far), so the last depth
// holding a NaN and within it the last NaN. The indices are the 2-D steps' combined:
// d H W + the index into H W of the maximum at depth d. The backward is the two poolings'.

namespace {

struct Pool3dArgs {
  std::array<int64_t, 3> k, s, p, dil;
};

void check_pool3d_input(const Tensor& x, const char* op) {
  KILN_CHECK(x.dim() == 4 || x.dim() == 5,
             "{}: expected a 4-D (unbatched C, D, H, W) or 5-D (batched N, C, D, H, W) input, got shape {}", op,
             x.sizes().str());
  for (int d = x.dim() - 4; d < x.dim(); ++d) {
    KILN_CHECK(x.sizes()[d] > 0, "{}: expected non-empty channel, depth, height and width dims, got shape {}", op,
               x.sizes().str());
  }
  KILN_CHECK(is_floating(x.dtype()), "{}: needs a floating-point input, got {}", op, dtype_name(x.dtype()));
}

Pool3dArgs pool3d_args(const Tensor& x, const Shape& kernel_size, const Shape& stride, const Shape& padding,
                       const Shape& dilation, bool ceil_mode, const char* op) {
  check_pool3d_input(x, op);
  const Pool3dArgs a{triple_arg(kernel_size, op, "kernel_size", 1),
                     triple_arg(stride.empty() ? kernel_size : stride, op, "stride", 1),
                     triple_arg(padding, op, "padding", 0), triple_arg(dilation, op, "dilation", 1)};
  for (int i = 0; i < 3; ++i) {
    KILN_CHECK(a.p[i] <= a.k[i] / 2, "{}: padding {} must be at most half of the kernel size {}", op, padding.str(),
               kernel_size.str());
  }
  for (int i = 0; i < 3; ++i) {
    const int64_t in = x.size(x.dim() - 3 + i);
    KILN_CHECK(pool_out_size(in, a.k[i], a.p[i], a.s[i], a.dil[i], ceil_mode) > 0,
               "{}: the output would be empty: the input {} is too small for kernel {} with padding {} and dilation {}",
               op, x.sizes().str(), kernel_size.str(), padding.str(), dilation.str());
  }
  return a;
}

Tensor batched5(const Tensor& x) { return x.dim() == 4 ? x.unsqueeze(0) : x; }
Tensor unbatched5_like(const Tensor& out, const Tensor& x) { return x.dim() == 4 ? out.squeeze(0) : out; }

// The maxima of the 2-D steps (Note [3-D pooling is separable]) put together: out (N, C, Do, Ho, Wo)
// and indices into D H W. `first` and `first_indices` are the 2-D step's (N C, D, Ho, Wo); `second`
// and `second_indices` the depth step's (N C, 1, Do, Ho Wo), whose indices run over D x Ho Wo.
std::tuple<Tensor, Tensor> join_max3d(const Tensor& input, const Tensor& first_indices, const Tensor& second,
                                      const Tensor& second_indices) {
  const int64_t N = input.size(0), C = input.size(1), H = input.size(3), W = input.size(4);
  const int64_t Ho = first_indices.size(2), Wo = first_indices.size(3), Do = second.size(2);
  const int64_t plane = Ho * Wo;
  Tensor indices;
  {
    NoGradGuard no_grad;
    const Tensor depth = second_indices.reshape({N * C, Do, plane}).floor_divide(plane);
    const Tensor in_plane = first_indices.reshape({N * C, first_indices.size(1), plane}).gather(1, depth);
    indices = (depth * (H * W) + in_plane).reshape({N, C, Do, Ho, Wo});
  }
  return {second.reshape({N, C, Do, Ho, Wo}), indices};
}

}  // namespace

std::tuple<Tensor, Tensor> max_pool3d_with_indices(const Tensor& x, const Shape& kernel_size, const Shape& stride,
                                                   const Shape& padding, const Shape& dilation, bool ceil_mode) {
  const Pool3dArgs a = pool3d_args(x, kernel_size, stride, padding, dilation, ceil_mode, "max_pool3d");
  const Tensor input = batched5(x);
  const int64_t N = input.size(0), C = input.size(1), D = input.size(2);
  auto [first, first_indices] =
      max_pool2d_with_indices(input.reshape({N * C, D, input.size(3), input.size(4)}), {a.k[1], a.k[2]},
                              {a.s[1], a.s[2]}, {a.p[1], a.p[2]}, {a.dil[1], a.dil[2]}, ceil_mode);
  auto [second, second_indices] =
      max_pool2d_with_indices(first.reshape({N * C, 1, D, first.size(2) * first.size(3)}), {a.k[0], 1}, {a.s[0], 1},
                              {a.p[0], 0}, {a.dil[0], 1}, ceil_mode);
  auto [out, indices] = join_max3d(input, first_indices, second, second_indices);
  return {unbatched5_like(out, x), unbatched5_like(indices, x)};
}

Tensor max_pool3d(const Tensor& x, const Shape& kernel_size, const Shape& stride, const Shape& padding,
                  const Shape& dilation, bool ceil_mode) {
  return std::get<0>(max_pool3d_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode));
}

Tensor avg_pool3d(const Tensor& x, const Shape& kernel_size, const Shape& stride, const Shape& padding,
                  bool ceil_mode, bool count_include_pad, std::optional<int64_t> divisor_override) {
  const Pool3dArgs a = pool3d_args(x, kernel_size, stride, padding, {1}, ceil_mode, "avg_pool3d");
  KILN_CHECK(!divisor_override || *divisor_override != 0, "avg_pool3d: divisor_override must be nonzero");
  const Tensor input = batched5(x);
  const int64_t N = input.size(0), C = input.size(1), D = input.size(2);
  // With divisor_override, both steps sum (divisor 1) and the sum is divided once.
  const std::optional<int64_t> sum = divisor_override ? std::optional<int64_t>(1) : std::nullopt;
  const Tensor first = avg_pool2d(input.reshape({N * C, D, input.size(3), input.size(4)}), {a.k[1], a.k[2]},
                                  {a.s[1], a.s[2]}, {a.p[1], a.p[2]}, ceil_mode, count_include_pad, sum);
  const int64_t Ho = first.size(2), Wo = first.size(3);
  Tensor out = avg_pool2d(first.reshape({N * C, 1, D, Ho * Wo}), {a.k[0], 1}, {a.s[0], 1}, {a.p[0], 0}, ceil_mode,
                          count_include_pad, sum);
  out = out.reshape({N, C, out.size(2), Ho, Wo});
  if (divisor_override) out = out / static_cast<double>(*divisor_override);
  return unbatched5_like(out, x);
}

namespace {

std::array<int64_t, 3> adaptive_output_size3(const Shape& output_size, const char* op) {
  KILN_CHECK(output_size.size() == 1 || output_size.size() == 3,
             "{}: output_size must have one or three elements, got {}", op, output_size.str());
  std::array<int64_t, 3> o{};
  for (int i = 0; i < 3; ++i) o[static_cast<size_t>(i)] = output_size[output_size.size() == 3 ? i : 0];
  KILN_CHECK(o[0] >= 0 && o[1] >= 0 && o[2] >= 0, "{}: output_size must be non-negative, got {}", op,
             output_size.str());
  return o;
}

}  // namespace

Tensor adaptive_avg_pool3d(const Tensor& x, const Shape& output_size) {
  const char* op = "adaptive_avg_pool3d";
  check_pool3d_input(x, op);
  const auto o = adaptive_output_size3(output_size, op);
  const Tensor input = batched5(x);
  const int64_t N = input.size(0), C = input.size(1), D = input.size(2);
  // The depth step's width, Ho Wo cells into Ho Wo, keeps each cell as it is.
  const Tensor first = adaptive_avg_pool2d(input.reshape({N * C, D, input.size(3), input.size(4)}), {o[1], o[2]});
  const Tensor out = adaptive_avg_pool2d(first.reshape({N * C, 1, D, o[1] * o[2]}), {o[0], o[1] * o[2]});
  return unbatched5_like(out.reshape({N, C, o[0], o[1], o[2]}), x);
}

std::tuple<Tensor, Tensor> adaptive_max_pool3d_with_indices(const Tensor& x, const Shape& output_size) {
  const char* op = "adaptive_max_pool3d";
  check_pool3d_input(x, op);
  const auto o = adaptive_output_size3(output_size, op);
  const Tensor input = batched5(x);
  const int64_t N = input.size(0), C = input.size(1), D = input.size(2);
  auto [first, first_indices] =
      adaptive_max_pool2d_with_indices(input.reshape({N * C, D, input.size(3), input.size(4)}), {o[1], o[2]});
  auto [second, second_indices] =
      adaptive_max_pool2d_with_indices(first.reshape({N * C, 1, D, o[1] * o[2]}), {o[0], o[1] * o[2]});
  auto [out, indices] = join_max3d(input, first_indices, second, second_indices);
  return {unbatched5_like(out, x), unbatched5_like(indices, x)};
}

Tensor adaptive_max_pool3d(const Tensor& x, const Shape& output_size) {
  return std::get<0>(adaptive_max_pool3d_with_indices(x, output_size));
}

}  // namespace ops
}  // namespace kiln
