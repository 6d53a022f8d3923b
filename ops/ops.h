// ops/ops.h: every op Kiln has, as free functions (namespace kiln, also spelled kiln::ops).
//
// Each op checks its arguments, broadcasts, promotes dtypes (PyTorch's rules), allocates its output,
// calls its device's backend (ops/dispatch.cpp) and, when an input requires grad, records a node
// whose backward formula is written beside the forward with these same functions. Sections follow
// the .cpp files that define them. Tensor's methods (core/tensor.h) forward here.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "core/allocator.h"
#include "core/backend.h"
#include "core/generator.h"
#include "core/tensor.h"

namespace kiln {
inline namespace ops {

// ---- factories.cpp ----
Tensor empty(const Shape& shape, TensorOptions options = {});
Tensor zeros(const Shape& shape, TensorOptions options = {});
Tensor ones(const Shape& shape, TensorOptions options = {});
Tensor full(const Shape& shape, const Scalar& value, TensorOptions options = {});
Tensor scalar_tensor(const Scalar& value, TensorOptions options = {});  // 0-dimensional
// [0, end); the dtype, unless given, is int64 for integer arguments and float32 for float ones.
Tensor arange(const Scalar& end, std::optional<DType> dtype = {}, Device device = Device::cpu());
Tensor arange(const Scalar& start, const Scalar& end, const Scalar& step = 1,
              std::optional<DType> dtype = {}, Device device = Device::cpu());
Tensor linspace(double start, double end, int64_t steps, TensorOptions options = {});
Tensor eye(int64_t n, std::optional<int64_t> m = {}, TensorOptions options = {});
Tensor rand(const Shape& shape, TensorOptions options = {}, Generator* gen = nullptr);   // U[0, 1)
Tensor randn(const Shape& shape, TensorOptions options = {}, Generator* gen = nullptr);  // N(0, 1)
Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions options = kInt64,
               Generator* gen = nullptr);
Tensor randperm(int64_t n, TensorOptions options = kInt64, Generator* gen = nullptr);
Tensor bernoulli(const Shape& shape, double p, TensorOptions options = {}, Generator* gen = nullptr);
// ---- dropout (in the random section) ----
// Zeroes each element with probability p (a bernoulli(1 - p) mask from gen) and scales the rest by
// 1 / (1 - p); train = false or p = 0 returns the input itself, p = 1 gives zeros.
Tensor dropout(const Tensor& input, double p = 0.5, bool train = true, Generator* gen = nullptr);
// dropout of a part of a larger tensor: input holds indices [start, start + input.size(dim)) of
// dim of a tensor that is `whole` long there and the same elsewhere. Its mask is that part of the
// mask dropout would draw for the whole tensor from gen's state, and gen advances as for the whole.
// So ranks that each hold a part of one activation (tensor or sequence parallelism) drop what one
// process drops, and their generators stay in step (Note [random element mapping], core/generator.h).
// A cut that does not fit is an Error in evaluation (train = false) too.
Tensor dropout_part(const Tensor& input, double p, bool train, int64_t dim, int64_t start, int64_t whole,
                    Generator* gen = nullptr);
Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor full_like(const Tensor& t, const Scalar& value);
Tensor rand_like(const Tensor& t, Generator* gen = nullptr);
Tensor randn_like(const Tensor& t, Generator* gen = nullptr);
Tensor randint_like(const Tensor& t, int64_t low, int64_t high, Generator* gen = nullptr);
// From data: tensor({1, 2, 3}) is float32 (as LibTorch); from_vector keeps T's dtype.
Tensor tensor(std::initializer_list<double> values, TensorOptions options = {});
Tensor tensor(std::initializer_list<std::initializer_list<double>> rows, TensorOptions options = {});
template <typename T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, Device device = Device::cpu());
template <typename T>
Tensor from_vector(const std::vector<T>& values) {
  return from_vector(values, Shape{static_cast<int64_t>(values.size())});
}
// Wraps memory Kiln does not own (no copy; the caller keeps it alive). Strides default to contiguous.
Tensor from_blob(void* data, const Shape& shape, DType dtype, Device device = Device::cpu());

// ---- copy.cpp ----
Tensor contiguous(const Tensor& t);
Tensor clone(const Tensor& t);
Tensor to(const Tensor& t, Device device, DType dtype, bool non_blocking = false);
Tensor pin_memory(const Tensor& t);
Tensor detach(const Tensor& t);
// (views.cpp) A view of all of t, without t's history: what a custom Function or checkpoint returns
// for an input it passes through. As a view, in-place ops recorded by autograd refuse it, and refuse t
// while it lives.
Tensor alias(const Tensor& t);

// ---- views.cpp (share storage with their input) ----
Tensor view(const Tensor& t, const Shape& shape);
Tensor reshape(const Tensor& t, const Shape& shape);
Tensor permute(const Tensor& t, const Shape& dims);
Tensor transpose(const Tensor& t, int64_t dim0, int64_t dim1);
Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length);
Tensor slice(const Tensor& t, int64_t dim, std::optional<int64_t> start, std::optional<int64_t> end,
             int64_t step = 1);
Tensor select(const Tensor& t, int64_t dim, int64_t index);
Tensor expand(const Tensor& t, const Shape& shape);
Tensor squeeze(const Tensor& t, std::optional<int64_t> dim = {});
Tensor unsqueeze(const Tensor& t, int64_t dim);
Tensor flatten(const Tensor& t, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor unflatten(const Tensor& t, int64_t dim, const Shape& sizes);
// PyTorch's Tensor.unfold: a view with dim `dimension` replaced by the (size_d - size) / step + 1
// windows and a new last dim of each window's `size` elements (windows overlap when step < size).
// Its backward sums the overlapping windows' gradients (an index_add, itself differentiable).
Tensor unfold(const Tensor& t, int64_t dimension, int64_t size, int64_t step);
Tensor as_strided(const Tensor& t, const Shape& sizes, const Shape& strides, int64_t offset);
// The diagonal `offset` (above the main one when positive) of the matrices in dims dim1 and dim2: a
// view with those dims removed and the diagonal as a new last dim, as torch.diagonal.
Tensor diagonal(const Tensor& t, int64_t offset = 0, int64_t dim1 = 0, int64_t dim2 = 1);
// A zero tensor with x's last dim written along the diagonal `offset` of the new dims dim1 and dim2
// (x's other dims fill the rest in order): diagonal's inverse, and its gradient.
Tensor diag_embed(const Tensor& x, int64_t offset = 0, int64_t dim1 = -2, int64_t dim2 = -1);

// ---- elementwise.cpp ----
Tensor neg(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor sign(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor log1p(const Tensor& x);
Tensor expm1(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor reciprocal(const Tensor& x);
Tensor sin(const Tensor& x);
Tensor cos(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x, std::string_view approximate = "none");  // "none" (erf) or "tanh"
// gelu(input + bias), bias (N) along the last dim: the bias add of a Linear and the GELU after it,
// one pass each way while fusion is on (set_fusion; float32/float64), else composed.
Tensor bias_gelu(const Tensor& input, const Tensor& bias, std::string_view approximate = "none");
Tensor silu(const Tensor& x);
Tensor softplus(const Tensor& x);
Tensor erf(const Tensor& x);
Tensor erfc(const Tensor& x);
Tensor erfinv(const Tensor& x);  // erf's inverse on [-1, 1]: +-inf at +-1, NaN outside
Tensor tan(const Tensor& x);
Tensor asin(const Tensor& x);
Tensor acos(const Tensor& x);
Tensor atan(const Tensor& x);
Tensor sinh(const Tensor& x);
Tensor cosh(const Tensor& x);
Tensor asinh(const Tensor& x);
Tensor acosh(const Tensor& x);
Tensor atanh(const Tensor& x);
Tensor log2(const Tensor& x);
Tensor log10(const Tensor& x);
Tensor exp2(const Tensor& x);
Tensor lgamma(const Tensor& x);                // log |Gamma(x)|: +inf at 0, -1, -2, ...
Tensor digamma(const Tensor& x);               // d/dx lgamma: -inf at +0, +inf at -0, NaN at -1, -2, ...
Tensor polygamma(int64_t n, const Tensor& x);  // digamma's n-th derivative (n = 0: digamma)
Tensor sinc(const Tensor& x);                  // sin(pi x) / (pi x), 1 at 0 (the normalized sinc, torch.sinc)
// log(x / (1 - x)); with eps, x is clamped to [eps, 1 - eps] first.
Tensor logit(const Tensor& x, std::optional<double> eps = {});
Tensor deg2rad(const Tensor& x);
Tensor rad2deg(const Tensor& x);
// NaN, +inf and -inf replaced by nan (default 0), posinf and neginf (default the dtype's largest and
// lowest finite values); integer tensors are returned as they are (a copy).
Tensor nan_to_num(const Tensor& x, std::optional<double> nan = 0.0, std::optional<double> posinf = {},
                  std::optional<double> neginf = {});
Tensor square(const Tensor& x);
Tensor pow(const Tensor& x, const Scalar& exponent);
Tensor pow(const Tensor& x, const Tensor& exponent);
Tensor clamp(const Tensor& x, std::optional<Scalar> min, std::optional<Scalar> max = {});
Tensor add(const Tensor& a, const Tensor& b, const Scalar& alpha = 1);
Tensor add(const Tensor& a, const Scalar& b);
Tensor sub(const Tensor& a, const Tensor& b, const Scalar& alpha = 1);
Tensor sub(const Tensor& a, const Scalar& b);
Tensor rsub(const Tensor& a, const Scalar& b);  // b - a
Tensor mul(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Scalar& b);
Tensor div(const Tensor& a, const Tensor& b);  // true division: integers give float32
Tensor div(const Tensor& a, const Scalar& b);
Tensor rdiv(const Scalar& a, const Tensor& b);  // a / b
// div with rounding: "trunc" (toward 0) or "floor" (floor_divide); integers stay integers.
Tensor div(const Tensor& a, const Tensor& b, std::string_view rounding_mode);
// Rounding to integral values in the same dtype (integers unchanged); round takes halves to even.
Tensor floor(const Tensor& x);
Tensor ceil(const Tensor& x);
Tensor trunc(const Tensor& x);
Tensor round(const Tensor& x);
// a - floor(a / b) * b (the sign of b: Python's %), a - trunc(a / b) * b (the sign of a: C's fmod)
// and floor(a / b), in the promoted dtype; an integer division by zero is an Error.
Tensor remainder(const Tensor& a, const Tensor& b);
Tensor remainder(const Tensor& a, const Scalar& b);
Tensor fmod(const Tensor& a, const Tensor& b);
Tensor fmod(const Tensor& a, const Scalar& b);
Tensor floor_divide(const Tensor& a, const Tensor& b);
Tensor floor_divide(const Tensor& a, const Scalar& b);
// Integers and bools only (on bools, the logical ops).
Tensor bitwise_and(const Tensor& a, const Tensor& b);
Tensor bitwise_and(const Tensor& a, const Scalar& b);
Tensor bitwise_or(const Tensor& a, const Tensor& b);
Tensor bitwise_or(const Tensor& a, const Scalar& b);
Tensor bitwise_xor(const Tensor& a, const Tensor& b);
Tensor bitwise_xor(const Tensor& a, const Scalar& b);
Tensor bitwise_not(const Tensor& x);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
// The floating binary functions (integers promoted to float32), broadcasting, differentiable in both.
Tensor atan2(const Tensor& a, const Tensor& b);       // the angle of (b, a): atan(a / b) in the right quadrant
Tensor hypot(const Tensor& a, const Tensor& b);       // sqrt(a^2 + b^2) without overflow
Tensor logaddexp(const Tensor& a, const Tensor& b);   // log(e^a + e^b), without overflow
Tensor logaddexp2(const Tensor& a, const Tensor& b);  // log2(2^a + 2^b)
Tensor copysign(const Tensor& a, const Tensor& b);    // |a| with b's sign (-0 counts as negative)
Tensor xlogy(const Tensor& a, const Tensor& b);       // a log b, 0 where a = 0 (unless b is NaN)
Tensor xlogy(const Tensor& a, const Scalar& b);
Tensor xlogy(const Scalar& a, const Tensor& b);
// torch.special's functions (ops/elementwise.cpp; core/special_math.h computes each in float64, to
// float32's need for float32). Integers become float32. Differentiable as in PyTorch (not in zeta's x
// or the incomplete gammas' a: an Error there, as PyTorch's).
namespace special {
Tensor i0(const Tensor& x);                        // the modified Bessel function I0
Tensor i0e(const Tensor& x);                       // e^-|x| I0(x)
Tensor i1(const Tensor& x);                        // I1
Tensor i1e(const Tensor& x);                       // e^-|x| I1(x)
Tensor erfcx(const Tensor& x);                     // e^(x^2) erfc(x), without overflow (1 / (x sqrt pi) for large x)
Tensor ndtr(const Tensor& x);                      // the standard normal cdf, erfc(-x / sqrt 2) / 2
Tensor log_ndtr(const Tensor& x);                  // its log, accurate where it underflows (-804.6 at -40)
Tensor ndtri(const Tensor& p);                     // its inverse: -inf at 0, +inf at 1, NaN outside [0, 1]
Tensor entr(const Tensor& x);                      // -x log x: 0 at 0, -inf for x < 0
Tensor xlog1py(const Tensor& a, const Tensor& b);  // a log1p(b), 0 where a = 0 (unless b is NaN)
Tensor xlog1py(const Tensor& a, const Scalar& b);
Tensor xlog1py(const Scalar& a, const Tensor& b);
// Hurwitz's zeta(x, q) = sum_k (q + k)^-x: +inf at x = 1 and at q = 0, -1, ...; NaN for x < 1, and for
// q < 0 unless x is whole.
Tensor zeta(const Tensor& x, const Tensor& q);
Tensor zeta(const Tensor& x, const Scalar& q);
Tensor zeta(const Scalar& x, const Tensor& q);
// The regularized lower and upper incomplete gamma functions P(a, x) and Q(a, x) = 1 - P (NaN for
// a < 0 or x < 0).
Tensor gammainc(const Tensor& a, const Tensor& x);
Tensor gammaincc(const Tensor& a, const Tensor& x);
// log of the multivariate gamma function of dimension p >= 1; every a must exceed (p - 1) / 2.
Tensor multigammaln(const Tensor& a, int64_t p);
// The Bessel functions J0 and I0 (even), J1 and I1 (odd), Y0, Y1 (NaN for x < 0, -inf at 0), K0, K1
// (NaN for x < 0, +inf at 0), e^x K0, e^x K1 and the spherical j0 = sin(x) / x, with PyTorch's names;
// here differentiable (PyTorch 1.13 gives them no gradient).
Tensor bessel_j0(const Tensor& x);
Tensor bessel_j1(const Tensor& x);
Tensor bessel_y0(const Tensor& x);
Tensor bessel_y1(const Tensor& x);
Tensor modified_bessel_i0(const Tensor& x);  // i0
Tensor modified_bessel_i1(const Tensor& x);  // i1
Tensor modified_bessel_k0(const Tensor& x);
Tensor modified_bessel_k1(const Tensor& x);
Tensor scaled_modified_bessel_k0(const Tensor& x);
Tensor scaled_modified_bessel_k1(const Tensor& x);
Tensor spherical_bessel_j0(const Tensor& x);
// Airy's Ai (0 at +-inf; PyTorch 1.13: NaN), here differentiable (Ai'' = x Ai).
Tensor airy_ai(const Tensor& x);
// The orthogonal polynomials p_n(x) of degree n = the whole part of n (7.9 -> 7), a tensor or a number:
// Chebyshev's T, U, V, W, the same shifted to [0, 1] (p_n(2x - 1)), Hermite's H (physicists') and He
// (probabilists'), Laguerre's L and Legendre's P, with PyTorch's names. 0 for n < 0, 1 for n = 0; NaN
// for a NaN n or n = +inf (PyTorch 1.13: 0). Chebyshev's take any n; the others n <= 2^24 (an Error
// beyond: they run n steps of a recurrence). Values beyond float64's range are +-inf with their sign
// (PyTorch 1.13: NaN, as at x = +-inf). Differentiable in x to order 7, for n <= 2^24 (PyTorch 1.13
// gives them no gradient); n gets a zero gradient.
Tensor chebyshev_polynomial_t(const Tensor& x, const Tensor& n);
Tensor chebyshev_polynomial_t(const Tensor& x, const Scalar& n);
Tensor chebyshev_polynomial_t(const Scalar& x, const Tensor& n);
Tensor chebyshev_polynomial_u(const Tensor& x, const Tensor& n);
Tensor chebyshev_polynomial_u(const Tensor& x, const Scalar& n);
Tensor chebyshev_polynomial_u(const Scalar& x, const Tensor& n);
Tensor chebyshev_polynomial_v(const Tensor& x, const Tensor& n);
Tensor chebyshev_polynomial_v(const Tensor& x, const Scalar& n);
Tensor chebyshev_polynomial_v(const Scalar& x, const Tensor& n);
Tensor chebyshev_polynomial_w(const Tensor& x, const Tensor& n);
Tensor chebyshev_polynomial_w(const Tensor& x, const Scalar& n);
Tensor chebyshev_polynomial_w(const Scalar& x, const Tensor& n);
Tensor shifted_chebyshev_polynomial_t(const Tensor& x, const Tensor& n);
Tensor shifted_chebyshev_polynomial_t(const Tensor& x, const Scalar& n);
Tensor shifted_chebyshev_polynomial_t(const Scalar& x, const Tensor& n);
Tensor shifted_chebyshev_polynomial_u(const Tensor& x, const Tensor& n);
Tensor shifted_chebyshev_polynomial_u(const Tensor& x, const Scalar& n);
Tensor shifted_chebyshev_polynomial_u(const Scalar& x, const Tensor& n);
Tensor shifted_chebyshev_polynomial_v(const Tensor& x, const Tensor& n);
Tensor shifted_chebyshev_polynomial_v(const Tensor& x, const Scalar& n);
Tensor shifted_chebyshev_polynomial_v(const Scalar& x, const Tensor& n);
Tensor shifted_chebyshev_polynomial_w(const Tensor& x, const Tensor& n);
Tensor shifted_chebyshev_polynomial_w(const Tensor& x, const Scalar& n);
Tensor shifted_chebyshev_polynomial_w(const Scalar& x, const Tensor& n);
Tensor hermite_polynomial_h(const Tensor& x, const Tensor& n);
Tensor hermite_polynomial_h(const Tensor& x, const Scalar& n);
Tensor hermite_polynomial_h(const Scalar& x, const Tensor& n);
Tensor hermite_polynomial_he(const Tensor& x, const Tensor& n);
Tensor hermite_polynomial_he(const Tensor& x, const Scalar& n);
Tensor hermite_polynomial_he(const Scalar& x, const Tensor& n);
Tensor laguerre_polynomial_l(const Tensor& x, const Tensor& n);
Tensor laguerre_polynomial_l(const Tensor& x, const Scalar& n);
Tensor laguerre_polynomial_l(const Scalar& x, const Tensor& n);
Tensor legendre_polynomial_p(const Tensor& x, const Tensor& n);
Tensor legendre_polynomial_p(const Tensor& x, const Scalar& n);
Tensor legendre_polynomial_p(const Scalar& x, const Tensor& n);
Tensor expit(const Tensor& x);    // sigmoid
Tensor gammaln(const Tensor& x);  // lgamma
Tensor psi(const Tensor& x);      // digamma
}  // namespace special
// torch's own names for four of them.
Tensor i0(const Tensor& x);
Tensor igamma(const Tensor& a, const Tensor& x);   // special::gammainc
Tensor igammac(const Tensor& a, const Tensor& x);  // special::gammaincc
Tensor mvlgamma(const Tensor& a, int64_t p);       // special::multigammaln
// |a - b| <= atol + rtol |b| elementwise (bool), or a == b; NaNs equal only with equal_nan. a and b
// of one dtype, as PyTorch's; allclose: every element of isclose.
Tensor isclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8, bool equal_nan = false);
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8, bool equal_nan = false);
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, const Scalar& b);
Tensor ne(const Tensor& a, const Scalar& b);
Tensor lt(const Tensor& a, const Scalar& b);
Tensor le(const Tensor& a, const Scalar& b);
Tensor gt(const Tensor& a, const Scalar& b);
Tensor ge(const Tensor& a, const Scalar& b);
// Bool tensors of where x is NaN, +-inf, or neither (integer and bool x: no NaN, no inf).
Tensor isnan(const Tensor& x);
Tensor isinf(const Tensor& x);
Tensor isfinite(const Tensor& x);
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Tensor& b);
Tensor logical_not(const Tensor& x);
Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b);
Tensor where(const Tensor& condition, const Tensor& a, const Scalar& b);
Tensor masked_fill(const Tensor& x, const Tensor& mask, const Scalar& value);
// input + value * tensor1 * tensor2 and input + value * tensor1 / tensor2, broadcast, in the
// promoted dtype of the three (PyTorch's addcmul, addcdiv; addcdiv never divides integers).
Tensor addcmul(const Tensor& input, const Tensor& tensor1, const Tensor& tensor2, const Scalar& value = 1);
Tensor addcdiv(const Tensor& input, const Tensor& tensor1, const Tensor& tensor2, const Scalar& value = 1);
// input + weight * (end - input), broadcast; floating, one dtype for input, end and a weight tensor.
Tensor lerp(const Tensor& input, const Tensor& end, const Tensor& weight);
Tensor lerp(const Tensor& input, const Tensor& end, const Scalar& weight);
DType result_type(const Tensor& a, const Tensor& b);
DType result_type(const Tensor& a, const Scalar& b);
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op = "broadcast_shapes");

// ---- reduce.cpp ({} dims = all dims) ----
Tensor sum(const Tensor& x, const Shape& dims = {}, bool keepdim = false,
           std::optional<DType> dtype = {});
Tensor mean(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
Tensor prod(const Tensor& x, std::optional<int64_t> dim = {}, bool keepdim = false);
Tensor amax(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
Tensor amin(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
Tensor max(const Tensor& x);  // of all elements
Tensor min(const Tensor& x);
std::tuple<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim = false);  // values, indices
std::tuple<Tensor, Tensor> min(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& x, std::optional<int64_t> dim = {}, bool keepdim = false);
Tensor argmin(const Tensor& x, std::optional<int64_t> dim = {}, bool keepdim = false);
Tensor var(const Tensor& x, const Shape& dims = {}, int64_t correction = 1, bool keepdim = false);
Tensor std(const Tensor& x, const Shape& dims = {}, int64_t correction = 1, bool keepdim = false);
Tensor norm(const Tensor& x, double p = 2, const Shape& dims = {}, bool keepdim = false);
Tensor logsumexp(const Tensor& x, const Shape& dims, bool keepdim = false);
Tensor all(const Tensor& x, std::optional<int64_t> dim = {}, bool keepdim = false);
Tensor any(const Tensor& x, std::optional<int64_t> dim = {}, bool keepdim = false);
Tensor sum_to(const Tensor& x, const Shape& shape);  // undoes broadcasting: sums the expanded dims

// ---- linalg.cpp ----
Tensor matmul(const Tensor& a, const Tensor& b);  // PyTorch's rank rules, broadcast batch dims
Tensor mm(const Tensor& a, const Tensor& b);      // 2-D only
Tensor bmm(const Tensor& a, const Tensor& b);     // 3-D only, equal batch
// bias + a @ b (PyTorch's addmm with beta = alpha = 1): a and b 2-D, bias broadcast to the product's
// shape, one dtype. A 1-D bias may be added in the GEMM's epilogue (Backend::matmul_bias).
Tensor addmm(const Tensor& bias, const Tensor& a, const Tensor& b);
// The same written into `out` (of the product's shape, dtype and device; any strides), which it
// returns. Like PyTorch's out= forms it records no gradient: an Error where one would be recorded.
Tensor addmm_out(const Tensor& out, const Tensor& bias, const Tensor& a, const Tensor& b);
// gelu(bias + a @ b), `approximate` as gelu's: a and b 2-D, bias 1-D with b.size(1) elements, one
// dtype. In the tanh form, with fusion on (set_fusion), bias and GELU run in the GEMM's epilogue
// where the backend can (Backend::matmul_bias_gelu: cuBLASLt on CUDA); otherwise it is composed:
// bias_gelu(matmul(a, b), bias, approximate) where bias_gelu's pass is fused (float32, float64),
// else gelu(addmm(bias, a, b), approximate). PyTorch's counterpart is the internal
// torch._addmm_activation(bias, a, b, use_gelu=True). Autocast: lower precision, as addmm.
Tensor addmm_gelu(const Tensor& bias, const Tensor& a, const Tensor& b, std::string_view approximate = "tanh");

// ---- einsum.cpp ----
// Einstein summation as PyTorch's torch.einsum: einsum("bij,bjk->bik", {a, b}); letters label dims,
// "..." the dims left over (broadcast), a letter twice in one term its diagonal, and without "->" the
// output is "..." and the letters written once, in ASCII order. Composed of sums and bmm (Note
// [einsum as products] in ops/einsum.cpp), so differentiable on every device.
Tensor einsum(std::string_view equation, const std::vector<Tensor>& operands);

// ---- solve.cpp: torch.linalg's solve, inv, det, slogdet, solve_ex and inv_ex (LU with partial pivoting
// on the host, float32 and float64, batched; differentiable; solving with an exactly singular matrix is an
// Error, or info in the _ex forms) ----
namespace linalg {
// X with A X = B (left) or X A = B; A (*, n, n), B (*, n, k), or a vector (*, n) when B is 1-D or
// has A's shape without its last dim, as PyTorch's.
Tensor solve(const Tensor& a, const Tensor& b, bool left = true);
Tensor inv(const Tensor& a);  // A^-1 for A (*, n, n)
Tensor det(const Tensor& a);  // det A (*), 0 for a singular matrix (its gradient there: the cofactors)
// (sign, log |det A|), each (*): sign 0 and -inf for a singular matrix; the gradient through log |det|.
std::tuple<Tensor, Tensor> slogdet(const Tensor& a);
// solve and inv without the Error for a singular matrix: (result, info), info int32 of the batch's shape,
// 0 or the 1-based column of a zero pivot, the result NaN for that matrix (check_errors: the Error anyway).
std::tuple<Tensor, Tensor> solve_ex(const Tensor& a, const Tensor& b, bool left = true, bool check_errors = false);
std::tuple<Tensor, Tensor> inv_ex(const Tensor& a, bool check_errors = false);
}  // namespace linalg

// ---- lu.cpp: torch.linalg's lu_factor, lu_factor_ex, lu and lu_solve, and torch.lu_unpack (P A = L U
// with partial pivoting on the host in float64, any m x n, batched; differentiable) ----
namespace linalg {
// (LU, pivots, info): L's multipliers below the diagonal and U on and above it in LU (*, m, n); pivots
// int32 (*, min(m, n)), 1-based, LAPACK's; info int32 (*), 0 or the first 1-based j with U_jj = 0 (the
// Error with check_errors). Without pivot, no row exchanges (pivots 1, 2, ...).
std::tuple<Tensor, Tensor, Tensor> lu_factor_ex(const Tensor& a, bool pivot = true, bool check_errors = false);
std::tuple<Tensor, Tensor> lu_factor(const Tensor& a, bool pivot = true);   // an Error where U_jj = 0
std::tuple<Tensor, Tensor, Tensor> lu(const Tensor& a, bool pivot = true);  // (P, L, U), A = P L U
// X with A X = B (A^T X = B with adjoint; X A = B or X A^T = B without left) from lu_factor's output.
Tensor lu_solve(const Tensor& lu, const Tensor& pivots, const Tensor& b, bool left = true, bool adjoint = false);
}  // namespace linalg
// (P (*, m, m), L (*, m, k), U (*, k, n)) from packed LU and its pivots; what is not asked for is empty.
std::tuple<Tensor, Tensor, Tensor> lu_unpack(const Tensor& lu, const Tensor& pivots, bool unpack_data = true,
                                             bool unpack_pivots = true);

// ---- decompose.cpp: torch.linalg's cholesky, cholesky_ex, solve_triangular, eigh, eigvalsh and qr, and
// torch's cholesky_solve (on the host in float64, float32 and float64 matrices, batched; differentiable) ----
namespace linalg {
// L (lower) with A = L L^T for symmetric positive-definite A (*, n, n), read from its lower triangle;
// with upper, U = L^T (A = U^T U). Not positive-definite: an Error naming the failing minor.
Tensor cholesky(const Tensor& a, bool upper = false);
// (L, info): info int32 (*), 0 or the order of the leading minor that is not positive-definite, L NaN
// for that matrix (check_errors: the Error instead).
std::tuple<Tensor, Tensor> cholesky_ex(const Tensor& a, bool upper = false, bool check_errors = false);
// X with A X = B (left) or X A = B for triangular A (*, n, n), only its upper or lower triangle read
// (its diagonal as ones with unitriangular); B (*, n, k) (left) or (*, k, n); batch dims broadcast.
Tensor solve_triangular(const Tensor& a, const Tensor& b, bool upper, bool left = true, bool unitriangular = false);
// (eigenvalues ascending (*, n), eigenvectors as columns (*, n, n)) of the symmetric matrix read from
// A's lower ("L") or upper ("U") triangle. Each eigenvector is determined only up to its sign (and
// within an eigenspace of a repeated eigenvalue, whose gradient is not finite).
std::tuple<Tensor, Tensor> eigh(const Tensor& a, std::string_view uplo = "L");
Tensor eigvalsh(const Tensor& a, std::string_view uplo = "L");
// (Q, R) with A = Q R for A (*, m, n), k = min(m, n): mode "reduced" Q (*, m, k) with orthonormal
// columns and R (*, k, n) upper triangular; "complete" Q (*, m, m) and R (*, m, n); "r" R only (Q
// empty). LAPACK's signs (R's diagonal negative where the column's leading entry is positive). The
// gradient is defined for "reduced", and for "complete" with m <= n.
std::tuple<Tensor, Tensor> qr(const Tensor& a, std::string_view mode = "reduced");
}  // namespace linalg
// X with A X = B where A = L L^T (or U^T U with upper), given the Cholesky factor: torch.cholesky_solve.
Tensor cholesky_solve(const Tensor& b, const Tensor& l, bool upper = false);

// ---- svd.cpp: torch.linalg's svd, svdvals, pinv, matrix_rank, lstsq and norms, and torch.svd (the SVD on
// the host in float64, float32 and float64 matrices, batched; differentiable) ----
namespace linalg {
// (U, S, Vh) with A = U diag(S) Vh for A (*, m, n), k = min(m, n): S (*, k) descending; U (*, m, m) and
// Vh (*, n, n) with full_matrices (PyTorch's default), else U (*, m, k) and Vh (*, k, n). Each pair of
// singular vectors is determined only up to its sign (LAPACK's signs may differ from these). A
// non-finite entry is an Error.
std::tuple<Tensor, Tensor, Tensor> svd(const Tensor& a, bool full_matrices = true);
Tensor svdvals(const Tensor& a);  // S (*, k), descending; NaN for a matrix with a non-finite entry
// The Moore-Penrose pseudo-inverse (*, n, m): singular values at most max(atol, rtol * the largest)
// count as 0; rtol by default eps * max(m, n) (0 where a positive atol is given). With hermitian, A
// is taken as symmetric (its lower triangle read) and factored by eigh.
Tensor pinv(const Tensor& a, std::optional<double> atol = {}, std::optional<double> rtol = {}, bool hermitian = false);
// The number of singular values above pinv's tolerance (int64, *).
Tensor matrix_rank(const Tensor& a, std::optional<double> atol = {}, std::optional<double> rtol = {},
                   bool hermitian = false);
// torch.linalg.lstsq's named tuple.
struct LstsqResult {
  Tensor solution;         // X (*, n, k) minimizing |A X - B| (of least norm); (*, n) for a vector B
  Tensor residuals;        // |A X - B|^2 per column (*, k) where m > n, every A has full rank and the
                           // driver is not gelsy; else empty
  Tensor rank;             // int64 (*), except for gels (empty)
  Tensor singular_values;  // (*, min(m, n)) for gelsd and gelss; else empty
};
// The least-squares solution of A X = B: A (*, m, n), B (*, m, k) or (*, m) (one dim fewer than A),
// batch dims broadcast. Singular values at most rcond times the largest (by default eps * max(m, n))
// count as 0. Every driver ("gels", "gelsy" by default, "gelsd", "gelss") solves through the SVD; the
// driver picks which of the other outputs are filled, as PyTorch's. Differentiable in the solution.
LstsqResult lstsq(const Tensor& a, const Tensor& b, std::optional<double> rcond = {},
                  std::optional<std::string> driver = {});
// The p-norm of x's elements over dim (all of them when empty): kiln::norm under PyTorch's name.
Tensor vector_norm(const Tensor& x, double ord = 2, const Shape& dim = {}, bool keepdim = false);
// The matrix norm over the two dims `dim`: ord 1 / -1 the largest / smallest column sum of |A|, inf /
// -inf the row sums', 2 / -2 the largest / smallest singular value; "fro" sqrt(sum A^2), "nuc" the sum
// of the singular values.
Tensor matrix_norm(const Tensor& a, double ord, const Shape& dim = {-2, -1}, bool keepdim = false);
Tensor matrix_norm(const Tensor& a, std::string_view ord = "fro", const Shape& dim = {-2, -1}, bool keepdim = false);
// torch.linalg.norm: with one dim (or a 1-D input and no dim) a vector norm, with two (or a 2-D input)
// a matrix norm; without ord and dim, the 2-norm of all elements.
Tensor norm(const Tensor& a, std::optional<double> ord = {}, std::optional<Shape> dim = {}, bool keepdim = false);
Tensor norm(const Tensor& a, std::string_view ord, std::optional<Shape> dim = {}, bool keepdim = false);
// The condition number: the ratio of the largest and smallest singular values for p 2 (the default) and
// -2 (any shape); norm(A, p) norm(A^-1, p) for square A otherwise (inf where A is singular).
Tensor cond(const Tensor& a, std::optional<double> p = {});
Tensor cond(const Tensor& a, std::string_view p);
}  // namespace linalg
// torch.svd: (U, S, V), reduced where some (the default), V not transposed; without compute_uv, U and
// V are zero-filled (m x m) and (n x n).
std::tuple<Tensor, Tensor, Tensor> svd(const Tensor& a, bool some = true, bool compute_uv = true);

// ---- composite.cpp: arrangements and products composed of other ops (differentiable, every device) ----
// A 1-D x as a square matrix with x on its diagonal `diagonal`; a 2-D x's diagonal, copied.
Tensor diag(const Tensor& x, int64_t diagonal = 0);
Tensor trace(const Tensor& x);                   // the sum of a matrix's main diagonal
Tensor outer(const Tensor& a, const Tensor& b);  // a_i b_j for vectors a, b
Tensor dot(const Tensor& a, const Tensor& b);    // vectors of one length and dtype; 0-d
Tensor inner(const Tensor& a, const Tensor& b);  // sums over both last dims (a * b when either is 0-d)
Tensor mv(const Tensor& m, const Tensor& v);     // matrix times vector
// beta input + alpha (product): mv, outer (addr), bmm (baddbmm); beta = 0 ignores input's values.
Tensor addmv(const Tensor& input, const Tensor& mat, const Tensor& vec, const Scalar& beta = 1,
             const Scalar& alpha = 1);
Tensor addr(const Tensor& input, const Tensor& vec1, const Tensor& vec2, const Scalar& beta = 1,
            const Scalar& alpha = 1);
Tensor baddbmm(const Tensor& input, const Tensor& batch1, const Tensor& batch2, const Scalar& beta = 1,
               const Scalar& alpha = 1);
// Sums of products over dims_a of a and dims_b of b (paired in order); the result has a's other dims,
// then b's. With a number n: a's last n dims against b's first n.
Tensor tensordot(const Tensor& a, const Tensor& b, const Shape& dims_a, const Shape& dims_b);
Tensor tensordot(const Tensor& a, const Tensor& b, int64_t dims = 2);
Tensor kron(const Tensor& a, const Tensor& b);  // the Kronecker product (ranks padded with leading 1s)
// The p-norm distance between each row of x1 (..., P, M) and each of x2 (..., R, M): (..., P, R).
Tensor cdist(const Tensor& x1, const Tensor& x2, double p = 2);
namespace linalg {
Tensor cross(const Tensor& a, const Tensor& b, int64_t dim = -1);  // 3-vectors along dim, broadcast
Tensor matrix_power(const Tensor& a, int64_t n);                   // A^n by squaring; n < 0 inverts first
Tensor matrix_exp(const Tensor& a);  // e^A of square float32/float64 matrices, by scaling, Pade and squaring
// The product of the matrices in the cheapest order; the first may be a row vector, the last a column.
Tensor multi_dot(const std::vector<Tensor>& tensors);
Tensor vecdot(const Tensor& x, const Tensor& y, int64_t dim = -1);  // sum(x * y, dim), broadcast
// The Vandermonde matrix (*, n, N): columns x^0, x^1, ..., x^(N-1); N = n by default, at least 2.
Tensor vander(const Tensor& x, std::optional<int64_t> n = {});
// Q's first n columns from geqrf's form: the reflections I - tau_i v_i v_i^T, v_i column i of A (*, m, n)
// below its diagonal with a 1 on it; tau (*, k), k <= n <= m.
Tensor householder_product(const Tensor& a, const Tensor& tau);
// The inverse of A for tensordot over its first ind dims: result (A.shape[ind:] + A.shape[:ind]).
Tensor tensorinv(const Tensor& a, int64_t ind = 2);
// X with tensordot(A, X, X.dim()) = B (dims of A moved to the end first).
Tensor tensorsolve(const Tensor& a, const Tensor& b, std::optional<Shape> dims = {});
Tensor diagonal(const Tensor& a, int64_t offset = 0, int64_t dim1 = -2, int64_t dim2 = -1);  // of the last two dims
}  // namespace linalg
// x's elements moved `shifts` places along dims, wrapping around (the flattened tensor without dims).
Tensor roll(const Tensor& x, const Shape& shifts, const Shape& dims = {});
Tensor tile(const Tensor& x, const Shape& reps);  // repeat, reps padded with leading 1s to x's rank
// Each element (each slice along dim; of the flattened x without dim) repeated `repeats` times in
// place; with a tensor, a count per slice. The one-argument form gives the indices: [0, 0, 1, 2, 2]
// for counts [2, 1, 2].
Tensor repeat_interleave(const Tensor& x, int64_t repeats, std::optional<int64_t> dim = {});
Tensor repeat_interleave(const Tensor& x, const Tensor& repeats, std::optional<int64_t> dim = {});
Tensor repeat_interleave(const Tensor& repeats);
// The dims `source` moved to `destination`, the others keeping their order (a view).
Tensor movedim(const Tensor& x, const Shape& source, const Shape& destination);
Tensor movedim(const Tensor& x, int64_t source, int64_t destination);
Tensor swapaxes(const Tensor& x, int64_t axis0, int64_t axis1);  // transpose
// Rotated by 90 degrees k times in the plane of dims, from the first toward the second.
Tensor rot90(const Tensor& x, int64_t k = 1, const Shape& dims = {0, 1});
Tensor fliplr(const Tensor& x);  // flip dim 1
Tensor flipud(const Tensor& x);  // flip dim 0
// Coordinate grids of 0-d or 1-D tensors, each expanded (a view) to the sizes of all: "ij" (matrix)
// indexing, or "xy" (Cartesian: the first two output dims swapped).
std::vector<Tensor> meshgrid(const std::vector<Tensor>& tensors, std::string_view indexing = "ij");
Tensor cartesian_prod(const std::vector<Tensor>& tensors);  // every combination as a row
// gather with indices broadcast against x in every dim but dim; without dim, of the flattened x.
Tensor take_along_dim(const Tensor& x, const Tensor& indices, std::optional<int64_t> dim = {});
// The (row, column) indices (2, N) of the lower (upper) triangle of a row x col matrix from diagonal offset.
Tensor tril_indices(int64_t row, int64_t col, int64_t offset = 0, DType dtype = kInt64, Device device = Device::cpu());
Tensor triu_indices(int64_t row, int64_t col, int64_t offset = 0, DType dtype = kInt64, Device device = Device::cpu());

// ---- sort.cpp: along one dim (default the last), 0-d tensors as one element ----
// (values, indices): every line in ascending (descending) order, stable: equal values keep their
// order, NaN counts as larger than every number (PyTorch's sort with stable = true).
std::tuple<Tensor, Tensor> sort(const Tensor& x, int64_t dim = -1, bool descending = false);
Tensor argsort(const Tensor& x, int64_t dim = -1, bool descending = false);  // sort's indices
// The k largest (smallest) of each line and their indices, in order, ties by position (PyTorch's
// sorted = true; its order among equal values is unspecified).
std::tuple<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t dim = -1, bool largest = true);
std::tuple<Tensor, Tensor> kthvalue(const Tensor& x, int64_t k, int64_t dim = -1, bool keepdim = false);  // k >= 1
// The lower of the two middle values (and its index) for an even count; NaN where a line holds NaN.
// nanmedian leaves NaN out (NaN only where the whole line is NaN).
std::tuple<Tensor, Tensor> median(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor median(const Tensor& x);  // of all elements
std::tuple<Tensor, Tensor> nanmedian(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor nanmedian(const Tensor& x);
// Running sums and products (integers and bool as int64 unless dtype says otherwise), extremes with
// the latest position of the extreme (a NaN holding until the next one), log-sum-exp (floating).
Tensor cumsum(const Tensor& x, int64_t dim, std::optional<DType> dtype = {});
Tensor cumprod(const Tensor& x, int64_t dim, std::optional<DType> dtype = {});
std::tuple<Tensor, Tensor> cummax(const Tensor& x, int64_t dim);
std::tuple<Tensor, Tensor> cummin(const Tensor& x, int64_t dim);
Tensor logcumsumexp(const Tensor& x, int64_t dim);
Tensor msort(const Tensor& x);  // sort(x, 0)'s values
// For each of values, where it would go in the last dim of sorted_sequence to keep that in order: the
// first position whose element is >= it (> it with right), or the size of that dim. sorted_sequence
// is 1-D, or (*, m) with values (*, n) of the same leading dims; values any shape for a 1-D one. An
// int64 result of values' shape (int32 with out_int32); sorter (int64 or int32, the sequence's shape)
// gives the order of an unsorted sequence (argsort's). As PyTorch's, whose binary search this follows
// step for step (an unsorted sequence gives its answers too).
Tensor searchsorted(const Tensor& sorted_sequence, const Tensor& values, bool out_int32 = false, bool right = false,
                    const Tensor& sorter = {});
Tensor searchsorted(const Tensor& sorted_sequence, const Scalar& value, bool out_int32 = false, bool right = false,
                    const Tensor& sorter = {});
// searchsorted(boundaries, input, out_int32, right) for 1-D boundaries: the bucket of each element.
Tensor bucketize(const Tensor& input, const Tensor& boundaries, bool out_int32 = false, bool right = false);
// The q-quantiles (q in [0, 1]: a number, or a 0-d or 1-D tensor of x's dtype, whose dim then comes
// first in the result) of x's elements, or along dim (kept as size 1 with keepdim). interpolation:
// "linear", "lower", "higher", "midpoint" or "nearest" (halves to even), between the two ranks
// around q (n - 1) in the sorted line. float32 and float64; a line holding NaN gives NaN, which
// nanquantile leaves out (Note [quantile as a sort and a lerp] in ops/sort.cpp). Differentiable.
Tensor quantile(const Tensor& x, const Tensor& q, std::optional<int64_t> dim = {}, bool keepdim = false,
                std::string_view interpolation = "linear");
Tensor quantile(const Tensor& x, double q, std::optional<int64_t> dim = {}, bool keepdim = false,
                std::string_view interpolation = "linear");
Tensor nanquantile(const Tensor& x, const Tensor& q, std::optional<int64_t> dim = {}, bool keepdim = false,
                   std::string_view interpolation = "linear");
Tensor nanquantile(const Tensor& x, double q, std::optional<int64_t> dim = {}, bool keepdim = false,
                   std::string_view interpolation = "linear");

// ---- select.cpp: ops whose output size depends on the values (one count read back to the host) ----
// The coordinates of x's nonzero elements (NaN counts as nonzero), (count, x.dim()) int64, in
// row-major order; argwhere is the same. where(condition) gives them as one 1-D tensor per dim
// (PyTorch's nonzero(as_tuple=True); a 0-d condition gives one).
Tensor nonzero(const Tensor& x);
Tensor argwhere(const Tensor& x);
std::vector<Tensor> where(const Tensor& condition);
Tensor count_nonzero(const Tensor& x, const Shape& dims = {});  // int64; every dim when dims is empty
// The elements of x where mask (bool) is true, x and mask broadcast together, as a 1-D tensor in
// row-major order. Differentiable (an index_select).
Tensor masked_select(const Tensor& x, const Tensor& mask);
// x (broadcast with mask) with its elements where mask is true replaced, in row-major order, by the
// first elements of source (x's dtype, at least as many elements as mask has true ones; any shape).
// Differentiable with respect to x and source (a scatter).
Tensor masked_scatter(const Tensor& x, const Tensor& mask, const Tensor& source);
// (values, inverse, counts): the distinct elements of x in ascending order (NaN last, each NaN its
// own value; -0 and 0 one value), for each element of x the index of its value (x's shape), and how
// many times each value occurs. With dim: the distinct slices along dim in lexicographic order,
// inverse of x.size(dim) elements. unique_consecutive merges only runs of equal neighbours, in place.
// Not differentiable, as PyTorch's; always sorted (PyTorch's sorted = true).
std::tuple<Tensor, Tensor, Tensor> unique(const Tensor& x, std::optional<int64_t> dim = {});
std::tuple<Tensor, Tensor, Tensor> unique_consecutive(const Tensor& x, std::optional<int64_t> dim = {});
// How often each value 0, 1, ... max(x) occurs in x (1-D, non-negative integers), or the sum of the
// weights (one per element) of each; at least minlength bins. int64 counts, float32 sums of float32
// weights, float64 sums of other weights (PyTorch's dtypes).
Tensor bincount(const Tensor& x, const Tensor& weights = {}, int64_t minlength = 0);
// A histogram of x (floating) in `bins` equal bins over [min, max], or over x's own range when min ==
// max; elements outside the range and NaN are not counted (Note [histc's bins] in ops/select.cpp).
Tensor histc(const Tensor& x, int64_t bins = 100, double min = 0, double max = 0);

// ---- softmax.cpp ----
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);
// The cross-entropy of each row of logits (R, C) against class indices target (R, int64): per row
// -(1 - eps) log_softmax(logits)[t] - eps / C sum_c log_softmax(logits)[c], and 0 where target ==
// ignore_index. One pass each way while fusion is on (set_fusion): the (R, C) log-probabilities
// are never stored. float16 and bfloat16 logits are computed in float32 and give a float32 loss
// (their gradient keeps their dtype), as after autocast's cast, without a float32 copy of them.
// nn::functional::cross_entropy calls it.
Tensor softmax_cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index = -100,
                             double label_smoothing = 0);

// ---- ctc.cpp ----
// CTC's negative log-likelihood (Graves et al., 2006) of each sample, -log p(targets[n] | log_probs[:, n]),
// as one fused kernel each way: log_probs (T, N, C) float32 or float64, targets (N, S) int64 whose
// first target_lengths[n] columns are sample n's labels (class indices), input_lengths and
// target_lengths (N) int64 in [0, T] and [0, S]; -> (N) of log_probs' dtype, +inf where the target
// has no alignment in the sample's frames (with no gradient). Its gradient with respect to log_probs
// is the true one (PyTorch's adds exp(log_probs), which a log_softmax before it cancels), and cannot
// itself be differentiated (create_graph is an Error, as in PyTorch). nn::ctc_loss (the reductions,
// concatenated targets, zero_infinity, 16-bit inputs) calls it while fusion is on (set_fusion).
Tensor ctc_nll(const Tensor& log_probs, const Tensor& targets, const Tensor& input_lengths,
               const Tensor& target_lengths, int64_t blank = 0);

// ---- attention.cpp ----
// softmax(query key^T * scale + mask) value, as torch.nn.functional.scaled_dot_product_attention:
// query (..., L, E), key (..., S, E), value (..., S, Ev) -> (..., L, Ev), batch dims broadcast.
// attn_mask: bool (true = may attend) or float (added to the scores), broadcast to (..., L, S);
// is_causal: query i attends to keys j <= i (not with attn_mask); scale: 1 / sqrt(E) by default;
// dropout_p > 0 drops probabilities (pass 0 in evaluation). Without mask it runs as one fused kernel
// that never holds the (L, S) scores (see ops/attention.cpp; with dropout on the CPU only), unless
// fusion is off.
Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const Tensor& attn_mask = {}, double dropout_p = 0.0, bool is_causal = false,
                                    std::optional<double> scale = {}, Generator* gen = nullptr);
// scaled_dot_product_attention of some heads of a larger attention: the heads (the last batch dim
// of query and key, broadcast) are heads [first_head, first_head + their number) of whole_heads.
// The result is the same; what differs is
// dropout's mask, which is those heads' part of the mask the attention of all whole_heads heads would
// draw from gen's state (gen advances as for all of them, as with dropout_part). Tensor-parallel
// attention (distributed/tensor_parallel) runs a rank's heads with it.
Tensor scaled_dot_product_attention_part(const Tensor& query, const Tensor& key, const Tensor& value,
                                         int64_t first_head, int64_t whole_heads, const Tensor& attn_mask = {},
                                         double dropout_p = 0.0, bool is_causal = false,
                                         std::optional<double> scale = {}, Generator* gen = nullptr);

// ---- shape_ops.cpp ----
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);
std::vector<Tensor> split_with_sizes(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim = 0);
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);
Tensor flip(const Tensor& x, const Shape& dims);
Tensor repeat(const Tensor& x, const Shape& repeats);
// pad: (left, right) pairs starting from the last dim, as torch.nn.functional.pad; constant mode.
Tensor pad(const Tensor& x, const std::vector<int64_t>& padding, double value = 0);
// pad in mode "constant" (as above), "reflect" (mirrored about the edge element, which is not
// repeated: 0 1 2 3 padded by 2 gives 2 1 | 0 1 2 3 | 2 1), "replicate" (the edge element repeated:
// 0 0 | ... | 3 3) or "circular" (wrapped around: 2 3 | ... | 0 1). As PyTorch: the non-constant
// modes pad the last 1, 2 or 3 dims of an input with one or two more (unbatched or batched),
// reflect's pads must be below the dim's size and circular's at most what a crop leaves, a negative
// pad crops (circular wraps around the cropped input, reflect and replicate read the uncropped one),
// and value is for "constant" only.
Tensor pad(const Tensor& x, const std::vector<int64_t>& padding, std::string_view mode, double value = 0);
// (*, C r^2, H, W) -> (*, C, H r, W r), as torch.pixel_shuffle; pixel_unshuffle is its inverse.
Tensor pixel_shuffle(const Tensor& x, int64_t upscale_factor);
Tensor pixel_unshuffle(const Tensor& x, int64_t downscale_factor);
Tensor tril(const Tensor& x, int64_t diagonal = 0);
Tensor triu(const Tensor& x, int64_t diagonal = 0);

// ---- index.cpp (indices are int64 or int32) ----
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
Tensor index_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& source);
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
Tensor scatter(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
Tensor embedding(const Tensor& weight, const Tensor& indices);  // weight (V, C), any index shape
Tensor one_hot(const Tensor& indices, int64_t num_classes = -1);  // int64 output

// ---- conv.cpp ---- (input N,C,H,W or unbatched C,H,W as PyTorch; weight (C_out, C_in/groups, kH, kW))
Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias = {},
              const Shape& stride = {1, 1}, const Shape& padding = {0, 0},
              const Shape& dilation = {1, 1}, int64_t groups = 1);
Tensor conv1d(const Tensor& input, const Tensor& weight, const Tensor& bias = {}, int64_t stride = 1,
              int64_t padding = 0, int64_t dilation = 1, int64_t groups = 1);
// input (N, C, D, H, W) or unbatched (C, D, H, W); weight (C_out, C_in / groups, kD, kH, kW); stride,
// padding and dilation one number for all three dims, or three.
Tensor conv3d(const Tensor& input, const Tensor& weight, const Tensor& bias = {},
              const Shape& stride = {1, 1, 1}, const Shape& padding = {0, 0, 0},
              const Shape& dilation = {1, 1, 1}, int64_t groups = 1);
// Transposed convolutions, PyTorch's argument order: input (N, C_in, H, W) or (C_in, H, W), weight
// (C_in, C_out / groups, kH, kW), bias (C_out); output_padding (< stride or < dilation) adds rows and
// columns at the end. The 1-D form: input (N, C_in, L) or (C_in, L), weight (C_in, C_out / groups, k).
Tensor conv_transpose2d(const Tensor& input, const Tensor& weight, const Tensor& bias = {},
                        const Shape& stride = {1, 1}, const Shape& padding = {0, 0},
                        const Shape& output_padding = {0, 0}, int64_t groups = 1, const Shape& dilation = {1, 1});
Tensor conv_transpose1d(const Tensor& input, const Tensor& weight, const Tensor& bias = {}, int64_t stride = 1,
                        int64_t padding = 0, int64_t output_padding = 0, int64_t groups = 1, int64_t dilation = 1);
// The 3-D form: input (N, C_in, D, H, W) or (C_in, D, H, W), weight (C_in, C_out / groups, kD, kH, kW);
// stride, padding, output_padding and dilation one number for all three dims, or three. One
// conv_transpose2d over the depth slices and an index_add of its depth taps (Note [conv_transpose3d
// as conv_transpose2d], ops/conv.cpp).
Tensor conv_transpose3d(const Tensor& input, const Tensor& weight, const Tensor& bias = {},
                        const Shape& stride = {1}, const Shape& padding = {0}, const Shape& output_padding = {0},
                        int64_t groups = 1, const Shape& dilation = {1});
// The gradients of conv2d (its backward; ordinary ops, so they have a backward too): with respect to
// the input, of shape input_shape (N, C_in, H, W), and with respect to the weight, of weight_shape.
Tensor conv2d_backward_input(const Tensor& grad_output, const Tensor& weight, const Shape& input_shape,
                             const Shape& stride, const Shape& padding, const Shape& dilation,
                             int64_t groups);
Tensor conv2d_backward_weight(const Tensor& grad_output, const Tensor& input, const Shape& weight_shape,
                              const Shape& stride, const Shape& padding, const Shape& dilation,
                              int64_t groups);

// ---- pool.cpp ---- (stride {} means = kernel_size; a single-element Shape {k} means {k, k})
Tensor max_pool2d(const Tensor& x, const Shape& kernel_size, const Shape& stride = {},
                  const Shape& padding = {0, 0}, const Shape& dilation = {1, 1}, bool ceil_mode = false);
std::tuple<Tensor, Tensor> max_pool2d_with_indices(const Tensor& x, const Shape& kernel_size,
                  const Shape& stride = {}, const Shape& padding = {0, 0},
                  const Shape& dilation = {1, 1}, bool ceil_mode = false);  // indices int64 into H*W as PyTorch
Tensor avg_pool2d(const Tensor& x, const Shape& kernel_size, const Shape& stride = {},
                  const Shape& padding = {0, 0}, bool ceil_mode = false, bool count_include_pad = true,
                  std::optional<int64_t> divisor_override = {});
Tensor adaptive_avg_pool2d(const Tensor& x, const Shape& output_size);
// Output cell (i, j) is the maximum over rows [floor(i H / Ho), ceil((i + 1) H / Ho)) and the columns
// alike, as PyTorch's; the indices are int64 into H * W, the first maximum on ties.
Tensor adaptive_max_pool2d(const Tensor& x, const Shape& output_size);
std::tuple<Tensor, Tensor> adaptive_max_pool2d_with_indices(const Tensor& x, const Shape& output_size);
// max_pool2d(x, 2): a square kernel given as one number.
inline Tensor max_pool2d(const Tensor& x, int64_t kernel_size) { return max_pool2d(x, Shape{kernel_size}); }
inline Tensor avg_pool2d(const Tensor& x, int64_t kernel_size) { return avg_pool2d(x, Shape{kernel_size}); }
// 1-D pooling over the last dim of an (N, C, L) or unbatched (C, L) input: the 2-D pooling of a
// height-1 image, as conv1d is conv2d's. Arguments as PyTorch's (stride unset: kernel_size); the
// indices of max_pool1d_with_indices index L.
Tensor max_pool1d(const Tensor& x, int64_t kernel_size, std::optional<int64_t> stride = {}, int64_t padding = 0,
                  int64_t dilation = 1, bool ceil_mode = false);
std::tuple<Tensor, Tensor> max_pool1d_with_indices(const Tensor& x, int64_t kernel_size,
                                                   std::optional<int64_t> stride = {}, int64_t padding = 0,
                                                   int64_t dilation = 1, bool ceil_mode = false);
Tensor avg_pool1d(const Tensor& x, int64_t kernel_size, std::optional<int64_t> stride = {}, int64_t padding = 0,
                  bool ceil_mode = false, bool count_include_pad = true);
Tensor adaptive_avg_pool1d(const Tensor& x, int64_t output_size);
Tensor adaptive_max_pool1d(const Tensor& x, int64_t output_size);
std::tuple<Tensor, Tensor> adaptive_max_pool1d_with_indices(const Tensor& x, int64_t output_size);
// 3-D pooling over the last three dims of an (N, C, D, H, W) or unbatched (C, D, H, W) input, with
// PyTorch's arguments (one number for all three dims, or three; stride {} means = kernel_size), output
// sizes and checks; the indices of the max poolings index D * H * W. Each is two 2-D poolings (Note
// [3-D pooling is separable], ops/pool.cpp), so any device and differentiable twice.
Tensor max_pool3d(const Tensor& x, const Shape& kernel_size, const Shape& stride = {}, const Shape& padding = {0},
                  const Shape& dilation = {1}, bool ceil_mode = false);
std::tuple<Tensor, Tensor> max_pool3d_with_indices(const Tensor& x, const Shape& kernel_size, const Shape& stride = {},
                                                   const Shape& padding = {0}, const Shape& dilation = {1},
                                                   bool ceil_mode = false);
Tensor avg_pool3d(const Tensor& x, const Shape& kernel_size, const Shape& stride = {}, const Shape& padding = {0},
                  bool ceil_mode = false, bool count_include_pad = true,
                  std::optional<int64_t> divisor_override = {});
Tensor adaptive_avg_pool3d(const Tensor& x, const Shape& output_size);
Tensor adaptive_max_pool3d(const Tensor& x, const Shape& output_size);
std::tuple<Tensor, Tensor> adaptive_max_pool3d_with_indices(const Tensor& x, const Shape& output_size);

// ---- norm.cpp ----
// training: normalises with batch statistics and updates running_mean/var in place (unbiased var,
// momentum as PyTorch) when they are defined; eval: uses the running statistics.
Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight, const Tensor& bias, bool training, double momentum = 0.1,
                  double eps = 1e-5);
Tensor layer_norm(const Tensor& input, const Shape& normalized_shape, const Tensor& weight = {},
                  const Tensor& bias = {}, double eps = 1e-5);
// The residual add of a pre-LN transformer and the LayerNorm after it: returns (x + residual,
// layer_norm(x + residual)). One pass each way while fusion is on (set_fusion; float32/float64), else
// composed. layer_norm and rms_norm themselves are one fused pass (with their affine) too.
std::tuple<Tensor, Tensor> add_layer_norm(const Tensor& x, const Tensor& residual, const Shape& normalized_shape,
                                          const Tensor& weight = {}, const Tensor& bias = {}, double eps = 1e-5);
Tensor rms_norm(const Tensor& input, const Shape& normalized_shape, const Tensor& weight = {},
                std::optional<double> eps = {});  // eps default: machine epsilon of the dtype (PyTorch)
Tensor group_norm(const Tensor& input, int64_t num_groups, const Tensor& weight = {},
                  const Tensor& bias = {}, double eps = 1e-5);

// ---- print.cpp ----
std::string to_string(const Tensor& t);

}  // namespace ops

// Kernel fusion (DESIGN.md §5): on by default. set_fusion(false), or KILN_FUSION=0 in the environment,
// makes the fused ops (scaled_dot_product_attention, gelu's backward, bias_gelu, addmm_gelu,
// layer_norm, rms_norm, add_layer_norm, softmax_cross_entropy, and nn::ctc_loss's ctc_nll) run as their
// unfused compositions, so that a benchmark can measure what fusion buys. Process-wide (attention.cpp). The fused
// Adam/AdamW and SGD steps are the optimizers' own `fused` option, as in PyTorch. docs/fusion.md
// lists them all.
void set_fusion(bool enabled);
bool fusion_enabled();

// ---- optim.cpp ----
// One fused Adam / AdamW step (Backend::adam_step in core/backend.h has the rule) over lists of
// tensors of one device and one dtype (float32 or float64), each contiguous, updated in place:
// optim::Adam's `fused` option. max_exp_avg_sqs is empty unless args.amsgrad.
void fused_adam_(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                 const std::vector<Tensor>& exp_avgs, const std::vector<Tensor>& exp_avg_sqs,
                 const std::vector<Tensor>& max_exp_avg_sqs, const AdamStepArgs& args);
// One fused SGD step (Backend::sgd_step in core/backend.h has the rule) over lists of tensors of one
// device and one dtype (float32 or float64), each contiguous, updated in place: optim::SGD's `fused`
// option. momentum_buffers is empty when args.momentum is 0; with args.first_step they are only
// written (empty_like is enough).
void fused_sgd_(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                const std::vector<Tensor>& momentum_buffers, const SgdStepArgs& args);

// ---- dispatch.cpp: the allocator statistics of a device (core/allocator.h) ----
namespace memory {
MemoryStats stats(Device device);
void reset_peak(Device device);
void empty_cache(Device device);  // returns the allocator's cached free blocks to the system
}  // namespace memory

}  // namespace kiln
