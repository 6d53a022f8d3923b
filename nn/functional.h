// nn/functional.h: the functional forms of the layers and the losses, as torch.nn.functional. They are
// compositions of ops (ops/ops.h), except where one recorded node gives a cheaper or more exact
// gradient: linear(), embedding(), nll_loss (and cross_entropy's class-index path), binary_cross_entropy
// and binary_cross_entropy_with_logits.
// Reachable as nn::cross_entropy and nn::functional::cross_entropy alike (an inline namespace).
// Implemented in nn/functional.cpp, the losses and distances in nn/loss.cpp; the losses as modules
// (nn::CrossEntropyLoss ...) are in nn/loss.h.
//
// Losses take an options struct with PyTorch's names and defaults:
//   nn::cross_entropy(logits, labels, {.ignore_index = 0, .reduction = "sum", .label_smoothing = 0.1})
// (designated initialisers go in the struct's order, which is PyTorch's keyword order)
// reduction: "mean" (default), "sum" or "none".
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "core/tensor.h"
#include "ops/ops.h"

namespace kiln::nn {
inline namespace functional {

// The ops that torch.nn.functional also has, under the same names (the same functions as kiln::).
using ops::adaptive_avg_pool1d;
using ops::adaptive_avg_pool2d;
using ops::adaptive_avg_pool3d;
using ops::adaptive_max_pool1d;
using ops::adaptive_max_pool1d_with_indices;
using ops::adaptive_max_pool2d;
using ops::adaptive_max_pool2d_with_indices;
using ops::adaptive_max_pool3d;
using ops::adaptive_max_pool3d_with_indices;
using ops::avg_pool1d;
using ops::avg_pool2d;
using ops::avg_pool3d;
using ops::batch_norm;
using ops::conv1d;
using ops::conv2d;
using ops::conv3d;
using ops::conv_transpose1d;
using ops::conv_transpose2d;
using ops::conv_transpose3d;
using ops::dropout;
using ops::gelu;
using ops::group_norm;
using ops::layer_norm;
using ops::log_softmax;
using ops::max_pool1d;
using ops::max_pool1d_with_indices;
using ops::max_pool2d;
using ops::max_pool2d_with_indices;
using ops::max_pool3d;
using ops::max_pool3d_with_indices;
using ops::one_hot;
using ops::pad;
using ops::pixel_shuffle;
using ops::pixel_unshuffle;
using ops::relu;
using ops::rms_norm;
using ops::scaled_dot_product_attention;
using ops::silu;
using ops::softmax;
using ops::softplus;

// ---- layers ----
// x (*, in) @ weight (out, in)^T + bias (out): the bias is added in place into the product and the
// backward is one node (the hot path of an MLP).
Tensor linear(const Tensor& input, const Tensor& weight, const Tensor& bias = {});
// linear's graph without its value, for a recompute that only differentiates the result (see
// Note [a recompute computes what backward reads] in autograd/checkpoint.cpp): records the same
// LinearBackward node as linear, on a tensor of linear's shape and dtype that holds zeros, and
// skips the product. The gradients it passes back are linear's; the values it returns are not, so
// only ops whose backward does not read them may take it as an input (an add, as the residual
// connection; a dropout, whose backward reads only its mask), and their values are then wrong too.
Tensor linear_graph_only(const Tensor& input, const Tensor& weight, const Tensor& bias = {});
// gelu(linear(input, weight, bias), approximate) as one op where there is a bias: ops::addmm_gelu,
// whose GEMM epilogue adds the bias and applies the GELU on CUDA. nn::GeluMLP's first layer.
Tensor linear_gelu(const Tensor& input, const Tensor& weight, const Tensor& bias = {},
                   std::string_view approximate = "none");
// weight (V, C), indices of any shape -> (*indices, C). The row padding_idx receives no gradient.
Tensor embedding(const Tensor& indices, const Tensor& weight, std::optional<int64_t> padding_idx = {});
// torch.nn.functional.embedding's other arguments:
//   nn::embedding(tokens, weight, {.max_norm = 1.0, .scale_grad_by_freq = true});
// max_norm: before the lookup, every row the indices reference whose norm_type-norm exceeds max_norm
// is scaled in place (under no_grad) by max_norm / (norm + 1e-7), as embedding_renorm_ below.
// scale_grad_by_freq: each row's gradient is divided by the number of times the indices reference it.
struct EmbeddingFuncOptions {
  std::optional<int64_t> padding_idx = {};
  std::optional<double> max_norm = {};
  double norm_type = 2;
  bool scale_grad_by_freq = false;
};
Tensor embedding(const Tensor& indices, const Tensor& weight, const EmbeddingFuncOptions& options);
// PyTorch's torch.embedding_renorm_: the rows of weight (V, C) that indices reference, each once, whose
// norm_type-norm is above max_norm, times max_norm / (norm + 1e-7); the norm and the factor in float64.
Tensor& embedding_renorm_(Tensor& weight, const Tensor& indices, double max_norm, double norm_type = 2);
// torch.nn.functional.embedding_bag's other arguments, in its order:
//   nn::embedding_bag(tokens, weight, {.offsets = starts, .mode = "sum", .per_sample_weights = w});
struct EmbeddingBagFuncOptions {
  Tensor offsets = {};  // a 1-D input's bags: where each starts (1-D, int64 or int32; first 0, none decreasing)
  std::optional<double> max_norm = {};  // as embedding's
  double norm_type = 2;
  bool scale_grad_by_freq = false;
  std::string mode = "mean";            // "sum", "mean" or "max" over each bag's embeddings
  Tensor per_sample_weights = {};       // the input's shape: each embedding's factor ("sum" only)
  bool include_last_offset = false;     // offsets has one entry more than there are bags: the last bag's end
  std::optional<int64_t> padding_idx = {};  // that index is left out of its bag (and of the mean's count)
};
// The embeddings of each bag of indices reduced by mode -> (B, embedding_dim): input (B, L) is B bags of L
// indices (with include_last_offset the last row is in no bag, as PyTorch's); a 1-D input is cut into bags
// at offsets. An empty bag gives zeros; max's gradient goes to the first of tied rows. For a 1-D input,
// sum and mean add each row into its bag (index_add), so no (B, longest bag, embedding_dim) tensor is
// formed; max pads the bags to the longest.
Tensor embedding_bag(const Tensor& input, const Tensor& weight, const EmbeddingBagFuncOptions& options = {});
// input (N, C, *) -> the same, each channel's group of C / groups moved so that the groups interleave:
// channel g (C / groups) + i goes to i groups + g (torch.nn.functional.channel_shuffle, ShuffleNet's).
Tensor channel_shuffle(const Tensor& input, int64_t groups);
// Each element of input (N, C, *) over (k + alpha / size * (sum of the squares of the `size` channels
// around it, zero beyond the ends))^beta: the window runs from size / 2 channels before to (size - 1) / 2
// after (torch.nn.functional.local_response_norm, AlexNet's).
Tensor local_response_norm(const Tensor& input, int64_t size, double alpha = 1e-4, double beta = 0.75, double k = 1.0);
// Power-average pooling (torch.nn.functional.lp_pool1d / lp_pool2d): each window's (sum of x^p)^(1/p),
// over (N, C, L) / (N, C, H, W) inputs or their unbatched forms, without padding; stride unset: the
// kernel. Computed as PyTorch does, avg_pool(x^p) times the window's size (so with ceil_mode a window
// cut by the border is scaled by the whole window's size) and then ^(1/p): the same values, and the
// same NaN gradient where a window sums to 0.
Tensor lp_pool1d(const Tensor& input, double norm_type, int64_t kernel_size, std::optional<int64_t> stride = {},
                 bool ceil_mode = false);
Tensor lp_pool2d(const Tensor& input, double norm_type, const Shape& kernel_size, const Shape& stride = {},
                 bool ceil_mode = false);

// ---- resampling and instance norm (compositions of ops: any device, differentiable twice) ----
// torch.nn.functional.interpolate's arguments:
//   nn::interpolate(x, {.size = {64, 64}, .mode = "bilinear"});
//   nn::interpolate(x, {.scale_factor = {2}});   // nearest, every spatial dim twice as large
// size or scale_factor (one of them): one value per spatial dim of the input (N, C, d1[, d2[, d3]]), or
// one for all; with scale_factor the output is floor(in * scale_factor) and, unless
// recompute_scale_factor, the source positions use 1 / scale_factor itself, as PyTorch's.
// mode: "nearest" (source floor(o * in / out), PyTorch's, which shifts the image by half a pixel),
// "nearest-exact" (floor((o + 0.5) * in / out)), "linear" (3-D input), "bilinear" (4-D), "trilinear"
// (5-D), "bicubic" (4-D; a = -0.75, edge pixels repeated) or "area" (adaptive average pooling; 3-D
// and 4-D). align_corners (the linear modes and bicubic; false by default) maps the corner pixels'
// centres onto each other instead of their outer edges. The linear modes take floating inputs.
struct InterpolateOptions {
  std::vector<int64_t> size = {};
  std::vector<double> scale_factor = {};
  std::string mode = "nearest";
  std::optional<bool> align_corners = {};
  std::optional<bool> recompute_scale_factor = {};
};
Tensor interpolate(const Tensor& input, const InterpolateOptions& options);
// Each (sample, channel) plane of input (N, C, *) normalised by its own mean and variance, as
// torch.nn.functional.instance_norm: batch_norm over input viewed as (1, N C, *). With
// use_input_stats the running statistics (C), when given, are updated with the mean over the batch of
// each plane's statistics; without it they normalise instead.
Tensor instance_norm(const Tensor& input, const Tensor& running_mean = {}, const Tensor& running_var = {},
                     const Tensor& weight = {}, const Tensor& bias = {}, bool use_input_stats = true,
                     double momentum = 0.1, double eps = 1e-5);

// ---- sliding blocks (torch.nn.functional.unfold and fold; compositions of ops) ----
// unfold ("im2col"): input (N, C, H, W) or (C, H, W) -> (N, C kh kw, L), one column per position of
// the kernel over the zero-padded input, L = oh ow positions, each column's rows ordered (c, i, j)
// as conv2d's weight (C_out, C, kh, kw) is, so conv2d(x, w) == w.view({C_out, -1}).matmul(unfold(x)).
// kernel_size, dilation, padding and stride: one number for both dims or two (PyTorch's order).
Tensor unfold(const Tensor& input, const Shape& kernel_size, const Shape& dilation = {1},
              const Shape& padding = {0}, const Shape& stride = {1});
// fold ("col2im"), unfold's adjoint: input (N, C kh kw, L) or (C kh kw, L) -> (N, C, H, W) with
// (H, W) = output_size, each column's values summed into the positions unfold reads them from (so
// fold(unfold(x)) is x times how many blocks cover each pixel).
Tensor fold(const Tensor& input, const Shape& output_size, const Shape& kernel_size, const Shape& dilation = {1},
            const Shape& padding = {0}, const Shape& stride = {1});

// ---- activations with parameters (compositions of ops; gradients as PyTorch's at the kinks) ----
// x for x > 0, negative_slope * x otherwise (gradient negative_slope at 0).
Tensor leaky_relu(const Tensor& input, double negative_slope = 0.01);
// x for x > 0, alpha * (exp(x) - 1) otherwise.
Tensor elu(const Tensor& input, double alpha = 1.0);
// x clamped to [min_val, max_val]; the gradient is 0 at the bounds and outside, as PyTorch's.
Tensor hardtanh(const Tensor& input, double min_val = -1.0, double max_val = 1.0);
// log(1 + exp(beta x)) / beta, and x where beta x > threshold; softplus(x) is ops::softplus (beta 1,
// threshold 20).
Tensor softplus(const Tensor& input, double beta, double threshold = 20.0);
// The rest of torch.nn.functional's activations. At a kink the gradient is the one PyTorch's scalar
// CPU kernel gives (its vectorized path disagrees at a few points, noted where it does).
// min(max(x, 0), 6): hardtanh(input, 0, 6), gradient 0 at 0 and 6.
Tensor relu6(const Tensor& input);
// scale * elu(x, alpha) with alpha = 1.6732632423543772 and scale = 1.0507009873554805 (self-normalising).
Tensor selu(const Tensor& input);
// max(0, x) + min(0, alpha (exp(x / alpha) - 1)); alpha must not be 0.
Tensor celu(const Tensor& input, double alpha = 1.0);
// x tanh(softplus(x)).
Tensor mish(const Tensor& input);
// x relu6(x + 3) / 6. Gradient: 0 below -3, x / 3 + 1/2 on [-3, 3], 1 above (at exactly 3 PyTorch's
// vectorized kernel gives 1); hardswish(-inf) is 0, where PyTorch's formula gives -inf x 0 = NaN.
Tensor hardswish(const Tensor& input);
// relu6(x + 3) / 6, gradient 1/6 strictly inside (-3, 3) (PyTorch's 1/6 is a float32 constant, 3e-8 off).
Tensor hardsigmoid(const Tensor& input);
// x / (1 + |x|).
Tensor softsign(const Tensor& input);
// x - tanh(x).
Tensor tanhshrink(const Tensor& input);
// value where x <= threshold, x elsewhere (a NaN stays NaN and passes its gradient).
Tensor threshold(const Tensor& input, double threshold, double value);
// log(sigmoid(x)) = -softplus(-x), exact for all x (no threshold), gradient 1 - sigmoid(x).
Tensor logsigmoid(const Tensor& input);
// x where |x| > lambd, 0 elsewhere; NaN stays NaN and passes its gradient.
Tensor hardshrink(const Tensor& input, double lambd = 0.5);
// x - lambd where x > lambd, x + lambd where x < -lambd, 0 elsewhere; lambd >= 0. A NaN gives 0 and
// no gradient (PyTorch's vectorized kernel; its scalar one passes the gradient of that 0).
Tensor softshrink(const Tensor& input, double lambd = 0.5);
// x for x > 0, weight * x otherwise; weight holds one slope or one per channel (dim 1 of an input of
// 2 or more dims), as torch.nn.functional.prelu.
Tensor prelu(const Tensor& input, const Tensor& weight);
// a * sigmoid(b) where a and b are the two halves of input along dim (whose size must be even).
Tensor glu(const Tensor& input, int64_t dim = -1);
// softmax(-x, dim).
Tensor softmin(const Tensor& input, int64_t dim);
// Randomized leaky ReLU: while training each element x <= 0 is multiplied by its own slope drawn
// uniformly from [lower, upper) (from gen); otherwise leaky_relu with slope (lower + upper) / 2.
Tensor rrelu(const Tensor& input, double lower = 1.0 / 8, double upper = 1.0 / 3, bool train = false,
             Generator* gen = nullptr);

// ---- channel dropout (torch.nn.functional.dropout1d/2d/3d) ----
// Each channel (every element of one (sample, channel) plane) is zeroed with probability p, and the
// rest scaled by 1 / (1 - p); the identity when !train or p = 0. Inputs: dropout1d (C, L) or
// (N, C, L); dropout2d (N, C, H, W), or (N, C, L) as PyTorch 1.13 reads a 3-D input (it warns that
// this will become (C, H, W)); dropout3d (C, D, H, W) or (N, C, D, H, W).
Tensor dropout1d(const Tensor& input, double p = 0.5, bool train = true, Generator* gen = nullptr);
Tensor dropout2d(const Tensor& input, double p = 0.5, bool train = true, Generator* gen = nullptr);
Tensor dropout3d(const Tensor& input, double p = 0.5, bool train = true, Generator* gen = nullptr);

// ---- alpha dropout (torch.nn.functional.alpha_dropout, feature_alpha_dropout) ----
// Dropout for self-normalizing (SELU) networks: while training, each element (alpha_dropout), or all
// the elements of each (sample, channel) together (feature_alpha_dropout: dim 1 is the channel, inputs
// of at least 2 dims), is set with probability p to SELU's negative saturation -alpha' (alpha' =
// lambda alpha = 1.7580993408473766), and the result is scaled and shifted, a x + b with a = 1 /
// sqrt((alpha'^2 p + 1)(1 - p)) and b = a alpha' p, so that inputs of zero mean and unit variance keep
// them. The identity when !train or p = 0 (PyTorch's default is train = false); zeros at p = 1. The
// mask is dropout's: the same draws from gen as dropout of the mask's shape.
Tensor alpha_dropout(const Tensor& input, double p = 0.5, bool train = false, Generator* gen = nullptr);
Tensor feature_alpha_dropout(const Tensor& input, double p = 0.5, bool train = false, Generator* gen = nullptr);

// ---- bilinear (torch.nn.functional.bilinear) ----
// y[..., o] = sum over (i, j) of input1[..., i] weight[o, i, j] input2[..., j], plus bias[o]:
// input1 (*, in1), input2 (*, in2) with the same leading dims, weight (out, in1, in2), bias (out) or
// undefined; y (*, out).
Tensor bilinear(const Tensor& input1, const Tensor& input2, const Tensor& weight, const Tensor& bias = {});

// ---- fractional max pooling (torch.nn.functional.fractional_max_pool2d / 3d) ----
// The maximum of each window of kernel_size, the windows at pseudo-random starts (Note [fractional max
// pooling is a gather], nn/fractional_pool.cpp): output_size windows per dim, or the input's size times
// output_ratio rounded down (one of the two; one number for every dim, or one per dim). random_samples,
// (N, C, 2) or (N, C, 3) in [0, 1) (N = 1 for an unbatched input; PyTorch's _random_samples, whose
// first is the width's in 2-D, and the depth's in 3-D), fixes the starts; undefined, they are drawn from
// U[0, 1) with gen. Input (N, C, H, W) or (C, H, W); (N, C, D, H, W) or (C, D, H, W). The indices are
// int64 into each (n, c) plane, as max_pool2d_with_indices gives them.
std::tuple<Tensor, Tensor> fractional_max_pool2d_with_indices(const Tensor& input, const Shape& kernel_size,
                                                              const Shape& output_size = {},
                                                              const std::vector<double>& output_ratio = {},
                                                              const Tensor& random_samples = {},
                                                              Generator* gen = nullptr);
Tensor fractional_max_pool2d(const Tensor& input, const Shape& kernel_size, const Shape& output_size = {},
                             const std::vector<double>& output_ratio = {}, const Tensor& random_samples = {},
                             Generator* gen = nullptr);
std::tuple<Tensor, Tensor> fractional_max_pool3d_with_indices(const Tensor& input, const Shape& kernel_size,
                                                              const Shape& output_size = {},
                                                              const std::vector<double>& output_ratio = {},
                                                              const Tensor& random_samples = {},
                                                              Generator* gen = nullptr);
Tensor fractional_max_pool3d(const Tensor& input, const Shape& kernel_size, const Shape& output_size = {},
                             const std::vector<double>& output_ratio = {}, const Tensor& random_samples = {},
                             Generator* gen = nullptr);

// ---- max unpooling (torch.nn.functional.max_unpool1d/2d/3d) ----
// Max pooling's partial inverse: a zero tensor of the output size with each input value put at its
// index, as max_pool*d_with_indices gives them (int64, into the L, H * W or D * H * W elements of each
// (n, c) plane); differentiable in input (its gradient gathers the output's at the indices). The output
// size of each spatial dim is (in - 1) * stride - 2 * padding + kernel_size (stride unset: kernel_size),
// or output_size (the spatial sizes, or N, C and the spatial sizes), which must lie strictly between that
// size minus and plus the stride, as PyTorch's rule. Inputs (N, C, ...) or unbatched (C, ...); indices of
// the input's shape. An index outside its plane is an Error; where indices repeat, one of the values
// lands there and each gets that element's gradient.
Tensor max_unpool1d(const Tensor& input, const Tensor& indices, int64_t kernel_size,
                    std::optional<int64_t> stride = {}, int64_t padding = 0, const Shape& output_size = {});
// kernel_size, stride and padding: one number for both dims, or two (stride {}: kernel_size).
Tensor max_unpool2d(const Tensor& input, const Tensor& indices, const Shape& kernel_size, const Shape& stride = {},
                    const Shape& padding = {0}, const Shape& output_size = {});
// kernel_size, stride and padding: one number for all three dims, or three (stride {}: kernel_size).
Tensor max_unpool3d(const Tensor& input, const Tensor& indices, const Shape& kernel_size, const Shape& stride = {},
                    const Shape& padding = {0}, const Shape& output_size = {});

// ---- losses ----
struct CrossEntropyOptions {
  Tensor weight = {};          // (C): a rescaling weight per class
  int64_t ignore_index = -100;  // class-index targets equal to it contribute nothing
  std::string reduction = "mean";
  double label_smoothing = 0.0;  // in [0, 1]
};
// input (N, C) / (N, C, d1, ...) / (C) logits; target: class indices (N) / (N, d1, ...) / () of int64
// or int32, or class probabilities of the input's shape and a floating dtype. "mean" with class
// indices divides by the sum of the targets' weights (PyTorch's weighted mean); with probabilities
// by the number of samples.
Tensor cross_entropy(const Tensor& input, const Tensor& target, const CrossEntropyOptions& options = {});

struct NLLLossOptions {
  Tensor weight = {};
  int64_t ignore_index = -100;
  std::string reduction = "mean";
};
// input: log-probabilities (N, C) / (N, C, d1, ...) / (C); target: class indices.
Tensor nll_loss(const Tensor& input, const Tensor& target, const NLLLossOptions& options = {});

struct LossOptions {
  std::string reduction = "mean";
};
Tensor mse_loss(const Tensor& input, const Tensor& target, const LossOptions& options = {});
Tensor l1_loss(const Tensor& input, const Tensor& target, const LossOptions& options = {});

struct SmoothL1LossOptions {
  std::string reduction = "mean";
  double beta = 1.0;  // 0.5 d^2 / beta below beta, |d| - 0.5 beta above; beta = 0 is l1_loss
};
Tensor smooth_l1_loss(const Tensor& input, const Tensor& target, const SmoothL1LossOptions& options = {});

struct HuberLossOptions {
  std::string reduction = "mean";
  double delta = 1.0;  // 0.5 d^2 below delta, delta (|d| - 0.5 delta) above: delta * smooth_l1 with beta = delta
};
Tensor huber_loss(const Tensor& input, const Tensor& target, const HuberLossOptions& options = {});

struct KLDivLossOptions {
  std::string reduction = "mean";  // "batchmean" (the sum over the batch's first dim: the KL divergence),
                                   // "sum", "none", or "mean" (over every element, PyTorch's default)
  bool log_target = false;         // target given as log-probabilities
};
// input: log-probabilities; target: probabilities (or log-probabilities). Pointwise
// target * (log target - input), 0 where target is 0.
Tensor kl_div(const Tensor& input, const Tensor& target, const KLDivLossOptions& options = {});

struct BCELossOptions {
  Tensor weight = {};  // broadcasts to the input
  std::string reduction = "mean";
};
// input: probabilities in [0, 1]; the logs are clamped at -100, as PyTorch.
Tensor binary_cross_entropy(const Tensor& input, const Tensor& target, const BCELossOptions& options = {});

struct BCEWithLogitsLossOptions {
  Tensor weight = {};      // broadcasts to the input
  Tensor pos_weight = {};  // weight of the positive term, broadcast along the last (class) dim
  std::string reduction = "mean";
};
// sigmoid + binary cross-entropy in one numerically stable formula (no overflow for large |x|).
Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target,
                                        const BCEWithLogitsLossOptions& options = {});

// ---- margin, embedding and likelihood losses (compositions of ops: any device, differentiable twice) ----
// Each is PyTorch's formula; the input and target of one shape (Kiln does not broadcast losses), except
// margin_ranking_loss, which broadcasts as PyTorch's does.

// log(1 + exp(-target * input)), target +-1; computed as softplus, so that it stays finite where
// PyTorch's exp overflows (target * input below about -710 in float64).
Tensor soft_margin_loss(const Tensor& input, const Tensor& target, const LossOptions& options = {});

struct MarginRankingLossOptions {
  double margin = 0;
  std::string reduction = "mean";
};
// max(0, -target * (input1 - input2) + margin): target 1 asks input1 to rank above input2, -1 below.
// The three have one number of dims and broadcast.
Tensor margin_ranking_loss(const Tensor& input1, const Tensor& input2, const Tensor& target,
                           const MarginRankingLossOptions& options = {});

struct HingeEmbeddingLossOptions {
  double margin = 1;
  std::string reduction = "mean";
};
// input where target is not -1, plus max(0, margin - input) where target is not 1 (so both for a target
// other than +-1, as PyTorch). input: distances, target +-1 (similar / dissimilar).
Tensor hinge_embedding_loss(const Tensor& input, const Tensor& target, const HingeEmbeddingLossOptions& options = {});

struct CosineEmbeddingLossOptions {
  double margin = 0;
  std::string reduction = "mean";
};
// 1 - cos(input1, input2) where target is 1, max(0, cos - margin) where it is -1 (0 elsewhere). input1
// and input2 (N, D) with target (N), or (D) with a 0-d target; cos = <x1, x2> / sqrt((|x1|^2 + 1e-12)
// (|x2|^2 + 1e-12)), PyTorch's.
Tensor cosine_embedding_loss(const Tensor& input1, const Tensor& input2, const Tensor& target,
                             const CosineEmbeddingLossOptions& options = {});

struct MultiLabelSoftMarginLossOptions {
  Tensor weight = {};  // (C) or broadcasting to the input: a weight per class
  std::string reduction = "mean";
};
// input (N, C) or (C) logits, target of its shape in [0, 1]: the binary cross-entropy of each class
// (times weight), averaged over the C classes: a loss per sample, then reduced.
Tensor multilabel_soft_margin_loss(const Tensor& input, const Tensor& target,
                                   const MultiLabelSoftMarginLossOptions& options = {});

// input (N, C) or (C); target of its shape, int64 or int32: each row's class indices, ended by the first
// -1 (the rest is ignored). Per sample the sum over its target classes j and the other classes i of
// max(0, 1 - (x[j] - x[i])), divided by C.
Tensor multilabel_margin_loss(const Tensor& input, const Tensor& target, const LossOptions& options = {});

struct MultiMarginLossOptions {
  int64_t p = 1;  // 1 or 2
  double margin = 1;
  Tensor weight = {};  // (C): a weight per target class
  std::string reduction = "mean";
};
// input (N, C) or (C); target (N) class indices (int64 or int32; 0-d or (1) for a (C) input). Per sample
// sum over i != y of weight[y] max(0, margin - x[y] + x[i])^p, divided by C; the result has the
// target's shape before reduction. No gradient reaches weight (as PyTorch).
Tensor multi_margin_loss(const Tensor& input, const Tensor& target, const MultiMarginLossOptions& options = {});

struct TripletMarginLossOptions {
  double margin = 1;
  double p = 2;
  double eps = 1e-6;
  bool swap = false;  // also measure positive to negative and take the smaller distance
  std::string reduction = "mean";
};
// max(0, d(anchor, positive) - d(anchor, negative) + margin), d = pairwise_distance(p, eps); the three of
// one number of dims: (N, D) or (D).
Tensor triplet_margin_loss(const Tensor& anchor, const Tensor& positive, const Tensor& negative,
                           const TripletMarginLossOptions& options = {});

struct TripletMarginWithDistanceLossOptions {
  // d(x, y) -> the distance of each pair; pairwise_distance when empty.
  std::function<Tensor(const Tensor&, const Tensor&)> distance_function = {};
  double margin = 1;
  bool swap = false;
  std::string reduction = "mean";
};
Tensor triplet_margin_with_distance_loss(const Tensor& anchor, const Tensor& positive, const Tensor& negative,
                                         const TripletMarginWithDistanceLossOptions& options = {});

struct PoissonNLLLossOptions {
  bool log_input = true;  // the input is log(rate): exp(input) - target input; else input - target log(input + eps)
  bool full = false;      // add Stirling's target log(target) - target + 0.5 log(2 pi target) where target > 1
  double eps = 1e-8;
  std::string reduction = "mean";
};
Tensor poisson_nll_loss(const Tensor& input, const Tensor& target, const PoissonNLLLossOptions& options = {});

struct GaussianNLLLossOptions {
  bool full = false;  // add 0.5 log(2 pi)
  double eps = 1e-6;  // var is clamped to it from below (the gradient passes the clamp, as PyTorch's)
  std::string reduction = "mean";
};
// 0.5 (log(var) + (input - target)^2 / var). var: the input's shape, or it without the last dim, or with
// a last dim of 1 (one variance per row); no entry negative.
Tensor gaussian_nll_loss(const Tensor& input, const Tensor& target, const Tensor& var,
                         const GaussianNLLLossOptions& options = {});

struct CTCLossOptions {
  int64_t blank = 0;
  std::string reduction = "mean";  // "mean": each sample's loss over its target length (at least 1), then their mean
  bool zero_infinity = false;      // an impossible alignment's infinite loss becomes 0
};
// Connectionist temporal classification (Graves et al., 2006), as torch.nn.functional.ctc_loss: minus the
// log of the summed probability of every frame-wise path that collapses (repeats merged, blanks dropped)
// to the target. log_probs (T, N, C) or unbatched (T, C): log-softmax outputs over C classes, blank
// included; targets (N, S) padded, or 1-D holding the batch's targets one after another (unbatched: the
// one target);
// input_lengths and target_lengths (N) (unbatched: 0-d), integer tensors read on the host: frames used
// per sample (<= T) and target length. A composition of ops over the T frames (Note [ctc as ops] in
// nn/loss.cpp). Its gradient with respect to log_probs is the derivative; PyTorch's native one adds
// exp(log_probs), which a log_softmax's backward cancels, so through a log_softmax the two agree. An
// infinite loss (a target too long for its frames) passes no gradient (PyTorch's NaN).
Tensor ctc_loss(const Tensor& log_probs, const Tensor& targets, const Tensor& input_lengths,
                const Tensor& target_lengths, const CTCLossOptions& options = {});

// ---- distances ----
struct NormalizeOptions {
  double p = 2;
  int64_t dim = 1;
  double eps = 1e-12;
};
// input / max(||input||_p over dim, eps), as torch.nn.functional.normalize.
Tensor normalize(const Tensor& input, const NormalizeOptions& options = {});

struct CosineSimilarityOptions {
  int64_t dim = 1;
  double eps = 1e-8;
};
// sum over dim of (x1 / max(|x1|, eps)) (x2 / max(|x2|, eps)), x1 and x2 broadcast; PyTorch 1.13's
// formula and gradient (see Note [cosine similarity's clamped norm] in nn/loss.cpp).
Tensor cosine_similarity(const Tensor& x1, const Tensor& x2, const CosineSimilarityOptions& options = {});

struct PairwiseDistanceOptions {
  double p = 2;
  double eps = 1e-6;  // added to the difference
  bool keepdim = false;
};
// ||x1 - x2 + eps||_p over the last dim (of the one with more dims), x1 and x2 broadcast.
Tensor pairwise_distance(const Tensor& x1, const Tensor& x2, const PairwiseDistanceOptions& options = {});

}  // namespace functional
}  // namespace kiln::nn
