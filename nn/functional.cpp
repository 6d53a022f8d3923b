// nn/functional.cpp: linear, embedding, the activations, dropouts, resampling and sliding blocks of
// nn/functional.h, written with ops:: calls (so they run on any device and their backward is
// differentiable again). The losses and distances are in nn/loss.cpp.
#include "nn/functional.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "core/grad_mode.h"
#include "ops/autocast.h"
#include "ops/dispatch.h"
#include "ops/ops.h"
#include "ops/record.h"

namespace kiln::nn {
inline namespace functional {

// ---- layers ----

namespace {

// t (*, n) as a matrix (rows, n), rows the product of the other dims: reshape({-1, n}) cannot say
// that when n is 0 (a Linear or an Embedding of width 0).
Tensor as_rows(const Tensor& t) {
  int64_t rows = 1;
  for (int d = 0; d + 1 < t.dim(); ++d) rows *= t.size(d);
  return t.reshape({rows, t.size(-1)});
}

// linear's checks, shared by linear and linear_graph_only.
void check_linear(const Tensor& input, const Tensor& weight, const Tensor& bias) {
  KILN_CHECK(weight.dim() == 2, "linear: weight must be 2-D (out_features, in_features), got shape {}",
             weight.sizes().str());
  KILN_CHECK(input.dim() >= 1, "linear: the input must have at least 1 dim (its last is in_features = {}), got a "
             "0-d tensor", weight.size(1));
  KILN_CHECK(input.size(-1) == weight.size(1),
             "linear: the input's last dim ({}) must equal in_features ({}); input shape {}, weight shape {}",
             input.size(-1), weight.size(1), input.sizes().str(), weight.sizes().str());
  KILN_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)),
             "linear: bias must have shape ({}), got {}", weight.size(0), bias.sizes().str());
  KILN_CHECK(input.dtype() == weight.dtype() && input.device() == weight.device(),
             "linear: the input ({} on {}) and the weight ({} on {}) must have the same dtype and device",
             dtype_name(input.dtype()), input.device().str(), dtype_name(weight.dtype()), weight.device().str());
}

// linear's node, LinearBackward, recorded with y as its output. Its formula reads the input and the
// weight, never y: that is what lets linear_graph_only record it on a y that was not computed. The
// input is kept only when the weight needs a gradient, and the weight only when the input does (a
// frozen layer keeps no activation), as PyTorch's.
void record_linear(const Tensor& input, const Tensor& weight, const Tensor& bias, const Tensor& y) {
  if (!autograd::should_record(input, weight) && !(bias.defined() && autograd::should_record(bias))) return;
  auto backward = [x = autograd::SavedTensor(weight.requires_grad() ? input : Tensor(), false),
                   w = autograd::SavedTensor(input.requires_grad() ? weight : Tensor(), false),
                   has_bias = bias.defined()](const autograd::Grads& g) -> autograd::TensorList {
    Tensor gy = g[0];
    autograd::TensorList out(has_bias ? 3 : 2);
    if (g.needs_grad(0)) out[0] = matmul(gy, w.unpack("LinearBackward"));  // dL/dx = gy W
    Tensor gy2 = as_rows(gy);
    if (g.needs_grad(1)) out[1] = matmul(gy2.t(), as_rows(x.unpack("LinearBackward")));  // gy^T x
    if (has_bias && g.needs_grad(2)) out[2] = gy2.sum({0});
    return out;
  };
  // The braced lists build no vectors (ops/record.h).
  if (bias.defined())
    autograd::record("LinearBackward", {input, weight, bias}, {y}, std::move(backward));
  else
    autograd::record("LinearBackward", {input, weight}, {y}, std::move(backward));
}

// (..., in_features) -> (..., out_features): linear's output shape.
Shape linear_shape(const Tensor& input, const Tensor& weight) {
  Shape shape = input.sizes();
  shape[shape.size() - 1] = weight.size(0);
  return shape;
}

}  // namespace

Tensor linear(const Tensor& input, const Tensor& weight, const Tensor& bias) {
  // Under autocast the three cast to 16 bits (See Note [autocast] in ops/autocast.h); the weight's
  // cast is cached for the scope and its gradient comes back to the float32 parameter.
  if (autocast::is_enabled(input.device().type)) {
    if (autocast::OpScope ac{autocast::Op::Linear, input.device()})
      return linear(ac.cast(input), ac.cast(weight), ac.cast(bias));
  }
  check_linear(input, weight, bias);
  Tensor y;
  {
    NoGradGuard no_grad;
    if (bias.defined() && input.dim() >= 2 && input.is_contiguous() && bias.dtype() == input.dtype() &&
        weight.dtype() == input.dtype()) {
      // (..., K) seen as (rows, K), and y as (rows, N), for free: on CUDA the bias is then added in the
      // GEMM's epilogue (Note [cuBLASLt bias epilogue] in cuda/matmul.cu). y itself is a fresh
      // tensor, not a view, so in-place ops on it stay recordable.
      const int64_t K = input.size(-1), N = weight.size(0);
      int64_t rows = 1;
      for (int d = 0; d + 1 < input.dim(); ++d) rows *= input.size(d);
      y = empty(linear_shape(input, weight), input.options());
      addmm_out(y.view({rows, N}), bias, input.view({rows, K}), weight.t());
    } else {
      y = matmul(input, weight.t());
      if (bias.defined()) y.add_(bias);  // in place: no second output buffer
    }
  }
  record_linear(input, weight, bias, y);
  return y;
}

Tensor linear_graph_only(const Tensor& input, const Tensor& weight, const Tensor& bias) {
  // The same casts as linear, so that the graph is linear's graph under autocast too.
  if (autocast::is_enabled(input.device().type)) {
    if (autocast::OpScope ac{autocast::Op::Linear, input.device()})
      return linear_graph_only(ac.cast(input), ac.cast(weight), ac.cast(bias));
  }
  check_linear(input, weight, bias);
  Tensor y = zeros(linear_shape(input, weight), input.options());  // linear's y has the input's dtype
  record_linear(input, weight, bias, y);
  return y;
}

Tensor linear_gelu(const Tensor& input, const Tensor& weight, const Tensor& bias, std::string_view approximate) {
  // linear's casts under autocast, as linear makes them.
  if (autocast::is_enabled(input.device().type)) {
    if (autocast::OpScope ac{autocast::Op::Linear, input.device()})
      return linear_gelu(ac.cast(input), ac.cast(weight), ac.cast(bias), approximate);
  }
  if (!bias.defined() || bias.dtype() != input.dtype()) return gelu(linear(input, weight, bias), approximate);
  check_linear(input, weight, bias);
  // (..., K) seen as rows of K: on CUDA in the tanh form the bias and the GELU run in the GEMM's
  // epilogue (Note [cuBLASLt GELU epilogue] in cuda/matmul.cu), elsewhere the GEMM and bias_gelu's one
  // pass (fused while fusion is on).
  const Tensor rows = input.reshape({-1, input.size(-1)});
  return addmm_gelu(bias, rows, weight.t(), approximate).view(linear_shape(input, weight));
}

Tensor embedding(const Tensor& indices, const Tensor& weight, std::optional<int64_t> padding_idx) {
  return embedding(indices, weight, EmbeddingFuncOptions{.padding_idx = padding_idx});
}

Tensor& embedding_renorm_(Tensor& weight, const Tensor& indices, double max_norm, double norm_type) {
  KILN_CHECK(weight.dim() == 2 && is_floating(weight.dtype()),
             "embedding_renorm_: the weight must be a 2-D (num_embeddings, dim) floating tensor, got {} of shape {}",
             dtype_name(weight.dtype()), weight.sizes().str());
  KILN_CHECK(max_norm >= 0, "embedding_renorm_: max_norm must be non-negative, got {}", max_norm);
  KILN_CHECK(norm_type > 0, "embedding_renorm_: norm_type must be positive, got {}", norm_type);
  NoGradGuard no_grad;
  const Tensor flat = indices.reshape({-1});
  if (flat.numel() == 0) return weight;
  // Each referenced row's factor, written into a column of ones (a row referenced twice is written
  // twice with the same factor), so that one in-place multiply leaves every other row as it was.
  const Tensor norms = weight.index_select(0, flat).to(kFloat64).norm(norm_type, {1}, true);
  const Tensor scale = where(norms.gt(max_norm), max_norm / (norms + 1e-7), 1.0);
  const DType factor_dtype = weight.dtype() == kFloat64 ? kFloat64 : kFloat32;
  const Tensor factor = ones({weight.size(0), 1}, TensorOptions(factor_dtype).device(weight.device()))
                            .scatter(0, flat.to(kInt64).unsqueeze(1), scale.to(factor_dtype));
  weight.mul_(factor);
  return weight;
}

Tensor embedding(const Tensor& indices, const Tensor& weight, const EmbeddingFuncOptions& options) {
  const std::optional<int64_t> padding_idx = options.padding_idx;
  Tensor y;
  {
    NoGradGuard no_grad;
    try {
      // Both index the weight with indices: embedding_renorm_ first, so that the lookup reads the
      // renormalised rows.
      if (options.max_norm && weight.dim() == 2) {
        Tensor w = weight;
        embedding_renorm_(w, indices, *options.max_norm, options.norm_type);
      }
      y = ops::embedding(weight, indices);  // checks the weight is 2-D, then index_select the indices
    } catch (const OutOfMemoryError&) {
      throw;
    } catch (const Error& e) {
      // Only the indices' range is said again in the layer's terms (a 2-D weight's message, or the
      // indices' dtype, already says what is wrong).
      if (weight.dim() != 2 || std::string_view(e.what()).find("out of bounds") == std::string_view::npos) throw;
      KILN_FAIL("embedding: {} (indices must be in [0, num_embeddings) = [0, {}))", e.what(), weight.size(0));
    }
  }
  KILN_CHECK(!padding_idx || (*padding_idx < weight.size(0) && *padding_idx >= -weight.size(0)),
             "embedding: padding_idx {} must be within [-{}, {}), the weight's rows", padding_idx.value_or(0),
             weight.size(0), weight.size(0));
  if (autograd::should_record(weight)) {
    int64_t pad = padding_idx.value_or(-1);
    if (pad < 0 && padding_idx) pad += weight.size(0);
    autograd::record("EmbeddingBackward", {weight}, {y},
                     [idx = autograd::SavedTensor(indices, false), rows = weight.size(0), pad,
                      by_freq = options.scale_grad_by_freq,
                      dtype = weight.dtype()](const autograd::Grads& g) -> autograd::TensorList {
                       Tensor flat = idx.unpack("EmbeddingBackward").reshape({-1});
                       Tensor gy = as_rows(g[0]);
                       if (pad >= 0) gy = gy.masked_fill(flat.eq(pad).unsqueeze(1), 0);  // no gradient
                       const TensorOptions opts = TensorOptions(dtype).device(gy.device());
                       if (by_freq) {  // each occurrence's share: 1 / (the row's count in indices)
                         Tensor counts = index_add(zeros({rows}, opts), 0, flat, ones({flat.numel()}, opts));
                         gy = gy / counts.index_select(0, flat).unsqueeze(1);
                       }
                       return {index_add(zeros({rows, gy.size(1)}, opts), 0, flat, gy)};
                     });
  }
  return y;
}

namespace {

// The bags of a 1-D input: where each starts and ends, and each index's bag (-1: in none), read on the
// host from the offsets. The vectors are sized before they are filled, so an input too large for host
// memory is an OutOfMemoryError, not a slow death.
struct Bags {
  std::vector<int64_t> start, end, bag_of;
  int64_t longest = 0;
  int64_t count() const { return static_cast<int64_t>(start.size()); }
};

Bags bags_of(const Tensor& input, const EmbeddingBagFuncOptions& options, const char* op) {
  const Tensor& offsets = options.offsets;
  KILN_CHECK(offsets.defined() && offsets.dim() == 1 && (offsets.dtype() == kInt64 || offsets.dtype() == kInt32),
             "{}: a 1-D input needs offsets, a 1-D int64 or int32 tensor of where each bag starts, got {}", op,
             offsets.defined() ? fmt::format("{} of shape {}", dtype_name(offsets.dtype()), offsets.sizes().str())
                               : std::string("none"));
  const int64_t n = input.numel(), entries = offsets.numel();
  KILN_CHECK(!options.include_last_offset || entries >= 1,
             "{}: with include_last_offset, offsets needs at least one entry (the end of the last bag)", op);
  Bags bags;
  try {
    const std::vector<int64_t> at = offsets.to_vector<int64_t>();
    KILN_CHECK(entries == 0 || at[0] == 0, "{}: offsets[0] is {}; the first bag must start at the input's start, 0",
               op, entries == 0 ? 0 : at[0]);
    for (int64_t i = 1; i < entries; ++i) {
      KILN_CHECK(at[i] >= at[i - 1], "{}: offsets must not decrease, but offsets[{}] = {} < offsets[{}] = {}", op, i,
                 at[i], i - 1, at[i - 1]);
    }
    KILN_CHECK(entries == 0 || at.back() <= n, "{}: offsets[{}] is {}, past the input's {} indices", op,
               entries - 1, entries == 0 ? 0 : at.back(), n);
    const int64_t count = options.include_last_offset ? entries - 1 : entries;
    bags.start.assign(at.begin(), at.begin() + count);
    bags.end.resize(static_cast<size_t>(count));
    bags.bag_of.assign(static_cast<size_t>(n), -1);
    for (int64_t b = 0; b < count; ++b) {
      bags.end[b] = b + 1 < entries ? at[b + 1] : n;
      for (int64_t i = bags.start[b]; i < bags.end[b]; ++i) bags.bag_of[i] = b;
      bags.longest = std::max(bags.longest, bags.end[b] - bags.start[b]);
    }
  } catch (const std::bad_alloc&) {
    throw OutOfMemoryError(
        fmt::format("{}: out of CPU memory for the bags of {} indices at {} offsets", op, n, entries));
  }
  return bags;
}

// Whether each index counts in its bag: not padding_idx.
Tensor not_padding(const Tensor& indices, const Tensor& weight, std::optional<int64_t> padding_idx) {
  if (!padding_idx) return ones(indices.sizes(), TensorOptions(kBool).device(indices.device()));
  return indices.ne(*padding_idx < 0 ? *padding_idx + weight.size(0) : *padding_idx);
}

// max over dim 1 of rows (B, L, D) where counted (B, L), zeros for a bag that counts nothing. max(dim),
// not amax: its gradient goes to the first of tied rows only, as PyTorch's.
Tensor bag_max(const Tensor& rows, const Tensor& counted) {
  const Tensor most = std::get<0>(max(rows.masked_fill(counted.logical_not().unsqueeze(2), -INFINITY), 1));
  return where(counted.any(1, true), most, 0.0);
}

}  // namespace

Tensor embedding_bag(const Tensor& input, const Tensor& weight, const EmbeddingBagFuncOptions& options) {
  const char* op = "embedding_bag";
  const std::string& mode = options.mode;
  KILN_CHECK(mode == "sum" || mode == "mean" || mode == "max", "{}: mode '{}' is not one of 'sum', 'mean', 'max'", op,
             mode);
  KILN_CHECK(weight.dim() == 2 && weight.is_floating_point(),
             "{}: weight must be a 2-D floating tensor (num_embeddings, embedding_dim), got {} of shape {}", op,
             dtype_name(weight.dtype()), weight.sizes().str());
  KILN_CHECK(input.dim() == 1 || input.dim() == 2,
             "{}: input must be 2-D (bags, L), or 1-D with offsets, got shape {}", op, input.sizes().str());
  KILN_CHECK(!(mode == "max" && options.scale_grad_by_freq),
             "{}: mode 'max' cannot scale the gradient by frequency (scale_grad_by_freq); use 'sum' or 'mean'", op);
  const Tensor& psw = options.per_sample_weights;
  if (psw.defined()) {
    KILN_CHECK(mode == "sum", "{}: per_sample_weights needs mode 'sum', got '{}'", op, mode);
    KILN_CHECK(psw.sizes() == input.sizes() && psw.dtype() == weight.dtype(),
               "{}: per_sample_weights ({} of shape {}) must have the input's shape {} and the weight's dtype {}", op,
               dtype_name(psw.dtype()), psw.sizes().str(), input.sizes().str(), dtype_name(weight.dtype()));
  }
  const EmbeddingFuncOptions lookup{.padding_idx = options.padding_idx, .max_norm = options.max_norm,
                                    .norm_type = options.norm_type, .scale_grad_by_freq = options.scale_grad_by_freq};
  if (input.dim() == 2) {  // B bags of L: the rows (B, L, D), reduced over L
    KILN_CHECK(!options.offsets.defined(), "{}: a 2-D input (bags, L) is its own bags; leave offsets undefined", op);
    KILN_CHECK(!options.include_last_offset || input.size(0) >= 1,
               "{}: include_last_offset with a 2-D input needs at least one row (its offsets end at the last)", op);
    // include_last_offset: PyTorch's offsets for a 2-D input are each row's start, the last one read as
    // the end of the one before, so the last row is in no bag.
    const Tensor bagged = options.include_last_offset ? input.narrow(0, 0, input.size(0) - 1) : input;
    Tensor rows = embedding(bagged, weight, lookup);
    if (psw.defined()) rows = rows * psw.narrow(0, 0, bagged.size(0)).unsqueeze(2);
    const Tensor counted = not_padding(bagged, weight, options.padding_idx);
    if (mode == "max") return bag_max(rows, counted);
    const Tensor sum = where(counted.unsqueeze(2), rows, 0.0).sum({1});
    if (mode == "sum") return sum;
    return sum / counted.sum({1}, true).clamp(1).to(weight.dtype());
  }
  // 1-D: each row added into its bag (sum, mean), or the bags padded to the longest (max).
  const Bags bags = bags_of(input, options, op);
  const int64_t n = input.numel(), dim = weight.size(1), count = bags.count();
  Tensor rows = embedding(input, weight, lookup);  // (n, D)
  if (psw.defined()) rows = rows * psw.unsqueeze(1);
  const Device device = weight.device();
  const Tensor bag_index = from_vector(bags.bag_of, {n}, device);
  const Tensor counted = bag_index.ge(0).logical_and(not_padding(input, weight, options.padding_idx));
  if (count == 0) return zeros({0, dim}, weight.options());
  if (mode != "max") {
    const Tensor into = bag_index.clamp(0);  // a row in no bag adds zero to bag 0
    Tensor out = index_add(zeros({count, dim}, weight.options()), 0, into, where(counted.unsqueeze(1), rows, 0.0));
    if (mode == "sum") return out;
    const Tensor counts = index_add(zeros({count}, weight.options()), 0, into, counted.to(weight.dtype()));
    return out / counts.clamp(1).unsqueeze(1);
  }
  if (bags.longest == 0) return zeros({count, dim}, weight.options());
  std::vector<int64_t> position;
  std::vector<uint8_t> in_bag;
  try {
    position.assign(static_cast<size_t>(count * bags.longest), 0);
    in_bag.assign(position.size(), 0);
  } catch (const std::bad_alloc&) {
    throw OutOfMemoryError(fmt::format("{}: out of CPU memory for {} bags padded to {} indices", op, count,
                                       bags.longest));
  }
  for (int64_t b = 0; b < count; ++b) {
    for (int64_t j = 0; j < bags.end[b] - bags.start[b]; ++j) {
      position[b * bags.longest + j] = bags.start[b] + j;
      in_bag[b * bags.longest + j] = 1;
    }
  }
  const Tensor at = from_vector(position, {count * bags.longest}, device);
  const Tensor valid = from_vector(in_bag, {count, bags.longest}, device)
                           .to(kBool)
                           .logical_and(counted.index_select(0, at).view({count, bags.longest}));
  return bag_max(rows.index_select(0, at).view({count, bags.longest, dim}), valid);
}

Tensor channel_shuffle(const Tensor& input, int64_t groups) {
  KILN_CHECK(input.dim() >= 3, "channel_shuffle: input must be (N, C, *) with at least one dim after C, got shape {}",
             input.sizes().str());
  const int64_t channels = input.size(1);
  KILN_CHECK(groups > 0 && channels % groups == 0,
             "channel_shuffle: groups ({}) must be positive and divide the {} channels", groups, channels);
  Shape split = input.sizes();
  split[1] = channels / groups;
  split.insert(1, groups);  // (N, groups, C / groups, *)
  return input.reshape(split).transpose(1, 2).reshape(input.sizes());
}

Tensor local_response_norm(const Tensor& input, int64_t size, double alpha, double beta, double k) {
  KILN_CHECK(input.dim() >= 3, "local_response_norm: input must be (N, C, *) with at least one dim after C, got shape {}",
             input.sizes().str());
  KILN_CHECK(size > 0, "local_response_norm: size must be positive, got {}", size);
  if (input.numel() == 0) return input;
  // The squares as (N, 1, C, rest), zero-padded along C, averaged over windows of `size` channels.
  const int64_t n = input.size(0), c = input.size(1), rest = input.numel() / (n * c);
  const Tensor squares = pad(input.square().reshape({n, 1, c, rest}), {0, 0, size / 2, (size - 1) / 2});
  const Tensor mean = avg_pool2d(squares, {size, 1}, {1, 1}).reshape(input.sizes());
  return input / (mean * alpha + k).pow(beta);
}

namespace {
// (sign(pooled) relu(|pooled|) window)^(1/p), PyTorch's last step of lp_pool, whose gradient it keeps.
Tensor lp_pool_finish(const Tensor& pooled, double norm_type, int64_t window) {
  return (pooled.sign() * pooled.abs().relu() * static_cast<double>(window)).pow(1.0 / norm_type);
}
}  // namespace

Tensor lp_pool1d(const Tensor& input, double norm_type, int64_t kernel_size, std::optional<int64_t> stride,
                 bool ceil_mode) {
  KILN_CHECK(norm_type != 0, "lp_pool1d: norm_type must not be 0 (the power 1 / norm_type)");
  return lp_pool_finish(avg_pool1d(input.pow(norm_type), kernel_size, stride, 0, ceil_mode), norm_type, kernel_size);
}

Tensor lp_pool2d(const Tensor& input, double norm_type, const Shape& kernel_size, const Shape& stride, bool ceil_mode) {
  KILN_CHECK(norm_type != 0, "lp_pool2d: norm_type must not be 0 (the power 1 / norm_type)");
  KILN_CHECK(kernel_size.size() == 1 || kernel_size.size() == 2,
             "lp_pool2d: kernel_size must be one number or two, got {}", kernel_size.str());
  const int64_t window = kernel_size.size() == 1 ? kernel_size[0] * kernel_size[0] : kernel_size[0] * kernel_size[1];
  return lp_pool_finish(avg_pool2d(input.pow(norm_type), kernel_size, stride, {0, 0}, ceil_mode), norm_type, window);
}

// ---- activations with parameters ----

namespace {

// The geometry of unfold and fold: the kernel's positions over the zero-padded (Hp, Wp) image.
struct Blocks {
  int64_t kh, kw, dh, dw, ph, pw, sh, sw;
  int64_t height, width;  // the image's, unpadded
  int64_t oh, ow;         // the positions

  int64_t padded_width() const { return width + 2 * pw; }
  int64_t padded_height() const { return height + 2 * ph; }
  // The flat index into the padded image of every element unfold reads, in its order (i, j, y, x):
  // (y sh + i dh) Wp + x sw + j dw for kernel tap (i, j) at position (y, x).
  Tensor indices(Device device) const {
    Tensor at = empty({kh * kw * oh * ow}, kInt64);  // too large: the allocator's Error
    int64_t* next = at.data_ptr<int64_t>();
    for (int64_t i = 0; i < kh; ++i) {
      for (int64_t j = 0; j < kw; ++j) {
        for (int64_t y = 0; y < oh; ++y) {
          for (int64_t x = 0; x < ow; ++x) *next++ = (y * sh + i * dh) * padded_width() + x * sw + j * dw;
        }
      }
    }
    return at.to(device);
  }
};

// One number for both dims or two, each >= least (pair_arg, ops/dispatch.h).
std::pair<int64_t, int64_t> pair_of(const Shape& v, const char* op, const char* what, int64_t least) {
  std::pair<int64_t, int64_t> hw;
  pair_arg(v, op, what, least, hw.first, hw.second);
  return hw;
}

Blocks blocks(int64_t height, int64_t width, const Shape& kernel_size, const Shape& dilation, const Shape& padding,
              const Shape& stride, const char* op) {
  Blocks b{};
  std::tie(b.kh, b.kw) = pair_of(kernel_size, op, "kernel_size", 1);
  std::tie(b.dh, b.dw) = pair_of(dilation, op, "dilation", 1);
  std::tie(b.ph, b.pw) = pair_of(padding, op, "padding", 0);
  std::tie(b.sh, b.sw) = pair_of(stride, op, "stride", 1);
  b.height = height;
  b.width = width;
  // In 128 bits: a huge padding or dilation must not wrap around into a plausible size.
  const auto positions = [](int64_t size, int64_t pad, int64_t k, int64_t dil, int64_t str) -> __int128 {
    const __int128 span = static_cast<__int128>(dil) * (k - 1) + 1, room = size + 2 * static_cast<__int128>(pad);
    return room < span ? 0 : (room - span) / str + 1;
  };
  const __int128 oh = positions(height, b.ph, b.kh, b.dh, b.sh), ow = positions(width, b.pw, b.kw, b.dw, b.sw);
  KILN_CHECK(oh >= 1 && ow >= 1,
             "{}: the image ({}, {}) padded by ({}, {}) holds no ({}, {}) kernel dilated by ({}, {}); the number of "
             "positions must be at least one in each dim (a smaller kernel or dilation, or more padding)", op,
             height, width, b.ph, b.pw, b.kh, b.kw, b.dh, b.dw);
  // Each product checked before the next factor joins it, so that none passes 2^124.
  const auto fits = [](std::initializer_list<__int128> factors) {
    const __int128 limit = static_cast<__int128>(1) << 62;
    __int128 product = 1;
    for (__int128 f : factors) {
      if (f >= limit || (product *= f) >= limit) return false;
    }
    return true;
  };
  KILN_CHECK(fits({oh, ow, b.kh, b.kw}) &&
                 fits({height + 2 * static_cast<__int128>(b.ph), width + 2 * static_cast<__int128>(b.pw)}),
             "{}: the padded image or its {} x {} blocks are too large to index", op, b.kh, b.kw);
  b.oh = static_cast<int64_t>(oh);
  b.ow = static_cast<int64_t>(ow);
  return b;
}

}  // namespace

Tensor unfold(const Tensor& input, const Shape& kernel_size, const Shape& dilation, const Shape& padding,
              const Shape& stride) {
  KILN_CHECK(input.dim() == 3 || input.dim() == 4, "unfold: needs an (N, C, H, W) or (C, H, W) input, got {}-D {}",
             input.dim(), input.sizes().str());
  if (input.dim() == 3) return unfold(input.unsqueeze(0), kernel_size, dilation, padding, stride).squeeze(0);
  const int64_t n = input.size(0), c = input.size(1);
  const Blocks b = blocks(input.size(2), input.size(3), kernel_size, dilation, padding, stride, "unfold");
  const Tensor padded = b.ph == 0 && b.pw == 0 ? input : pad(input, {b.pw, b.pw, b.ph, b.ph});
  return padded.reshape({n, c, b.padded_height() * b.padded_width()})
      .index_select(2, b.indices(input.device()))
      .reshape({n, c * b.kh * b.kw, b.oh * b.ow});
}

Tensor fold(const Tensor& input, const Shape& output_size, const Shape& kernel_size, const Shape& dilation,
            const Shape& padding, const Shape& stride) {
  KILN_CHECK(input.dim() == 2 || input.dim() == 3, "fold: needs an (N, C kh kw, L) or (C kh kw, L) input, got {}-D {}",
             input.dim(), input.sizes().str());
  if (input.dim() == 2) {
    return fold(input.unsqueeze(0), output_size, kernel_size, dilation, padding, stride).squeeze(0);
  }
  const auto [height, width] = pair_of(output_size, "fold", "output_size", 0);
  const Blocks b = blocks(height, width, kernel_size, dilation, padding, stride, "fold");
  const int64_t n = input.size(0), taps = b.kh * b.kw;
  KILN_CHECK(input.size(1) % taps == 0,
             "fold: the input's dim 1 ({}) must be a multiple of the kernel's kh kw = {} x {} = {} (C kh kw rows)",
             input.size(1), b.kh, b.kw, taps);
  KILN_CHECK(input.size(2) == b.oh * b.ow,
             "fold: the input's dim 2 ({}) must be the number of blocks, {} x {} = {}, that a ({}, {}) kernel "
             "(dilation ({}, {}), padding ({}, {}), stride ({}, {})) takes over output_size ({}, {})",
             input.size(2), b.oh, b.ow, b.oh * b.ow, b.kh, b.kw, b.dh, b.dw, b.ph, b.pw, b.sh, b.sw, height, width);
  const int64_t c = input.size(1) / taps;
  Tensor image = index_add(zeros({n, c, b.padded_height() * b.padded_width()}, input.options()), 2,
                           b.indices(input.device()), input.reshape({n, c, taps * b.oh * b.ow}));
  image = image.view({n, c, b.padded_height(), b.padded_width()});
  return b.ph == 0 && b.pw == 0 ? image : image.narrow(2, b.ph, height).narrow(3, b.pw, width).contiguous();
}

Tensor leaky_relu(const Tensor& input, double negative_slope) {
  return where(input.gt(0), input, input * negative_slope);
}

namespace {

// scale x for x > 0, scale alpha (exp(input_scale x) - 1) otherwise: elu, selu and celu (PyTorch's
// elu with its scale and input_scale). NaN takes the identity branch, so its gradient passes as
// PyTorch's (x <= 0 ? ... : g). The other branch reads 0 wherever it is not taken: a large x would
// make it inf and a NaN keep it NaN, and its zero gradient times exp(x) would then be a NaN in the sum.
Tensor scaled_elu(const Tensor& input, double alpha, double scale, double input_scale) {
  const Tensor negative = input.le(0);
  Tensor x = input.masked_fill(negative.logical_not(), 0.0);
  if (input_scale != 1) x = x * input_scale;
  if (scale == 1) return where(negative, x.expm1() * alpha, input);
  return where(negative, x.expm1() * (alpha * scale), input * scale);
}

}  // namespace

Tensor elu(const Tensor& input, double alpha) { return scaled_elu(input, alpha, 1, 1); }

Tensor selu(const Tensor& input) {
  constexpr double alpha = 1.6732632423543772848170429916717;
  constexpr double scale = 1.0507009873554804934193349852946;
  return scaled_elu(input, alpha, scale, 1);
}

Tensor celu(const Tensor& input, double alpha) {
  KILN_CHECK(alpha != 0, "celu: alpha must not be 0 (it divides x)");
  return scaled_elu(input, alpha, 1, 1 / alpha);
}

Tensor relu6(const Tensor& input) { return hardtanh(input, 0, 6); }

Tensor mish(const Tensor& input) { return input * ops::softplus(input).tanh(); }

Tensor hardswish(const Tensor& input) {
  // The middle branch reads 0 wherever it is not taken (a NaN or an infinite x would make its unused
  // gradient a NaN); taken on [-3, 3] closed, so at -3 and 3 the slope is x / 3 + 1/2 (PyTorch's
  // scalar kernel; its vectorized one gives 1 at 3).
  const Tensor inside = input.ge(-3).logical_and(input.le(3));
  const Tensor c = input.masked_fill(inside.logical_not(), 0.0);
  return where(inside, c * (c + 3) / 6, input.masked_fill(input.lt(-3), 0.0));
}

Tensor hardsigmoid(const Tensor& input) {
  const Tensor inside = input.gt(-3).logical_and(input.lt(3));
  const Tensor shifted = input + 3;
  return where(inside, shifted, shifted.detach().clamp(0.0, 6.0)) / 6;
}

Tensor softsign(const Tensor& input) { return input / (input.abs() + 1); }

Tensor tanhshrink(const Tensor& input) { return input - input.tanh(); }

Tensor threshold(const Tensor& input, double threshold, double value) {
  return input.masked_fill(input.le(threshold), value);
}

Tensor logsigmoid(const Tensor& input) {
  // softplus without a threshold computes u + log1p(exp(-u)) above 20, exact where the identity is not.
  return -softplus(-input, 1.0, INFINITY);
}

Tensor hardshrink(const Tensor& input, double lambd) {
  // A NaN is not inside [-lambd, lambd]: it stays, with its gradient.
  return input.masked_fill(input.abs().le(lambd), 0.0);
}

Tensor softshrink(const Tensor& input, double lambd) {
  KILN_CHECK(lambd >= 0, "softshrink: lambd must be >= 0, got {}", lambd);
  // A NaN gives 0, as both of PyTorch's kernels; no finite value carries a NaN's gradient, so it gets
  // none (PyTorch's vectorized kernel's; its scalar one passes it).
  const Tensor keep = input.abs().gt(lambd);
  return (input - input.detach().sign() * lambd).masked_fill(keep.logical_not(), 0.0);
}

Tensor prelu(const Tensor& input, const Tensor& weight) {
  KILN_CHECK(weight.defined(), "prelu: weight is undefined");
  KILN_CHECK(weight.dim() <= 1, "prelu: weight must be 0-d or 1-D (one slope, or one per channel), got {}-D {}",
             weight.dim(), weight.sizes().str());
  Tensor slope = weight;
  if (weight.numel() == 1) {
    slope = weight.reshape({});
  } else {
    const int64_t channels = input.dim() >= 2 ? input.size(1) : 1;
    KILN_CHECK(input.dim() > 0 && weight.numel() == channels,
               "prelu: weight has {} slopes but the input {} has {} channel(s) (dim 1; a 0-d or 1-D input "
               "has one): give one slope, or one per channel", weight.numel(), input.sizes().str(), channels);
    std::vector<int64_t> shape(static_cast<size_t>(input.dim() - 1), 1);
    shape[0] = channels;
    slope = weight.reshape(Shape(shape));
  }
  // The branch not taken reads 0: x = inf times a zero gradient would put a NaN in the slope's gradient.
  const Tensor positive = input.gt(0);
  return where(positive, input, input.masked_fill(positive, 0.0) * slope);
}

Tensor glu(const Tensor& input, int64_t dim) {
  KILN_CHECK(input.dim() > 0, "glu: needs a dim to halve; a 0-d tensor has none");
  const int64_t d = wrap_dim(dim, static_cast<int>(input.dim()), "glu");
  KILN_CHECK(input.size(d) % 2 == 0, "glu: the halved dim {} must have an even size, got {}", d, input.size(d));
  const int64_t half = input.size(d) / 2;
  return input.narrow(d, 0, half) * input.narrow(d, half, half).sigmoid();
}

Tensor softmin(const Tensor& input, int64_t dim) { return softmax(-input, dim); }

Tensor rrelu(const Tensor& input, double lower, double upper, bool train, Generator* gen) {
  KILN_CHECK(std::isfinite(lower) && std::isfinite(upper) && lower <= upper,
             "rrelu: lower ({}) must be <= upper ({}), both finite", lower, upper);
  if (!train) return leaky_relu(input, (lower + upper) / 2);
  KILN_CHECK(is_floating(input.dtype()), "rrelu: needs a floating-point input, got {}", dtype_name(input.dtype()));
  Tensor slope = ops::rand(input.sizes(), input.options(), gen);
  slope = slope * (upper - lower) + lower;
  // PyTorch's noise: the slope where x <= 0, 1 elsewhere (a NaN too).
  const Tensor negative = input.le(0);
  return where(negative, input.masked_fill(negative.logical_not(), 0.0) * slope, input);
}

namespace {

// dropout's mask (ops::dropout of ones: bernoulli(1 - p) scaled by 1 / (1 - p)) drawn once per
// (sample, channel) and broadcast over the rest: it has input's shape up to the channel dim
// (channel_dim) and 1 after it.
Tensor channel_dropout(const Tensor& input, double p, bool train, Generator* gen, int64_t channel_dim,
                       const char* op) {
  KILN_CHECK(p >= 0 && p <= 1, "{}: probability p must be in [0, 1], got {}", op, p);
  if (!train || p == 0) return input;
  KILN_CHECK(is_floating(input.dtype()), "{}: needs a floating-point input, got {}", op, dtype_name(input.dtype()));
  std::vector<int64_t> shape(static_cast<size_t>(input.dim()), 1);
  for (int64_t d = 0; d <= channel_dim; ++d) shape[static_cast<size_t>(d)] = input.size(d);
  return input * dropout(ones(Shape(shape), input.options()), p, true, gen);
}

}  // namespace

Tensor dropout1d(const Tensor& input, double p, bool train, Generator* gen) {
  KILN_CHECK(input.dim() == 2 || input.dim() == 3,
             "dropout1d: needs a (C, L) or (N, C, L) input, got {}-D {} (use dropout2d or dropout3d for more "
             "spatial dims, dropout for elementwise)", input.dim(), input.sizes().str());
  return channel_dropout(input, p, train, gen, input.dim() == 3 ? 1 : 0, "dropout1d");
}

Tensor dropout2d(const Tensor& input, double p, bool train, Generator* gen) {
  KILN_CHECK(input.dim() == 3 || input.dim() == 4,
             "dropout2d: needs an (N, C, H, W) input (or (N, C, L), as PyTorch reads a 3-D one), got {}-D {}",
             input.dim(), input.sizes().str());
  return channel_dropout(input, p, train, gen, 1, "dropout2d");
}

Tensor dropout3d(const Tensor& input, double p, bool train, Generator* gen) {
  KILN_CHECK(input.dim() == 4 || input.dim() == 5,
             "dropout3d: needs a (C, D, H, W) or (N, C, D, H, W) input, got {}-D {}", input.dim(),
             input.sizes().str());
  return channel_dropout(input, p, train, gen, input.dim() == 5 ? 1 : 0, "dropout3d");
}

namespace {

// Note [alpha dropout]: with keep = the dropout mask (1 kept, 0 dropped), PyTorch computes
// x * (keep a) + ((keep - 1) alpha' a + alpha' a p): a x + alpha' a p where kept, alpha' a (p - 1)
// (that is, a (-alpha') + b) where dropped. The same ops in the same order give its float32 values.
Tensor alpha_dropout_with(const Tensor& input, double p, bool train, Generator* gen, bool feature, const char* op) {
  KILN_CHECK(p >= 0 && p <= 1, "{}: probability p must be in [0, 1], got {}", op, p);
  if (!train || p == 0 || input.numel() == 0) return input;
  KILN_CHECK(is_floating(input.dtype()), "{}: needs a floating-point input, got {}", op, dtype_name(input.dtype()));
  if (p == 1) return input * 0.0;
  Shape mask_shape = input.sizes();
  if (feature) {  // one draw per (sample, channel)
    KILN_CHECK(input.dim() >= 2, "{}: needs an input of at least 2 dims (N, C, ...), got shape {}", op,
               input.sizes().str());
    for (int d = 2; d < input.dim(); ++d) mask_shape[d] = 1;
  }
  constexpr double kAlpha = 1.7580993408473766;  // SELU's lambda * alpha
  const double a = 1 / std::sqrt((kAlpha * kAlpha * p + 1) * (1 - p));
  const Tensor keep = dropout(ones(mask_shape, input.options()), p, true, gen).ne(0).to(input.dtype());
  return input * (keep * a) + ((keep - 1.0) * (kAlpha * a) + kAlpha * a * p);
}

}  // namespace

Tensor alpha_dropout(const Tensor& input, double p, bool train, Generator* gen) {
  return alpha_dropout_with(input, p, train, gen, false, "alpha_dropout");
}

Tensor feature_alpha_dropout(const Tensor& input, double p, bool train, Generator* gen) {
  return alpha_dropout_with(input, p, train, gen, true, "feature_alpha_dropout");
}

Tensor hardtanh(const Tensor& input, double min_val, double max_val) {
  KILN_CHECK(min_val <= max_val, "hardtanh: min_val ({}) must be <= max_val ({})", min_val, max_val);
  // clamp's value; the gradient only strictly inside (clamp's passes at the bounds too), and at NaN,
  // which is neither outside nor at a bound, as PyTorch's ((x <= min || x >= max) ? 0 : g).
  Tensor outside = input.le(min_val).logical_or(input.ge(max_val));
  return where(outside, input.detach().clamp(min_val, max_val), input);
}

Tensor softplus(const Tensor& input, double beta, double threshold) {
  KILN_CHECK(beta != 0 && std::isfinite(beta), "softplus: beta must be finite and nonzero, got {}", beta);
  if (beta == 1 && threshold == 20) return ops::softplus(input);  // the op's own threshold
  Tensor bx = input * beta;
  // ops::softplus is the identity above 20 itself, so its branch never overflows. Above a threshold
  // past 20, softplus(u) = u + log1p(exp(-u)) for 20 < u <= threshold; u clamped to 20 below keeps
  // the unused branch finite (its zero gradient times an inf would be a NaN).
  Tensor soft = ops::softplus(bx);
  if (threshold > 20) {
    Tensor u = bx.clamp(20.0, {});
    soft = where(bx.gt(20), u + (-u).exp().log1p(), soft);
  }
  return where(bx.gt(threshold), input, soft / beta);
}

Tensor instance_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                     const Tensor& bias, bool use_input_stats, double momentum, double eps) {
  KILN_CHECK(input.dim() >= 3, "instance_norm: expects an input (N, C, *) of at least 3 dims, got shape {}",
             input.sizes().str());
  const int64_t n = input.size(0), c = input.size(1);
  for (const Tensor* t : {&running_mean, &running_var, &weight, &bias}) {
    KILN_CHECK(!t->defined() || t->sizes() == Shape{c}, "instance_norm: weight, bias and running statistics "
               "must have shape ({}) for input of shape {}, got {}", c, input.sizes().str(), t->sizes().str());
  }
  KILN_CHECK(running_mean.defined() == running_var.defined(),
             "instance_norm: give both running_mean and running_var, or neither");
  KILN_CHECK(!use_input_stats || input.numel() == 0 || input.numel() / (n * c) > 1,
             "instance_norm: needs more than one spatial element per channel when using the input's statistics, "
             "got input of shape {}", input.sizes().str());
  // Each (sample, channel) plane is a channel of batch_norm over (1, N C, *).
  Shape planes = input.sizes();
  planes[0] = 1;
  planes[1] = n * c;
  auto per_plane = [n](const Tensor& t) { return t.defined() ? t.repeat(Shape{n}) : Tensor(); };
  Tensor mean_copy, var_copy;
  if (running_mean.defined()) {
    NoGradGuard no_grad;
    mean_copy = per_plane(running_mean);
    var_copy = per_plane(running_var);
  }
  Tensor out = batch_norm(input.reshape(planes), mean_copy, var_copy, per_plane(weight), per_plane(bias),
                          use_input_stats, momentum, eps);
  if (running_mean.defined() && use_input_stats) {  // each channel's statistics averaged over the batch
    NoGradGuard no_grad;
    Tensor(running_mean).copy_(mean_copy.reshape(Shape{n, c}).mean(Shape{0}));
    Tensor(running_var).copy_(var_copy.reshape(Shape{n, c}).mean(Shape{0}));
  }
  return out.reshape(input.sizes());
}

}  // namespace functional
}  // namespace kiln::nn
