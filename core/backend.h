// core/backend.h: the kernel contract every device backend implements (cpu/, cuda/).
//
// A kernel sees raw strided views and a stream, never a Tensor: no autograd, no shape rules, no
// allocation. ops/ has already checked the arguments, broadcast the inputs (a broadcast dim has
// stride 0), promoted dtypes and allocated the output; kernels only compute. Strides are in
// elements and may be 0 (broadcast) or negative (flip). See docs/tensors-and-autograd.md.
//
// ops/dispatch.cpp is the one place that picks a backend for a device.
#pragma once

#include <cstdint>
#include <vector>

#include "core/allocator.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/scalar.h"
#include "core/shape.h"

namespace kiln {

// A tensor as a kernel sees it: a pointer to element 0, the dtype, sizes and strides.
struct View {
  void* data = nullptr;
  DType dtype = kFloat32;
  Shape sizes;
  Shape strides;

  int ndim() const { return sizes.size(); }
  int64_t numel() const { return sizes.numel(); }
  bool is_contiguous() const;  // row-major with no gaps (size-1 dims may have any stride)
  template <typename T> T* ptr() const { return static_cast<T*>(data); }
};

// How a BLAS library can read a (rows x cols) matrix with element strides (rs, cs): row-major
// (transposed = false, leading dimension ld between rows) or column-major (transposed = true, ld
// between columns). False when it has neither layout (two non-unit strides): copy it first. Size-1
// dims may have any stride. Used by the GEMMs of cpu/matmul.cpp and cuda/matmul.cu.
inline bool blas_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs, bool& transposed, int64_t& ld) {
  const int64_t min_cols = cols > 1 ? cols : 1, min_rows = rows > 1 ? rows : 1;
  if (cs == 1 || cols == 1) {
    ld = rows == 1 ? min_cols : rs;
    if (ld >= min_cols) {
      transposed = false;
      return true;
    }
  }
  if (rs == 1 || rows == 1) {
    ld = cols == 1 ? min_rows : cs;
    if (ld >= min_rows) {
      transposed = true;
      return true;
    }
  }
  return false;
}

// A device's work queue; the CPU runs everything in order and ignores it.
struct Stream {
  Device device;
  void* handle = nullptr;  // cudaStream_t on CUDA
};

enum class UnaryOp : uint8_t {
  Neg, Abs, Sign, Exp, Log, Log1p, Expm1, Sqrt, Rsqrt, Reciprocal, Sin, Cos, Tanh, Sigmoid,
  Relu, GeluErf, GeluTanh, Silu, Softplus, Erf, Square,
  PowScalar,  // x^a            (args.a)
  Clamp,      // min(max(x, a), b) with a = -inf / b = +inf meaning "no bound"
  Floor, Ceil, Trunc,
  Round,       // to the nearest integer, halves to even (PyTorch's round)
  BitwiseNot,  // integers only
  LogicalNot,  // output bool
  Tan, Asin, Acos, Atan, Sinh, Cosh, Asinh, Acosh, Atanh, Log2, Log10, Exp2,
  Erfc, Erfinv, Lgamma, Digamma,
  Polygamma,  // the a-th derivative of digamma, a >= 1 (core/special_math.h)
  // torch.special's (core/special_math.h): e^(x^2) erfc(x), the normal distribution's cdf, its log and
  // its quantile, -x log x; and (core/bessel_math.h) I0, I1 and their e^-|x| scalings, J0, J1, Y0, Y1,
  // K0, K1 and their e^x scalings, and the spherical j0, sin(x) / x.
  Erfcx, Ndtr, LogNdtr, Ndtri, Entr,
  I0, I0e, I1, I1e, BesselJ0, BesselJ1, BesselY0, BesselY1, BesselK0, BesselK1, BesselK0e, BesselK1e,
  SphericalBesselJ0,
  AiryAi, AiryAiPrime,  // Airy's Ai and its derivative (core/bessel_math.h)
};
struct UnaryArgs {
  double a = 0, b = 0;
};

enum class BinaryOp : uint8_t {
  Add, Sub,  // a + alpha * b, a - alpha * b
  Mul, Div, Pow, Maximum, Minimum,
  GeluErfBackward, GeluTanhBackward,  // a * gelu'(b): the gradient a of gelu at the input b, in one pass
  ReluBackward,                       // b > 0 ? a : 0: the gradient a of relu at its output b (threshold_backward)
  Remainder,    // a - floor(a / b) * b: the sign of b (Python's %, PyTorch's remainder)
  Fmod,         // a - trunc(a / b) * b: the sign of a (C's fmod)
  FloorDivide,  // floor(a / b)
  TruncDivide,  // trunc(a / b) (C's integer division)
  BitwiseAnd, BitwiseOr, BitwiseXor,  // integers only
  // (Integer divisors are never 0 here: ops/ checks. ops/ sends the bitwise ops integers only.)
  Atan2, Hypot, Copysign,  // floating only (ops/ promotes integers), as the three below
  LogAddExp,               // log(e^a + e^b), a when a = b = +-inf
  LogAddExp2,              // log2(2^a + 2^b)
  Xlogy,                   // a log b, 0 where a = 0 unless b is NaN
  Xlog1py,                 // a log1p(b), 0 where a = 0 unless b is NaN
  Zeta,                    // Hurwitz's zeta(a, b) (core/special_math.h)
  Gammainc, Gammaincc,     // the regularized incomplete gamma functions P(a, b), Q(a, b)
  // The orthogonal polynomials p_n(a) of degree n = the whole part of b, and their shifted forms p_n(2a - 1)
  // (core/polynomial_math.h). alpha is the order of the derivative taken: 0 for p_n itself.
  ChebyshevT, ChebyshevU, ChebyshevV, ChebyshevW, ShiftedChebyshevT, ShiftedChebyshevU, ShiftedChebyshevV,
  ShiftedChebyshevW, HermiteH, HermiteHe, LaguerreL, LegendreP,
  Eq, Ne, Lt, Le, Gt, Ge, LogicalAnd, LogicalOr,  // output bool
};
constexpr bool is_comparison(BinaryOp op) { return op >= BinaryOp::Eq; }

// Three operands a, b, c and a number v (PyTorch's addcmul, addcdiv and lerp):
enum class TernaryOp : uint8_t {
  Addcmul,     // a + v * b * c
  Addcdiv,     // a + v * (b / c)   (floating types only)
  Lerp,        // a + c * (b - a), weight c; for |c| >= 0.5 b - (b - a) * (1 - c), as PyTorch
  LerpScalar,  // Lerp with the weight v (c is not read)
};

enum class ReduceKind : uint8_t { Sum, Prod, Max, Min, ArgMax, ArgMin, All, Any };

// The running reductions of Backend::scan (PyTorch's cumsum, cumprod, cummax, cummin, logcumsumexp).
enum class ScanKind : uint8_t { Sum, Prod, Max, Min, LogSumExp };

enum class RandomKind : uint8_t {
  Uniform,    // U[a, b)
  Normal,     // N(a, b^2)
  Randint,    // integers in [low, low + range)
  Bernoulli,  // 1 with probability a
};

// The parameters of a draw. Uniform, Normal and Bernoulli read a and b; Randint reads low and range
// (range = high - low >= 1), integers so that int64 bounds beyond 2^53 stay exact. The output may
// be part of a larger draw (ops::dropout_part): element i of the output is element draw_index(i) of
// the draw (Note [random element mapping]): first + i, or with run > 0, runs of `run` consecutive
// elements `stride` apart, first + (i / run) stride + i % run.
struct RandomArgs {
  double a = 0, b = 0;
  int64_t low = 0;
  uint64_t range = 0;
  uint64_t first = 0, run = 0, stride = 0;
  KILN_HOST_DEVICE uint64_t draw_index(uint64_t i) const {
    return run == 0 ? first + i : first + (i / run) * stride + i % run;
  }
};

// The geometry of a 2-D convolution (per dim: h, w), and of a 3-D one with its depth (d), which
// only the 5-D views of a 3-D convolution read.
struct ConvArgs {
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dilation_h = 1, dilation_w = 1;
  int64_t groups = 1;
  int64_t stride_d = 1, pad_d = 0, dilation_d = 1;
};

// The geometry of a 2-D pooling window. Window (oh, ow) covers input rows
// oh * stride_h - pad_h + i * dilation_h for i in [0, kernel_h), likewise columns.
struct Pool2dArgs {
  int64_t kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  int64_t dilation_h = 1, dilation_w = 1;  // max pooling only
  bool count_include_pad = true;           // avg pooling: padded positions count in the divisor
  int64_t divisor = 0;                     // avg pooling: divide by this instead (0: none)
};

// One Adam / AdamW step, fused: for each index i of the lists, p = params[i] with its grad g and its
// state m = exp_avgs[i], v = exp_avg_sqs[i] (and vmax = max_exp_avg_sqs[i] with amsgrad), all
// contiguous views of one shape and one floating dtype, elementwise:
//   g = maximize ? -g : g;  decoupled ? p *= 1 - lr * weight_decay : g += weight_decay * p
//   m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g * g;  vmax = max(vmax, v)
//   p -= step_size * m / (sqrt(amsgrad ? vmax : v) / bias_correction2_sqrt + eps)
// (optim/adam.h; step_size = lr / (1 - beta1^t), bias_correction2_sqrt = sqrt(1 - beta2^t)).
struct AdamStepArgs {
  double lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
  double step_size = 0, bias_correction2_sqrt = 1;
  bool decoupled = false, amsgrad = false, maximize = false;
};

// One SGD step, fused: for each index i of the lists, p = params[i] with its grad g and, with a
// momentum, its buffer buf = momentum_buffers[i], all contiguous views of one shape and one
// floating dtype, elementwise (optim/sgd.h; in the unfused step's order, so both round alike):
//   g = maximize ? -g : g;  g = g + weight_decay * p                (when weight_decay != 0)
//   with momentum: buf = first_step ? g : buf * momentum + (1 - dampening) * g
//                  g = nesterov ? g + momentum * buf : buf
//   p = p + (-lr) * g
// first_step: the buffers are new (their contents are ignored and overwritten).
struct SgdStepArgs {
  double lr = 0, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false, maximize = false, first_step = false;
};

// Scaled dot-product attention without a mask tensor (ops/attention.cpp): scores = scale * q k^T, and
// when causal, query row i sees key columns j <= i only (PyTorch's is_causal: the mask is
// tril(ones(L, S)), aligned at the top left).
// With dropout > 0 (the CPU kernels only), probability (z, i, j) of slice z = (batch, head) is kept,
// times 1 / (1 - dropout), where element mask_index(z, i, j) of a Bernoulli(1 - dropout) draw from
// (seed, offset) is 1 (Note [random element mapping] in core/generator.h): the element ops::dropout
// draws for it on the whole (..., L, S) probabilities. The slices' heads may be heads
// [first_head, first_head + heads) of whole_heads (ops::scaled_dot_product_attention_part): slice z
// is then head first_head + z % heads of batch z / heads of a draw over all whole_heads heads.
struct AttentionArgs {
  double scale = 1;
  bool causal = false;
  double dropout = 0;
  uint64_t seed = 0, offset = 0;
  int64_t heads = 1, first_head = 0, whole_heads = 1;
  KILN_HOST_DEVICE uint64_t mask_index(int64_t z, int64_t i, int64_t j, int64_t L, int64_t S) const {
    const int64_t slice = (z / heads) * whole_heads + first_head + z % heads;
    return static_cast<uint64_t>((slice * L + i) * S + j);
  }
};

// An attention operand (Backend::attention below) as the CPU and CUDA kernels read it: B x H
// matrices of contiguous columns; slice z of the (batch, head) pairs starts at slice(z), its rows ld
// apart (a one-row slice's ld is its row length, whatever the stride says).
template <typename T>
struct AttentionHeads {
  T* data;
  int64_t heads, sb, sh, ld;
  KILN_HOST_DEVICE T* slice(int64_t z) const { return data + (z / heads) * sb + (z % heads) * sh; }
};
template <typename T>
AttentionHeads<T> attention_heads(const View& v) {  // v: (B, H, rows, cols)
  return {static_cast<T*>(v.data), v.sizes[1], v.strides[0], v.strides[1], v.sizes[2] > 1 ? v.strides[2] : v.sizes[3]};
}

class Backend {
 public:
  virtual ~Backend() = default;

  // -- memory --
  virtual Allocator& allocator(int device_index) = 0;
  virtual Stream current_stream(int device_index) = 0;
  virtual void synchronize(int device_index) = 0;
  // dst = src, converting dtype; src is broadcast to dst's shape. Either side may be on the CPU when
  // this is a device backend (host <-> device copies are the device backend's job).
  virtual void copy(const View& src, Device src_device, const View& dst, Device dst_device,
                    const Stream& s) = 0;
  // copy(), but allowed to return before the copy has finished where that is safe (PyTorch's
  // non_blocking=true): the CUDA backend does so between pinned host memory and a device (Note
  // [non_blocking copies] in cuda/copy.cpp). Backends without asynchronous copies just copy.
  virtual void copy_non_blocking(const View& src, Device src_device, const View& dst, Device dst_device,
                                 const Stream& s) {
    copy(src, src_device, dst, dst_device, s);
  }
  // The allocator of pinned host memory for this backend's devices (a CPU device's memory, which
  // Tensor::pin_memory() and TensorOptions::pinned_memory(true) take), or nullptr if it has none.
  virtual Allocator* host_allocator() { return nullptr; }
  virtual void fill(const View& out, const Scalar& value, const Stream& s) = 0;
  // out[i] = start + i * step along the flattened (contiguous) out.
  virtual void arange(const View& out, double start, double step, const Stream& s) = 0;
  // See Note [random element mapping] in core/generator.h.
  virtual void random(RandomKind kind, const View& out, uint64_t seed, uint64_t offset,
                      const RandomArgs& args, const Stream& s) = 0;

  // -- elementwise: inputs already have out's shape (stride 0 where broadcast) and dtype (but the
  //    bool outputs of comparisons and LogicalNot) --
  virtual void unary(UnaryOp op, const View& in, const View& out, UnaryArgs args,
                     const Stream& s) = 0;
  virtual void binary(BinaryOp op, const View& a, const View& b, const View& out, double alpha,
                      const Stream& s) = 0;
  virtual void where(const View& cond, const View& a, const View& b, const View& out,
                     const Stream& s) = 0;
  // out = op(a, b, c, v): one dtype throughout (floating for Addcdiv and the Lerps), computed in
  // opmath_t; out may be a (the in-place forms).
  virtual void ternary(TernaryOp op, const View& a, const View& b, const View& c, const View& out, double v,
                       const Stream& s) = 0;

  // -- reductions: out has in's rank with size 1 in each reduced dim; ArgMax/ArgMin write int64
  //    and reduce exactly one dim (or the whole tensor, flattened, when out has one element) --
  virtual void reduce(ReduceKind op, const View& in, const View& out, const Stream& s) = 0;

  // -- linear algebra: c[..., M, N] = a[..., M, K] @ b[..., K, N]; batch dims already broadcast --
  virtual void matmul(const View& a, const View& b, const View& c, const Stream& s) = 0;
  // c[M, N] = a[M, K] @ b[K, N] + bias[N] (bias added to every row) in one call, the bias added in
  // the GEMM's epilogue, where the backend has such a kernel for these operands (cuBLASLt on CUDA:
  // Note [cuBLASLt bias epilogue] in cuda/matmul.cu). Returns false, having done nothing, where it
  // has none; the caller then composes matmul and add. 2-D views of one dtype, bias 1-D.
  virtual bool matmul_bias(const View& a, const View& b, const View& bias, const View& c, const Stream& s) {
    (void)a, (void)b, (void)bias, (void)c, (void)s;
    return false;
  }
  // c[M, N] = gelu_tanh(a @ b + bias) and pre[M, N] = a @ b + bias (the GELU's input, which the
  // backward needs) from one GEMM, both written in its epilogue (cuBLASLt's GELU_AUX_BIAS on CUDA:
  // Note [cuBLASLt GELU epilogue] in cuda/matmul.cu). GELU in its tanh form only, the one cuBLASLt
  // has. Returns false, having done nothing, where the backend has no such kernel; the caller
  // (ops::addmm_gelu) then composes. 2-D views of one dtype, bias 1-D, c and pre contiguous.
  virtual bool matmul_bias_gelu(const View& a, const View& b, const View& bias, const View& c, const View& pre,
                                const Stream& s) {
    (void)a, (void)b, (void)bias, (void)c, (void)pre, (void)s;
    return false;
  }

  // -- softmax along `dim` (log_softmax when log is true) --
  virtual void softmax(const View& in, const View& out, int dim, bool log, const Stream& s) = 0;
  // The gradient of softmax (log_softmax when log) along `dim` from its output y and the output's
  // gradient g, in one pass over each row: out = y * (g - sum(g * y)), or g - exp(y) * sum(g). y,
  // g and out have one shape and one floating dtype (g may be broadcast: stride 0); the row sums
  // are taken in opmath_t.
  virtual void softmax_backward(const View& y, const View& g, const View& out, int dim, bool log,
                                const Stream& s) = 0;

  // -- indexing: index is int64; out[..., i, ...] = in[..., index[i], ...] along dim --
  virtual void index_select(const View& in, int dim, const View& index, const View& out,
                            const Stream& s) = 0;
  // out[..., index[i], ...] += src[..., i, ...] along dim
  virtual void index_add(const View& out, int dim, const View& index, const View& src,
                         const Stream& s) = 0;
  // out[i][j] = in[i][index[i][j]] (dim 1; likewise for any dim); index has out's shape
  virtual void gather(const View& in, int dim, const View& index, const View& out,
                      const Stream& s) = 0;
  // out[i][index[i][j]] = src[i][j] (or += when accumulate)
  virtual void scatter(const View& out, int dim, const View& index, const View& src,
                       bool accumulate, const Stream& s) = 0;

  // -- convolution: NCHW, every view contiguous, floating dtypes; input (N, C_in, H, W), weight
  //    (C_out, C_in / groups, kH, kW), out (N, C_out, H_out, W_out) with PyTorch's output size;
  //    bias (C_out) or data == nullptr for none. Group g maps input channels
  //    [g * C_in/groups, (g+1) * C_in/groups) to output channels likewise. A backend whose
  //    conv3d_kernels() is true also takes 5-D views, NCDHW, with the weight (C_out, C_in / groups,
  //    kD, kH, kW) and the depth's fields of ConvArgs: a 3-D convolution; ops composes one from 2-D
  //    convolutions on the others (Note [conv3d as conv2d] in ops/conv.cpp) --
  virtual void conv(const View& input, const View& weight, const View& bias, const View& out, const ConvArgs& args,
                    const Stream& s) = 0;
  // grad_input (N, C_in, H, W) = d<grad_out, conv(input, weight)> / d input (overwritten)
  virtual void conv_backward_input(const View& grad_out, const View& weight, const View& grad_input,
                                   const ConvArgs& args, const Stream& s) = 0;
  // grad_weight (C_out, C_in / groups, kH, kW) = d<grad_out, conv(input, weight)> / d weight
  virtual void conv_backward_weight(const View& grad_out, const View& input, const View& grad_weight,
                                    const ConvArgs& args, const Stream& s) = 0;
  virtual bool conv3d_kernels() const { return false; }

  // -- pooling over the last two dims of contiguous (N, C, H, W) views (N * C planes) --
  // out: the max of each window (padding never wins; NaN wins), indices (int64, out's shape): its
  // position h * W + w in the input plane.
  virtual void max_pool2d(const View& in, const View& out, const View& indices, const Pool2dArgs& args,
                          const Stream& s) = 0;
  // grad_in = 0, then grad_in[plane][indices[plane][i]] += grad_out[plane][i]
  virtual void max_pool2d_backward(const View& grad_out, const View& indices, const View& grad_in,
                                   const Stream& s) = 0;
  // out: the sum of each window (clipped to the input) over PyTorch's divisor: args.divisor if
  // nonzero, else the window size clipped to the padded input (count_include_pad) or to the input.
  virtual void avg_pool2d(const View& in, const View& out, const Pool2dArgs& args, const Stream& s) = 0;
  virtual void avg_pool2d_backward(const View& grad_out, const View& grad_in, const Pool2dArgs& args,
                                   const Stream& s) = 0;  // grad_in overwritten
  // Output element i of a dim of size in -> out averages [floor(i * in / out), ceil((i + 1) * in / out)).
  virtual void adaptive_avg_pool2d(const View& in, const View& out, const Stream& s) = 0;
  virtual void adaptive_avg_pool2d_backward(const View& grad_out, const View& grad_in,
                                            const Stream& s) = 0;  // grad_in overwritten
  // out: the max of each adaptive window (as adaptive_avg_pool2d's; NaN wins, and a later value wins
  // only when larger or NaN), indices: its position h * W + w in the plane. The backward is max_pool2d's.
  virtual void adaptive_max_pool2d(const View& in, const View& out, const View& indices, const Stream& s) = 0;

  // -- the fused Adam/AdamW step over lists of same-dtype views (ops/optim.cpp) --
  virtual void adam_step(const std::vector<View>& params, const std::vector<View>& grads,
                         const std::vector<View>& exp_avgs, const std::vector<View>& exp_avg_sqs,
                         const std::vector<View>& max_exp_avg_sqs, const AdamStepArgs& args,
                         const Stream& s) = 0;  // max_exp_avg_sqs empty unless amsgrad
  // -- the fused SGD step over lists of same-dtype views (ops/optim.cpp) --
  virtual void sgd_step(const std::vector<View>& params, const std::vector<View>& grads,
                        const std::vector<View>& momentum_buffers, const SgdStepArgs& args,
                        const Stream& s) = 0;  // momentum_buffers empty when args.momentum == 0

  // -- normalisation of each row of a contiguous (R, M) view: mean[r] and rstd[r] = 1 / sqrt(var[r] +
  //    eps) (biased variance), out = (in - mean) * rstd. rms: mean = 0 and var = mean(in^2) (RMSNorm).
  //    mean and rstd are (R) in in's dtype --
  virtual void norm_rows(const View& in, const View& out, const View& mean, const View& rstd, double eps,
                         bool rms, const Stream& s) = 0;

  // -- fused kernels, which ops use while fusion is on (set_fusion in ops/ops.h; each is tested equal to
  //    the composition it replaces). Every view is contiguous and of one floating dtype (float32 or
  //    float64), apart from target (int64); a view with data == nullptr is absent. Column sums over rows
  //    (grad_weight, grad_bias) are added in an order fixed by the shape alone, so they do not depend
  //    on the thread count --
  // LayerNorm / RMSNorm with its affine, on (R, M) rows, residual-add first when residual is given:
  //   h = x (+ residual, and then h is written to sum);  mean, rstd (R) of h as norm_rows;
  //   out = (h - mean) * rstd * weight + bias         (weight, bias (M); each optional)
  virtual void layer_norm(const View& x, const View& residual, const View& weight, const View& bias,
                          const View& out, const View& sum, const View& mean, const View& rstd, double eps,
                          bool rms, const Stream& s) = 0;
  // From h, mean and rstd of the forward and grad_out: grad_in = d<grad_out, out>/dh, plus grad_sum
  // where given (the gradient that reached h directly: the residual stream's); grad_weight and
  // grad_bias (M) = the column sums of grad_out * xhat and of grad_out, where given. All overwritten.
  virtual void layer_norm_backward(const View& grad_out, const View& grad_sum, const View& h,
                                   const View& weight, const View& mean, const View& rstd, const View& grad_in,
                                   const View& grad_weight, const View& grad_bias, bool rms,
                                   const Stream& s) = 0;
  // out = gelu(in + bias) on (R, N) rows, bias (N); erf form, or tanh form when tanh.
  virtual void bias_gelu(const View& in, const View& bias, const View& out, bool tanh, const Stream& s) = 0;
  // grad_in = grad_out * gelu'(in + bias); grad_bias (N) = the column sums of grad_in, where given.
  virtual void bias_gelu_backward(const View& grad_out, const View& in, const View& bias, const View& grad_in,
                                  const View& grad_bias, bool tanh, const Stream& s) = 0;
  // Cross-entropy of the rows of logits (R, C) with class indices target (R), label smoothing eps:
  //   lse[r] = logsumexp(logits[r]);  loss[r] = lse - (1 - eps) logits[r][t] - eps / C sum_c logits[r][c],
  //   and loss[r] = 0 where target[r] == ignore_index. A target outside [0, C) otherwise is an Error.
  //   float16 and bfloat16 logits are computed in float32: their loss and lse (and in the backward
  //   grad_loss) are float32, their grad_logits of their own dtype; float32 and float64 keep theirs.
  virtual void cross_entropy(const View& logits, const View& target, const View& loss, const View& lse,
                             int64_t ignore_index, double label_smoothing, const Stream& s) = 0;
  // grad_logits[r][c] = grad_loss[r] * (exp(logits[r][c] - lse[r]) - (1 - eps) [c == t] - eps / C), and 0
  // on ignored rows.
  virtual void cross_entropy_backward(const View& logits, const View& target, const View& lse,
                                      const View& grad_loss, const View& grad_logits, int64_t ignore_index,
                                      double label_smoothing, const Stream& s) = 0;

  // CTC (Graves et al., 2006) of each sample n of log_probs (T, N, C), float32 or float64, with targets
  //   (N, S) int64 whose first target_lengths[n] columns are sample n's labels (class indices), and
  //   input_lengths, target_lengths (N) int64 in [0, T] and [0, S] (ops/ctc.cpp has checked them all).
  //   Over the extended target l' = (blank, l_1, blank, l_2, ..., blank) of L_n = 2 target_lengths[n]
  //   + 1 states, with T_n = input_lengths[n]:
  //     log_alpha[n][t][s] = log of the probability of the alignments of frames 0..t that end in state s
  //       (for t < T_n and s < L_n; the other entries are not written);
  //     nll[n] = -log(alpha[T_n - 1][L_n - 1] + alpha[T_n - 1][L_n - 2]), +inf where no alignment
  //       exists, 0 for an empty target without frames.
  //   nll (N) and log_alpha (N, T, 2 S + 1) are of log_probs' dtype, every view contiguous.
  virtual void ctc_loss(const View& log_probs, const View& targets, const View& input_lengths,
                        const View& target_lengths, const View& nll, const View& log_alpha, int64_t blank,
                        const Stream& s) = 0;
  // From the forward's views and grad_nll (N): grad_log_probs[t][n][c] = -grad_nll[n] exp(log(sum over
  //   states s with l'[s] = c of alpha[t][s] beta[t][s]) + nll[n] - log_probs[t][n][c]) for t < T_n,
  //   beta the same recursion run from the last frame back (into log_beta, (N, T, 2 S + 1) scratch), and
  //   0 on the other frames and for a sample whose nll is +inf. grad_log_probs is overwritten.
  virtual void ctc_loss_backward(const View& grad_nll, const View& log_probs, const View& targets,
                                 const View& input_lengths, const View& target_lengths, const View& nll,
                                 const View& log_alpha, const View& log_beta, const View& grad_log_probs,
                                 int64_t blank, const Stream& s) = 0;

  // -- attention over (B, H, rows, cols) views of one floating dtype: q (B, H, L, E), k (B, H, S, E),
  //    v (B, H, S, Ev), out (B, H, L, Ev) = softmax(scores) v row by row (the probabilities dropped
  //    and scaled first where args.dropout > 0), never holding a whole (L, S) score matrix, and lse
  //    (B, H, L), contiguous, = the log-sum-exp of each score row, which with the mask's draw is all
  //    the backward needs to rebuild the probabilities: p[i][j] = exp(score[i][j] - lse[i]); lse is
  //    float32 when q is 16-bit. Every view but lse may have any strides on its first three dims (the
  //    heads of a (B, T, 3 C) projection read in place, an output written as (B, L, H, Ev): Note
  //    [attention layout] in ops/attention.cpp); its last dim has stride 1 and its rows do not
  //    overlap. The CPU takes float32, float64 and bfloat16, with or without dropout; CUDA float16,
  //    bfloat16 and float32 with Ev = E in {32, 64, 96, 128}, 16-bit rows starting on 16-byte
  //    boundaries, and no dropout --
  virtual void attention(const View& q, const View& k, const View& v, const View& out, const View& lse,
                         const AttentionArgs& args, const Stream& s) = 0;
  // The gradients of <grad_out, out> with respect to q, k and v (each overwritten), from the forward's
  // inputs, its out and lse.
  virtual void attention_backward(const View& q, const View& k, const View& v, const View& out,
                                  const View& lse, const View& grad_out, const View& grad_q,
                                  const View& grad_k, const View& grad_v, const AttentionArgs& args,
                                  const Stream& s) = 0;

  // ---- sorting and scanning (cpu/sort.cpp, cuda/sort.cu) ----
  // Along dim `dim` of in, any strides: each line of in (all other dims fixed) is ordered ascending,
  // or descending, and its first k = values.sizes[dim] elements written to values (in's dtype) and
  // their positions in the line to indices (int64); values and indices have in's sizes but k along
  // dim, 0 < k <= n. The order is total and so stable: NaN above every number (last ascending, first
  // descending, as PyTorch's sort), and equal keys (0 and -0 too) in increasing position. A line
  // whose first k are asked for gets the first k of its full sort (topk).
  virtual void sort(const View& in, int dim, bool descending, const View& values, const View& indices,
                    const Stream& s) = 0;
  // The element of rank k - 1 (1 <= k <= n) in each line's ascending order above, and its position:
  // values and indices have in's sizes but 1 along dim (PyTorch's kthvalue with keepdim; median).
  virtual void kthvalue(const View& in, int dim, int64_t k, const View& values, const View& indices,
                        const Stream& s) = 0;
  // Along dim `dim`: out[..., j, ...] = the reduction of in[..., 0..j, ...], out of in's sizes and
  // dtype (any strides; ops/ converts integer inputs to int64 for Sum and Prod unless a dtype is asked
  // for), summed and multiplied in double (float32 and float64), float (16-bit), or the integer type
  // itself, wrapping as two's complement. Max and Min also
  // write the position of the running extreme to indices (int64): the latest position whose value is
  // >= the running max (<= min), a NaN taking over and staying until the next NaN, as PyTorch's
  // cummax/cummin; indices is ignored otherwise. LogSumExp: log(sum exp), floating dtypes only.
  virtual void scan(ScanKind kind, const View& in, int dim, const View& out, const View& indices,
                    const Stream& s) = 0;
  // Binary search along rows: for each element v of row b of values (B, n), the position in row b
  // of sorted (B, m), or in its only row when it has one (1, m), where v would go to keep the row in
  // order: the first position whose element is not below v (>= v), or with right the first above
  // it (> v), m when there is none, written to out (B, n; int64 or int32). Every view contiguous,
  // sorted and values of one dtype. The search halves [0, m) exactly as PyTorch's does, stepping right
  // while !(element >= v) (!(element > v) with right), so a NaN value lands at m and NaN elements at
  // a row's end compare as PyTorch's do.
  virtual void searchsorted(const View& sorted, const View& values, bool right, const View& out,
                            const Stream& s) = 0;

  // ---- selection (cpu/index.cpp, cuda/index.cu) ----
  // The flat positions of mask's true elements (mask bool and contiguous), in increasing order, into
  // out (int64, contiguous), which has exactly as many elements as mask has true ones (ops/ counts
  // them first: torch.nonzero's output size depends on the values).
  virtual void nonzero(const View& mask, const View& out, const Stream& s) = 0;
};

}  // namespace kiln
