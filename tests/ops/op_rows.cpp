// tests/ops/op_rows.cpp: the rows of the op table (op_table.h). Each row calls the op through the
// public API with the case's inputs and arguments, on whatever device the inputs are.
#include "op_table.h"

#include "support.h"

namespace kiln::test {
namespace {

using autograd::TensorList;

using Fn1 = std::function<Tensor(const Tensor&)>;
using Fn1a = std::function<Tensor(const Tensor&, const GoldenCase&)>;
using Fn2 = std::function<Tensor(const Tensor&, const Tensor&)>;

OpRow unary(std::string op, Deriv d, Fn1 f) {
  return {std::move(op), d, [f](const TensorList& in, const GoldenCase&) { return TensorList{f(in.at(0))}; }};
}
OpRow unary_args(std::string op, Deriv d, Fn1a f) {
  return {std::move(op), d, [f](const TensorList& in, const GoldenCase& c) { return TensorList{f(in.at(0), c)}; }};
}
OpRow binary(std::string op, Deriv d, Fn2 f) {
  return {std::move(op), d,
          [f](const TensorList& in, const GoldenCase&) { return TensorList{f(in.at(0), in.at(1))}; }};
}
// An orthogonal polynomial p_n(x): n is the second input, or the case's number n (the Scalar overload).
using Polynomial = Tensor (*)(const Tensor&, const Tensor&);
using PolynomialOfNumber = Tensor (*)(const Tensor&, const Scalar&);
OpRow polynomial(std::string op, Polynomial f, PolynomialOfNumber g) {
  return {std::move(op), Deriv::GradGrad, [f, g](const TensorList& in, const GoldenCase& c) {
            return TensorList{c.has("n") ? g(in.at(0), c.scalar("n")) : f(in.at(0), in.at(1))};
          }};
}
// A view followed by contiguous(): the copy must be contiguous and hold the view's values.
OpRow view_op(std::string op, Fn1a f) {
  return {std::move(op), Deriv::GradGrad, [f](const TensorList& in, const GoldenCase& c) {
            Tensor r = f(in.at(0), c).contiguous();
            CHECK(r.is_contiguous());
            return TensorList{r};
          }};
}

// beta input + alpha (a product of the other two inputs): addmv, addr, baddbmm.
using Scaled = Tensor (*)(const Tensor&, const Tensor&, const Tensor&, const Scalar&, const Scalar&);
OpRow scaled_product(std::string op, Scaled f) {
  return {std::move(op), Deriv::GradGrad, [f](const TensorList& in, const GoldenCase& c) {
            const Scalar beta = c.scalar("beta", Scalar(1)), alpha = c.scalar("alpha", Scalar(1));
            return TensorList{f(in.at(0), in.at(1), in.at(2), beta, alpha)};
          }};
}
Tensor opt_input(const TensorList& in, size_t k) { return k < in.size() ? in[k] : Tensor(); }
Shape dims_arg(const GoldenCase& c) { return c.shape("dims", Shape{}); }
bool keepdim_arg(const GoldenCase& c) { return c.flag("keepdim"); }
std::optional<double> opt_real(const GoldenCase& c, const char* key) {
  return c.has(key) ? std::optional<double>(c.real(key)) : std::nullopt;
}
std::optional<std::string> opt_str(const GoldenCase& c, const char* key) {
  return c.has(key) ? std::optional<std::string>(c.str(key)) : std::nullopt;
}

}  // namespace

const std::vector<OpRow>& op_table() {
  using D = Deriv;
  static const std::vector<OpRow> rows = {
      // ---- elementwise, unary ----
      unary("neg", D::GradGrad, [](const Tensor& x) { return kiln::neg(x); }),
      unary("abs", D::Grad, [](const Tensor& x) { return kiln::abs(x); }),
      unary("sign", D::None, [](const Tensor& x) { return kiln::sign(x); }),
      unary("exp", D::GradGrad, [](const Tensor& x) { return kiln::exp(x); }),
      unary("log", D::GradGrad, [](const Tensor& x) { return kiln::log(x); }),
      unary("log1p", D::GradGrad, [](const Tensor& x) { return kiln::log1p(x); }),
      unary("expm1", D::GradGrad, [](const Tensor& x) { return kiln::expm1(x); }),
      unary("sqrt", D::GradGrad, [](const Tensor& x) { return kiln::sqrt(x); }),
      unary("rsqrt", D::GradGrad, [](const Tensor& x) { return kiln::rsqrt(x); }),
      unary("reciprocal", D::GradGrad, [](const Tensor& x) { return kiln::reciprocal(x); }),
      unary("sin", D::GradGrad, [](const Tensor& x) { return kiln::sin(x); }),
      unary("cos", D::GradGrad, [](const Tensor& x) { return kiln::cos(x); }),
      unary("tanh", D::GradGrad, [](const Tensor& x) { return kiln::tanh(x); }),
      unary("sigmoid", D::GradGrad, [](const Tensor& x) { return kiln::sigmoid(x); }),
      unary("relu", D::Grad, [](const Tensor& x) { return kiln::relu(x); }),
      unary_args("gelu", D::GradGrad, [](const Tensor& x, const GoldenCase& c) { return kiln::gelu(x, c.str("approximate")); }),
      unary("silu", D::GradGrad, [](const Tensor& x) { return kiln::silu(x); }),
      unary("softplus", D::GradGrad, [](const Tensor& x) { return kiln::softplus(x); }),
      unary("erf", D::GradGrad, [](const Tensor& x) { return kiln::erf(x); }),
      unary("square", D::GradGrad, [](const Tensor& x) { return kiln::square(x); }),
      unary_args("pow_scalar", D::GradGrad,
                 [](const Tensor& x, const GoldenCase& c) { return kiln::pow(x, c.scalar("exponent")); }),
      unary_args("clamp", D::Grad, [](const Tensor& x, const GoldenCase& c) {
        return kiln::clamp(x, c.opt_scalar("min"), c.opt_scalar("max"));
      }),
      unary("logical_not", D::None, [](const Tensor& x) { return kiln::logical_not(x); }),

      // ---- elementwise, binary ----
      {"add", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         return TensorList{kiln::add(in.at(0), in.at(1), c.scalar("alpha", Scalar(1)))};
       }},
      {"sub", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         return TensorList{kiln::sub(in.at(0), in.at(1), c.scalar("alpha", Scalar(1)))};
       }},
      binary("mul", D::GradGrad, [](const Tensor& a, const Tensor& b) { return kiln::mul(a, b); }),
      binary("div", D::GradGrad, [](const Tensor& a, const Tensor& b) { return kiln::div(a, b); }),
      binary("pow", D::GradGrad, [](const Tensor& a, const Tensor& b) { return kiln::pow(a, b); }),
      binary("maximum", D::Grad, [](const Tensor& a, const Tensor& b) { return kiln::maximum(a, b); }),
      binary("minimum", D::Grad, [](const Tensor& a, const Tensor& b) { return kiln::minimum(a, b); }),
      binary("eq", D::None, [](const Tensor& a, const Tensor& b) { return kiln::eq(a, b); }),
      binary("ne", D::None, [](const Tensor& a, const Tensor& b) { return kiln::ne(a, b); }),
      binary("lt", D::None, [](const Tensor& a, const Tensor& b) { return kiln::lt(a, b); }),
      binary("le", D::None, [](const Tensor& a, const Tensor& b) { return kiln::le(a, b); }),
      binary("gt", D::None, [](const Tensor& a, const Tensor& b) { return kiln::gt(a, b); }),
      binary("ge", D::None, [](const Tensor& a, const Tensor& b) { return kiln::ge(a, b); }),
      binary("logical_and", D::None, [](const Tensor& a, const Tensor& b) { return kiln::logical_and(a, b); }),
      binary("logical_or", D::None, [](const Tensor& a, const Tensor& b) { return kiln::logical_or(a, b); }),
      {"where", D::GradGrad,
       [](const TensorList& in, const GoldenCase&) { return TensorList{kiln::where(in.at(0), in.at(1), in.at(2))}; }},
      {"masked_fill", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         return TensorList{kiln::masked_fill(in.at(0), in.at(1), c.scalar("value"))};
       }},

      // ---- rounding, remainders, floor division, bitwise ----
      unary("floor", D::Grad, [](const Tensor& x) { return kiln::floor(x); }),
      unary("ceil", D::Grad, [](const Tensor& x) { return kiln::ceil(x); }),
      unary("trunc", D::Grad, [](const Tensor& x) { return kiln::trunc(x); }),
      unary("round", D::Grad, [](const Tensor& x) { return kiln::round(x); }),
      binary("remainder", D::Grad, [](const Tensor& a, const Tensor& b) { return kiln::remainder(a, b); }),
      binary("fmod", D::Grad, [](const Tensor& a, const Tensor& b) { return kiln::fmod(a, b); }),
      binary("floor_divide", D::Grad, [](const Tensor& a, const Tensor& b) { return kiln::floor_divide(a, b); }),
      binary("div_trunc", D::Grad, [](const Tensor& a, const Tensor& b) { return kiln::div(a, b, "trunc"); }),
      binary("div_floor", D::Grad, [](const Tensor& a, const Tensor& b) { return kiln::div(a, b, "floor"); }),
      unary_args("remainder_scalar", D::Grad,
                 [](const Tensor& x, const GoldenCase& c) { return kiln::remainder(x, c.scalar("s")); }),
      unary_args("fmod_scalar", D::Grad,
                 [](const Tensor& x, const GoldenCase& c) { return kiln::fmod(x, c.scalar("s")); }),
      unary_args("floor_divide_scalar", D::Grad,
                 [](const Tensor& x, const GoldenCase& c) { return kiln::floor_divide(x, c.scalar("s")); }),
      binary("bitwise_and", D::None, [](const Tensor& a, const Tensor& b) { return a & b; }),
      binary("bitwise_or", D::None, [](const Tensor& a, const Tensor& b) { return a | b; }),
      binary("bitwise_xor", D::None, [](const Tensor& a, const Tensor& b) { return a ^ b; }),
      unary("bitwise_not", D::None, [](const Tensor& x) { return ~x; }),
      unary_args("bitwise_and_scalar", D::None,
                 [](const Tensor& x, const GoldenCase& c) { return kiln::bitwise_and(x, c.scalar("s")); }),

      // ---- elementwise, ternary ----
      {"addcmul", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         return TensorList{kiln::addcmul(in.at(0), in.at(1), in.at(2), c.scalar("value", Scalar(1)))};
       }},
      {"addcdiv", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         return TensorList{kiln::addcdiv(in.at(0), in.at(1), in.at(2), c.scalar("value", Scalar(1)))};
       }},
      {"lerp", D::GradGrad,
       [](const TensorList& in, const GoldenCase&) { return TensorList{kiln::lerp(in.at(0), in.at(1), in.at(2))}; }},
      {"lerp_scalar", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         return TensorList{kiln::lerp(in.at(0), in.at(1), c.scalar("weight"))};
       }},

      // ---- elementwise, scalar forms ----
      unary_args("add_scalar", D::GradGrad, [](const Tensor& x, const GoldenCase& c) { return kiln::add(x, c.scalar("s")); }),
      unary_args("sub_scalar", D::GradGrad, [](const Tensor& x, const GoldenCase& c) { return kiln::sub(x, c.scalar("s")); }),
      unary_args("rsub_scalar", D::GradGrad, [](const Tensor& x, const GoldenCase& c) { return kiln::rsub(x, c.scalar("s")); }),
      unary_args("mul_scalar", D::GradGrad, [](const Tensor& x, const GoldenCase& c) { return kiln::mul(x, c.scalar("s")); }),
      unary_args("div_scalar", D::GradGrad, [](const Tensor& x, const GoldenCase& c) { return kiln::div(x, c.scalar("s")); }),
      unary_args("eq_scalar", D::None, [](const Tensor& x, const GoldenCase& c) { return kiln::eq(x, c.scalar("s")); }),
      unary_args("ne_scalar", D::None, [](const Tensor& x, const GoldenCase& c) { return kiln::ne(x, c.scalar("s")); }),
      unary_args("lt_scalar", D::None, [](const Tensor& x, const GoldenCase& c) { return kiln::lt(x, c.scalar("s")); }),
      unary_args("le_scalar", D::None, [](const Tensor& x, const GoldenCase& c) { return kiln::le(x, c.scalar("s")); }),
      unary_args("gt_scalar", D::None, [](const Tensor& x, const GoldenCase& c) { return kiln::gt(x, c.scalar("s")); }),
      unary_args("ge_scalar", D::None, [](const Tensor& x, const GoldenCase& c) { return kiln::ge(x, c.scalar("s")); }),
      {"where_scalar", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         return TensorList{kiln::where(in.at(0), in.at(1), c.scalar("s"))};
       }},

      // ---- reductions ----
      unary_args("sum", D::GradGrad, [](const Tensor& x, const GoldenCase& c) {
        return kiln::sum(x, dims_arg(c), keepdim_arg(c), c.opt_dtype("dtype"));
      }),
      unary_args("mean", D::GradGrad,
                 [](const Tensor& x, const GoldenCase& c) { return kiln::mean(x, dims_arg(c), keepdim_arg(c)); }),
      unary_args("prod", D::GradGrad,
                 [](const Tensor& x, const GoldenCase& c) { return kiln::prod(x, c.opt_integer("dim"), keepdim_arg(c)); }),
      unary_args("amax", D::Grad,
                 [](const Tensor& x, const GoldenCase& c) { return kiln::amax(x, dims_arg(c), keepdim_arg(c)); }),
      unary_args("amin", D::Grad,
                 [](const Tensor& x, const GoldenCase& c) { return kiln::amin(x, dims_arg(c), keepdim_arg(c)); }),
      unary("max_all", D::Grad, [](const Tensor& x) { return kiln::max(x); }),
      unary("min_all", D::Grad, [](const Tensor& x) { return kiln::min(x); }),
      {"max_dim", D::Grad,
       [](const TensorList& in, const GoldenCase& c) {
         auto [values, indices] = kiln::max(in.at(0), c.integer("dim"), keepdim_arg(c));
         return TensorList{values, indices};
       }},
      {"min_dim", D::Grad,
       [](const TensorList& in, const GoldenCase& c) {
         auto [values, indices] = kiln::min(in.at(0), c.integer("dim"), keepdim_arg(c));
         return TensorList{values, indices};
       }},
      unary_args("argmax", D::None,
                 [](const Tensor& x, const GoldenCase& c) { return kiln::argmax(x, c.opt_integer("dim"), keepdim_arg(c)); }),
      unary_args("argmin", D::None,
                 [](const Tensor& x, const GoldenCase& c) { return kiln::argmin(x, c.opt_integer("dim"), keepdim_arg(c)); }),
      unary_args("var", D::GradGrad, [](const Tensor& x, const GoldenCase& c) {
        return kiln::var(x, dims_arg(c), c.integer("correction", 1), keepdim_arg(c));
      }),
      unary_args("std", D::GradGrad, [](const Tensor& x, const GoldenCase& c) {
        return kiln::std(x, dims_arg(c), c.integer("correction", 1), keepdim_arg(c));
      }),
      unary_args("norm", D::GradGrad, [](const Tensor& x, const GoldenCase& c) {
        return kiln::norm(x, c.real("p"), dims_arg(c), keepdim_arg(c));
      }),
      unary_args("logsumexp", D::GradGrad,
                 [](const Tensor& x, const GoldenCase& c) { return kiln::logsumexp(x, c.shape("dims"), keepdim_arg(c)); }),
      unary_args("all", D::None,
                 [](const Tensor& x, const GoldenCase& c) { return kiln::all(x, c.opt_integer("dim"), keepdim_arg(c)); }),
      unary_args("any", D::None,
                 [](const Tensor& x, const GoldenCase& c) { return kiln::any(x, c.opt_integer("dim"), keepdim_arg(c)); }),

      // ---- linear algebra, softmax ----
      binary("matmul", D::GradGrad, [](const Tensor& a, const Tensor& b) { return kiln::matmul(a, b); }),
      binary("mm", D::GradGrad, [](const Tensor& a, const Tensor& b) { return kiln::mm(a, b); }),
      binary("bmm", D::GradGrad, [](const Tensor& a, const Tensor& b) { return kiln::bmm(a, b); }),
      {"addmm", D::GradGrad,
       [](const TensorList& in, const GoldenCase&) { return TensorList{kiln::addmm(in.at(0), in.at(1), in.at(2))}; }},
      {"addmm_gelu", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         return TensorList{kiln::addmm_gelu(in.at(0), in.at(1), in.at(2), c.str("approximate"))};
       }},
      unary_args("softmax", D::GradGrad,
                 [](const Tensor& x, const GoldenCase& c) { return kiln::softmax(x, c.integer("dim")); }),
      unary_args("log_softmax", D::GradGrad,
                 [](const Tensor& x, const GoldenCase& c) { return kiln::log_softmax(x, c.integer("dim")); }),

      // ---- shape ops ----
      {"cat", D::GradGrad, [](const TensorList& in, const GoldenCase& c) { return TensorList{kiln::cat(in, c.integer("dim"))}; }},
      {"stack", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) { return TensorList{kiln::stack(in, c.integer("dim"))}; }},
      {"split", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) { return kiln::split(in.at(0), c.integer("size"), c.integer("dim")); }},
      {"split_with_sizes", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         return kiln::split_with_sizes(in.at(0), c.ints("sizes"), c.integer("dim"));
       }},
      {"chunk", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) { return kiln::chunk(in.at(0), c.integer("chunks"), c.integer("dim")); }},
      unary_args("flip", D::GradGrad, [](const Tensor& x, const GoldenCase& c) { return kiln::flip(x, c.shape("dims")); }),
      unary_args("repeat", D::GradGrad,
                 [](const Tensor& x, const GoldenCase& c) { return kiln::repeat(x, c.shape("repeats")); }),
      unary_args("pad", D::GradGrad,
                 [](const Tensor& x, const GoldenCase& c) { return kiln::pad(x, c.ints("padding"), c.real("value", 0)); }),
      unary_args("tril", D::GradGrad,
                 [](const Tensor& x, const GoldenCase& c) { return kiln::tril(x, c.integer("diagonal", 0)); }),
      unary_args("triu", D::GradGrad,
                 [](const Tensor& x, const GoldenCase& c) { return kiln::triu(x, c.integer("diagonal", 0)); }),

      // ---- index ops ----
      {"index_select", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         return TensorList{kiln::index_select(in.at(0), c.integer("dim"), in.at(1))};
       }},
      {"index_add", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         return TensorList{kiln::index_add(in.at(0), c.integer("dim"), in.at(1), in.at(2))};
       }},
      {"gather", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) { return TensorList{kiln::gather(in.at(0), c.integer("dim"), in.at(1))}; }},
      {"scatter", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         return TensorList{kiln::scatter(in.at(0), c.integer("dim"), in.at(1), in.at(2))};
       }},
      {"scatter_add", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         return TensorList{kiln::scatter_add(in.at(0), c.integer("dim"), in.at(1), in.at(2))};
       }},
      binary("embedding", D::GradGrad, [](const Tensor& w, const Tensor& i) { return kiln::embedding(w, i); }),
      unary_args("one_hot", D::None,
                 [](const Tensor& i, const GoldenCase& c) { return kiln::one_hot(i, c.integer("num_classes", -1)); }),

      // ---- casts and copies ----
      unary_args("to", D::GradGrad, [](const Tensor& x, const GoldenCase& c) { return x.to(c.dtype("dtype")); }),
      unary("clone", D::GradGrad, [](const Tensor& x) { return kiln::clone(x); }),
      unary("contiguous", D::GradGrad, [](const Tensor& x) {
        Tensor r = kiln::contiguous(x);
        CHECK(r.is_contiguous());
        return r;
      }),
      unary_args("sum_to", D::GradGrad, [](const Tensor& x, const GoldenCase& c) { return kiln::sum_to(x, c.shape("shape")); }),
      // Not differentiable in Kiln (by design: it says so); values only.
      unary_args("as_strided", D::None, [](const Tensor& x, const GoldenCase& c) {
        return kiln::as_strided(x, c.shape("sizes"), c.shape("strides"), c.integer("offset")).contiguous();
      }),

      // ---- factories (no inputs; the C++ default dtype is float32, arange's is inferred) ----
      {"arange", D::None,
       [](const TensorList&, const GoldenCase& c) {
         if (!c.has("start")) {
           return TensorList{c.has("dtype") ? kiln::arange(c.scalar("end"), c.dtype("dtype")) : kiln::arange(c.scalar("end"))};
         }
         return TensorList{kiln::arange(c.scalar("start"), c.scalar("end"), c.scalar("step", Scalar(1)), c.opt_dtype("dtype"))};
       }},
      {"linspace", D::None,
       [](const TensorList&, const GoldenCase& c) {
         return TensorList{kiln::linspace(c.real("start"), c.real("end"), c.integer("steps"),
                                          c.opt_dtype("dtype").value_or(kFloat32))};
       }},
      {"eye", D::None,
       [](const TensorList&, const GoldenCase& c) {
         return TensorList{kiln::eye(c.integer("n"), c.opt_integer("m"), c.opt_dtype("dtype").value_or(kFloat32))};
       }},
      {"full", D::None,
       [](const TensorList&, const GoldenCase& c) {
         return TensorList{kiln::full(c.shape("shape"), c.scalar("value"), c.opt_dtype("dtype").value_or(kFloat32))};
       }},

      // ---- views, then contiguous() ----
      view_op("permute", [](const Tensor& x, const GoldenCase& c) { return kiln::permute(x, c.shape("dims")); }),
      view_op("transpose",
              [](const Tensor& x, const GoldenCase& c) { return kiln::transpose(x, c.integer("dim0"), c.integer("dim1")); }),
      view_op("narrow", [](const Tensor& x, const GoldenCase& c) {
        return kiln::narrow(x, c.integer("dim"), c.integer("start"), c.integer("length"));
      }),
      view_op("slice", [](const Tensor& x, const GoldenCase& c) {
        return kiln::slice(x, c.integer("dim"), c.opt_integer("start"), c.opt_integer("end"), c.integer("step"));
      }),
      view_op("select",
              [](const Tensor& x, const GoldenCase& c) { return kiln::select(x, c.integer("dim"), c.integer("index")); }),
      view_op("expand", [](const Tensor& x, const GoldenCase& c) { return kiln::expand(x, c.shape("shape")); }),
      view_op("squeeze", [](const Tensor& x, const GoldenCase& c) { return kiln::squeeze(x, c.opt_integer("dim")); }),
      view_op("unsqueeze", [](const Tensor& x, const GoldenCase& c) { return kiln::unsqueeze(x, c.integer("dim")); }),
      view_op("flatten", [](const Tensor& x, const GoldenCase& c) {
        return kiln::flatten(x, c.integer("start", 0), c.integer("end", -1));
      }),
      view_op("unfold_view",
              [](const Tensor& x, const GoldenCase& c) {
                return kiln::unfold(x, c.integer("dim"), c.integer("size"), c.integer("step"));
              }),
      view_op("unflatten",
              [](const Tensor& x, const GoldenCase& c) { return kiln::unflatten(x, c.integer("dim"), c.shape("sizes")); }),
      view_op("view", [](const Tensor& x, const GoldenCase& c) { return kiln::view(x, c.shape("shape")); }),
      view_op("reshape", [](const Tensor& x, const GoldenCase& c) { return kiln::reshape(x, c.shape("shape")); }),

      // ---- nn ops (optional tensors: the inputs after the required ones, when the case has them) ----
      {"conv2d", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         return TensorList{kiln::conv2d(in.at(0), in.at(1), opt_input(in, 2), c.shape("stride", Shape{1, 1}),
                                        c.shape("padding", Shape{0, 0}), c.shape("dilation", Shape{1, 1}),
                                        c.integer("groups", 1))};
       }},
      {"conv3d", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         return TensorList{kiln::conv3d(in.at(0), in.at(1), opt_input(in, 2), c.shape("stride", Shape{1, 1, 1}),
                                        c.shape("padding", Shape{0, 0, 0}), c.shape("dilation", Shape{1, 1, 1}),
                                        c.integer("groups", 1))};
       }},
      {"conv_transpose2d", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         return TensorList{kiln::conv_transpose2d(in.at(0), in.at(1), opt_input(in, 2), c.shape("stride", Shape{1, 1}),
                                                  c.shape("padding", Shape{0, 0}),
                                                  c.shape("output_padding", Shape{0, 0}), c.integer("groups", 1),
                                                  c.shape("dilation", Shape{1, 1}))};
       }},
      {"conv_transpose3d", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         return TensorList{kiln::conv_transpose3d(in.at(0), in.at(1), opt_input(in, 2), c.shape("stride", Shape{1}),
                                                  c.shape("padding", Shape{0}), c.shape("output_padding", Shape{0}),
                                                  c.integer("groups", 1), c.shape("dilation", Shape{1}))};
       }},
      {"conv_transpose1d", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         return TensorList{kiln::conv_transpose1d(in.at(0), in.at(1), opt_input(in, 2), c.integer("stride", 1),
                                                  c.integer("padding", 0), c.integer("output_padding", 0),
                                                  c.integer("groups", 1), c.integer("dilation", 1))};
       }},
      {"conv1d", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         return TensorList{kiln::conv1d(in.at(0), in.at(1), opt_input(in, 2), c.integer("stride", 1),
                                        c.integer("padding", 0), c.integer("dilation", 1), c.integer("groups", 1))};
       }},
      unary_args("max_pool2d", D::GradGrad, [](const Tensor& x, const GoldenCase& c) {
        return kiln::max_pool2d(x, c.shape("kernel"), c.shape("stride", Shape{}), c.shape("padding", Shape{0, 0}),
                                c.shape("dilation", Shape{1, 1}), c.flag("ceil_mode"));
      }),
      {"max_pool2d_with_indices", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         auto [values, indices] = kiln::max_pool2d_with_indices(
             in.at(0), c.shape("kernel"), c.shape("stride", Shape{}), c.shape("padding", Shape{0, 0}),
             c.shape("dilation", Shape{1, 1}), c.flag("ceil_mode"));
         return TensorList{values, indices};
       }},
      unary_args("avg_pool2d", D::GradGrad, [](const Tensor& x, const GoldenCase& c) {
        return kiln::avg_pool2d(x, c.shape("kernel"), c.shape("stride", Shape{}), c.shape("padding", Shape{0, 0}),
                                c.flag("ceil_mode"), c.flag("count_include_pad", true), c.opt_integer("divisor"));
      }),
      unary_args("adaptive_avg_pool2d", D::GradGrad,
                 [](const Tensor& x, const GoldenCase& c) { return kiln::adaptive_avg_pool2d(x, c.shape("size")); }),
      unary_args("max_pool1d", D::GradGrad, [](const Tensor& x, const GoldenCase& c) {
        return kiln::max_pool1d(x, c.integer("kernel"), c.opt_integer("stride"), c.integer("padding", 0),
                                c.integer("dilation", 1), c.flag("ceil_mode"));
      }),
      {"max_pool1d_with_indices", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         auto [values, indices] =
             kiln::max_pool1d_with_indices(in.at(0), c.integer("kernel"), c.opt_integer("stride"),
                                           c.integer("padding", 0), c.integer("dilation", 1), c.flag("ceil_mode"));
         return TensorList{values, indices};
       }},
      unary_args("avg_pool1d", D::GradGrad, [](const Tensor& x, const GoldenCase& c) {
        return kiln::avg_pool1d(x, c.integer("kernel"), c.opt_integer("stride"), c.integer("padding", 0),
                                c.flag("ceil_mode"), c.flag("count_include_pad", true));
      }),
      unary_args("adaptive_avg_pool1d", D::GradGrad,
                 [](const Tensor& x, const GoldenCase& c) { return kiln::adaptive_avg_pool1d(x, c.integer("size")); }),
      unary_args("adaptive_max_pool2d", D::GradGrad,
                 [](const Tensor& x, const GoldenCase& c) { return kiln::adaptive_max_pool2d(x, c.shape("size")); }),
      {"adaptive_max_pool2d_with_indices", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         auto [values, indices] = kiln::adaptive_max_pool2d_with_indices(in.at(0), c.shape("size"));
         return TensorList{values, indices};
       }},
      {"max_pool3d_with_indices", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         auto [values, indices] = kiln::max_pool3d_with_indices(
             in.at(0), c.shape("kernel"), c.shape("stride", Shape{}), c.shape("padding", Shape{0}),
             c.shape("dilation", Shape{1}), c.flag("ceil_mode"));
         return TensorList{values, indices};
       }},
      unary_args("avg_pool3d", D::GradGrad, [](const Tensor& x, const GoldenCase& c) {
        return kiln::avg_pool3d(x, c.shape("kernel"), c.shape("stride", Shape{}), c.shape("padding", Shape{0}),
                                c.flag("ceil_mode"), c.flag("count_include_pad", true), c.opt_integer("divisor"));
      }),
      unary_args("adaptive_avg_pool3d", D::GradGrad,
                 [](const Tensor& x, const GoldenCase& c) { return kiln::adaptive_avg_pool3d(x, c.shape("size")); }),
      {"adaptive_max_pool3d_with_indices", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         auto [values, indices] = kiln::adaptive_max_pool3d_with_indices(in.at(0), c.shape("size"));
         return TensorList{values, indices};
       }},
      unary_args("adaptive_max_pool1d", D::GradGrad,
                 [](const Tensor& x, const GoldenCase& c) { return kiln::adaptive_max_pool1d(x, c.integer("size")); }),
      {"adaptive_max_pool1d_with_indices", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         auto [values, indices] = kiln::adaptive_max_pool1d_with_indices(in.at(0), c.integer("size"));
         return TensorList{values, indices};
       }},
      {"layer_norm", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         return TensorList{kiln::layer_norm(in.at(0), c.shape("shape"), opt_input(in, 1), opt_input(in, 2),
                                            c.real("eps", 1e-5))};
       }},
      {"rms_norm", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         std::optional<double> eps;
         if (c.has("eps")) eps = c.real("eps");
         return TensorList{kiln::rms_norm(in.at(0), c.shape("shape"), opt_input(in, 1), eps)};
       }},
      {"group_norm", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         return TensorList{kiln::group_norm(in.at(0), c.integer("groups"), opt_input(in, 1), opt_input(in, 2),
                                            c.real("eps", 1e-5))};
       }},
      {"instance_norm", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         return TensorList{nn::instance_norm(in.at(0), {}, {}, opt_input(in, 1), opt_input(in, 2), true, 0.1,
                                             c.real("eps", 1e-5))};
       }},
      unary_args("pad_mode", D::GradGrad,
                 [](const Tensor& x, const GoldenCase& c) { return kiln::pad(x, c.ints("padding"), c.str("mode")); }),
      unary_args("pixel_shuffle", D::GradGrad,
                 [](const Tensor& x, const GoldenCase& c) { return kiln::pixel_shuffle(x, c.integer("r")); }),
      unary_args("pixel_unshuffle", D::GradGrad,
                 [](const Tensor& x, const GoldenCase& c) { return kiln::pixel_unshuffle(x, c.integer("r")); }),
      unary_args("unfold", D::GradGrad,
                 [](const Tensor& x, const GoldenCase& c) {
                   return nn::unfold(x, c.shape("kernel"), c.shape("dilation"), c.shape("padding"), c.shape("stride"));
                 }),
      unary_args("fold", D::GradGrad,
                 [](const Tensor& x, const GoldenCase& c) {
                   return nn::fold(x, c.shape("output"), c.shape("kernel"), c.shape("dilation"), c.shape("padding"),
                                   c.shape("stride"));
                 }),
      unary_args("interpolate", D::GradGrad, [](const Tensor& x, const GoldenCase& c) {
        nn::InterpolateOptions o;
        if (c.has("size")) o.size = c.ints("size");
        if (c.has("scale")) o.scale_factor.push_back(c.real("scale"));
        if (c.has("scale2")) o.scale_factor.push_back(c.real("scale2"));
        o.mode = c.str("mode");
        if (c.has("align_corners")) o.align_corners = c.flag("align_corners");
        if (c.has("recompute")) o.recompute_scale_factor = c.flag("recompute");
        return nn::interpolate(x, o);
      }),
      {"batch_norm", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         return TensorList{kiln::batch_norm(in.at(0), {}, {}, opt_input(in, 1), opt_input(in, 2), true, 0.1,
                                            c.real("eps", 1e-5))};
       }},
      {"batch_norm_eval", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         return TensorList{kiln::batch_norm(in.at(0), in.at(1), in.at(2), in.at(3), in.at(4), false, 0.1,
                                            c.real("eps", 1e-5))};
       }},
      // Training updates the running statistics in place: the output and both updated buffers.
      {"batch_norm_stats", D::None,
       [](const TensorList& in, const GoldenCase& c) {
         Tensor running_mean = in.at(1).clone(), running_var = in.at(2).clone();
         Tensor y = kiln::batch_norm(in.at(0), running_mean, running_var, in.at(3), in.at(4), true,
                                     c.real("momentum"));
         return TensorList{y, running_mean, running_var};
       }},
      // ---- sorting and running reductions (ops/sort.cpp) ----
      {"sort", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         auto [values, indices] = kiln::sort(in.at(0), c.integer("dim", -1), c.flag("descending"));
         return TensorList{values, indices};
       }},
      unary_args("argsort", D::None, [](const Tensor& x, const GoldenCase& c) {
        return kiln::argsort(x, c.integer("dim", -1), c.flag("descending"));
      }),
      {"topk", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         auto [values, indices] = kiln::topk(in.at(0), c.integer("k"), c.integer("dim", -1), c.flag("largest", true));
         return TensorList{values, indices};
       }},
      {"kthvalue", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         auto [values, indices] = kiln::kthvalue(in.at(0), c.integer("k"), c.integer("dim", -1), keepdim_arg(c));
         return TensorList{values, indices};
       }},
      {"median_dim", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         auto [values, indices] = kiln::median(in.at(0), c.integer("dim"), keepdim_arg(c));
         return TensorList{values, indices};
       }},
      unary("median_all", D::GradGrad, [](const Tensor& x) { return kiln::median(x); }),
      {"nanmedian_dim", D::None,
       [](const TensorList& in, const GoldenCase& c) {
         auto [values, indices] = kiln::nanmedian(in.at(0), c.integer("dim"), keepdim_arg(c));
         return TensorList{values, indices};
       }},
      unary_args("cumsum", D::GradGrad, [](const Tensor& x, const GoldenCase& c) {
        return kiln::cumsum(x, c.integer("dim"), c.opt_dtype("dtype"));
      }),
      unary_args("cumprod", D::GradGrad, [](const Tensor& x, const GoldenCase& c) {
        return kiln::cumprod(x, c.integer("dim"), c.opt_dtype("dtype"));
      }),
      {"cummax", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         auto [values, indices] = kiln::cummax(in.at(0), c.integer("dim"));
         return TensorList{values, indices};
       }},
      {"cummin", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         auto [values, indices] = kiln::cummin(in.at(0), c.integer("dim"));
         return TensorList{values, indices};
       }},
      {"einsum", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) { return TensorList{kiln::einsum(c.str("eq"), in)}; }},
      unary_args("logcumsumexp", D::Grad,
                 [](const Tensor& x, const GoldenCase& c) { return kiln::logcumsumexp(x, c.integer("dim")); }),
      // ---- searches and quantiles (ops/sort.cpp), selections (ops/select.cpp) ----
      unary("msort", D::GradGrad, [](const Tensor& x) { return kiln::msort(x); }),
      {"searchsorted", D::None,
       [](const TensorList& in, const GoldenCase& c) {
         return TensorList{
             kiln::searchsorted(in.at(0), in.at(1), c.flag("out_int32"), c.flag("right"), opt_input(in, 2))};
       }},
      unary_args("searchsorted_scalar", D::None,
                 [](const Tensor& x, const GoldenCase& c) {
                   return kiln::searchsorted(x, c.scalar("value"), false, c.flag("right"));
                 }),
      {"bucketize", D::None,
       [](const TensorList& in, const GoldenCase& c) {
         return TensorList{kiln::bucketize(in.at(0), in.at(1), c.flag("out_int32"), c.flag("right"))};
       }},
      {"quantile", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         const std::string mode = c.has("mode") ? c.str("mode") : "linear";
         if (in.size() > 1) return TensorList{kiln::quantile(in[0], in[1], c.opt_integer("dim"), keepdim_arg(c), mode)};
         return TensorList{kiln::quantile(in.at(0), c.real("q"), c.opt_integer("dim"), keepdim_arg(c), mode)};
       }},
      {"nanquantile", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         const std::string mode = c.has("mode") ? c.str("mode") : "linear";
         if (in.size() > 1) {
           return TensorList{kiln::nanquantile(in[0], in[1], c.opt_integer("dim"), keepdim_arg(c), mode)};
         }
         return TensorList{kiln::nanquantile(in.at(0), c.real("q"), c.opt_integer("dim"), keepdim_arg(c), mode)};
       }},
      unary("nonzero", D::None, [](const Tensor& x) { return kiln::nonzero(x); }),
      {"where_condition", D::None,
       [](const TensorList& in, const GoldenCase&) { return TensorList(kiln::where(in.at(0))); }},
      unary_args("count_nonzero", D::None,
                 [](const Tensor& x, const GoldenCase& c) { return kiln::count_nonzero(x, c.shape("dims", {})); }),
      {"masked_select", D::GradGrad,
       [](const TensorList& in, const GoldenCase&) { return TensorList{kiln::masked_select(in.at(0), in.at(1))}; }},
      {"masked_scatter", D::GradGrad,
       [](const TensorList& in, const GoldenCase&) {
         return TensorList{kiln::masked_scatter(in.at(0), in.at(1), in.at(2))};
       }},
      {"unique", D::None,
       [](const TensorList& in, const GoldenCase& c) {
         auto [values, inverse, counts] = kiln::unique(in.at(0), c.opt_integer("dim"));
         return TensorList{values, inverse, counts};
       }},
      {"unique_consecutive", D::None,
       [](const TensorList& in, const GoldenCase& c) {
         auto [values, inverse, counts] = kiln::unique_consecutive(in.at(0), c.opt_integer("dim"));
         return TensorList{values, inverse, counts};
       }},
      {"bincount", D::None,
       [](const TensorList& in, const GoldenCase& c) {
         return TensorList{kiln::bincount(in.at(0), opt_input(in, 1), c.integer("minlength", 0))};
       }},
      unary_args("histc", D::None, [](const Tensor& x, const GoldenCase& c) {
        return kiln::histc(x, c.integer("bins", 100), c.real("min", 0), c.real("max", 0));
      }),
      // ---- decompositions (ops/decompose.cpp): symmetric inputs made as gen_golden.py's spd() and sym() ----
      unary_args("cholesky_spd", D::GradGrad,
                 [](const Tensor& x, const GoldenCase& c) {
                   const Tensor a = matmul(x, x.mT()) + eye(x.size(-2), {}, x.options()) * 0.5;
                   return linalg::cholesky(a, c.flag("upper"));
                 }),
      {"solve_triangular", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         return TensorList{
             linalg::solve_triangular(in.at(0), in.at(1), c.flag("upper"), c.flag("left", true), c.flag("unit"))};
       }},
      {"cholesky_solve", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         return TensorList{kiln::cholesky_solve(in.at(0), in.at(1), c.flag("upper"))};
       }},
      {"eigh_sym", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         auto [w, v] = linalg::eigh(in.at(0) + in.at(0).mT(), c.has("uplo") ? c.str("uplo") : "L");
         // Each eigenvector's sign fixed as signed_eigh() in gen_golden.py: its largest |entry| positive.
         const Tensor top = v.gather(-2, argmax(v.abs(), -2, true));
         return TensorList{w, v * sign(top)};
       }},
      {"qr", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         auto [q, r] = linalg::qr(in.at(0), c.has("mode") ? c.str("mode") : "reduced");
         return TensorList{q, r};
       }},
      unary_args("eigvalsh", D::None,
                 [](const Tensor& x, const GoldenCase& c) {
                   return linalg::eigvalsh(x, c.has("uplo") ? c.str("uplo") : "L");
                 }),
      // ---- LU (ops/lu.cpp), the _ex forms, matrix_exp, multi_dot, vecdot, vander ----
      {"lu_factor_ex", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         auto [lu, pivots, info] = linalg::lu_factor_ex(in.at(0), c.flag("pivot", true));
         return TensorList{lu, pivots, info};
       }},
      {"lu", D::GradGrad,
       [](const TensorList& in, const GoldenCase&) {
         auto [p, l, u] = linalg::lu(in.at(0));
         return TensorList{p, l, u};
       }},
      {"lu_solve", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         return TensorList{linalg::lu_solve(in.at(0), in.at(1), in.at(2), c.flag("left", true), c.flag("adjoint"))};
       }},
      {"solve_ex", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         auto [x, info] = linalg::solve_ex(in.at(0), in.at(1), c.flag("left", true));
         return TensorList{x, info};
       }},
      {"inv_ex", D::GradGrad,
       [](const TensorList& in, const GoldenCase&) {
         auto [inverse, info] = linalg::inv_ex(in.at(0));
         return TensorList{inverse, info};
       }},
      {"cholesky_ex_spd", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         const Tensor a = matmul(in.at(0), in.at(0).mT()) + eye(in.at(0).size(-2), {}, in.at(0).options()) * 0.5;
         auto [l, info] = linalg::cholesky_ex(a, c.flag("upper"));
         return TensorList{l, info};
       }},
      unary("matrix_exp", D::GradGrad, [](const Tensor& x) { return linalg::matrix_exp(x); }),
      {"multi_dot", D::GradGrad, [](const TensorList& in, const GoldenCase&) { return TensorList{linalg::multi_dot(in)}; }},
      {"vecdot", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         return TensorList{linalg::vecdot(in.at(0), in.at(1), c.integer("dim", -1))};
       }},
      unary_args("vander", D::GradGrad,
                 [](const Tensor& x, const GoldenCase& c) { return linalg::vander(x, c.opt_integer("n")); }),
      binary("householder_product", D::GradGrad,
             [](const Tensor& a, const Tensor& tau) { return linalg::householder_product(a, tau); }),
      unary_args("tensorinv", D::GradGrad,
                 [](const Tensor& x, const GoldenCase& c) { return linalg::tensorinv(x, c.integer("ind", 2)); }),
      {"tensorsolve", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         std::optional<Shape> dims;
         if (c.has("dims")) dims = c.shape("dims");
         return TensorList{linalg::tensorsolve(in.at(0), in.at(1), dims)};
       }},
      unary_args("linalg_diagonal", D::GradGrad,
                 [](const Tensor& x, const GoldenCase& c) {
                   return linalg::diagonal(x, c.integer("offset", 0), c.integer("dim1", -2), c.integer("dim2", -1))
                       .contiguous();
                 }),
      // ---- the SVD and what is built on it (ops/svd.cpp) ----
      {"svd_signed", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         const bool full = c.flag("full");
         auto [u, s, vh] = linalg::svd(in.at(0), full);
         const int64_t k = s.size(-1);
         Tensor uk = u.narrow(-1, 0, k), vhk = vh.narrow(-2, 0, k);
         if (k > 0) {  // each pair's sign fixed as signed_svd() in gen_golden.py: U's largest |entry| positive
           const Tensor sg = sign(uk.gather(-2, argmax(uk.abs(), -2, true)));
           uk = uk * sg;
           vhk = vhk * sg.mT();
         }
         TensorList out{s, uk, vhk};
         if (full) {  // the complements of the first k vectors, through the extra ones
           const Tensor ue = u.narrow(-1, k, u.size(-1) - k), ve = vh.narrow(-2, k, vh.size(-2) - k);
           out.push_back(matmul(ue, ue.mT()));
           out.push_back(matmul(ve.mT(), ve));
         }
         return out;
       }},
      unary("svdvals", D::GradGrad, [](const Tensor& x) { return linalg::svdvals(x); }),
      unary_args("pinv", D::GradGrad,
                 [](const Tensor& x, const GoldenCase& c) {
                   return linalg::pinv(x, opt_real(c, "atol"), opt_real(c, "rtol"), c.flag("hermitian"));
                 }),
      unary_args("matrix_rank", D::None,
                 [](const Tensor& x, const GoldenCase& c) {
                   return linalg::matrix_rank(x, opt_real(c, "atol"), opt_real(c, "rtol"), c.flag("hermitian"));
                 }),
      {"lstsq", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         return TensorList{linalg::lstsq(in.at(0), in.at(1), opt_real(c, "rcond"), opt_str(c, "driver")).solution};
       }},
      {"lstsq_outputs", D::None,
       [](const TensorList& in, const GoldenCase& c) {
         auto r = linalg::lstsq(in.at(0), in.at(1), opt_real(c, "rcond"), opt_str(c, "driver"));
         return TensorList{r.solution, r.residuals, r.rank, r.singular_values};
       }},
      unary_args("matrix_norm", D::GradGrad,
                 [](const Tensor& x, const GoldenCase& c) {
                   const std::string ord = c.has("ord") ? c.str("ord") : "fro";
                   const Shape dims = c.shape("dims", Shape{0, 1});
                   if (ord == "fro" || ord == "nuc") return linalg::matrix_norm(x, ord, dims, keepdim_arg(c));
                   return linalg::matrix_norm(x, c.real("ord"), dims, keepdim_arg(c));
                 }),
      unary_args("cond", D::GradGrad,
                 [](const Tensor& x, const GoldenCase& c) {
                   if (!c.has("ord")) return linalg::cond(x);
                   const std::string ord = c.str("ord");
                   if (ord == "fro" || ord == "nuc") return linalg::cond(x, ord);
                   return linalg::cond(x, c.real("ord"));
                 }),

      // ---- trigonometric, hyperbolic, logarithmic and special functions ----
      unary("tan", D::GradGrad, [](const Tensor& x) { return kiln::tan(x); }),
      unary("asin", D::GradGrad, [](const Tensor& x) { return kiln::asin(x); }),
      unary("acos", D::GradGrad, [](const Tensor& x) { return kiln::acos(x); }),
      unary("atan", D::GradGrad, [](const Tensor& x) { return kiln::atan(x); }),
      unary("sinh", D::GradGrad, [](const Tensor& x) { return kiln::sinh(x); }),
      unary("cosh", D::GradGrad, [](const Tensor& x) { return kiln::cosh(x); }),
      unary("asinh", D::GradGrad, [](const Tensor& x) { return kiln::asinh(x); }),
      unary("acosh", D::GradGrad, [](const Tensor& x) { return kiln::acosh(x); }),
      unary("atanh", D::GradGrad, [](const Tensor& x) { return kiln::atanh(x); }),
      unary("log2", D::GradGrad, [](const Tensor& x) { return kiln::log2(x); }),
      unary("log10", D::GradGrad, [](const Tensor& x) { return kiln::log10(x); }),
      unary("exp2", D::GradGrad, [](const Tensor& x) { return kiln::exp2(x); }),
      unary("erfc", D::GradGrad, [](const Tensor& x) { return kiln::erfc(x); }),
      unary("erfinv", D::GradGrad, [](const Tensor& x) { return kiln::erfinv(x); }),
      unary("lgamma", D::GradGrad, [](const Tensor& x) { return kiln::lgamma(x); }),
      unary("digamma", D::GradGrad, [](const Tensor& x) { return kiln::digamma(x); }),
      unary_args("polygamma", D::GradGrad,
                 [](const Tensor& x, const GoldenCase& c) { return kiln::polygamma(c.integer("n"), x); }),
      unary("sinc", D::GradGrad, [](const Tensor& x) { return kiln::sinc(x); }),
      unary("deg2rad", D::GradGrad, [](const Tensor& x) { return kiln::deg2rad(x); }),
      unary("rad2deg", D::GradGrad, [](const Tensor& x) { return kiln::rad2deg(x); }),
      unary_args("logit", D::GradGrad,
                 [](const Tensor& x, const GoldenCase& c) {
                   const auto eps = c.opt_scalar("eps");
                   return kiln::logit(x, eps ? std::optional<double>(eps->to_double()) : std::nullopt);
                 }),
      unary_args("nan_to_num", D::GradGrad,
                 [](const Tensor& x, const GoldenCase& c) {
                   auto get = [&](const char* key) -> std::optional<double> {
                     const auto v = c.opt_scalar(key);
                     return v ? std::optional<double>(v->to_double()) : std::nullopt;
                   };
                   return kiln::nan_to_num(x, get("nan").value_or(0.0), get("posinf"), get("neginf"));
                 }),
      binary("atan2", D::GradGrad, [](const Tensor& a, const Tensor& b) { return kiln::atan2(a, b); }),
      binary("hypot", D::GradGrad, [](const Tensor& a, const Tensor& b) { return kiln::hypot(a, b); }),
      binary("logaddexp", D::GradGrad, [](const Tensor& a, const Tensor& b) { return kiln::logaddexp(a, b); }),
      binary("logaddexp2", D::GradGrad, [](const Tensor& a, const Tensor& b) { return kiln::logaddexp2(a, b); }),
      binary("copysign", D::GradGrad, [](const Tensor& a, const Tensor& b) { return kiln::copysign(a, b); }),
      binary("xlogy", D::GradGrad, [](const Tensor& a, const Tensor& b) { return kiln::xlogy(a, b); }),
      // torch.special's (the zeta and incomplete gamma grad cases give their first input as int64: no
      // gradient there, in PyTorch or Kiln)
      unary("i0", D::GradGrad, [](const Tensor& x) { return kiln::special::i0(x); }),
      unary("i0e", D::GradGrad, [](const Tensor& x) { return kiln::special::i0e(x); }),
      unary("i1", D::GradGrad, [](const Tensor& x) { return kiln::special::i1(x); }),
      unary("i1e", D::GradGrad, [](const Tensor& x) { return kiln::special::i1e(x); }),
      unary("erfcx", D::GradGrad, [](const Tensor& x) { return kiln::special::erfcx(x); }),
      unary("ndtr", D::GradGrad, [](const Tensor& x) { return kiln::special::ndtr(x); }),
      unary("log_ndtr", D::GradGrad, [](const Tensor& x) { return kiln::special::log_ndtr(x); }),
      unary("ndtri", D::GradGrad, [](const Tensor& x) { return kiln::special::ndtri(x); }),
      unary("entr", D::GradGrad, [](const Tensor& x) { return kiln::special::entr(x); }),
      binary("xlog1py", D::GradGrad, [](const Tensor& a, const Tensor& b) { return kiln::special::xlog1py(a, b); }),
      binary("zeta", D::GradGrad, [](const Tensor& a, const Tensor& b) { return kiln::special::zeta(a, b); }),
      binary("gammainc", D::GradGrad, [](const Tensor& a, const Tensor& b) { return kiln::special::gammainc(a, b); }),
      binary("gammaincc", D::GradGrad, [](const Tensor& a, const Tensor& b) { return kiln::special::gammaincc(a, b); }),
      unary("bessel_j0", D::GradGrad, [](const Tensor& x) { return kiln::special::bessel_j0(x); }),
      unary("bessel_j1", D::GradGrad, [](const Tensor& x) { return kiln::special::bessel_j1(x); }),
      unary("bessel_y0", D::GradGrad, [](const Tensor& x) { return kiln::special::bessel_y0(x); }),
      unary("bessel_y1", D::GradGrad, [](const Tensor& x) { return kiln::special::bessel_y1(x); }),
      unary("modified_bessel_k0", D::GradGrad, [](const Tensor& x) { return kiln::special::modified_bessel_k0(x); }),
      unary("modified_bessel_k1", D::GradGrad, [](const Tensor& x) { return kiln::special::modified_bessel_k1(x); }),
      unary("scaled_modified_bessel_k0", D::GradGrad,
            [](const Tensor& x) { return kiln::special::scaled_modified_bessel_k0(x); }),
      unary("scaled_modified_bessel_k1", D::GradGrad,
            [](const Tensor& x) { return kiln::special::scaled_modified_bessel_k1(x); }),
      unary("spherical_bessel_j0", D::GradGrad, [](const Tensor& x) { return kiln::special::spherical_bessel_j0(x); }),
      unary("airy_ai", D::GradGrad, [](const Tensor& x) { return kiln::special::airy_ai(x); }),
      polynomial("chebyshev_polynomial_t", kiln::special::chebyshev_polynomial_t,
                 kiln::special::chebyshev_polynomial_t),
      polynomial("chebyshev_polynomial_u", kiln::special::chebyshev_polynomial_u,
                 kiln::special::chebyshev_polynomial_u),
      polynomial("chebyshev_polynomial_v", kiln::special::chebyshev_polynomial_v,
                 kiln::special::chebyshev_polynomial_v),
      polynomial("chebyshev_polynomial_w", kiln::special::chebyshev_polynomial_w,
                 kiln::special::chebyshev_polynomial_w),
      polynomial("shifted_chebyshev_polynomial_t", kiln::special::shifted_chebyshev_polynomial_t,
                 kiln::special::shifted_chebyshev_polynomial_t),
      polynomial("shifted_chebyshev_polynomial_u", kiln::special::shifted_chebyshev_polynomial_u,
                 kiln::special::shifted_chebyshev_polynomial_u),
      polynomial("shifted_chebyshev_polynomial_v", kiln::special::shifted_chebyshev_polynomial_v,
                 kiln::special::shifted_chebyshev_polynomial_v),
      polynomial("shifted_chebyshev_polynomial_w", kiln::special::shifted_chebyshev_polynomial_w,
                 kiln::special::shifted_chebyshev_polynomial_w),
      polynomial("hermite_polynomial_h", kiln::special::hermite_polynomial_h, kiln::special::hermite_polynomial_h),
      polynomial("hermite_polynomial_he", kiln::special::hermite_polynomial_he, kiln::special::hermite_polynomial_he),
      polynomial("laguerre_polynomial_l", kiln::special::laguerre_polynomial_l, kiln::special::laguerre_polynomial_l),
      polynomial("legendre_polynomial_p", kiln::special::legendre_polynomial_p, kiln::special::legendre_polynomial_p),
      unary_args("multigammaln", D::GradGrad,
                 [](const Tensor& x, const GoldenCase& c) { return kiln::special::multigammaln(x, c.integer("p")); }),
      {"isclose", D::None,
       [](const TensorList& in, const GoldenCase& c) {
         return TensorList{kiln::isclose(in.at(0), in.at(1), c.scalar("rtol", Scalar(1e-5)).to_double(),
                                         c.scalar("atol", Scalar(1e-8)).to_double(), c.flag("equal_nan"))};
       }},

      // ---- diagonals, products and arrangements ----
      view_op("diagonal",
              [](const Tensor& x, const GoldenCase& c) {
                return kiln::diagonal(x, c.integer("offset", 0), c.integer("dim1", 0), c.integer("dim2", 1));
              }),
      unary_args("diag_embed", D::GradGrad,
                 [](const Tensor& x, const GoldenCase& c) {
                   return kiln::diag_embed(x, c.integer("offset", 0), c.integer("dim1", -2), c.integer("dim2", -1));
                 }),
      unary_args("diag", D::GradGrad, [](const Tensor& x, const GoldenCase& c) { return kiln::diag(x, c.integer("k", 0)); }),
      unary("trace", D::GradGrad, [](const Tensor& x) { return kiln::trace(x); }),
      binary("outer", D::GradGrad, [](const Tensor& a, const Tensor& b) { return kiln::outer(a, b); }),
      binary("dot", D::GradGrad, [](const Tensor& a, const Tensor& b) { return kiln::dot(a, b); }),
      binary("inner", D::GradGrad, [](const Tensor& a, const Tensor& b) { return kiln::inner(a, b); }),
      binary("mv", D::GradGrad, [](const Tensor& a, const Tensor& b) { return kiln::mv(a, b); }),
      scaled_product("addmv", kiln::addmv),
      scaled_product("addr", kiln::addr),
      scaled_product("baddbmm", kiln::baddbmm),
      {"tensordot", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         if (c.has("n")) return TensorList{kiln::tensordot(in.at(0), in.at(1), c.integer("n"))};
         return TensorList{kiln::tensordot(in.at(0), in.at(1), c.shape("dims_a"), c.shape("dims_b"))};
       }},
      binary("kron", D::GradGrad, [](const Tensor& a, const Tensor& b) { return kiln::kron(a, b); }),
      {"cross", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         return TensorList{linalg::cross(in.at(0), in.at(1), c.integer("dim", -1))};
       }},
      unary_args("matrix_power", D::GradGrad,
                 [](const Tensor& x, const GoldenCase& c) { return linalg::matrix_power(x, c.integer("n")); }),
      {"cdist", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         return TensorList{kiln::cdist(in.at(0), in.at(1), c.scalar("p", Scalar(2.0)).to_double())};
       }},
      unary_args("roll", D::GradGrad,
                 [](const Tensor& x, const GoldenCase& c) { return kiln::roll(x, c.shape("shifts"), c.shape("dims", {})); }),
      unary_args("tile", D::GradGrad, [](const Tensor& x, const GoldenCase& c) { return kiln::tile(x, c.shape("reps")); }),
      unary_args("repeat_interleave", D::GradGrad,
                 [](const Tensor& x, const GoldenCase& c) {
                   return kiln::repeat_interleave(x, c.integer("repeats"), c.opt_integer("dim"));
                 }),
      {"repeat_interleave_tensor", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         return TensorList{kiln::repeat_interleave(in.at(0), in.at(1), c.opt_integer("dim"))};
       }},
      view_op("movedim",
              [](const Tensor& x, const GoldenCase& c) { return kiln::movedim(x, c.shape("src"), c.shape("dst")); }),
      unary_args("rot90", D::GradGrad,
                 [](const Tensor& x, const GoldenCase& c) {
                   return kiln::rot90(x, c.integer("k"), c.shape("dims", Shape{0, 1}));
                 }),
      unary("fliplr", D::GradGrad, [](const Tensor& x) { return kiln::fliplr(x); }),
      unary("flipud", D::GradGrad, [](const Tensor& x) { return kiln::flipud(x); }),
      {"meshgrid", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         TensorList out;
         for (const Tensor& t : kiln::meshgrid(in, c.str("indexing"))) out.push_back(t.contiguous());
         return out;
       }},
      {"cartesian_prod", D::GradGrad,
       [](const TensorList& in, const GoldenCase&) { return TensorList{kiln::cartesian_prod(in)}; }},
      {"take_along_dim", D::GradGrad,
       [](const TensorList& in, const GoldenCase& c) {
         return TensorList{kiln::take_along_dim(in.at(0), in.at(1), c.opt_integer("dim"))};
       }},
      {"tril_indices", D::None,
       [](const TensorList&, const GoldenCase& c) {
         return TensorList{kiln::tril_indices(c.integer("row"), c.integer("col"), c.integer("offset", 0))};
       }},
      {"triu_indices", D::None,
       [](const TensorList&, const GoldenCase& c) {
         return TensorList{kiln::triu_indices(c.integer("row"), c.integer("col"), c.integer("offset", 0))};
       }},
  };
  return rows;
}

void check_outputs(const TensorList& outs, const GoldenCase& c, std::optional<Device> device) {
  REQUIRE(outs.size() == c.outputs.size());
  for (size_t k = 0; k < outs.size(); ++k) {
    Tensor expected = GoldenFile::get().output(c, k);
    INFO("output " << k << ": actual " << dtype_name(outs[k].dtype()) << " " << outs[k].sizes().str() << " on "
                   << outs[k].device().str() << ", expected " << dtype_name(expected.dtype()) << " "
                   << expected.sizes().str());
    if (device) CHECK(outs[k].device() == *device);
    CHECK(dtype_name(outs[k].dtype()) == dtype_name(expected.dtype()));
    CHECK(outs[k].sizes() == expected.sizes());
    if (outs[k].sizes() != expected.sizes()) continue;
    // DESIGN's tolerance of the expected dtype (so a result in a wrong dtype is still judged fairly).
    Tolerance tol = is_floating(expected.dtype()) ? tolerance_for(expected.dtype()) : Tolerance{0, 0};
    check_close(outs[k].cpu(), expected, tol);
  }
}

std::vector<const GoldenCase*> cases_of(const std::string& op) {
  std::vector<const GoldenCase*> out;
  for (const auto& c : GoldenFile::get().cases())
    if (c.op == op) out.push_back(&c);
  return out;
}

}  // namespace kiln::test
