// ops/elementwise.cpp: unary, binary and ternary (addcmul, addcdiv, lerp) elementwise ops,
// where/masked_fill, their in-place forms, and PyTorch's type promotion. Each op's backward formula
// sits right after its forward.
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <utility>

#include "core/polynomial_math.h"
#include "ops/autocast.h"
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

enum class Category { Bool, Integral, Floating };
Category category(DType t) {
  return t == kBool ? Category::Bool : is_floating(t) ? Category::Floating : Category::Integral;
}
Category category(const Scalar& s) {
  return s.is_bool() ? Category::Bool : s.is_floating() ? Category::Floating : Category::Integral;
}

// PyTorch's can_cast: no float -> integer and no number -> bool for in-place results.
bool can_cast(DType from, DType to) { return category(from) <= category(to); }

Tensor cast_no_grad(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  NoGradGuard no_grad;
  return x.to(dtype);
}

DType floating_of(DType t) { return is_floating(t) ? t : kFloat32; }

// ---- unary ----

Tensor unary_forward(UnaryOp op, const Tensor& x, DType dtype, UnaryArgs args = {}) {
  Tensor in = cast_no_grad(x, dtype);
  Tensor out = empty_tensor(x.sizes(), op == UnaryOp::LogicalNot ? kBool : dtype, x.device());
  flops::Op count(0, is_floating(out.dtype()) ? out.numel() : 0);
  backend_for(x.device()).unary(op, view_of(in), view_of(out), args, stream_for(x.device()));
  return out;
}

void check_not_bool(const Tensor& x, const char* op) {
  KILN_CHECK(x.dtype() != kBool, "{}: not defined for bool tensors; convert first, e.g. x.to(kFloat32)", op);
}

// A floating unary op: integers and bool are promoted to float32, as in PyTorch (exp(mask) is
// float32); the activations gelu, silu and softplus refuse bool, as PyTorch does, at their call.
Tensor float_unary(UnaryOp op, const Tensor& x, const char* name, UnaryArgs args = {}) {
  return unary_forward(op, x, floating_of(x.dtype()), args);
}

// The three shapes a unary backward takes: from the input, from the output, or from neither.
template <typename F>
Tensor with_input_grad(Tensor y, const Tensor& x, const char* name, F formula) {
  if (should_record(x)) {
    record(name, {x}, {y}, [name, formula, xs = SavedTensor(x, false)](const Grads& g) -> TensorList {
      return {formula(g[0], xs.unpack(name))};
    });
  }
  return y;
}
template <typename F>
Tensor with_output_grad(Tensor y, const Tensor& x, const char* name, F formula) {
  if (should_record(x)) {
    record(name, {x}, {y}, [name, formula, ys = SavedTensor(y, true)](const Grads& g) -> TensorList {
      return {formula(g[0], ys.unpack(name))};
    });
  }
  return y;
}

// f(x) where x != 0 and `limit` where x = 0, f taken of x with its zeros replaced by 1: the branch
// where() leaves out then has no 0 / 0 whose NaN would reach a gradient (sinc, and the gradients of
// I1 / x-like quotients).
template <typename F>
Tensor with_limit_at_zero(const Tensor& x, double limit, F f) {
  const Tensor zero = x.eq(0);
  return where(zero, full_like(x, limit), f(where(zero, ones_like(x), x)));
}

// ---- binary ----

Tensor binary_forward(BinaryOp op, const Tensor& a, const Tensor& b, DType compute, double alpha,
                      const char* name) {
  check_same_device(name, a, b);
  Shape shape = a.sizes() == b.sizes() ? a.sizes() : broadcast_shapes(a.sizes(), b.sizes(), name);
  Tensor ac = cast_no_grad(a, compute), bc = cast_no_grad(b, compute);
  Tensor out = empty_tensor(shape, is_comparison(op) ? kBool : compute, a.device());
  flops::Op count(0, is_floating(out.dtype()) ? out.numel() : 0);
  backend_for(a.device())
      .binary(op, broadcast_view(ac, shape), broadcast_view(bc, shape), view_of(out), alpha,
              stream_for(a.device()));
  return out;
}

// What a binary op's backward needs to know of an input that was broadcast and converted on the way
// in: fit() sums the gradient back to the input's shape and converts it to the input's dtype.
struct InputInfo {
  Shape shape;
  DType dtype;
  explicit InputInfo(const Tensor& t) : shape(t.sizes()), dtype(t.dtype()) {}
  Tensor fit(const Tensor& g) const {
    Tensor r = g.sizes() == shape ? g : sum_to(g, shape);
    return r.dtype() == dtype ? r : r.to(dtype);
  }
};

// add's and sub's alpha reaches an integer kernel cast to the integer type: a fraction would be cut
// off (alpha 0.9 added nothing). PyTorch refuses any floating alpha there; whole ones pass here.
void check_integer_alpha(DType dt, double alpha, const char* name) {
  KILN_CHECK(is_floating(dt) || alpha == std::trunc(alpha),
             "{}: alpha ({}) must be a whole number for {} tensors, or it would be truncated; convert the "
             "tensors to a floating dtype first",
             name, alpha, dtype_name(dt));
}

Tensor arithmetic(BinaryOp op, const Tensor& a, const Tensor& b, double alpha, const char* name) {
  DType dt = result_type(a, b);  // bool operands promote (mask * float is float)
  if (op == BinaryOp::Add || op == BinaryOp::Sub) check_integer_alpha(dt, alpha, name);
  // PyTorch refuses a bool on either side of a subtraction (to invert a mask, logical_not is meant).
  KILN_CHECK(op != BinaryOp::Sub || (a.dtype() != kBool && b.dtype() != kBool),
             "{}: subtraction with a bool tensor is not supported; to invert a mask use logical_not(), or "
             "convert the bool tensor first, e.g. x.to(kInt64)",
             name);
  if (dt == kBool) {  // two bools, as PyTorch: + and maximum are or, * and minimum are and
    if (op == BinaryOp::Add || op == BinaryOp::Maximum) return logical_or(a, b);
    if (op == BinaryOp::Mul || op == BinaryOp::Minimum) return logical_and(a, b);
    KILN_CHECK(op == BinaryOp::Div, "{}: not defined for two bool tensors; convert one first, e.g. x.to(kFloat32)",
               name);
  }
  if (op == BinaryOp::Div) dt = floating_of(dt);
  return binary_forward(op, a, b, dt, alpha, name);
}

Tensor compare(BinaryOp op, const Tensor& a, const Tensor& b, const char* name) {
  return binary_forward(op, a, b, result_type(a, b), 1, name);
}

// A Scalar operand becomes a 0-dim tensor of the dtype the op will compute in.
Tensor wrap(const Scalar& s, const Tensor& like) {
  DType dt = result_type(like, s);
  return scalar_tensor(s, TensorOptions(dt).device(like.device()));
}

constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- ternary (addcmul, addcdiv, lerp) ----

// result_type over three tensors, as PyTorch: the dimensioned tensors decide, and 0-dim tensors
// only raise the category.
DType result_type3(const Tensor& a, const Tensor& b, const Tensor& c) {
  std::optional<DType> dimmed, zero;
  for (const Tensor* t : {&a, &b, &c}) {
    std::optional<DType>& slot = t->dim() == 0 ? zero : dimmed;
    slot = slot ? promote_types(*slot, t->dtype()) : t->dtype();
  }
  if (!dimmed) return *zero;
  if (zero && category(*zero) > category(*dimmed)) return *zero;
  return *dimmed;
}

Tensor ternary_forward(TernaryOp op, const Tensor& a, const Tensor& b, const Tensor& c, DType dt, double v,
                       const char* name) {
  check_same_device(name, a, b);
  check_same_device(name, a, c);
  const Shape shape = broadcast_shapes(broadcast_shapes(a.sizes(), b.sizes(), name), c.sizes(), name);
  Tensor ac = cast_no_grad(a, dt), bc = cast_no_grad(b, dt), cc = cast_no_grad(c, dt);
  Tensor out = empty_tensor(shape, dt, a.device());
  flops::Op count(0, is_floating(dt) ? 3 * out.numel() : 0);
  backend_for(a.device())
      .ternary(op, broadcast_view(ac, shape), broadcast_view(bc, shape), broadcast_view(cc, shape), view_of(out), v,
               stream_for(a.device()));
  return out;
}

// The checks of addcmul and addcdiv (PyTorch's): no bool; a floating value needs a floating result;
// addcdiv divides floats only.
DType addc_result_type(const Tensor& a, const Tensor& t1, const Tensor& t2, const Scalar& value, bool div,
                       const char* name) {
  const DType dt = result_type3(a, t1, t2);
  KILN_CHECK(dt != kBool, "{}: not defined for bool tensors; convert them first, e.g. x.to(kFloat32)", name);
  KILN_CHECK(!div || is_floating(t1.dtype()) || is_floating(t2.dtype()),
             "{}: integer division is not supported (tensor1 is {}, tensor2 {}); convert one of them to a "
             "floating dtype first",
             name, dtype_name(t1.dtype()), dtype_name(t2.dtype()));
  KILN_CHECK(is_floating(dt) || !value.is_floating(),
             "{}: for {} tensors the value must be an integer, got {}; convert the tensors to a floating dtype "
             "or pass an integer value",
             name, dtype_name(dt), value.to_double());
  if (!is_floating(dt)) {  // the value reaches the kernels as a double, then in the dtype: exact within these
    const int64_t v = value.to_int();
    constexpr int64_t kExact = int64_t{1} << 53;
    const auto [lo, hi] = dt == kInt64   ? std::pair<int64_t, int64_t>{-kExact, kExact}
                          : dt == kInt32 ? std::pair<int64_t, int64_t>{INT32_MIN, INT32_MAX}
                          : dt == kInt8  ? std::pair<int64_t, int64_t>{INT8_MIN, INT8_MAX}
                                         : std::pair<int64_t, int64_t>{0, UINT8_MAX};
    KILN_CHECK(v >= lo && v <= hi, "{}: the value {} does not fit {} ([{}, {}]); pass a smaller value or convert the "
               "tensors to a wider dtype", name, v, dtype_name(dt), lo, hi);
  }
  return dt;
}

// lerp's dtypes: floating, and the same for start, end and a tensor weight (PyTorch's rule).
void check_lerp_dtypes(const Tensor& start, const Tensor& end, const Tensor* weight, const char* name) {
  KILN_CHECK(is_floating(start.dtype()), "{}: needs floating tensors, got {}; convert first, e.g. x.to(kFloat32)",
             name, dtype_name(start.dtype()));
  KILN_CHECK(end.dtype() == start.dtype(), "{}: end is {} but the input is {}; convert one of them with .to()",
             name, dtype_name(end.dtype()), dtype_name(start.dtype()));
  KILN_CHECK(weight == nullptr || weight->dtype() == start.dtype(),
             "{}: weight is {} but the input is {}; convert one of them with .to()", name,
             dtype_name(weight ? weight->dtype() : start.dtype()), dtype_name(start.dtype()));
}

}  // namespace

inline namespace ops {

// ---- type promotion ----

DType result_type(const Tensor& a, const Tensor& b) {
  // Dimensioned tensors decide; a 0-dim tensor only raises the category (int tensor + float 0-dim
  // tensor gives the 0-dim's float type), as in PyTorch.
  bool a0 = a.dim() == 0, b0 = b.dim() == 0;
  if (a0 == b0) return promote_types(a.dtype(), b.dtype());
  const Tensor& dimmed = a0 ? b : a;
  const Tensor& zero = a0 ? a : b;
  if (category(zero.dtype()) > category(dimmed.dtype())) return zero.dtype();
  return dimmed.dtype();
}

DType result_type(const Tensor& a, const Scalar& b) {
  if (category(b) <= category(a.dtype())) return a.dtype();
  return b.is_floating() ? kFloat32 : kInt64;  // the default dtype of the scalar's category
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const int n = std::max(a.size(), b.size());
  Shape out = Shape::filled(n, 1);
  for (int i = 0; i < n; ++i) {
    int ia = i - (n - a.size()), ib = i - (n - b.size());
    int64_t sa = ia >= 0 ? a[ia] : 1, sb = ib >= 0 ? b[ib] : 1;
    KILN_CHECK(sa == sb || sa == 1 || sb == 1,
               "{}: shapes {} and {} cannot be broadcast: dim {} has sizes {} and {} (sizes must match "
               "or one must be 1)",
               op, a.str(), b.str(), i - n, sa, sb);
    out[i] = sa == 1 ? sb : sa;
  }
  return out;
}

// ---- unary ops ----

Tensor neg(const Tensor& x) {
  check_not_bool(x, "neg");
  Tensor y = unary_forward(UnaryOp::Neg, x, x.dtype());
  if (should_record(x)) record("NegBackward", {x}, {y}, [](const Grads& g) -> TensorList { return {-g[0]}; });
  return y;
}
Tensor abs(const Tensor& x) {
  check_not_bool(x, "abs");
  return with_input_grad(unary_forward(UnaryOp::Abs, x, x.dtype()), x, "AbsBackward",
                         [](const Tensor& g, const Tensor& x) { return g * x.sign(); });
}
Tensor sign(const Tensor& x) {
  if (x.dtype() == kBool) return x.clone();  // PyTorch: the sign of a bool is itself
  Tensor y = unary_forward(UnaryOp::Sign, x, x.dtype());
  if (should_record(x)) record("SignBackward", {x}, {y}, [](const Grads& g) -> TensorList { return {zeros_like(g[0])}; });
  return y;
}
Tensor exp(const Tensor& x) {
  if (autocast::is_enabled(x.device().type)) {  // See Note [autocast] in ops/autocast.h
    if (autocast::OpScope ac{autocast::Op::Exp, x.device()}) return exp(ac.cast(x));
  }
  return with_output_grad(float_unary(UnaryOp::Exp, x, "exp"), x, "ExpBackward",
                          [](const Tensor& g, const Tensor& y) { return g * y; });  // d e^x = e^x
}
Tensor log(const Tensor& x) {
  if (autocast::is_enabled(x.device().type)) {
    if (autocast::OpScope ac{autocast::Op::Log, x.device()}) return log(ac.cast(x));
  }
  return with_input_grad(float_unary(UnaryOp::Log, x, "log"), x, "LogBackward",
                         [](const Tensor& g, const Tensor& x) { return g / x; });
}
Tensor log1p(const Tensor& x) {
  if (autocast::is_enabled(x.device().type)) {
    if (autocast::OpScope ac{autocast::Op::Log1p, x.device()}) return log1p(ac.cast(x));
  }
  return with_input_grad(float_unary(UnaryOp::Log1p, x, "log1p"), x, "Log1pBackward",
                         [](const Tensor& g, const Tensor& x) { return g / (x + 1); });
}
Tensor expm1(const Tensor& x) {
  if (autocast::is_enabled(x.device().type)) {
    if (autocast::OpScope ac{autocast::Op::Expm1, x.device()}) return expm1(ac.cast(x));
  }
  return with_output_grad(float_unary(UnaryOp::Expm1, x, "expm1"), x, "Expm1Backward",
                          [](const Tensor& g, const Tensor& y) { return g * (y + 1); });
}
Tensor sqrt(const Tensor& x) {
  return with_output_grad(float_unary(UnaryOp::Sqrt, x, "sqrt"), x, "SqrtBackward",
                          [](const Tensor& g, const Tensor& y) { return g / (y * 2); });
}
Tensor rsqrt(const Tensor& x) {  // d x^-1/2 = -1/2 x^-3/2 = -1/2 y^3
  if (autocast::is_enabled(x.device().type)) {
    if (autocast::OpScope ac{autocast::Op::Rsqrt, x.device()}) return rsqrt(ac.cast(x));
  }
  return with_output_grad(float_unary(UnaryOp::Rsqrt, x, "rsqrt"), x, "RsqrtBackward",
                          [](const Tensor& g, const Tensor& y) { return g * y * y * y * -0.5; });
}
Tensor reciprocal(const Tensor& x) {  // d 1/x = -1/x^2
  if (autocast::is_enabled(x.device().type)) {
    if (autocast::OpScope ac{autocast::Op::Reciprocal, x.device()}) return reciprocal(ac.cast(x));
  }
  return with_output_grad(float_unary(UnaryOp::Reciprocal, x, "reciprocal"), x, "ReciprocalBackward",
                          [](const Tensor& g, const Tensor& y) { return -(g * y * y); });
}
Tensor sin(const Tensor& x) {
  return with_input_grad(float_unary(UnaryOp::Sin, x, "sin"), x, "SinBackward",
                         [](const Tensor& g, const Tensor& x) { return g * x.cos(); });
}
Tensor cos(const Tensor& x) {
  return with_input_grad(float_unary(UnaryOp::Cos, x, "cos"), x, "CosBackward",
                         [](const Tensor& g, const Tensor& x) { return -(g * x.sin()); });
}
Tensor tanh(const Tensor& x) {  // d tanh = 1 - tanh^2
  return with_output_grad(float_unary(UnaryOp::Tanh, x, "tanh"), x, "TanhBackward",
                          [](const Tensor& g, const Tensor& y) { return g * (1 - y * y); });
}
Tensor sigmoid(const Tensor& x) {  // d s = s (1 - s)
  return with_output_grad(float_unary(UnaryOp::Sigmoid, x, "sigmoid"), x, "SigmoidBackward",
                          [](const Tensor& g, const Tensor& y) { return g * y * (1 - y); });
}
Tensor relu(const Tensor& x) {
  check_not_bool(x, "relu");
  // The backward is one pass, y <= 0 ? 0 : g (BinaryOp::ReluBackward, PyTorch's threshold_backward,
  // so a NaN y passes g), unless it is itself differentiated (create_graph) or fusion is off: then
  // g * !(y <= 0) as ops, which differs only where y <= 0 and g is inf or NaN (NaN, not 0).
  return with_output_grad(unary_forward(UnaryOp::Relu, x, x.dtype()), x, "ReluBackward",
                          [](const Tensor& g, const Tensor& y) {
                            if (fused_backward() && g.dtype() == y.dtype()) {
                              return binary_forward(BinaryOp::ReluBackward, g, y, y.dtype(), 1, "relu backward");
                            }
                            return g * y.le(0).logical_not();
                          });
}
namespace {
// gelu'(x) as ops, differentiable again (create_graph) and the formula of the unfused backward:
//   erf form:  d/dx x Phi(x) = Phi(x) + x phi(x)
//   tanh form: d/dx 0.5 x (1 + tanh(u)), u = k (x + c x^3): 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 c x^2)
Tensor gelu_derivative(const Tensor& x, bool tanh_form) {
  if (tanh_form) {
    const double k = 0.79788456080286535588, c = 0.044715;
    Tensor x2 = x * x;
    Tensor t = ((x + x2 * x * c) * k).tanh();
    return (t + 1) * 0.5 + x * (1 - t * t) * (x2 * (3 * c) + 1) * (0.5 * k);
  }
  Tensor cdf = (erf(x * 0.70710678118654752440) + 1) * 0.5;
  Tensor pdf = (x * x * -0.5).exp() * 0.39894228040143267794;
  return cdf + x * pdf;
}

}  // namespace

bool parse_gelu_approximate(std::string_view approximate, const char* op) {
  KILN_CHECK(approximate == "none" || approximate == "tanh", "{}: approximate must be \"none\" or \"tanh\", got \"{}\"",
             op, approximate);
  return approximate == "tanh";
}

Tensor gelu_backward(const Tensor& grad, const Tensor& x, bool tanh_form) {
  // One fused pass with fusion on, unless the backward is itself differentiated (create_graph).
  if (fused_backward()) {
    return binary_forward(tanh_form ? BinaryOp::GeluTanhBackward : BinaryOp::GeluErfBackward, grad, x,
                          result_type(grad, x), 1, "gelu backward");
  }
  return grad * gelu_derivative(x, tanh_form);
}

Tensor gelu(const Tensor& x, std::string_view approximate) {
  const bool tanh_form = parse_gelu_approximate(approximate, "gelu");
  // The backward is one fused pass, g * gelu'(x) (BinaryOp::GeluErfBackward / GeluTanhBackward in
  // core/scalar_math.h), unless it is itself being differentiated (create_graph): then the same
  // formula as ops, so that it has a gradient of its own; likewise with fusion off (set_fusion).
  check_not_bool(x, "gelu");
  return with_input_grad(float_unary(tanh_form ? UnaryOp::GeluTanh : UnaryOp::GeluErf, x, "gelu"), x,
                         "GeluBackward",
                         [tanh_form](const Tensor& g, const Tensor& x) { return gelu_backward(g, x, tanh_form); });
}

bool bias_gelu_fuses(DType dtype) { return fusion_enabled() && (dtype == kFloat32 || dtype == kFloat64); }

Tensor bias_gelu(const Tensor& input, const Tensor& bias, std::string_view approximate) {
  const char* op = "bias_gelu";
  flops::Op count(0, 2 * input.numel());  // the add and the GELU
  const bool tanh_form = parse_gelu_approximate(approximate, op);
  KILN_CHECK(input.dim() >= 1 && bias.dim() == 1 && bias.size(0) == input.size(-1),
             "{}: bias must be 1-D with as many elements as the input's last dim; got input {} and bias {}", op,
             input.sizes().str(), bias.sizes().str());
  check_same_device(op, input, bias);
  const bool fused = input.dtype() == bias.dtype() && bias_gelu_fuses(input.dtype());
  if (!fused) return gelu(input + bias, approximate);
  const int64_t N = bias.size(0), R = N == 0 ? 0 : input.numel() / N;
  Tensor x = input.reshape({R, N}).contiguous(), b = bias.contiguous();
  Tensor out = empty_tensor({R, N}, x.dtype(), x.device());
  if (out.numel() > 0) {
    backend_for(x.device()).bias_gelu(view_of(x), view_of(b), view_of(out), tanh_form, stream_for(x.device()));
  }
  if (should_record(input, bias)) {
    // Saves in and bias, not in + bias: the sum is recomputed in the backward's one pass.
    record("BiasGeluBackward", {x, b}, {out},
           [xs = SavedTensor(x, false), bs = SavedTensor(b, false), tanh_form](const Grads& g) -> TensorList {
             Tensor xv = xs.unpack("BiasGeluBackward"), bv = bs.unpack("BiasGeluBackward");
             if (GradMode::is_enabled()) {  // create_graph: as ops, differentiable again
               Tensor gi = gelu_backward(g[0], xv + bv, tanh_form);  // the formula as ops here
               return {gi, g.needs_grad(1) ? gi.sum({0}) : Tensor()};
             }
             Tensor go = g[0].contiguous();
             Tensor gi = empty_tensor(xv.sizes(), xv.dtype(), xv.device());
             Tensor gb = g.needs_grad(1) ? empty_tensor(bv.sizes(), bv.dtype(), bv.device()) : Tensor();
             if (gb.defined() && gi.numel() == 0) gb.zero_();
             if (gi.numel() > 0) {
               backend_for(xv.device()).bias_gelu_backward(view_of(go), view_of(xv), view_of(bv), view_of(gi),
                                                           view_or_none(gb), tanh_form,
                                                           stream_for(xv.device()));
             }
             return {gi, gb};
           });
  }
  return out.reshape(input.sizes());
}

Tensor silu(const Tensor& x) {  // d x s(x) = s (1 + x (1 - s))
  check_not_bool(x, "silu");
  return with_input_grad(float_unary(UnaryOp::Silu, x, "silu"), x, "SiluBackward",
                         [](const Tensor& g, const Tensor& x) {
                           Tensor s = x.sigmoid();
                           return g * s * (x * (1 - s) + 1);
                         });
}
Tensor softplus(const Tensor& x) {  // d log(1 + e^x) = sigmoid(x); the identity above 20
  if (autocast::is_enabled(x.device().type)) {
    if (autocast::OpScope ac{autocast::Op::Softplus, x.device()}) return softplus(ac.cast(x));
  }
  check_not_bool(x, "softplus");
  return with_input_grad(float_unary(UnaryOp::Softplus, x, "softplus"), x, "SoftplusBackward",
                         [](const Tensor& g, const Tensor& x) { return where(x.gt(20), g, g * x.sigmoid()); });
}
Tensor erf(const Tensor& x) {  // d erf = 2/sqrt(pi) e^(-x^2)
  return with_input_grad(float_unary(UnaryOp::Erf, x, "erf"), x, "ErfBackward",
                         [](const Tensor& g, const Tensor& x) { return g * (x * x).neg().exp() * 1.1283791670955126; });
}
// ---- trigonometric, hyperbolic, logarithmic and special functions ----
// Integers and bool are promoted to float32 (float_unary); each gradient is PyTorch's formula, written
// as ops, so differentiable again. On CUDA under autocast, tan, asin, acos, sinh, cosh, log2, log10
// and erfinv run in float32 (PyTorch's list); on the CPU they run in their input's dtype.

// The autocast guard of the float32 rows, for a one-input op.
#define KILN_AUTOCAST_UNARY(OP, fn, x)                                               \
  if (autocast::is_enabled((x).device().type)) {                                     \
    if (autocast::OpScope ac{autocast::Op::OP, (x).device()}) return fn(ac.cast(x)); \
  }

Tensor tan(const Tensor& x) {  // d tan = 1 + tan^2
  KILN_AUTOCAST_UNARY(Tan, tan, x);
  return with_output_grad(float_unary(UnaryOp::Tan, x, "tan"), x, "TanBackward",
                          [](const Tensor& g, const Tensor& y) { return g * (y * y + 1); });
}
Tensor asin(const Tensor& x) {  // d asin = 1 / sqrt(1 - x^2)
  KILN_AUTOCAST_UNARY(Asin, asin, x);
  return with_input_grad(float_unary(UnaryOp::Asin, x, "asin"), x, "AsinBackward",
                         [](const Tensor& g, const Tensor& x) { return g * (1 - x * x).rsqrt(); });
}
Tensor acos(const Tensor& x) {  // d acos = -1 / sqrt(1 - x^2)
  KILN_AUTOCAST_UNARY(Acos, acos, x);
  return with_input_grad(float_unary(UnaryOp::Acos, x, "acos"), x, "AcosBackward",
                         [](const Tensor& g, const Tensor& x) { return -(g * (1 - x * x).rsqrt()); });
}
Tensor atan(const Tensor& x) {  // d atan = 1 / (1 + x^2)
  return with_input_grad(float_unary(UnaryOp::Atan, x, "atan"), x, "AtanBackward",
                         [](const Tensor& g, const Tensor& x) { return g / (x * x + 1); });
}
Tensor sinh(const Tensor& x) {
  KILN_AUTOCAST_UNARY(Sinh, sinh, x);
  return with_input_grad(float_unary(UnaryOp::Sinh, x, "sinh"), x, "SinhBackward",
                         [](const Tensor& g, const Tensor& x) { return g * cosh(x); });
}
Tensor cosh(const Tensor& x) {
  KILN_AUTOCAST_UNARY(Cosh, cosh, x);
  return with_input_grad(float_unary(UnaryOp::Cosh, x, "cosh"), x, "CoshBackward",
                         [](const Tensor& g, const Tensor& x) { return g * sinh(x); });
}
Tensor asinh(const Tensor& x) {  // d asinh = 1 / sqrt(x^2 + 1)
  return with_input_grad(float_unary(UnaryOp::Asinh, x, "asinh"), x, "AsinhBackward",
                         [](const Tensor& g, const Tensor& x) { return g * (x * x + 1).rsqrt(); });
}
Tensor acosh(const Tensor& x) {  // d acosh = 1 / sqrt(x^2 - 1)
  return with_input_grad(float_unary(UnaryOp::Acosh, x, "acosh"), x, "AcoshBackward",
                         [](const Tensor& g, const Tensor& x) { return g * (x * x - 1).rsqrt(); });
}
Tensor atanh(const Tensor& x) {  // d atanh = 1 / (1 - x^2)
  return with_input_grad(float_unary(UnaryOp::Atanh, x, "atanh"), x, "AtanhBackward",
                         [](const Tensor& g, const Tensor& x) { return g / (1 - x * x); });
}
Tensor log2(const Tensor& x) {
  KILN_AUTOCAST_UNARY(Log2, log2, x);
  return with_input_grad(float_unary(UnaryOp::Log2, x, "log2"), x, "Log2Backward",
                         [](const Tensor& g, const Tensor& x) { return g / (x * 0.69314718055994530942); });
}
Tensor log10(const Tensor& x) {
  KILN_AUTOCAST_UNARY(Log10, log10, x);
  return with_input_grad(float_unary(UnaryOp::Log10, x, "log10"), x, "Log10Backward",
                         [](const Tensor& g, const Tensor& x) { return g / (x * 2.30258509299404568402); });
}
Tensor exp2(const Tensor& x) {  // d 2^x = 2^x ln 2
  return with_output_grad(float_unary(UnaryOp::Exp2, x, "exp2"), x, "Exp2Backward",
                          [](const Tensor& g, const Tensor& y) { return g * y * 0.69314718055994530942; });
}
Tensor erfc(const Tensor& x) {  // d erfc = -2/sqrt(pi) e^(-x^2)
  return with_input_grad(
      float_unary(UnaryOp::Erfc, x, "erfc"), x, "ErfcBackward",
      [](const Tensor& g, const Tensor& x) { return g * (x * x).neg().exp() * -1.1283791670955126; });
}
Tensor erfinv(const Tensor& x) {  // d erfinv = sqrt(pi)/2 e^(erfinv(x)^2)
  KILN_AUTOCAST_UNARY(Erfinv, erfinv, x);
  return with_output_grad(float_unary(UnaryOp::Erfinv, x, "erfinv"), x, "ErfinvBackward",
                          [](const Tensor& g, const Tensor& y) { return g * (y * y).exp() * 0.88622692545275801365; });
}
Tensor lgamma(const Tensor& x) {  // d log |Gamma| = digamma
  return with_input_grad(float_unary(UnaryOp::Lgamma, x, "lgamma"), x, "LgammaBackward",
                         [](const Tensor& g, const Tensor& x) { return g * digamma(x); });
}
Tensor digamma(const Tensor& x) { return polygamma(0, x); }
Tensor polygamma(int64_t n, const Tensor& x) {
  KILN_CHECK(n >= 0, "polygamma: n must be non-negative (the order of the derivative of digamma), got {}", n);
  const UnaryOp op = n == 0 ? UnaryOp::Digamma : UnaryOp::Polygamma;
  return with_input_grad(float_unary(op, x, n == 0 ? "digamma" : "polygamma", {static_cast<double>(n), 0}), x,
                         n == 0 ? "DigammaBackward" : "PolygammaBackward",
                         [n](const Tensor& g, const Tensor& x) { return g * polygamma(n + 1, x); });
}
#undef KILN_AUTOCAST_UNARY

// In sinc and logit, float16 and bfloat16 compute in float32 and round once, as PyTorch's kernels do
// (their compositions would round at each of their steps).
// sin(pi x) / (pi x), 1 at 0.
Tensor sinc(const Tensor& x) {
  if (is_reduced_float(x.dtype())) return sinc(x.to(kFloat32)).to(x.dtype());
  const Tensor xf = x.is_floating_point() ? x : x.to(kFloat32);
  return with_limit_at_zero(xf, 1, [](const Tensor& safe) {
    const Tensor px = safe * 3.14159265358979323846;
    return px.sin() / px;
  });
}
// log(x / (1 - x)), x first clamped to [eps, 1 - eps] when eps is given (its gradient then 0 outside).
Tensor logit(const Tensor& x, std::optional<double> eps) {
  if (is_reduced_float(x.dtype())) return logit(x.to(kFloat32), eps).to(x.dtype());
  Tensor z = x.is_floating_point() ? x : x.to(kFloat32);
  if (eps) z = clamp(z, *eps, 1 - *eps);
  return log(z / (1 - z));
}
Tensor deg2rad(const Tensor& x) { return (x.is_floating_point() ? x : x.to(kFloat32)) * 0.017453292519943295769; }
Tensor rad2deg(const Tensor& x) { return (x.is_floating_point() ? x : x.to(kFloat32)) * 57.295779513082320877; }
// NaN, +inf and -inf replaced (by default with 0 and the dtype's largest and lowest finite values);
// the gradient passes where x is finite. Integers come back as they are.
Tensor nan_to_num(const Tensor& x, std::optional<double> nan, std::optional<double> posinf,
                  std::optional<double> neginf) {
  if (!x.is_floating_point()) return x.clone();
  const double big = largest_finite(x.dtype());
  Tensor r = where(x.isnan(), full({}, nan.value_or(0.0), x.options()), x);
  r = where(x.eq(kInf), full({}, posinf.value_or(big), x.options()), r);
  return where(x.eq(-kInf), full({}, neginf.value_or(-big), x.options()), r);
}
// |a - b| <= atol + rtol |b| elementwise, or a == b (equal infinities); NaN equal to NaN with equal_nan.
Tensor isclose(const Tensor& a, const Tensor& b, double rtol, double atol, bool equal_nan) {
  KILN_CHECK(rtol >= 0 && atol >= 0, "isclose: rtol ({}) and atol ({}) must be non-negative", rtol, atol);
  KILN_CHECK(a.dtype() == b.dtype(), "isclose: a is {} and b is {}; convert one of them so both have one dtype",
             dtype_name(a.dtype()), dtype_name(b.dtype()));
  NoGradGuard no_grad;
  Tensor close = a.eq(b);
  if (a.is_floating_point()) {
    const DType wide = a.dtype() == kFloat64 ? kFloat64 : kFloat32;  // 16-bit values compare in float32
    const Tensor aw = a.to(wide), bw = b.to(wide);
    const Tensor finite_close = (aw - bw).abs().le(bw.abs() * rtol + atol);
    close = close.logical_or(finite_close.logical_and(aw.isfinite()).logical_and(bw.isfinite()));
    if (equal_nan) close = close.logical_or(a.isnan().logical_and(b.isnan()));
  } else if (a.dtype() != kBool && (rtol != 0 || atol != 0)) {
    const Tensor aw = a.to(kFloat64), bw = b.to(kFloat64);
    close = close.logical_or((aw - bw).abs().le(bw.abs() * rtol + atol));
  }
  return close;
}
bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol, bool equal_nan) {
  return isclose(a, b, rtol, atol, equal_nan).all().item<bool>();
}

Tensor square(const Tensor& x) {
  if (x.dtype() == kBool) return square(x.to(kInt64));  // as PyTorch: bool squares as int64
  return with_input_grad(unary_forward(UnaryOp::Square, x, x.dtype()), x, "SquareBackward",
                         [](const Tensor& g, const Tensor& x) { return g * x * 2; });
}
Tensor pow(const Tensor& x, const Scalar& exponent) {
  if (autocast::is_enabled(x.device().type)) {
    if (autocast::OpScope ac{autocast::Op::Pow, x.device()}) return pow(ac.cast(x), exponent);
  }
  DType dt = result_type(x, exponent);
  // A bool base as PyTorch: int64 to an integer power, float32 to a floating one.
  if (x.dtype() == kBool) return pow(x.to(dt == kBool ? kInt64 : dt), exponent);
  KILN_CHECK(!(is_integral(dt) && exponent.to_double() < 0),
             "pow: integers to negative integer powers are not allowed; convert the base to float");
  const double p = exponent.to_double();
  return with_input_grad(unary_forward(UnaryOp::PowScalar, x, dt, {p, 0}), x, "PowBackward",
                         [p](const Tensor& g, const Tensor& x) {
                           if (p == 0) return zeros_like(g);
                           return g * x.pow(p - 1) * p;  // d x^p = p x^(p-1)
                         });
}
Tensor clamp(const Tensor& x, std::optional<Scalar> min, std::optional<Scalar> max) {
  KILN_CHECK(min || max, "clamp: at least one of min and max must be given");
  DType dt = x.dtype();
  if (min) dt = promote_types(dt, result_type(x, *min));
  if (max) dt = promote_types(dt, result_type(x, *max));
  if (x.dtype() == kBool) {  // clamps in the type its bounds promote it to (int64 or float32), as PyTorch
    KILN_CHECK(dt != kBool, "clamp: not defined for a bool tensor with bool bounds; convert first, e.g. x.to(kInt64)");
    return clamp(x.to(dt), min, max);
  }
  if (is_integral(dt)) {  // in the integer type: int64 values and bounds beyond 2^53 stay exact
    Tensor out = x.to(dt);
    if (min) out = maximum(out, scalar_tensor(*min, x.options().dtype(dt)));
    if (max) out = minimum(out, scalar_tensor(*max, x.options().dtype(dt)));  // max wins when min > max
    return out;
  }
  double lo = min ? min->to_double() : -kInf, hi = max ? max->to_double() : kInf;
  // A NaN bound makes every element NaN, as PyTorch's clamp; the kernels are given none.
  Tensor out = std::isnan(lo) || std::isnan(hi) ? full(x.sizes(), NAN, x.options().dtype(dt))
                                                : unary_forward(UnaryOp::Clamp, x, dt, {lo, hi});
  return with_input_grad(out, x, "ClampBackward",
                         [lo, hi](const Tensor& g, const Tensor& x) {
                           return g * x.ge(lo).logical_and(x.le(hi));  // 1 inside [min, max]
                         });
}
Tensor logical_not(const Tensor& x) { return unary_forward(UnaryOp::LogicalNot, x, x.dtype()); }

// ---- binary ops ----

Tensor add(const Tensor& a, const Tensor& b, const Scalar& alpha) {
  Tensor out = arithmetic(BinaryOp::Add, a, b, alpha.to_double(), "add");
  if (should_record(a, b)) {
    double al = alpha.to_double();
    record("AddBackward", {a, b}, {out}, [ia = InputInfo(a), ib = InputInfo(b), al](const Grads& g) -> TensorList {
      return {g.needs_grad(0) ? ia.fit(g[0]) : Tensor(),
              g.needs_grad(1) ? ib.fit(al == 1 ? g[0] : g[0] * al) : Tensor()};
    });
  }
  return out;
}
Tensor sub(const Tensor& a, const Tensor& b, const Scalar& alpha) {
  Tensor out = arithmetic(BinaryOp::Sub, a, b, alpha.to_double(), "sub");
  if (should_record(a, b)) {
    double al = alpha.to_double();
    record("SubBackward", {a, b}, {out}, [ia = InputInfo(a), ib = InputInfo(b), al](const Grads& g) -> TensorList {
      return {g.needs_grad(0) ? ia.fit(g[0]) : Tensor(),
              g.needs_grad(1) ? ib.fit(g[0] * -al) : Tensor()};
    });
  }
  return out;
}
Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = arithmetic(BinaryOp::Mul, a, b, 1, "mul");
  if (should_record(a, b)) {
    record("MulBackward", {a, b}, {out},
           [ia = InputInfo(a), ib = InputInfo(b), sa = SavedTensor(b.requires_grad() ? a : Tensor(), false),
            sb = SavedTensor(a.requires_grad() ? b : Tensor(), false)](const Grads& g) -> TensorList {
             return {g.needs_grad(0) ? ia.fit(g[0] * sb.unpack("MulBackward")) : Tensor(),
                     g.needs_grad(1) ? ib.fit(g[0] * sa.unpack("MulBackward")) : Tensor()};
           });
  }
  return out;
}
Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = arithmetic(BinaryOp::Div, a, b, 1, "div");
  if (should_record(a, b)) {
    record("DivBackward", {a, b}, {out},
           [ia = InputInfo(a), ib = InputInfo(b), sa = SavedTensor(b.requires_grad() ? a : Tensor(), false),
            sb = SavedTensor(b, false)](const Grads& g) -> TensorList {
             Tensor bv = sb.unpack("DivBackward");
             // d a/b / da = 1/b; d a/b / db = -(a/b)/b, divided twice (as PyTorch) where b*b could
             // underflow to 0 (b = 1e-30 in float32) and a/b^2 become inf.
             Tensor gb = g[0] / bv;
             return {g.needs_grad(0) ? ia.fit(gb) : Tensor(),
                     g.needs_grad(1) ? ib.fit(-(gb * (sa.unpack("DivBackward") / bv))) : Tensor()};
           });
  }
  return out;
}
Tensor pow(const Tensor& a, const Tensor& b) {
  if (autocast::is_enabled(a.device().type)) {
    if (autocast::OpScope ac{autocast::Op::Pow, a.device()}) return pow(ac.cast(a), ac.cast(b));
  }
  Tensor out = arithmetic(BinaryOp::Pow, a, b, 1, "pow");
  if (should_record(a, b)) {
    record("PowBackward", {a, b}, {out},
           [ia = InputInfo(a), ib = InputInfo(b), sa = SavedTensor(a, false), sb = SavedTensor(b, false),
            so = SavedTensor(out, true)](const Grads& g) -> TensorList {
             Tensor av = sa.unpack("PowBackward"), bv = sb.unpack("PowBackward");
             Tensor ga, gb;
             if (g.needs_grad(0)) {  // b a^(b-1), and 0 where b = 0 (as PyTorch: not 0 * 0^-1 = NaN at a = 0)
               Tensor d = g[0] * bv * av.pow(bv - 1);
               ga = ia.fit(where(bv.eq(0), zeros_like(d), d));
             }
             if (g.needs_grad(1)) {  // a^b log a, taken as 0 where a = 0 and b >= 0
               Tensor d = g[0] * so.unpack("PowBackward") * av.log();
               gb = ib.fit(where(av.eq(0).logical_and(bv.ge(0)), zeros_like(d), d));
             }
             return {ga, gb};
           });
  }
  return out;
}
// maximum/minimum: the gradient goes to the larger (smaller) input; ties split it in half.
static Tensor extreme(const Tensor& a, const Tensor& b, bool is_max) {
  Tensor out = arithmetic(is_max ? BinaryOp::Maximum : BinaryOp::Minimum, a, b, 1, is_max ? "maximum" : "minimum");
  if (should_record(a, b)) {
    record(is_max ? "MaximumBackward" : "MinimumBackward", {a, b}, {out},
           [ia = InputInfo(a), ib = InputInfo(b), sa = SavedTensor(a, false), sb = SavedTensor(b, false),
            is_max](const Grads& g) -> TensorList {
             Tensor av = sa.unpack("MaximumBackward"), bv = sb.unpack("MaximumBackward");
             Tensor wins = (is_max ? av.gt(bv) : av.lt(bv)).to(g[0].dtype()) + av.eq(bv).to(g[0].dtype()) * 0.5;
             return {g.needs_grad(0) ? ia.fit(g[0] * wins) : Tensor(),
                     g.needs_grad(1) ? ib.fit(g[0] * (1 - wins)) : Tensor()};
           });
  }
  return out;
}
Tensor maximum(const Tensor& a, const Tensor& b) { return extreme(a, b, true); }
Tensor minimum(const Tensor& a, const Tensor& b) { return extreme(a, b, false); }

// The floating binary functions: integer and bool operands are promoted to float32 (PyTorch refuses
// integers in hypot and logaddexp; here they are promoted too). Both gradients are PyTorch's formulas.
static Tensor float_binary(BinaryOp op, const Tensor& a, const Tensor& b, const char* name) {
  return binary_forward(op, a, b, floating_of(result_type(a, b)), 1, name);
}
Tensor atan2(const Tensor& a, const Tensor& b) {  // d/da = b / (a^2 + b^2), d/db = -a / (a^2 + b^2)
  if (autocast::is_enabled(a.device().type)) {
    if (autocast::OpScope ac{autocast::Op::Atan2, a.device(), {a, b}}) return atan2(ac.cast(a), ac.cast(b));
  }
  Tensor out = float_binary(BinaryOp::Atan2, a, b, "atan2");
  if (should_record(a, b)) {
    record("Atan2Backward", {a, b}, {out},
           [ia = InputInfo(a), ib = InputInfo(b), sa = SavedTensor(a, false),
            sb = SavedTensor(b, false)](const Grads& g) -> TensorList {
             const Tensor av = sa.unpack("Atan2Backward"), bv = sb.unpack("Atan2Backward");
             const Tensor scaled = g[0] / (av * av + bv * bv);
             return {g.needs_grad(0) ? ia.fit(scaled * bv) : Tensor(),
                     g.needs_grad(1) ? ib.fit(-(scaled * av)) : Tensor()};
           });
  }
  return out;
}
Tensor hypot(const Tensor& a, const Tensor& b) {  // d/da = a / hypot, d/db = b / hypot
  Tensor out = float_binary(BinaryOp::Hypot, a, b, "hypot");
  if (should_record(a, b)) {
    record("HypotBackward", {a, b}, {out},
           [ia = InputInfo(a), ib = InputInfo(b), sa = SavedTensor(a, false), sb = SavedTensor(b, false),
            so = SavedTensor(out, true)](const Grads& g) -> TensorList {
             const Tensor scaled = g[0] / so.unpack("HypotBackward");
             return {g.needs_grad(0) ? ia.fit(scaled * sa.unpack("HypotBackward")) : Tensor(),
                     g.needs_grad(1) ? ib.fit(scaled * sb.unpack("HypotBackward")) : Tensor()};
           });
  }
  return out;
}
// log(e^a + e^b) (base 2 with base2): d/da = 1 / (1 + e^(b - a)), d/db = 1 / (1 + e^(a - b)).
static Tensor logaddexp_impl(const Tensor& a, const Tensor& b, bool base2) {
  const char* name = base2 ? "logaddexp2" : "logaddexp";
  Tensor out = float_binary(base2 ? BinaryOp::LogAddExp2 : BinaryOp::LogAddExp, a, b, name);
  if (should_record(a, b)) {
    record(base2 ? "Logaddexp2Backward" : "LogaddexpBackward", {a, b}, {out},
           [ia = InputInfo(a), ib = InputInfo(b), sa = SavedTensor(a, false), sb = SavedTensor(b, false),
            base2](const Grads& g) -> TensorList {
             const char* node = base2 ? "Logaddexp2Backward" : "LogaddexpBackward";
             const Tensor av = sa.unpack(node), bv = sb.unpack(node);
             auto weight = [base2](const Tensor& d) { return 1 / ((base2 ? exp2(d) : exp(d)) + 1); };
             return {g.needs_grad(0) ? ia.fit(g[0] * weight(bv - av)) : Tensor(),
                     g.needs_grad(1) ? ib.fit(g[0] * weight(av - bv)) : Tensor()};
           });
  }
  return out;
}
Tensor logaddexp(const Tensor& a, const Tensor& b) { return logaddexp_impl(a, b, false); }
Tensor logaddexp2(const Tensor& a, const Tensor& b) { return logaddexp_impl(a, b, true); }
// |a| with b's sign: d/da = copysign(a, b) / a (+-1), 0 where a = 0; b gets no gradient (0), as PyTorch.
Tensor copysign(const Tensor& a, const Tensor& b) {
  Tensor out = float_binary(BinaryOp::Copysign, a, b, "copysign");
  if (should_record(a, b)) {
    record("CopysignBackward", {a, b}, {out},
           [ia = InputInfo(a), ib = InputInfo(b), sa = SavedTensor(a, false),
            so = SavedTensor(out, true)](const Grads& g) -> TensorList {
             Tensor ga, gb;
             if (g.needs_grad(0)) {
               const Tensor av = sa.unpack("CopysignBackward");
               const Tensor ratio = so.unpack("CopysignBackward") / av;
               ga = ia.fit(g[0] * where(av.eq(0), zeros_like(ratio), ratio));
             }
             if (g.needs_grad(1)) gb = ib.fit(zeros_like(g[0]));
             return {ga, gb};
           });
  }
  return out;
}
// a log b and a log1p(b) (special::xlog1py), 0 where a = 0 (unless b is NaN): d/da = log b (0 where
// a = 0 and b <= 0), d/db = a / b; d/da = log1p(b) (0 where a = 0 and b <= -1), d/db = a / (1 + b).
static Tensor xlog_impl(const Tensor& a, const Tensor& b, bool one_plus) {
  Tensor out = float_binary(one_plus ? BinaryOp::Xlog1py : BinaryOp::Xlogy, a, b,
                            one_plus ? "special::xlog1py" : "xlogy");
  if (should_record(a, b)) {
    const char* node = one_plus ? "Xlog1pyBackward" : "XlogyBackward";
    record(node, {a, b}, {out},
           [ia = InputInfo(a), ib = InputInfo(b), sa = SavedTensor(a, false), sb = SavedTensor(b, false), node,
            one_plus](const Grads& g) -> TensorList {
             const Tensor av = sa.unpack(node), bv = sb.unpack(node);
             Tensor ga, gb;
             if (g.needs_grad(0)) {
               const Tensor d = xlog_impl(g[0], bv, one_plus);
               ga = ia.fit(where(av.eq(0).logical_and(bv.le(one_plus ? -1 : 0)), zeros_like(d), d));
             }
             if (g.needs_grad(1)) gb = ib.fit(g[0] * av / (one_plus ? bv + 1 : bv));
             return {ga, gb};
           });
  }
  return out;
}
Tensor xlogy(const Tensor& a, const Tensor& b) { return xlog_impl(a, b, false); }

// ---- torch.special: Bessel, error, normal-distribution, entropy, zeta and incomplete gamma functions ----
// Computed in float64 per element by core/special_math.h and core/bessel_math.h (float16 and bfloat16
// through float32), integers promoted to float32. Gradients are PyTorch's formulas written as ops
// (differentiable again), and the Bessel functions', which PyTorch lacks, their derivatives; where
// PyTorch has none (zeta's s, gammainc's a) asking for one is an Error.
namespace special {

Tensor i0(const Tensor& x) {  // d I0 = I1
  return with_input_grad(float_unary(UnaryOp::I0, x, "special::i0"), x, "I0Backward",
                         [](const Tensor& g, const Tensor& x) { return g * special::i1(x); });
}
Tensor i0e(const Tensor& x) {  // d e^-|x| I0 = i1e - sgn(x) i0e
  return with_input_grad(float_unary(UnaryOp::I0e, x, "special::i0e"), x, "I0eBackward",
                         [](const Tensor& g, const Tensor& x) { return g * (i1e(x) - x.sign() * i0e(x)); });
}
// d I1 = I0 - I1 / x, and d e^-|x| I1 = i0e - i1e (sgn(x) + 1 / x); both 1/2 at x = 0 (with_limit_at_zero).
Tensor i1(const Tensor& x) {
  return with_input_grad(
      float_unary(UnaryOp::I1, x, "special::i1"), x, "I1Backward", [](const Tensor& g, const Tensor& x) {
        return g * with_limit_at_zero(x, 0.5,
                                      [](const Tensor& safe) { return special::i0(safe) - special::i1(safe) / safe; });
      });
}
Tensor i1e(const Tensor& x) {
  return with_input_grad(
      float_unary(UnaryOp::I1e, x, "special::i1e"), x, "I1eBackward", [](const Tensor& g, const Tensor& x) {
        return g * with_limit_at_zero(
                       x, 0.5, [](const Tensor& safe) { return i0e(safe) - i1e(safe) * (safe.sign() + 1 / safe); });
      });
}
Tensor erfcx(const Tensor& x) {  // d e^(x^2) erfc(x) = 2 x erfcx(x) - 2 / sqrt(pi)
  return with_input_grad(float_unary(UnaryOp::Erfcx, x, "special::erfcx"), x, "ErfcxBackward",
                         [](const Tensor& g, const Tensor& x) { return g * (2 * x * erfcx(x) - 1.1283791670955126); });
}
Tensor ndtr(const Tensor& x) {  // d Phi = e^(-x^2 / 2) / sqrt(2 pi)
  return with_input_grad(
      float_unary(UnaryOp::Ndtr, x, "special::ndtr"), x, "NdtrBackward",
      [](const Tensor& g, const Tensor& x) { return g * (x * x * -0.5).exp() * 0.3989422804014327; });
}
Tensor log_ndtr(const Tensor& x) {  // d log Phi = e^(-x^2 / 2 - log Phi) / sqrt(2 pi)
  return with_input_grad(
      float_unary(UnaryOp::LogNdtr, x, "special::log_ndtr"), x, "LogNdtrBackward",
      [](const Tensor& g, const Tensor& x) { return g * (x * x * -0.5 - log_ndtr(x)).exp() * 0.3989422804014327; });
}
Tensor ndtri(const Tensor& x) {  // d Phi^-1(p) = sqrt(2 pi) e^(Phi^-1(p)^2 / 2)
  return with_output_grad(
      float_unary(UnaryOp::Ndtri, x, "special::ndtri"), x, "NdtriBackward",
      [](const Tensor& g, const Tensor& y) { return g * (y * y * 0.5).exp() * 2.5066282746310002; });
}
Tensor entr(const Tensor& x) {  // d -x log x = -(1 + log x): +inf at 0, NaN left of it
  return with_input_grad(float_unary(UnaryOp::Entr, x, "special::entr"), x, "EntrBackward",
                         [](const Tensor& g, const Tensor& x) { return g * -(x.log() + 1); });
}
Tensor xlog1py(const Tensor& a, const Tensor& b) { return xlog_impl(a, b, true); }
// zeta(s, q): d/dq = -s zeta(s + 1, q). PyTorch has no gradient for s, nor does Kiln.
Tensor zeta(const Tensor& x, const Tensor& q) {
  Tensor out = float_binary(BinaryOp::Zeta, x, q, "special::zeta");
  if (should_record(x, q)) {
    record("ZetaBackward", {x, q}, {out},
           [iq = InputInfo(q), sx = SavedTensor(x, false), sq = SavedTensor(q, false)](const Grads& g) -> TensorList {
             KILN_CHECK(!g.needs_grad(0),
                        "special::zeta: the gradient with respect to x (the exponent, zeta's first argument) is not "
                        "implemented (nor is it in PyTorch); detach x, or compute it as a sum");
             const Tensor xv = sx.unpack("ZetaBackward"), qv = sq.unpack("ZetaBackward");
             return {Tensor(), iq.fit(g[0] * -xv * zeta(xv + 1, qv))};
           });
  }
  return out;
}
// P(a, x) and Q(a, x): d/dx = +-x^(a-1) e^-x / Gamma(a). PyTorch has no gradient for a, nor does Kiln.
static Tensor incomplete_gamma(const Tensor& a, const Tensor& x, bool upper) {
  const char* name = upper ? "special::gammaincc" : "special::gammainc";
  Tensor out = float_binary(upper ? BinaryOp::Gammaincc : BinaryOp::Gammainc, a, x, name);
  if (should_record(a, x)) {
    const char* node = upper ? "GammainccBackward" : "GammaincBackward";
    record(node, {a, x}, {out},
           [ix = InputInfo(x), sa = SavedTensor(a, false), sx = SavedTensor(x, false), name, node,
            upper](const Grads& g) -> TensorList {
             KILN_CHECK(!g.needs_grad(0),
                        "{}: the gradient with respect to a (the first argument) is not implemented (nor is it in "
                        "PyTorch); detach a",
                        name);
             const Tensor av = sa.unpack(node), xv = sx.unpack(node);
             const Tensor density = ((av - 1) * xv.log() - xv - lgamma(av)).exp();
             return {Tensor(), ix.fit(upper ? -(g[0] * density) : g[0] * density)};
           });
  }
  return out;
}
Tensor gammainc(const Tensor& a, const Tensor& x) { return incomplete_gamma(a, x, false); }
Tensor gammaincc(const Tensor& a, const Tensor& x) { return incomplete_gamma(a, x, true); }
// log of the multivariate gamma function: p (p - 1) / 4 log pi + sum_{j < p} lgamma(a - j / 2), composed.
Tensor multigammaln(const Tensor& a, int64_t p) {
  KILN_CHECK(p >= 1, "special::multigammaln: p must be at least 1 (the dimension), got {}", p);
  const Tensor af = a.is_floating_point() ? a : a.to(kFloat32);
  KILN_CHECK(af.numel() == 0 || af.gt(0.5 * static_cast<double>(p - 1)).all().item<bool>(),
             "special::multigammaln: every element of a must be greater than (p - 1) / 2 = {} for p = {}; "
             "the function is not defined there",
             0.5 * static_cast<double>(p - 1), p);
  const Tensor halves = arange(0, p, 1, af.dtype(), af.device()) * -0.5;
  const double constant = 0.25 * static_cast<double>(p) * static_cast<double>(p - 1) * 1.1447298858494002;  // log pi
  return lgamma(af.unsqueeze(-1) + halves).sum({-1}) + constant;
}

// The Bessel functions of the first, second and third kinds, PyTorch's names. PyTorch 1.13 gives them
// no gradient; here they have their derivatives (DLMF 10.6.2, 10.29.2), written with each other:
// J0' = -J1, Y0' = -Y1, K0' = -K1, J1' = J0 - J1 / x (1/2 at 0), Y1' = Y0 - Y1 / x, K1' = -K0 - K1 / x.
Tensor bessel_j0(const Tensor& x) {
  return with_input_grad(float_unary(UnaryOp::BesselJ0, x, "special::bessel_j0"), x, "BesselJ0Backward",
                         [](const Tensor& g, const Tensor& x) { return -(g * bessel_j1(x)); });
}
Tensor bessel_j1(const Tensor& x) {
  return with_input_grad(float_unary(UnaryOp::BesselJ1, x, "special::bessel_j1"), x, "BesselJ1Backward",
                         [](const Tensor& g, const Tensor& x) {
                           return g * with_limit_at_zero(x, 0.5, [](const Tensor& safe) {
                                    return bessel_j0(safe) - bessel_j1(safe) / safe;
                                  });
                         });
}
Tensor bessel_y0(const Tensor& x) {
  return with_input_grad(float_unary(UnaryOp::BesselY0, x, "special::bessel_y0"), x, "BesselY0Backward",
                         [](const Tensor& g, const Tensor& x) { return -(g * bessel_y1(x)); });
}
Tensor bessel_y1(const Tensor& x) {
  return with_input_grad(float_unary(UnaryOp::BesselY1, x, "special::bessel_y1"), x, "BesselY1Backward",
                         [](const Tensor& g, const Tensor& x) { return g * (bessel_y0(x) - bessel_y1(x) / x); });
}
Tensor modified_bessel_i0(const Tensor& x) { return special::i0(x); }
Tensor modified_bessel_i1(const Tensor& x) { return special::i1(x); }
Tensor modified_bessel_k0(const Tensor& x) {
  return with_input_grad(float_unary(UnaryOp::BesselK0, x, "special::modified_bessel_k0"), x,
                         "ModifiedBesselK0Backward",
                         [](const Tensor& g, const Tensor& x) { return -(g * modified_bessel_k1(x)); });
}
Tensor modified_bessel_k1(const Tensor& x) {
  return with_input_grad(
      float_unary(UnaryOp::BesselK1, x, "special::modified_bessel_k1"), x, "ModifiedBesselK1Backward",
      [](const Tensor& g, const Tensor& x) { return -(g * (modified_bessel_k0(x) + modified_bessel_k1(x) / x)); });
}
// e^x K0 and e^x K1: (e^x K0)' = e^x (K0 - K1), (e^x K1)' = e^x (K1 - K0 - K1 / x).
Tensor scaled_modified_bessel_k0(const Tensor& x) {
  return with_input_grad(float_unary(UnaryOp::BesselK0e, x, "special::scaled_modified_bessel_k0"), x,
                         "ScaledModifiedBesselK0Backward", [](const Tensor& g, const Tensor& x) {
                           return g * (scaled_modified_bessel_k0(x) - scaled_modified_bessel_k1(x));
                         });
}
Tensor scaled_modified_bessel_k1(const Tensor& x) {
  return with_input_grad(float_unary(UnaryOp::BesselK1e, x, "special::scaled_modified_bessel_k1"), x,
                         "ScaledModifiedBesselK1Backward", [](const Tensor& g, const Tensor& x) {
                           const Tensor k1 = scaled_modified_bessel_k1(x);
                           return g * (k1 - scaled_modified_bessel_k0(x) - k1 / x);
                         });
}
// sin(x) / x: its derivative is -x s(x), s(x) = (sin x - x cos x) / x^3, and below |x| = 0.05, where that
// quotient cancels, s = 1/3 - x^2/30 + x^4/840 - x^6/45360 (the next term 1e-17 of it). Written so, the
// gradient is differentiable at 0 too (its derivative there -1/3).
Tensor spherical_bessel_j0(const Tensor& x) {
  return with_input_grad(float_unary(UnaryOp::SphericalBesselJ0, x, "special::spherical_bessel_j0"), x,
                         "SphericalBesselJ0Backward", [](const Tensor& g, const Tensor& x) {
                           const Tensor small = x.abs().lt(0.05);
                           const Tensor safe = where(small, ones_like(x), x);
                           const Tensor x2 = x * x;
                           const Tensor series = 1.0 / 3 - x2 * (1.0 / 30 - x2 * (1.0 / 840 - x2 / 45360));
                           const Tensor s =
                               where(small, series, (safe.sin() - safe * safe.cos()) / (safe * safe * safe));
                           return -(g * x * s);
                         });
}
// Airy's Ai: d Ai = Ai', d Ai' = x Ai (Airy's equation), so differentiable to any order (PyTorch 1.13
// gives it no gradient).
static Tensor airy_ai_prime(const Tensor& x) {
  return with_input_grad(float_unary(UnaryOp::AiryAiPrime, x, "special::airy_ai"), x, "AiryAiPrimeBackward",
                         [](const Tensor& g, const Tensor& x) { return g * x * airy_ai(x); });
}
Tensor airy_ai(const Tensor& x) {
  return with_input_grad(float_unary(UnaryOp::AiryAi, x, "special::airy_ai"), x, "AiryAiBackward",
                         [](const Tensor& g, const Tensor& x) { return g * airy_ai_prime(x); });
}

// torch.special's names for ops Kiln has under torch's.
Tensor expit(const Tensor& x) { return sigmoid(x); }
Tensor gammaln(const Tensor& x) { return lgamma(x); }
Tensor psi(const Tensor& x) { return kiln::digamma(x); }

}  // namespace special

Tensor i0(const Tensor& x) { return special::i0(x); }
Tensor igamma(const Tensor& a, const Tensor& x) { return special::gammainc(a, x); }
Tensor igammac(const Tensor& a, const Tensor& x) { return special::gammaincc(a, x); }
Tensor mvlgamma(const Tensor& a, int64_t p) { return special::multigammaln(a, p); }

// A 16-bit float tensor with a number computes in float32 and rounds once, as PyTorch's opmath
// does: rounding the number first would turn 70000 into inf and 0.999 into 0.99902.
template <typename F>
static Tensor with_number(const Tensor& a, const Scalar& b, F op) {
  if (is_reduced_float(a.dtype()) && !b.is_bool()) {
    return op(a.to(kFloat32), scalar_tensor(b, TensorOptions(kFloat32).device(a.device()))).to(a.dtype());
  }
  return op(a, wrap(b, a));
}
Tensor add(const Tensor& a, const Scalar& b) {
  return with_number(a, b, [](const Tensor& x, const Tensor& y) { return add(x, y); });
}
Tensor sub(const Tensor& a, const Scalar& b) {
  return with_number(a, b, [](const Tensor& x, const Tensor& y) { return sub(x, y); });
}
Tensor rsub(const Tensor& a, const Scalar& b) {
  return with_number(a, b, [](const Tensor& x, const Tensor& y) { return sub(y, x); });
}
Tensor mul(const Tensor& a, const Scalar& b) {
  return with_number(a, b, [](const Tensor& x, const Tensor& y) { return mul(x, y); });
}
Tensor div(const Tensor& a, const Scalar& b) {
  return with_number(a, b, [](const Tensor& x, const Tensor& y) { return div(x, y); });
}
Tensor remainder(const Tensor& a, const Scalar& b) {
  return with_number(a, b, [](const Tensor& x, const Tensor& y) { return remainder(x, y); });
}
Tensor fmod(const Tensor& a, const Scalar& b) {
  return with_number(a, b, [](const Tensor& x, const Tensor& y) { return fmod(x, y); });
}
Tensor floor_divide(const Tensor& a, const Scalar& b) {
  return with_number(a, b, [](const Tensor& x, const Tensor& y) { return floor_divide(x, y); });
}
Tensor bitwise_and(const Tensor& a, const Scalar& b) { return bitwise_and(a, wrap(b, a)); }
Tensor bitwise_or(const Tensor& a, const Scalar& b) { return bitwise_or(a, wrap(b, a)); }
Tensor bitwise_xor(const Tensor& a, const Scalar& b) { return bitwise_xor(a, wrap(b, a)); }
Tensor rdiv(const Scalar& a, const Tensor& b) {
  return with_number(b, a, [](const Tensor& x, const Tensor& y) { return div(y, x); });
}

Tensor xlogy(const Tensor& a, const Scalar& b) {
  return with_number(a, b, [](const Tensor& x, const Tensor& y) { return xlogy(x, y); });
}
Tensor xlogy(const Scalar& a, const Tensor& b) {
  return with_number(b, a, [](const Tensor& x, const Tensor& y) { return xlogy(y, x); });
}

namespace special {

Tensor xlog1py(const Tensor& a, const Scalar& b) {
  return with_number(a, b, [](const Tensor& x, const Tensor& y) { return xlog1py(x, y); });
}
Tensor xlog1py(const Scalar& a, const Tensor& b) {
  return with_number(b, a, [](const Tensor& x, const Tensor& y) { return xlog1py(y, x); });
}
Tensor zeta(const Tensor& x, const Scalar& q) {
  return with_number(x, q, [](const Tensor& a, const Tensor& b) { return zeta(a, b); });
}
Tensor zeta(const Scalar& x, const Tensor& q) {
  return with_number(q, x, [](const Tensor& a, const Tensor& b) { return zeta(b, a); });
}

// ---- the orthogonal polynomials ----
// p_n(x) for the whole part of n (core/polynomial_math.h). Differentiable in x to any order, each
// derivative being the next BinaryOp call with alpha one higher (PyTorch 1.13 gives these no gradient);
// n, a degree, gets a zero gradient, as floor's input does.
static const char* polynomial_name(BinaryOp op) {  // in BinaryOp's order, from ChebyshevT
  static constexpr const char* kNames[] = {
      "special::chebyshev_polynomial_t",         "special::chebyshev_polynomial_u",
      "special::chebyshev_polynomial_v",         "special::chebyshev_polynomial_w",
      "special::shifted_chebyshev_polynomial_t", "special::shifted_chebyshev_polynomial_u",
      "special::shifted_chebyshev_polynomial_v", "special::shifted_chebyshev_polynomial_w",
      "special::hermite_polynomial_h",           "special::hermite_polynomial_he",
      "special::laguerre_polynomial_l",          "special::legendre_polynomial_p"};
  return kNames[static_cast<int>(op) - static_cast<int>(BinaryOp::ChebyshevT)];
}
// The m-th derivative. Chebyshev's polynomials have closed forms for any degree; the others, and every
// derivative, take n steps of a recurrence, so n is checked against its limit first (an element with
// n = 1e18 would otherwise run for years).
static Tensor polynomial(BinaryOp op, const Tensor& x, const Tensor& n, int m) {
  const char* name = polynomial_name(op);
  KILN_CHECK(m <= math::kMaxPolynomialDerivative,
             "{}: derivatives of order above {} are not implemented (asked for order {} by repeated backward "
             "passes)",
             name, math::kMaxPolynomialDerivative, m);
  const bool chebyshev = op <= BinaryOp::ShiftedChebyshevW;
  if ((m > 0 || !chebyshev) && n.defined() && n.numel() > 0) {
    // (In float32 unless int64 or float64: 2^24 has no float16, int8, ... of its own.)
    const Tensor wide = n.dtype() == kInt64 || n.dtype() == kFloat64 ? n : n.to(kFloat32);
    const Tensor over = wide.gt(math::kMaxRecurrenceDegree);
    if (over.any().item<bool>()) {
      KILN_FAIL(
          "{}: n (the degree) must be at most 2^24 = 16777216{}, got {}: {} by its three-term recurrence, "
          "n steps per element",
          name, m > 0 ? " for a gradient" : "", where(over, wide, 0).max().item<double>(),
          m > 0 ? "the derivatives are computed" : "the polynomial is computed");
    }
  }
  Tensor out = binary_forward(op, x, n, floating_of(result_type(x, n)), m, name);
  if (should_record(x, n)) {
    record("PolynomialBackward", {x, n}, {out},
           [ix = InputInfo(x), in = InputInfo(n), sx = SavedTensor(x, false), sn = SavedTensor(n, false), op,
            m](const Grads& g) -> TensorList {
             const Tensor xv = sx.unpack("PolynomialBackward"), nv = sn.unpack("PolynomialBackward");
             return {g.needs_grad(0) ? ix.fit(g[0] * polynomial(op, xv, nv, m + 1)) : Tensor(),
                     g.needs_grad(1) ? in.fit(zeros_like(g[0])) : Tensor()};
           });
  }
  return out;
}
static Tensor polynomial(BinaryOp op, const Tensor& x, const Scalar& n) {
  return with_number(x, n, [op](const Tensor& a, const Tensor& b) { return polynomial(op, a, b, 0); });
}
static Tensor polynomial(BinaryOp op, const Scalar& x, const Tensor& n) {
  return with_number(n, x, [op](const Tensor& a, const Tensor& b) { return polynomial(op, b, a, 0); });
}
Tensor chebyshev_polynomial_t(const Tensor& x, const Tensor& n) { return polynomial(BinaryOp::ChebyshevT, x, n, 0); }
Tensor chebyshev_polynomial_t(const Tensor& x, const Scalar& n) { return polynomial(BinaryOp::ChebyshevT, x, n); }
Tensor chebyshev_polynomial_t(const Scalar& x, const Tensor& n) { return polynomial(BinaryOp::ChebyshevT, x, n); }
Tensor chebyshev_polynomial_u(const Tensor& x, const Tensor& n) { return polynomial(BinaryOp::ChebyshevU, x, n, 0); }
Tensor chebyshev_polynomial_u(const Tensor& x, const Scalar& n) { return polynomial(BinaryOp::ChebyshevU, x, n); }
Tensor chebyshev_polynomial_u(const Scalar& x, const Tensor& n) { return polynomial(BinaryOp::ChebyshevU, x, n); }
Tensor chebyshev_polynomial_v(const Tensor& x, const Tensor& n) { return polynomial(BinaryOp::ChebyshevV, x, n, 0); }
Tensor chebyshev_polynomial_v(const Tensor& x, const Scalar& n) { return polynomial(BinaryOp::ChebyshevV, x, n); }
Tensor chebyshev_polynomial_v(const Scalar& x, const Tensor& n) { return polynomial(BinaryOp::ChebyshevV, x, n); }
Tensor chebyshev_polynomial_w(const Tensor& x, const Tensor& n) { return polynomial(BinaryOp::ChebyshevW, x, n, 0); }
Tensor chebyshev_polynomial_w(const Tensor& x, const Scalar& n) { return polynomial(BinaryOp::ChebyshevW, x, n); }
Tensor chebyshev_polynomial_w(const Scalar& x, const Tensor& n) { return polynomial(BinaryOp::ChebyshevW, x, n); }
Tensor shifted_chebyshev_polynomial_t(const Tensor& x, const Tensor& n) {
  return polynomial(BinaryOp::ShiftedChebyshevT, x, n, 0);
}
Tensor shifted_chebyshev_polynomial_t(const Tensor& x, const Scalar& n) {
  return polynomial(BinaryOp::ShiftedChebyshevT, x, n);
}
Tensor shifted_chebyshev_polynomial_t(const Scalar& x, const Tensor& n) {
  return polynomial(BinaryOp::ShiftedChebyshevT, x, n);
}
Tensor shifted_chebyshev_polynomial_u(const Tensor& x, const Tensor& n) {
  return polynomial(BinaryOp::ShiftedChebyshevU, x, n, 0);
}
Tensor shifted_chebyshev_polynomial_u(const Tensor& x, const Scalar& n) {
  return polynomial(BinaryOp::ShiftedChebyshevU, x, n);
}
Tensor shifted_chebyshev_polynomial_u(const Scalar& x, const Tensor& n) {
  return polynomial(BinaryOp::ShiftedChebyshevU, x, n);
}
Tensor shifted_chebyshev_polynomial_v(const Tensor& x, const Tensor& n) {
  return polynomial(BinaryOp::ShiftedChebyshevV, x, n, 0);
}
Tensor shifted_chebyshev_polynomial_v(const Tensor& x, const Scalar& n) {
  return polynomial(BinaryOp::ShiftedChebyshevV, x, n);
}
Tensor shifted_chebyshev_polynomial_v(const Scalar& x, const Tensor& n) {
  return polynomial(BinaryOp::ShiftedChebyshevV, x, n);
}
Tensor shifted_chebyshev_polynomial_w(const Tensor& x, const Tensor& n) {
  return polynomial(BinaryOp::ShiftedChebyshevW, x, n, 0);
}
Tensor shifted_chebyshev_polynomial_w(const Tensor& x, const Scalar& n) {
  return polynomial(BinaryOp::ShiftedChebyshevW, x, n);
}
Tensor shifted_chebyshev_polynomial_w(const Scalar& x, const Tensor& n) {
  return polynomial(BinaryOp::ShiftedChebyshevW, x, n);
}
Tensor hermite_polynomial_h(const Tensor& x, const Tensor& n) { return polynomial(BinaryOp::HermiteH, x, n, 0); }
Tensor hermite_polynomial_h(const Tensor& x, const Scalar& n) { return polynomial(BinaryOp::HermiteH, x, n); }
Tensor hermite_polynomial_h(const Scalar& x, const Tensor& n) { return polynomial(BinaryOp::HermiteH, x, n); }
Tensor hermite_polynomial_he(const Tensor& x, const Tensor& n) { return polynomial(BinaryOp::HermiteHe, x, n, 0); }
Tensor hermite_polynomial_he(const Tensor& x, const Scalar& n) { return polynomial(BinaryOp::HermiteHe, x, n); }
Tensor hermite_polynomial_he(const Scalar& x, const Tensor& n) { return polynomial(BinaryOp::HermiteHe, x, n); }
Tensor laguerre_polynomial_l(const Tensor& x, const Tensor& n) { return polynomial(BinaryOp::LaguerreL, x, n, 0); }
Tensor laguerre_polynomial_l(const Tensor& x, const Scalar& n) { return polynomial(BinaryOp::LaguerreL, x, n); }
Tensor laguerre_polynomial_l(const Scalar& x, const Tensor& n) { return polynomial(BinaryOp::LaguerreL, x, n); }
Tensor legendre_polynomial_p(const Tensor& x, const Tensor& n) { return polynomial(BinaryOp::LegendreP, x, n, 0); }
Tensor legendre_polynomial_p(const Tensor& x, const Scalar& n) { return polynomial(BinaryOp::LegendreP, x, n); }
Tensor legendre_polynomial_p(const Scalar& x, const Tensor& n) { return polynomial(BinaryOp::LegendreP, x, n); }

}  // namespace special

Tensor eq(const Tensor& a, const Tensor& b) { return compare(BinaryOp::Eq, a, b, "eq"); }
Tensor ne(const Tensor& a, const Tensor& b) { return compare(BinaryOp::Ne, a, b, "ne"); }
Tensor lt(const Tensor& a, const Tensor& b) { return compare(BinaryOp::Lt, a, b, "lt"); }
Tensor le(const Tensor& a, const Tensor& b) { return compare(BinaryOp::Le, a, b, "le"); }
Tensor gt(const Tensor& a, const Tensor& b) { return compare(BinaryOp::Gt, a, b, "gt"); }
Tensor ge(const Tensor& a, const Tensor& b) { return compare(BinaryOp::Ge, a, b, "ge"); }
Tensor eq(const Tensor& a, const Scalar& b) { return eq(a, wrap(b, a)); }
Tensor ne(const Tensor& a, const Scalar& b) { return ne(a, wrap(b, a)); }
Tensor lt(const Tensor& a, const Scalar& b) { return lt(a, wrap(b, a)); }
Tensor le(const Tensor& a, const Scalar& b) { return le(a, wrap(b, a)); }
Tensor gt(const Tensor& a, const Scalar& b) { return gt(a, wrap(b, a)); }
Tensor ge(const Tensor& a, const Scalar& b) { return ge(a, wrap(b, a)); }
// Compositions of the comparisons: NaN is the one value unequal to itself, and x - x is 0 exactly
// for every finite x and NaN for +-inf and NaN.
Tensor isnan(const Tensor& x) {
  if (!x.is_floating_point()) return zeros(x.sizes(), TensorOptions(kBool).device(x.device()));
  return ne(x, x);
}
Tensor isinf(const Tensor& x) {
  if (!x.is_floating_point()) return zeros(x.sizes(), TensorOptions(kBool).device(x.device()));
  NoGradGuard no_grad;
  return eq(abs(x), std::numeric_limits<double>::infinity());
}
Tensor isfinite(const Tensor& x) {
  if (!x.is_floating_point()) return ones(x.sizes(), TensorOptions(kBool).device(x.device()));
  NoGradGuard no_grad;
  return eq(sub(x, x), 0);
}
Tensor logical_and(const Tensor& a, const Tensor& b) { return compare(BinaryOp::LogicalAnd, a, b, "logical_and"); }
Tensor logical_or(const Tensor& a, const Tensor& b) { return compare(BinaryOp::LogicalOr, a, b, "logical_or"); }

// ---- rounding, remainders, floor division, bitwise ----

// floor, ceil, trunc and round keep the dtype (an integer tensor comes back as it is, copied, as
// PyTorch's); their gradient is 0 wherever it is defined, as PyTorch gives it.
static Tensor rounding(UnaryOp op, const Tensor& x, const char* name, const char* backward) {
  check_not_bool(x, name);
  Tensor y = unary_forward(op, x, x.dtype());
  if (should_record(x)) {
    record(backward, {x}, {y}, [](const Grads& g) -> TensorList { return {zeros_like(g[0])}; });
  }
  return y;
}
Tensor floor(const Tensor& x) { return rounding(UnaryOp::Floor, x, "floor", "FloorBackward"); }
Tensor ceil(const Tensor& x) { return rounding(UnaryOp::Ceil, x, "ceil", "CeilBackward"); }
Tensor trunc(const Tensor& x) { return rounding(UnaryOp::Trunc, x, "trunc", "TruncBackward"); }
Tensor round(const Tensor& x) { return rounding(UnaryOp::Round, x, "round", "RoundBackward"); }

// remainder, fmod, floor_divide and div's "trunc" in the promoted dtype (integers stay integers). An
// integer divisor of 0 is an Error, as PyTorch's ZeroDivisionError, found before the kernel runs:
// one pass over b, and a wait for it on a GPU.
static Tensor division(BinaryOp op, const Tensor& a, const Tensor& b, const char* name) {
  const DType dt = result_type(a, b);
  KILN_CHECK(dt != kBool, "{}: not defined for two bool tensors; convert one first, e.g. x.to(kInt64)", name);
  if (is_floating(dt)) return binary_forward(op, a, b, dt, 1, name);
  check_same_device(name, a, b);
  const Tensor divisor = cast_no_grad(b, dt);  // as the kernel sees it: 256 is 0 in int8
  KILN_CHECK(!divisor.eq(0).any().item<bool>(),
             "{}: integer division by zero (the divisor holds a 0 in {}); mask those elements first, or divide in "
             "a floating dtype (x.to(kFloat32)), where the result is inf or nan",
             name, dtype_name(dt));
  return binary_forward(op, a, divisor, dt, 1, name);
}
Tensor remainder(const Tensor& a, const Tensor& b) {
  Tensor out = division(BinaryOp::Remainder, a, b, "remainder");
  if (should_record(a, b)) {  // a - floor(a / b) b: d/da = 1, d/db = -floor(a / b)
    record("RemainderBackward", {a, b}, {out},
           [ia = InputInfo(a), ib = InputInfo(b), sa = SavedTensor(b.requires_grad() ? a : Tensor(), false),
            sb = SavedTensor(b.requires_grad() ? b : Tensor(), false)](const Grads& g) -> TensorList {
             if (!g.needs_grad(1)) return {g.needs_grad(0) ? ia.fit(g[0]) : Tensor(), Tensor()};
             Tensor quotient = floor_divide(sa.unpack("RemainderBackward"), sb.unpack("RemainderBackward"));
             return {g.needs_grad(0) ? ia.fit(g[0]) : Tensor(), ib.fit(-(g[0] * quotient))};
           });
  }
  return out;
}
Tensor fmod(const Tensor& a, const Tensor& b) {
  Tensor out = division(BinaryOp::Fmod, a, b, "fmod");
  if (should_record(a, b)) {  // a - trunc(a / b) b: d/da = 1, d/db = -trunc(a / b)
    record("FmodBackward", {a, b}, {out},
           [ia = InputInfo(a), ib = InputInfo(b), sa = SavedTensor(b.requires_grad() ? a : Tensor(), false),
            sb = SavedTensor(b.requires_grad() ? b : Tensor(), false)](const Grads& g) -> TensorList {
             return {g.needs_grad(0) ? ia.fit(g[0]) : Tensor(),
                     g.needs_grad(1)
                         ? ib.fit(-(g[0] * trunc(sa.unpack("FmodBackward") / sb.unpack("FmodBackward"))))
                         : Tensor()};
           });
  }
  return out;
}
// floor(a / b) or trunc(a / b): piecewise constant, so a gradient of 0, as PyTorch's.
static Tensor rounded_division(BinaryOp op, const Tensor& a, const Tensor& b, const char* name,
                               const char* backward) {
  Tensor out = division(op, a, b, name);
  if (should_record(a, b)) {
    record(backward, {a, b}, {out},
           [ia = InputInfo(a), ib = InputInfo(b)](const Grads& g) -> TensorList {
             return {g.needs_grad(0) ? ia.fit(zeros_like(g[0])) : Tensor(),
                     g.needs_grad(1) ? ib.fit(zeros_like(g[0])) : Tensor()};
           });
  }
  return out;
}
Tensor floor_divide(const Tensor& a, const Tensor& b) {
  return rounded_division(BinaryOp::FloorDivide, a, b, "floor_divide", "FloorDivideBackward");
}
Tensor div(const Tensor& a, const Tensor& b, std::string_view rounding_mode) {
  if (rounding_mode == "floor") return floor_divide(a, b);
  KILN_CHECK(rounding_mode == "trunc",
             "div: rounding_mode must be \"trunc\" or \"floor\" (or leave it out for true division), got \"{}\"",
             rounding_mode);
  // A 16-bit quotient is rounded to its dtype before trunc, as PyTorch's kernel rounds it: two ops.
  if (is_reduced_float(result_type(a, b))) return trunc(div(a, b));
  return rounded_division(BinaryOp::TruncDivide, a, b, "div", "DivBackward");
}

// The bitwise ops take integers and bools (on bools they are the logical ops), never floats.
static Tensor bitwise(BinaryOp op, const Tensor& a, const Tensor& b, const char* name) {
  const DType dt = result_type(a, b);
  KILN_CHECK(!is_floating(dt), "{}: needs integer or bool tensors, got {} and {}", name, dtype_name(a.dtype()),
             dtype_name(b.dtype()));
  if (dt == kBool) {
    if (op == BinaryOp::BitwiseAnd) return logical_and(a, b);
    if (op == BinaryOp::BitwiseOr) return logical_or(a, b);
    return ne(a, b);
  }
  return binary_forward(op, a, b, dt, 1, name);
}
Tensor bitwise_and(const Tensor& a, const Tensor& b) { return bitwise(BinaryOp::BitwiseAnd, a, b, "bitwise_and"); }
Tensor bitwise_or(const Tensor& a, const Tensor& b) { return bitwise(BinaryOp::BitwiseOr, a, b, "bitwise_or"); }
Tensor bitwise_xor(const Tensor& a, const Tensor& b) { return bitwise(BinaryOp::BitwiseXor, a, b, "bitwise_xor"); }
Tensor bitwise_not(const Tensor& x) {
  KILN_CHECK(!is_floating(x.dtype()), "bitwise_not: needs an integer or bool tensor, got {}", dtype_name(x.dtype()));
  if (x.dtype() == kBool) return logical_not(x);
  return unary_forward(UnaryOp::BitwiseNot, x, x.dtype());
}

Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b) {
  KILN_CHECK(condition.dtype() == kBool, "where: the condition must be a bool tensor, got {}",
             dtype_name(condition.dtype()));
  check_same_device("where", condition, a);
  check_same_device("where", a, b);
  Shape shape = broadcast_shapes(broadcast_shapes(condition.sizes(), a.sizes(), "where"), b.sizes(), "where");
  DType dt = result_type(a, b);
  Tensor ac = cast_no_grad(a, dt), bc = cast_no_grad(b, dt);
  Tensor out = empty_tensor(shape, dt, a.device());
  backend_for(a.device()).where(broadcast_view(condition, shape), broadcast_view(ac, shape),
                                broadcast_view(bc, shape), view_of(out), stream_for(a.device()));
  if (should_record(a, b)) {
    record("WhereBackward", {a, b}, {out},
           [ia = InputInfo(a), ib = InputInfo(b), c = SavedTensor(condition, false)](const Grads& g) -> TensorList {
             Tensor cond = c.unpack("WhereBackward"), zero = zeros({}, g[0].options());
             return {g.needs_grad(0) ? ia.fit(where(cond, g[0], zero)) : Tensor(),
                     g.needs_grad(1) ? ib.fit(where(cond, zero, g[0])) : Tensor()};
           });
  }
  return out;
}
Tensor where(const Tensor& condition, const Tensor& a, const Scalar& b) {
  return where(condition, a, scalar_tensor(b, TensorOptions(result_type(a, b)).device(a.device())));
}

// Out of place, the tensor and the mask broadcast together, as PyTorch's (masked_fill_ needs the
// mask to fit the tensor).
Tensor masked_fill(const Tensor& x, const Tensor& mask, const Scalar& value) {
  KILN_CHECK(mask.dtype() == kBool, "masked_fill: the mask must be a bool tensor, got {}", dtype_name(mask.dtype()));
  (void)broadcast_shapes(mask.sizes(), x.sizes(), "masked_fill");  // an Error naming both when they do not
  return where(mask, scalar_tensor(value, x.options()), x);
}

// ---- addcmul, addcdiv, lerp ----

Tensor addcmul(const Tensor& input, const Tensor& tensor1, const Tensor& tensor2, const Scalar& value) {
  const DType dt = addc_result_type(input, tensor1, tensor2, value, false, "addcmul");
  const double v = value.to_double();
  Tensor out = ternary_forward(TernaryOp::Addcmul, input, tensor1, tensor2, dt, v, "addcmul");
  if (should_record({input, tensor1, tensor2})) {
    record("AddcmulBackward", {input, tensor1, tensor2}, {out},
           [ia = InputInfo(input), i1 = InputInfo(tensor1), i2 = InputInfo(tensor2), v,
            s1 = SavedTensor(tensor2.requires_grad() ? tensor1 : Tensor(), false),
            s2 = SavedTensor(tensor1.requires_grad() ? tensor2 : Tensor(), false)](const Grads& g) -> TensorList {
             Tensor gv = v == 1 ? g[0] : g[0] * v;
             return {g.needs_grad(0) ? ia.fit(g[0]) : Tensor(),
                     g.needs_grad(1) ? i1.fit(gv * s2.unpack("AddcmulBackward")) : Tensor(),
                     g.needs_grad(2) ? i2.fit(gv * s1.unpack("AddcmulBackward")) : Tensor()};
           });
  }
  return out;
}

Tensor addcdiv(const Tensor& input, const Tensor& tensor1, const Tensor& tensor2, const Scalar& value) {
  const DType dt = addc_result_type(input, tensor1, tensor2, value, true, "addcdiv");
  const double v = value.to_double();
  Tensor out = ternary_forward(TernaryOp::Addcdiv, input, tensor1, tensor2, dt, v, "addcdiv");
  if (should_record({input, tensor1, tensor2})) {
    record("AddcdivBackward", {input, tensor1, tensor2}, {out},
           [ia = InputInfo(input), i1 = InputInfo(tensor1), i2 = InputInfo(tensor2), v,
            s1 = SavedTensor(tensor2.requires_grad() ? tensor1 : Tensor(), false),
            s2 = SavedTensor(tensor1.requires_grad() || tensor2.requires_grad() ? tensor2 : Tensor(), false)](
               const Grads& g) -> TensorList {
             if (!g.needs_grad(1) && !g.needs_grad(2)) return {g.needs_grad(0) ? ia.fit(g[0]) : Tensor(), {}, {}};
             Tensor t2 = s2.unpack("AddcdivBackward");
             Tensor gv = v == 1 ? g[0] : g[0] * v;
             Tensor g1 = gv / t2;  // d/dt1 of v t1 / t2; d/dt2 = -(v t1 / t2^2) = -(g v / t2) t1 / t2
             return {g.needs_grad(0) ? ia.fit(g[0]) : Tensor(),
                     g.needs_grad(1) ? i1.fit(g1) : Tensor(),
                     g.needs_grad(2) ? i2.fit(-(g1 * s1.unpack("AddcdivBackward")) / t2) : Tensor()};
           });
  }
  return out;
}

Tensor lerp(const Tensor& input, const Tensor& end, const Tensor& weight) {
  check_lerp_dtypes(input, end, &weight, "lerp");
  Tensor out = ternary_forward(TernaryOp::Lerp, input, end, weight, input.dtype(), 0, "lerp");
  if (should_record({input, end, weight})) {
    record("LerpBackward", {input, end, weight}, {out},
           [ia = InputInfo(input), ie = InputInfo(end), iw = InputInfo(weight),
            sw = SavedTensor(input.requires_grad() || end.requires_grad() ? weight : Tensor(), false),
            ss = SavedTensor(weight.requires_grad() ? input : Tensor(), false),
            se = SavedTensor(weight.requires_grad() ? end : Tensor(), false)](const Grads& g) -> TensorList {
             Tensor w = g.needs_grad(0) || g.needs_grad(1) ? sw.unpack("LerpBackward") : Tensor();
             return {g.needs_grad(0) ? ia.fit(g[0] * (1 - w)) : Tensor(),
                     g.needs_grad(1) ? ie.fit(g[0] * w) : Tensor(),
                     g.needs_grad(2) ? iw.fit(g[0] * (se.unpack("LerpBackward") - ss.unpack("LerpBackward")))
                                     : Tensor()};
           });
  }
  return out;
}

Tensor lerp(const Tensor& input, const Tensor& end, const Scalar& weight) {
  check_lerp_dtypes(input, end, nullptr, "lerp");
  const double w = weight.to_double();
  // The weight goes to the kernel as a number (in opmath, as PyTorch's); the third operand is unread.
  Tensor out = ternary_forward(TernaryOp::LerpScalar, input, end, input, input.dtype(), w, "lerp");
  if (should_record(input, end)) {
    record("LerpBackward", {input, end}, {out},
           [ia = InputInfo(input), ie = InputInfo(end), w](const Grads& g) -> TensorList {
             return {g.needs_grad(0) ? ia.fit(g[0] * (1 - w)) : Tensor(),
                     g.needs_grad(1) ? ie.fit(g[0] * w) : Tensor()};
           });
  }
  return out;
}

}  // namespace ops

// ---- in-place forms ----
// Without autograd the kernel writes into self directly. With autograd, the op runs out of place on
// a clone of self (so what its backward saves is the old value, not the overwritten one), the result
// is copied into self, and self takes over the result's place in the graph.

namespace {

template <typename OutOfPlace>
Tensor& inplace_recorded(Tensor& self, const char* op, OutOfPlace&& f) {
  autograd::check_inplace(self, op);
  Tensor r = f(self.clone());
  {
    NoGradGuard no_grad;
    backend_for(self.device()).copy(view_of(r), r.device(), view_of(self), self.device(), stream_for(self.device()));
  }
  self.bump_version();
  autograd::rebase_history(self, r);
  return self;
}

Tensor& binary_inplace(Tensor& self, BinaryOp op, const Tensor& other, double alpha, const char* name,
                       Tensor (*out_of_place)(const Tensor&, const Tensor&, double)) {
  check_inference_write(self, name);
  DType dt = result_type(self, other);
  if (op == BinaryOp::Div) dt = floating_of(dt);
  KILN_CHECK(can_cast(dt, self.dtype()), "{}: the result type {} can't be cast to the tensor's type {}", name,
             dtype_name(dt), dtype_name(self.dtype()));
  if (op == BinaryOp::Add || op == BinaryOp::Sub) check_integer_alpha(self.dtype(), alpha, name);
  KILN_CHECK(broadcast_shapes(other.sizes(), self.sizes(), name) == self.sizes(),
             "{}: the other operand's shape {} must broadcast to this tensor's shape {}", name,
             other.sizes().str(), self.sizes().str());
  if (should_record(self, other)) {
    return inplace_recorded(self, name, [&](const Tensor& s) { return out_of_place(s, other, alpha); });
  }
  check_same_device(name, self, other);
  KILN_CHECK(self.dtype() != kBool, "{}: not defined for bool tensors", name);
  check_no_internal_overlap(self, name);
  Tensor o = unaliased(cast_no_grad(other, self.dtype()), self);
  backend_for(self.device())
      .binary(op, view_of(self), broadcast_view(o, self.sizes()), view_of(self), alpha, stream_for(self.device()));
  self.bump_version();
  return self;
}

Tensor& unary_inplace(Tensor& self, UnaryOp op, UnaryArgs args, const char* name, Tensor (*out_of_place)(const Tensor&)) {
  check_inference_write(self, name);
  if (should_record(self)) return inplace_recorded(self, name, out_of_place);
  KILN_CHECK(self.dtype() != kBool, "{}: not defined for bool tensors", name);
  check_no_internal_overlap(self, name);
  backend_for(self.device()).unary(op, view_of(self), view_of(self), args, stream_for(self.device()));
  self.bump_version();
  return self;
}

}  // namespace

Tensor& Tensor::add_(const Tensor& other, const Scalar& alpha) {
  return binary_inplace(*this, BinaryOp::Add, other, alpha.to_double(), "add_",
                        [](const Tensor& a, const Tensor& b, double al) { return ops::add(a, b, al); });
}
Tensor& Tensor::sub_(const Tensor& other, const Scalar& alpha) {
  return binary_inplace(*this, BinaryOp::Sub, other, alpha.to_double(), "sub_",
                        [](const Tensor& a, const Tensor& b, double al) { return ops::sub(a, b, al); });
}
Tensor& Tensor::mul_(const Tensor& other) {
  return binary_inplace(*this, BinaryOp::Mul, other, 1, "mul_",
                        [](const Tensor& a, const Tensor& b, double) { return ops::mul(a, b); });
}
Tensor& Tensor::div_(const Tensor& other) {
  return binary_inplace(*this, BinaryOp::Div, other, 1, "div_",
                        [](const Tensor& a, const Tensor& b, double) { return ops::div(a, b); });
}
// A 16-bit float tensor with a number: computed out of place in float32 (see with_number) and
// written back, so the number is not rounded to 16 bits first.
static bool number_in_float32(const Tensor& t, const Scalar& v) { return is_reduced_float(t.dtype()) && !v.is_bool(); }
static Tensor& number_inplace(Tensor& self, const Scalar& v, const char* name,
                              Tensor (*op)(const Tensor&, const Scalar&)) {
  check_inference_write(self, name);
  if (should_record(self)) return inplace_recorded(self, name, [&](const Tensor& s) { return op(s, v); });
  check_no_internal_overlap(self, name);
  Tensor r = op(self, v);
  backend_for(self.device()).copy(view_of(r), r.device(), view_of(self), self.device(), stream_for(self.device()));
  self.bump_version();
  return self;
}
Tensor& Tensor::add_(const Scalar& other) {
  return number_in_float32(*this, other) ? number_inplace(*this, other, "add_", ops::add) : add_(wrap(other, *this));
}
Tensor& Tensor::sub_(const Scalar& other) {
  return number_in_float32(*this, other) ? number_inplace(*this, other, "sub_", ops::sub) : sub_(wrap(other, *this));
}
Tensor& Tensor::mul_(const Scalar& other) {
  return number_in_float32(*this, other) ? number_inplace(*this, other, "mul_", ops::mul) : mul_(wrap(other, *this));
}
Tensor& Tensor::div_(const Scalar& other) {
  return number_in_float32(*this, other) ? number_inplace(*this, other, "div_", ops::div) : div_(wrap(other, *this));
}

Tensor& Tensor::relu_() {
  return unary_inplace(*this, UnaryOp::Relu, {}, "relu_", [](const Tensor& x) { return ops::relu(x); });
}
Tensor& Tensor::neg_() {
  return unary_inplace(*this, UnaryOp::Neg, {}, "neg_", [](const Tensor& x) { return ops::neg(x); });
}
Tensor& Tensor::exp_() {
  KILN_CHECK(is_floating_point(), "exp_: needs a floating tensor, got {}", dtype_name(dtype()));
  return unary_inplace(*this, UnaryOp::Exp, {}, "exp_", [](const Tensor& x) { return ops::exp(x); });
}
Tensor& Tensor::sqrt_() {
  KILN_CHECK(is_floating_point(), "sqrt_: needs a floating tensor, got {}", dtype_name(dtype()));
  return unary_inplace(*this, UnaryOp::Sqrt, {}, "sqrt_", [](const Tensor& x) { return ops::sqrt(x); });
}
Tensor& Tensor::pow_(const Scalar& exponent) {
  check_inference_write(*this, "pow_");
  KILN_CHECK(can_cast(result_type(*this, exponent), dtype()), "pow_: the result type can't be cast to {}",
             dtype_name(dtype()));
  KILN_CHECK(!(is_integral(dtype()) && exponent.to_double() < 0),
             "pow_: integers to negative integer powers are not allowed; convert the base to float");
  if (should_record(*this)) return inplace_recorded(*this, "pow_", [&](const Tensor& x) { return ops::pow(x, exponent); });
  backend_for(device()).unary(UnaryOp::PowScalar, view_of(*this), view_of(*this), {exponent.to_double(), 0},
                              stream_for(device()));
  bump_version();
  return *this;
}
Tensor& Tensor::clamp_(std::optional<Scalar> min, std::optional<Scalar> max) {
  check_inference_write(*this, "clamp_");
  if (should_record(*this)) return inplace_recorded(*this, "clamp_", [&](const Tensor& x) { return ops::clamp(x, min, max); });
  KILN_CHECK(min || max, "clamp_: at least one of min and max must be given");
  check_not_bool(*this, "clamp_");
  if (is_integral(dtype())) {  // ops::clamp keeps integers exact; its result type must fit in place
    Tensor clamped = ops::clamp(*this, min, max);
    KILN_CHECK(can_cast(clamped.dtype(), dtype()), "clamp_: the result type {} can't be cast to the tensor's type {}; "
               "use integer bounds, or clamp out of place", dtype_name(clamped.dtype()), dtype_name(dtype()));
    backend_for(device()).copy(view_of(clamped), device(), view_of(*this), device(), stream_for(device()));
    bump_version();
    return *this;
  }
  const double lo = min ? min->to_double() : -kInf, hi = max ? max->to_double() : kInf;
  if (std::isnan(lo) || std::isnan(hi)) return fill_(NAN);  // as ops::clamp
  backend_for(device()).unary(UnaryOp::Clamp, view_of(*this), view_of(*this), {lo, hi}, stream_for(device()));
  bump_version();
  return *this;
}
Tensor& Tensor::masked_fill_(const Tensor& mask, const Scalar& value) {
  check_inference_write(*this, "masked_fill_");
  KILN_CHECK(broadcast_shapes(mask.sizes(), sizes(), "masked_fill_") == sizes(),
             "masked_fill_: the mask of shape {} must broadcast to the tensor's shape {}", mask.sizes().str(),
             sizes().str());
  if (should_record(*this)) {
    return inplace_recorded(*this, "masked_fill_", [&](const Tensor& x) { return ops::masked_fill(x, mask, value); });
  }
  Tensor filled = ops::masked_fill(*this, mask, value);
  backend_for(device()).copy(view_of(filled), device(), view_of(*this), device(), stream_for(device()));
  bump_version();
  return *this;
}
Tensor& Tensor::fill_(const Scalar& value) {
  check_inference_write(*this, "fill_");
  if (should_record(*this)) {  // still in the graph, with a zero gradient to its old value
    return inplace_recorded(*this, "fill_", [&](const Tensor& x) {
      Tensor r = full_like(x, value);
      record("FillBackward", {x}, {r}, [](const Grads& g) -> TensorList { return {zeros_like(g[0])}; });
      return r;
    });
  }
  backend_for(device()).fill(view_of(*this), value, stream_for(device()));
  bump_version();
  return *this;
}
Tensor& Tensor::zero_() { return fill_(0); }

// addcmul_, addcdiv_, lerp_: the result must keep this tensor's shape and be castable to its dtype.
namespace {
Tensor& ternary_inplace(Tensor& self, TernaryOp op, const Tensor& b, const Tensor& c, DType dt, double v,
                        const char* name, const std::function<Tensor(const Tensor&)>& out_of_place) {
  check_inference_write(self, name);
  KILN_CHECK(can_cast(dt, self.dtype()), "{}: the result type {} can't be cast to the tensor's type {}", name,
             dtype_name(dt), dtype_name(self.dtype()));
  const Shape shape = broadcast_shapes(broadcast_shapes(self.sizes(), b.sizes(), name), c.sizes(), name);
  KILN_CHECK(shape == self.sizes(), "{}: the operands broadcast to shape {}, not to this tensor's shape {}", name,
             shape.str(), self.sizes().str());
  if (should_record({self, b, c})) return inplace_recorded(self, name, out_of_place);
  if (dt != self.dtype()) {  // computed in the promoted dtype, as PyTorch, then rounded into self
    Tensor r = out_of_place(self);
    backend_for(self.device()).copy(view_of(r), r.device(), view_of(self), self.device(), stream_for(self.device()));
    self.bump_version();
    return self;
  }
  check_same_device(name, self, b);
  check_same_device(name, self, c);
  check_no_internal_overlap(self, name);
  Tensor bc = unaliased(cast_no_grad(b, self.dtype()), self), cc = unaliased(cast_no_grad(c, self.dtype()), self);
  backend_for(self.device())
      .ternary(op, view_of(self), broadcast_view(bc, shape), broadcast_view(cc, shape), view_of(self), v,
               stream_for(self.device()));
  self.bump_version();
  return self;
}
}  // namespace

Tensor& Tensor::addcmul_(const Tensor& tensor1, const Tensor& tensor2, const Scalar& value) {
  const DType dt = addc_result_type(*this, tensor1, tensor2, value, false, "addcmul_");
  return ternary_inplace(*this, TernaryOp::Addcmul, tensor1, tensor2, dt, value.to_double(), "addcmul_",
                         [&](const Tensor& s) { return ops::addcmul(s, tensor1, tensor2, value); });
}
Tensor& Tensor::addcdiv_(const Tensor& tensor1, const Tensor& tensor2, const Scalar& value) {
  const DType dt = addc_result_type(*this, tensor1, tensor2, value, true, "addcdiv_");
  return ternary_inplace(*this, TernaryOp::Addcdiv, tensor1, tensor2, dt, value.to_double(), "addcdiv_",
                         [&](const Tensor& s) { return ops::addcdiv(s, tensor1, tensor2, value); });
}
Tensor& Tensor::lerp_(const Tensor& end, const Tensor& weight) {
  check_lerp_dtypes(*this, end, &weight, "lerp_");
  return ternary_inplace(*this, TernaryOp::Lerp, end, weight, dtype(), 0, "lerp_",
                         [&](const Tensor& s) { return ops::lerp(s, end, weight); });
}
Tensor& Tensor::lerp_(const Tensor& end, const Scalar& weight) {
  check_lerp_dtypes(*this, end, nullptr, "lerp_");
  return ternary_inplace(*this, TernaryOp::LerpScalar, end, end, dtype(), weight.to_double(), "lerp_",
                         [&](const Tensor& s) { return ops::lerp(s, end, weight); });
}

}  // namespace kiln
