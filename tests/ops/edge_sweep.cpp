// tests/ops/edge_sweep.cpp: the inputs and ops of the edge sweep (tests/ops/edge_sweep.h).
#include "ops/edge_sweep.h"

#include <cmath>
#include <limits>

#include "nn/functional.h"
#include "support.h"

namespace kiln::test {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
}  // namespace

std::vector<EdgeInput> edge_inputs() {
  return {
      {"f32[2,3]", [] { return test::sample({2, 3}); }},
      {"f32[]", [] { return scalar_tensor(1.5); }},
      {"f32[0]", [] { return zeros({0}); }},
      {"f32[3,0]", [] { return zeros({3, 0}); }},
      {"f32[0,4]", [] { return zeros({0, 4}); }},
      // No elements, and a dim of 2^62: sizes, strides and offsets that multiply past 2^63 if an op
      // computes them before it sees there is nothing to compute.
      {"f32[0,2^62]", [] { return zeros({0, int64_t{1} << 62}); }},
      {"f32[2^62,0] view", [] { return zeros({0, int64_t{1} << 62}).t(); }},
      {"f32[2,3]^T", [] { return test::sample({2, 3}).t(); }},
      {"f32[4,3] expanded", [] { return test::sample({1, 3}).expand({4, 3}); }},
      {"f32[1]", [] { return ones({1}); }},
      {"f32[2,3,4,5]", [] { return test::sample({2, 3, 4, 5}); }},
      {"f32[2,3,4]", [] { return test::sample({2, 3, 4}); }},
      {"f32 nan inf", [] { return tensor({NAN, kInf, -kInf, 0.0, -0.0}); }},
      {"f64[2,3]", [] { return test::sample({2, 3}, kFloat64); }},
      {"f16[2,3]", [] { return test::sample({2, 3}).to(kFloat16); }},
      {"bf16[2,3]", [] { return test::sample({2, 3}).to(kBFloat16); }},
      {"i64[2,3]", [] { return tensor({{0, 1, 2}, {2, 1, 0}}, kInt64); }},
      {"i64 out of range", [] { return tensor({{-7, 1, 9}, {2, 100000, 0}}, kInt64); }},
      {"i64[]", [] { return scalar_tensor(1, kInt64); }},
      {"i32[2,3]", [] { return tensor({{0, 1, 2}, {2, 1, 0}}, kInt32); }},
      {"u8[2,3]", [] { return tensor({{0, 1, 255}, {2, 1, 0}}, kUInt8); }},
      {"i8[2,3]", [] { return tensor({{0, -1, 127}, {-128, 1, 0}}, kInt8); }},
      {"bool[2,3]", [] { return tensor({{0, 1, 1}, {0, 0, 0}}, kBool); }},
      {"i64[0]", [] { return zeros({0}, kInt64); }},
      {"i64 extremes", [] { return from_vector<int64_t>({std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()}); }},
      {"undefined", [] { return Tensor(); }},
  };
}

std::vector<EdgeOp> edge_ops() {
  std::vector<EdgeOp> v;
  const auto u = [&](std::string n, std::function<Tensor(const Tensor&)> f) {
    v.push_back({std::move(n), false, [f](const Tensor& a, const Tensor&) { return f(a); }});
  };
  using Call = std::function<Tensor(const Tensor&, const Tensor&)>;
  const auto b = [&](std::string n, Call f) { v.push_back({std::move(n), true, std::move(f)}); };
  const auto ud = [&](const std::string& n, std::function<Tensor(const Tensor&, int64_t)> f) {
    for (int64_t d : {-5, -1, 0, 1, 3})
      v.push_back({n + "@" + std::to_string(d), false, [f, d](const Tensor& a, const Tensor&) { return f(a, d); }});
  };
  const auto bd = [&](const std::string& n, std::function<Tensor(const Tensor&, const Tensor&, int64_t)> f) {
    for (int64_t d : {-5, -1, 0, 1})
      v.push_back({n + "@" + std::to_string(d), true, [f, d](const Tensor& a, const Tensor& c) { return f(a, c, d); }});
  };
  // elementwise
  u("neg", [](const Tensor& a) { return neg(a); });
  u("linalg::inv", [](const Tensor& a) { return linalg::inv(a); });
  u("linalg::det", [](const Tensor& a) { return linalg::det(a); });
  u("linalg::slogdet", [](const Tensor& a) { return std::get<1>(linalg::slogdet(a)); });
  u("abs", [](const Tensor& a) { return abs(a); });
  u("sign", [](const Tensor& a) { return sign(a); });
  u("exp", [](const Tensor& a) { return exp(a); });
  u("log1p", [](const Tensor& a) { return log1p(a); });
  u("rsqrt", [](const Tensor& a) { return rsqrt(a); });
  u("reciprocal", [](const Tensor& a) { return reciprocal(a); });
  u("sigmoid", [](const Tensor& a) { return sigmoid(a); });
  u("relu", [](const Tensor& a) { return relu(a); });
  u("gelu", [](const Tensor& a) { return gelu(a); });
  u("gelu tanh", [](const Tensor& a) { return gelu(a, "tanh"); });
  u("gelu fast", [](const Tensor& a) { return gelu(a, "fast"); });
  u("silu", [](const Tensor& a) { return silu(a); });
  u("erf", [](const Tensor& a) { return erf(a); });
  u("tan", [](const Tensor& a) { return tan(a); });
  u("acosh", [](const Tensor& a) { return acosh(a); });
  u("log10", [](const Tensor& a) { return log10(a); });
  u("erfinv", [](const Tensor& a) { return erfinv(a); });
  u("lgamma", [](const Tensor& a) { return lgamma(a); });
  u("digamma", [](const Tensor& a) { return digamma(a); });
  u("polygamma 3", [](const Tensor& a) { return polygamma(3, a); });
  u("special::i0", [](const Tensor& a) { return special::i0(a); });
  u("special::i1e", [](const Tensor& a) { return special::i1e(a); });
  u("special::erfcx", [](const Tensor& a) { return special::erfcx(a); });
  u("special::log_ndtr", [](const Tensor& a) { return special::log_ndtr(a); });
  u("special::ndtri", [](const Tensor& a) { return special::ndtri(a); });
  u("special::entr", [](const Tensor& a) { return special::entr(a); });
  u("special::multigammaln 2", [](const Tensor& a) { return special::multigammaln(a, 2); });
  u("special::bessel_j1", [](const Tensor& a) { return special::bessel_j1(a); });
  u("special::bessel_y0", [](const Tensor& a) { return special::bessel_y0(a); });
  u("special::modified_bessel_k1", [](const Tensor& a) { return special::modified_bessel_k1(a); });
  u("special::scaled_modified_bessel_k0", [](const Tensor& a) { return special::scaled_modified_bessel_k0(a); });
  u("special::spherical_bessel_j0", [](const Tensor& a) { return special::spherical_bessel_j0(a); });
  u("special::airy_ai", [](const Tensor& a) { return special::airy_ai(a); });
  u("sinc", [](const Tensor& a) { return sinc(a); });
  u("logit eps", [](const Tensor& a) { return logit(a, 0.1); });
  u("nan_to_num", [](const Tensor& a) { return nan_to_num(a); });
  u("diagonal", [](const Tensor& a) { return diagonal(a, 1, 0, -1); });
  u("diag_embed", [](const Tensor& a) { return diag_embed(a, -1); });
  u("diag", [](const Tensor& a) { return diag(a, 1); });
  u("trace", [](const Tensor& a) { return trace(a); });
  u("matrix_power -2", [](const Tensor& a) { return linalg::matrix_power(a, -2); });
  u("roll", [](const Tensor& a) { return roll(a, {3}); });
  u("roll dims", [](const Tensor& a) { return roll(a, {1, -1}, {0, -1}); });
  u("tile", [](const Tensor& a) { return tile(a, {2, 1}); });
  u("repeat_interleave", [](const Tensor& a) { return repeat_interleave(a, 2, 0); });
  u("repeat_interleave counts", [](const Tensor& a) { return repeat_interleave(a); });
  u("movedim", [](const Tensor& a) { return movedim(a, 0, -1); });
  u("rot90", [](const Tensor& a) { return rot90(a, 3); });
  u("fliplr", [](const Tensor& a) { return fliplr(a); });
  u("meshgrid", [](const Tensor& a) { return meshgrid({a, a}, "xy")[0]; });
  u("pow -1", [](const Tensor& a) { return pow(a, -1); });
  u("pow 0.5", [](const Tensor& a) { return pow(a, 0.5); });
  u("clamp", [](const Tensor& a) { return clamp(a, -0.5, 0.5); });
  u("clamp none", [](const Tensor& a) { return clamp(a, std::nullopt, std::nullopt); });
  u("clamp min > max", [](const Tensor& a) { return clamp(a, 1, -1); });
  u("round", [](const Tensor& a) { return round(a); });
  u("bitwise_not", [](const Tensor& a) { return bitwise_not(a); });
  u("isnan", [](const Tensor& a) { return isnan(a); });
  u("logical_not", [](const Tensor& a) { return logical_not(a); });
  u("div by 0", [](const Tensor& a) { return div(a, 0); });
  u("rdiv", [](const Tensor& a) { return rdiv(1, a); });
  u("remainder by 0", [](const Tensor& a) { return remainder(a, 0); });
  u("fmod by 0", [](const Tensor& a) { return fmod(a, 0); });
  u("floor_divide by 0", [](const Tensor& a) { return floor_divide(a, 0); });
  u("bitwise_and 3", [](const Tensor& a) { return bitwise_and(a, 3); });
  u("leaky_relu", [](const Tensor& a) { return nn::leaky_relu(a); });
  u("hardtanh min > max", [](const Tensor& a) { return nn::hardtanh(a, 1, -1); });
  u("softplus beta 0", [](const Tensor& a) { return nn::softplus(a, 0.0); });
  u("relu6", [](const Tensor& a) { return nn::relu6(a); });
  u("selu", [](const Tensor& a) { return nn::selu(a); });
  u("celu alpha 0", [](const Tensor& a) { return nn::celu(a, 0.0); });
  u("mish", [](const Tensor& a) { return nn::mish(a); });
  u("hardswish", [](const Tensor& a) { return nn::hardswish(a); });
  u("hardsigmoid", [](const Tensor& a) { return nn::hardsigmoid(a); });
  u("softsign", [](const Tensor& a) { return nn::softsign(a); });
  u("tanhshrink", [](const Tensor& a) { return nn::tanhshrink(a); });
  u("threshold", [](const Tensor& a) { return nn::threshold(a, 0.5, -1); });
  u("logsigmoid", [](const Tensor& a) { return nn::logsigmoid(a); });
  u("hardshrink", [](const Tensor& a) { return nn::hardshrink(a); });
  u("softshrink -1", [](const Tensor& a) { return nn::softshrink(a, -1); });
  u("glu", [](const Tensor& a) { return nn::glu(a); });
  u("softmin", [](const Tensor& a) { return nn::softmin(a, 0); });
  u("rrelu", [](const Tensor& a) { return nn::rrelu(a); });
  u("rrelu train", [](const Tensor& a) { return nn::rrelu(a, 0.1, 0.3, true); });
  u("dropout2d train", [](const Tensor& a) { return nn::dropout2d(a, 0.5); });
  u("dropout1d 1", [](const Tensor& a) { return nn::dropout1d(a, 1.0); });
  u("dropout3d eval", [](const Tensor& a) { return nn::dropout3d(a, 0.5, false); });
  u("alpha_dropout train", [](const Tensor& a) { return nn::alpha_dropout(a, 0.3, true); });
  u("feature_alpha_dropout train", [](const Tensor& a) { return nn::feature_alpha_dropout(a, 0.5, true); });
  u("alpha_dropout 1", [](const Tensor& a) { return nn::alpha_dropout(a, 1.0, true); });
  u("normalize", [](const Tensor& a) { return nn::normalize(a, {.p = 3, .dim = -1}); });
  u("channel_shuffle", [](const Tensor& a) { return nn::channel_shuffle(a, 2); });
  u("local_response_norm", [](const Tensor& a) { return nn::local_response_norm(a, 3, 0.5); });
  // reductions
  u("sum", [](const Tensor& a) { return sum(a); });
  u("mean", [](const Tensor& a) { return mean(a); });
  u("prod", [](const Tensor& a) { return prod(a); });
  u("max", [](const Tensor& a) { return max(a); });
  u("argmax", [](const Tensor& a) { return argmax(a); });
  u("var", [](const Tensor& a) { return var(a); });
  u("var correction 5", [](const Tensor& a) { return var(a, {}, 5); });
  u("norm 1", [](const Tensor& a) { return norm(a, 1); });
  u("norm inf", [](const Tensor& a) { return norm(a, kInf); });
  u("norm 0", [](const Tensor& a) { return norm(a, 0); });
  u("all", [](const Tensor& a) { return all(a); });
  ud("sum", [](const Tensor& a, int64_t d) { return sum(a, {d}); });
  ud("sum twice", [](const Tensor& a, int64_t d) { return sum(a, {d, d}); });
  ud("mean keepdim", [](const Tensor& a, int64_t d) { return mean(a, {d}, true); });
  ud("prod", [](const Tensor& a, int64_t d) { return prod(a, d); });
  // sorting and running reductions
  ud("sort", [](const Tensor& a, int64_t d) { return std::get<0>(sort(a, d)); });
  ud("sort descending indices", [](const Tensor& a, int64_t d) { return std::get<1>(sort(a, d, true)); });
  ud("argsort", [](const Tensor& a, int64_t d) { return argsort(a, d); });
  ud("topk 2", [](const Tensor& a, int64_t d) { return std::get<0>(topk(a, 2, d)); });
  ud("kthvalue 1", [](const Tensor& a, int64_t d) { return std::get<1>(kthvalue(a, 1, d)); });
  ud("median", [](const Tensor& a, int64_t d) { return std::get<0>(median(a, d)); });
  ud("nanmedian", [](const Tensor& a, int64_t d) { return std::get<0>(nanmedian(a, d)); });
  ud("cumsum", [](const Tensor& a, int64_t d) { return cumsum(a, d); });
  ud("cumprod", [](const Tensor& a, int64_t d) { return cumprod(a, d); });
  ud("cummax", [](const Tensor& a, int64_t d) { return std::get<1>(cummax(a, d)); });
  ud("cummin", [](const Tensor& a, int64_t d) { return std::get<0>(cummin(a, d)); });
  ud("logcumsumexp", [](const Tensor& a, int64_t d) { return logcumsumexp(a, d); });
  u("median of all", [](const Tensor& a) { return median(a); });
  // searches, quantiles and selections (ops/sort.cpp, ops/select.cpp)
  u("msort", [](const Tensor& a) { return msort(a); });
  ud("quantile", [](const Tensor& a, int64_t d) { return quantile(a, 0.3, d); });
  ud("nanquantile nearest keepdim", [](const Tensor& a, int64_t d) { return nanquantile(a, 0.5, d, true, "nearest"); });
  u("quantile of all", [](const Tensor& a) { return quantile(a, 0.75); });
  u("nonzero", [](const Tensor& a) { return nonzero(a); });
  u("linalg::cholesky", [](const Tensor& a) { return linalg::cholesky(a); });
  u("linalg::eigh", [](const Tensor& a) { return std::get<1>(linalg::eigh(a)); });
  u("linalg::eigvalsh, U", [](const Tensor& a) { return linalg::eigvalsh(a, "U"); });
  u("linalg::qr", [](const Tensor& a) { return std::get<0>(linalg::qr(a)); });
  u("linalg::qr, complete", [](const Tensor& a) { return std::get<1>(linalg::qr(a, "complete")); });
  u("linalg::lu", [](const Tensor& a) { return std::get<1>(linalg::lu(a)); });
  u("linalg::lu_factor_ex", [](const Tensor& a) { return std::get<0>(linalg::lu_factor_ex(a)); });
  u("linalg::inv_ex", [](const Tensor& a) { return std::get<0>(linalg::inv_ex(a)); });
  u("linalg::cholesky_ex", [](const Tensor& a) { return std::get<0>(linalg::cholesky_ex(a)); });
  u("linalg::matrix_exp", [](const Tensor& a) { return linalg::matrix_exp(a); });
  u("linalg::vander", [](const Tensor& a) { return linalg::vander(a, 3); });
  u("linalg::tensorinv", [](const Tensor& a) { return linalg::tensorinv(a, 1); });
  u("linalg::diagonal", [](const Tensor& a) { return linalg::diagonal(a, 1); });
  u("linalg::svd", [](const Tensor& a) { return std::get<0>(linalg::svd(a)); });
  u("linalg::svd, reduced", [](const Tensor& a) { return std::get<2>(linalg::svd(a, false)); });
  u("linalg::svdvals", [](const Tensor& a) { return linalg::svdvals(a); });
  u("linalg::pinv", [](const Tensor& a) { return linalg::pinv(a); });
  u("linalg::pinv, hermitian", [](const Tensor& a) { return linalg::pinv(a, {}, {}, true); });
  u("linalg::matrix_rank", [](const Tensor& a) { return linalg::matrix_rank(a); });
  u("linalg::matrix_norm nuc", [](const Tensor& a) { return linalg::matrix_norm(a, "nuc"); });
  u("linalg::matrix_norm inf", [](const Tensor& a) { return linalg::matrix_norm(a, INFINITY); });
  u("linalg::norm", [](const Tensor& a) { return linalg::norm(a); });
  u("linalg::cond", [](const Tensor& a) { return linalg::cond(a); });
  u("linalg::cond 1", [](const Tensor& a) { return linalg::cond(a, 1); });
  u("where(condition)", [](const Tensor& a) { return where(a.ne(0)).at(0); });
  ud("count_nonzero", [](const Tensor& a, int64_t d) { return count_nonzero(a, {d}); });
  u("unique", [](const Tensor& a) { return std::get<0>(unique(a)); });
  ud("unique along dim", [](const Tensor& a, int64_t d) { return std::get<1>(unique(a, d)); });
  ud("unique_consecutive along dim", [](const Tensor& a, int64_t d) { return std::get<2>(unique_consecutive(a, d)); });
  u("bincount", [](const Tensor& a) { return bincount(a); });
  u("histc", [](const Tensor& a) { return histc(a, 7); });
  u("einsum ii", [](const Tensor& a) { return einsum("ii", {a}); });
  u("einsum ...ij->...ji", [](const Tensor& a) { return einsum("...ij->...ji", {a}); });
  ud("amax", [](const Tensor& a, int64_t d) { return amax(a, {d}); });
  ud("max values", [](const Tensor& a, int64_t d) { return std::get<0>(max(a, d)); });
  ud("min indices", [](const Tensor& a, int64_t d) { return std::get<1>(min(a, d, true)); });
  ud("argmin", [](const Tensor& a, int64_t d) { return argmin(a, d); });
  ud("var", [](const Tensor& a, int64_t d) { return var(a, {d}); });
  ud("norm 3", [](const Tensor& a, int64_t d) { return norm(a, 3, {d}); });
  ud("logsumexp", [](const Tensor& a, int64_t d) { return logsumexp(a, {d}); });
  ud("any", [](const Tensor& a, int64_t d) { return any(a, d); });
  ud("softmax", [](const Tensor& a, int64_t d) { return softmax(a, d); });
  ud("log_softmax", [](const Tensor& a, int64_t d) { return log_softmax(a, d); });
  // views and shapes
  u("contiguous", [](const Tensor& a) { return contiguous(a); });
  u("detach", [](const Tensor& a) { return detach(a); });
  u("to float16", [](const Tensor& a) { return a.to(kFloat16); });
  u("to int8", [](const Tensor& a) { return a.to(kInt8); });
  u("view -1", [](const Tensor& a) { return view(a, {-1}); });
  u("view -1 -1", [](const Tensor& a) { return view(a, {-1, -1}); });
  u("view 0 -1", [](const Tensor& a) { return view(a, {0, -1}); });
  u("reshape 3 -1", [](const Tensor& a) { return reshape(a, {3, -1}); });
  u("reshape -2", [](const Tensor& a) { return reshape(a, {-2, 3}); });
  u("reshape 2^62", [](const Tensor& a) { return reshape(a, {int64_t{1} << 62, 4}); });
  u("permute 1 0", [](const Tensor& a) { return permute(a, {1, 0}); });
  u("permute 0 0", [](const Tensor& a) { return permute(a, {0, 0}); });
  u("expand", [](const Tensor& a) { return expand(a, {5, 2, 3}); });
  u("expand 2^40", [](const Tensor& a) { return expand(a, {int64_t{1} << 40, int64_t{1} << 40, 3}); });
  u("flatten 1 0", [](const Tensor& a) { return flatten(a, 1, 0); });
  u("unflatten -1 -1", [](const Tensor& a) { return unflatten(a, 0, {-1, -1}); });
  u("as_strided past the end", [](const Tensor& a) { return as_strided(a, {2, 2}, {100, 1}, 0); });
  u("as_strided negative stride", [](const Tensor& a) { return as_strided(a, {2, 2}, {-1, 1}, 0); });
  u("as_strided negative offset", [](const Tensor& a) { return as_strided(a, {1}, {1}, -3); });
  u("narrow past the end", [](const Tensor& a) { return narrow(a, 0, 1, 5); });
  u("narrow negative length", [](const Tensor& a) { return narrow(a, 0, 0, -1); });
  u("slice step 0", [](const Tensor& a) { return slice(a, 0, 0, 2, 0); });
  u("slice wide", [](const Tensor& a) { return slice(a, 0, -100, 100); });
  u("select 100", [](const Tensor& a) { return select(a, 0, 100); });
  u("flip 0 0", [](const Tensor& a) { return flip(a, {0, 0}); });
  u("repeat 0 2", [](const Tensor& a) { return repeat(a, {0, 2}); });
  u("repeat -1 2", [](const Tensor& a) { return repeat(a, {-1, 2}); });
  u("pad negative", [](const Tensor& a) { return pad(a, {-5, -5}); });
  u("pad odd", [](const Tensor& a) { return pad(a, {1}); });
  u("pad 5 dims", [](const Tensor& a) { return pad(a, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1}); });
  u("pad reflect 1", [](const Tensor& a) { return pad(a, {1, 1}, "reflect"); });
  u("pad reflect 2 dims", [](const Tensor& a) { return pad(a, {1, 1, 1, 0}, "reflect"); });
  u("pad replicate 2^62", [](const Tensor& a) { return pad(a, {int64_t{1} << 62, 1}, "replicate"); });
  u("pad replicate int64 max", [](const Tensor& a) {
    return pad(a, {std::numeric_limits<int64_t>::max(), 1}, "replicate");
  });
  u("pad circular crop", [](const Tensor& a) { return pad(a, {2, -1}, "circular"); });
  u("pixel_shuffle 2", [](const Tensor& a) { return pixel_shuffle(a, 2); });
  u("pixel_unshuffle 1", [](const Tensor& a) { return pixel_unshuffle(a, 1); });
  u("tril -100", [](const Tensor& a) { return tril(a, -100); });
  u("chunk 5", [](const Tensor& a) { return chunk(a, 5).back(); });
  u("split sizes -1", [](const Tensor& a) { return split_with_sizes(a, {1, -1, 3})[0]; });
  u("cat none", [](const Tensor&) { return cat({}, 0); });
  u("one_hot", [](const Tensor& a) { return one_hot(a); });
  u("one_hot 2", [](const Tensor& a) { return one_hot(a, 2); });
  ud("transpose", [](const Tensor& a, int64_t d) { return transpose(a, 0, d); });
  ud("unsqueeze", [](const Tensor& a, int64_t d) { return unsqueeze(a, d); });
  ud("squeeze", [](const Tensor& a, int64_t d) { return squeeze(a, d); });
  ud("select", [](const Tensor& a, int64_t d) { return select(a, d, 0); });
  ud("split", [](const Tensor& a, int64_t d) { return split(a, 2, d)[0]; });
  ud("chunk", [](const Tensor& a, int64_t d) { return chunk(a, 2, d)[0]; });
  ud("cat itself", [](const Tensor& a, int64_t d) { return cat({a, a}, d); });
  ud("stack itself", [](const Tensor& a, int64_t d) { return stack({a, a}, d); });
  ud("tril", [](const Tensor& a, int64_t d) { return tril(a, d); });
  ud("dropout_part", [](const Tensor& a, int64_t d) { return dropout_part(a, 0.5, true, d, 1, 3); });
  ud("one_hot", [](const Tensor& a, int64_t d) { return one_hot(a, d); });
  // nn
  u("dropout 1", [](const Tensor& a) { return dropout(a, 1.0); });
  u("dropout 1.5", [](const Tensor& a) { return dropout(a, 1.5); });
  u("layer_norm [3]", [](const Tensor& a) { return layer_norm(a, {3}); });
  u("layer_norm []", [](const Tensor& a) { return layer_norm(a, {}); });
  u("rms_norm [3]", [](const Tensor& a) { return rms_norm(a, {3}); });
  u("instance_norm", [](const Tensor& a) { return nn::instance_norm(a); });
  u("interpolate nearest 2x", [](const Tensor& a) { return nn::interpolate(a, {.scale_factor = {2}}); });
  u("interpolate bilinear", [](const Tensor& a) { return nn::interpolate(a, {.size = {3, 2}, .mode = "bilinear"}); });
  u("interpolate 2^50", [](const Tensor& a) { return nn::interpolate(a, {.size = {int64_t{1} << 50}}); });
  u("interpolate scale inf", [](const Tensor& a) { return nn::interpolate(a, {.scale_factor = {kInf}}); });
  u("interpolate area", [](const Tensor& a) { return nn::interpolate(a, {.size = {1}, .mode = "area"}); });
  u("group_norm 0", [](const Tensor& a) { return group_norm(a, 0); });
  u("max_pool2d 2", [](const Tensor& a) { return max_pool2d(a, {2, 2}); });
  u("max_pool2d 0", [](const Tensor& a) { return max_pool2d(a, {0, 0}); });
  u("max_pool2d stride 0", [](const Tensor& a) { return max_pool2d(a, {2, 2}, {0, 0}); });
  u("max_pool2d padding 3", [](const Tensor& a) { return max_pool2d(a, {2, 2}, {1, 1}, {3, 3}); });
  u("avg_pool2d padding 5", [](const Tensor& a) { return avg_pool2d(a, {2, 2}, {1, 1}, {5, 5}); });
  u("adaptive_avg_pool2d 0", [](const Tensor& a) { return adaptive_avg_pool2d(a, {0, 0}); });
  u("adaptive_max_pool2d -1", [](const Tensor& a) { return adaptive_max_pool2d(a, {-1, 2}); });
  u("max_pool3d 2", [](const Tensor& a) { return max_pool3d(a, {2}); });
  u("max_pool3d padding 2", [](const Tensor& a) { return max_pool3d(a, {2}, {1}, {2}); });
  u("avg_pool3d 1", [](const Tensor& a) { return avg_pool3d(a, {1}, {}, {0}, true, false, 3); });
  u("adaptive_avg_pool3d 0", [](const Tensor& a) { return adaptive_avg_pool3d(a, {0}); });
  u("adaptive_max_pool3d 2", [](const Tensor& a) { return adaptive_max_pool3d(a, {2, 1, 3}); });
  u("unfold view", [](const Tensor& a) { return unfold(a, -1, 1, 2); });
  u("unfold view 0 0", [](const Tensor& a) { return unfold(a, 0, 0, 1); });
  u("unfold 2", [](const Tensor& a) { return nn::unfold(a, {2}); });
  u("unfold padding 2^61", [](const Tensor& a) { return nn::unfold(a, {1}, {1}, {int64_t{1} << 61}); });
  u("fold 1", [](const Tensor& a) { return nn::fold(a, {1, 2}, {1}); });
  u("max_pool1d 0", [](const Tensor& a) { return max_pool1d(a, 0); });
  u("avg_pool1d -2", [](const Tensor& a) { return avg_pool1d(a, -2); });
  u("adaptive_max_pool1d 0", [](const Tensor& a) { return adaptive_max_pool1d(a, 0); });
  // factories
  u("randperm -1", [](const Tensor&) { return randperm(-1); });
  u("arange step 0", [](const Tensor&) { return arange(0, 10, 0); });
  u("arange backwards", [](const Tensor&) { return arange(10, 0, 1); });
  u("arange to nan", [](const Tensor&) { return arange(0, NAN, 1); });
  u("linspace -1", [](const Tensor&) { return linspace(0, 1, -1); });
  u("eye -1", [](const Tensor&) { return eye(-1); });
  u("randint empty range", [](const Tensor&) { return randint(5, 5, {3}); });
  u("empty -1", [](const Tensor&) { return empty({-1, 3}); });
  u("zeros 2^65 elements", [](const Tensor&) { return zeros({int64_t{1} << 62, 8}); });
  u("full nan int32", [](const Tensor&) { return full({2}, NAN, kInt32); });
  u("bernoulli 2", [](const Tensor&) { return bernoulli({2}, 2.0); });
  // in place
  b("atan2", [](const Tensor& a, const Tensor& c) { return atan2(a, c); });
  b("hypot", [](const Tensor& a, const Tensor& c) { return hypot(a, c); });
  b("logaddexp", [](const Tensor& a, const Tensor& c) { return logaddexp(a, c); });
  b("copysign", [](const Tensor& a, const Tensor& c) { return copysign(a, c); });
  b("xlogy", [](const Tensor& a, const Tensor& c) { return xlogy(a, c); });
  b("special::xlog1py", [](const Tensor& a, const Tensor& c) { return special::xlog1py(a, c); });
  b("special::zeta", [](const Tensor& a, const Tensor& c) { return special::zeta(a, c); });
  b("special::gammainc", [](const Tensor& a, const Tensor& c) { return special::gammainc(a, c); });
  b("special::gammaincc", [](const Tensor& a, const Tensor& c) { return special::gammaincc(a, c); });
  b("special::chebyshev_polynomial_t",
    [](const Tensor& a, const Tensor& c) { return special::chebyshev_polynomial_t(a, c); });
  b("special::chebyshev_polynomial_u",
    [](const Tensor& a, const Tensor& c) { return special::chebyshev_polynomial_u(a, c); });
  b("special::chebyshev_polynomial_v",
    [](const Tensor& a, const Tensor& c) { return special::chebyshev_polynomial_v(a, c); });
  b("special::chebyshev_polynomial_w",
    [](const Tensor& a, const Tensor& c) { return special::chebyshev_polynomial_w(a, c); });
  b("special::shifted_chebyshev_polynomial_t",
    [](const Tensor& a, const Tensor& c) { return special::shifted_chebyshev_polynomial_t(a, c); });
  b("special::shifted_chebyshev_polynomial_u",
    [](const Tensor& a, const Tensor& c) { return special::shifted_chebyshev_polynomial_u(a, c); });
  b("special::shifted_chebyshev_polynomial_v",
    [](const Tensor& a, const Tensor& c) { return special::shifted_chebyshev_polynomial_v(a, c); });
  b("special::shifted_chebyshev_polynomial_w",
    [](const Tensor& a, const Tensor& c) { return special::shifted_chebyshev_polynomial_w(a, c); });
  b("special::hermite_polynomial_h",
    [](const Tensor& a, const Tensor& c) { return special::hermite_polynomial_h(a, c); });
  b("special::hermite_polynomial_he",
    [](const Tensor& a, const Tensor& c) { return special::hermite_polynomial_he(a, c); });
  b("special::laguerre_polynomial_l",
    [](const Tensor& a, const Tensor& c) { return special::laguerre_polynomial_l(a, c); });
  b("special::legendre_polynomial_p",
    [](const Tensor& a, const Tensor& c) { return special::legendre_polynomial_p(a, c); });
  b("isclose", [](const Tensor& a, const Tensor& c) { return isclose(a, c); });
  b("outer", [](const Tensor& a, const Tensor& c) { return outer(a, c); });
  b("dot", [](const Tensor& a, const Tensor& c) { return dot(a, c); });
  b("inner", [](const Tensor& a, const Tensor& c) { return inner(a, c); });
  b("mv", [](const Tensor& a, const Tensor& c) { return mv(a, c); });
  b("tensordot", [](const Tensor& a, const Tensor& c) { return tensordot(a, c, 1); });
  b("kron", [](const Tensor& a, const Tensor& c) { return kron(a, c); });
  b("linalg::cross", [](const Tensor& a, const Tensor& c) { return linalg::cross(a, c); });
  b("cdist", [](const Tensor& a, const Tensor& c) { return cdist(a, c); });
  b("take_along_dim", [](const Tensor& a, const Tensor& c) { return take_along_dim(a, c, 0); });
  b("repeat_interleave tensor", [](const Tensor& a, const Tensor& c) { return repeat_interleave(a, c, 0); });
  b("baddbmm", [](const Tensor& a, const Tensor& c) { return baddbmm(a, c, c, 0.5, 2); });
  b("add_", [](const Tensor& a, const Tensor& c) { Tensor x = a; return x.add_(c); });
  b("mul_", [](const Tensor& a, const Tensor& c) { Tensor x = a; return x.mul_(c); });
  b("copy_", [](const Tensor& a, const Tensor& c) { Tensor x = a; return x.copy_(c); });
  b("masked_fill_", [](const Tensor& a, const Tensor& c) { Tensor x = a; return x.masked_fill_(c, 1.0); });
  b("lerp_", [](const Tensor& a, const Tensor& c) { Tensor x = a; return x.lerp_(c, 0.5); });
  b("addcdiv_", [](const Tensor& a, const Tensor& c) { Tensor x = a; return x.addcdiv_(c, c); });
  b("set_data", [](const Tensor& a, const Tensor& c) { Tensor x = a; x.set_data(c); return x; });
  b("set_grad", [](const Tensor& a, const Tensor& c) { Tensor x = a; x.set_grad(c); return x.grad(); });
  b("backward with a gradient", [](const Tensor& a, const Tensor& c) { (a * 2).backward(c); return a.grad(); });
  u("fill_ nan", [](const Tensor& a) { Tensor x = a; return x.fill_(NAN); });
  u("zero_", [](const Tensor& a) { Tensor x = a; return x.zero_(); });
  u("sqrt_", [](const Tensor& a) { Tensor x = a; return x.sqrt_(); });
  u("clamp_", [](const Tensor& a) { Tensor x = a; return x.clamp_(0, 1); });
  u("requires_grad_", [](const Tensor& a) { Tensor x = a; return x.requires_grad_(); });
  u("backward", [](const Tensor& a) { Tensor x = a; x.backward(); return x.grad(); });
  u("backward twice", [](const Tensor& a) { Tensor y = a.sum() * 2; y.backward(); y.backward(); return a.grad(); });
  u("item", [](const Tensor& a) { return scalar_tensor(a.item<double>()); });
  u("to_string", [](const Tensor& a) { return scalar_tensor(static_cast<double>(to_string(a).size())); });
  // binary
  b("add alpha", [](const Tensor& a, const Tensor& c) { return add(a, c, 2.5); });
  b("sub", [](const Tensor& a, const Tensor& c) { return sub(a, c); });
  b("div", [](const Tensor& a, const Tensor& c) { return div(a, c); });
  b("div floor", [](const Tensor& a, const Tensor& c) { return div(a, c, "floor"); });
  b("div round", [](const Tensor& a, const Tensor& c) { return div(a, c, "round"); });
  b("remainder", [](const Tensor& a, const Tensor& c) { return remainder(a, c); });
  b("floor_divide", [](const Tensor& a, const Tensor& c) { return floor_divide(a, c); });
  b("bitwise_xor", [](const Tensor& a, const Tensor& c) { return bitwise_xor(a, c); });
  b("pow", [](const Tensor& a, const Tensor& c) { return pow(a, c); });
  b("maximum", [](const Tensor& a, const Tensor& c) { return maximum(a, c); });
  b("lt", [](const Tensor& a, const Tensor& c) { return lt(a, c); });
  b("logical_and", [](const Tensor& a, const Tensor& c) { return logical_and(a, c); });
  b("where", [](const Tensor& a, const Tensor& c) { return where(a, c, c); });
  b("masked_fill", [](const Tensor& a, const Tensor& c) { return masked_fill(a, c, 7); });
  b("addcmul", [](const Tensor& a, const Tensor& c) { return addcmul(a, c, c, 0.5); });
  b("lerp", [](const Tensor& a, const Tensor& c) { return lerp(a, c, c); });
  b("matmul", [](const Tensor& a, const Tensor& c) { return matmul(a, c); });
  b("matmul by the transpose", [](const Tensor& a, const Tensor& c) { return matmul(a, c.t()); });
  b("bmm", [](const Tensor& a, const Tensor& c) { return bmm(a, c); });
  b("einsum ij,jk", [](const Tensor& a, const Tensor& c) { return einsum("ij,jk", {a, c}); });
  b("einsum ...,...", [](const Tensor& a, const Tensor& c) { return einsum("...,...", {a, c}); });
  b("masked_select", [](const Tensor& a, const Tensor& c) { return masked_select(a, c.gt(0)); });
  b("masked_scatter", [](const Tensor& a, const Tensor& c) { return masked_scatter(a, c.gt(0), a); });
  b("searchsorted", [](const Tensor& a, const Tensor& c) { return searchsorted(a, c); });
  b("bucketize, right", [](const Tensor& a, const Tensor& c) { return bucketize(a, c, false, true); });
  b("linalg::solve", [](const Tensor& a, const Tensor& c) { return linalg::solve(a, c); });
  b("linalg::solve_triangular", [](const Tensor& a, const Tensor& c) { return linalg::solve_triangular(a, c, true); });
  b("cholesky_solve", [](const Tensor& a, const Tensor& c) { return cholesky_solve(a, c); });
  b("linalg::solve, left = false", [](const Tensor& a, const Tensor& c) { return linalg::solve(a, c, false); });
  b("linalg::lstsq", [](const Tensor& a, const Tensor& c) { return linalg::lstsq(a, c).solution; });
  b("linalg::solve_ex", [](const Tensor& a, const Tensor& c) { return std::get<0>(linalg::solve_ex(a, c)); });
  b("linalg::lu_solve", [](const Tensor& a, const Tensor& c) {
    auto [lu, pivots, info] = linalg::lu_factor_ex(a);
    return linalg::lu_solve(lu, pivots, c);
  });
  b("linalg::multi_dot", [](const Tensor& a, const Tensor& c) { return linalg::multi_dot({a, c}); });
  b("linalg::vecdot", [](const Tensor& a, const Tensor& c) { return linalg::vecdot(a, c); });
  b("linalg::householder_product", [](const Tensor& a, const Tensor& c) { return linalg::householder_product(a, c); });
  b("linalg::tensorsolve", [](const Tensor& a, const Tensor& c) { return linalg::tensorsolve(a, c); });
  b("linalg::lstsq, gelsd residuals", [](const Tensor& a, const Tensor& c) { return linalg::lstsq(a, c, {}, "gelsd").residuals; });
  b("addmm", [](const Tensor& a, const Tensor& c) { return addmm(a, c, c.t()); });
  b("addmm_gelu", [](const Tensor& a, const Tensor& c) { return addmm_gelu(a, c, c.t()); });
  b("addmm_out", [](const Tensor& a, const Tensor& c) { return addmm_out(a, a, c, c.t()); });
  b("cat", [](const Tensor& a, const Tensor& c) { return cat({a, c}); });
  b("stack", [](const Tensor& a, const Tensor& c) { return stack({a, c}); });
  b("expand as", [](const Tensor& a, const Tensor& c) { return expand(a, c.sizes()); });
  b("sum_to", [](const Tensor& a, const Tensor& c) { return sum_to(a, c.sizes()); });
  b("view as", [](const Tensor& a, const Tensor& c) { return view(a, c.sizes()); });
  b("bias_gelu", [](const Tensor& a, const Tensor& c) { return bias_gelu(a, c); });
  b("embedding", [](const Tensor& a, const Tensor& c) { return embedding(a, c); });
  b("nn::embedding padding -100", [](const Tensor& a, const Tensor& c) { return nn::embedding(c, a, -100); });
  b("linear", [](const Tensor& a, const Tensor& c) { return nn::linear(a, c, c); });
  b("linear_gelu", [](const Tensor& a, const Tensor& c) { return nn::linear_gelu(a, c, a); });
  b("prelu", [](const Tensor& a, const Tensor& c) { return nn::prelu(a, c); });
  b("cross_entropy", [](const Tensor& a, const Tensor& c) { return nn::cross_entropy(a, c); });
  b("cross_entropy smoothing", [](const Tensor& a, const Tensor& c) {
    return nn::cross_entropy(a, c, {.ignore_index = 0, .label_smoothing = 0.2});
  });
  b("cross_entropy weight", [](const Tensor& a, const Tensor& c) { return nn::cross_entropy(a, c, {.weight = c}); });
  b("softmax_cross_entropy", [](const Tensor& a, const Tensor& c) { return softmax_cross_entropy(a, c); });
  b("nll_loss", [](const Tensor& a, const Tensor& c) { return nn::nll_loss(a, c); });
  b("smooth_l1 beta 0", [](const Tensor& a, const Tensor& c) { return nn::smooth_l1_loss(a, c, {.beta = 0}); });
  b("huber delta -1", [](const Tensor& a, const Tensor& c) { return nn::huber_loss(a, c, {.delta = -1}); });
  b("kl_div", [](const Tensor& a, const Tensor& c) { return nn::kl_div(a, c); });
  b("binary_cross_entropy", [](const Tensor& a, const Tensor& c) { return nn::binary_cross_entropy(a, c); });
  b("soft_margin_loss", [](const Tensor& a, const Tensor& c) { return nn::soft_margin_loss(a, c); });
  b("margin_ranking_loss", [](const Tensor& a, const Tensor& c) { return nn::margin_ranking_loss(a, c, c); });
  b("hinge_embedding_loss", [](const Tensor& a, const Tensor& c) { return nn::hinge_embedding_loss(a, c); });
  b("cosine_embedding_loss", [](const Tensor& a, const Tensor& c) { return nn::cosine_embedding_loss(a, a, c); });
  b("multilabel_soft_margin_loss weight",
    [](const Tensor& a, const Tensor& c) { return nn::multilabel_soft_margin_loss(a, a, {.weight = c}); });
  b("multilabel_margin_loss", [](const Tensor& a, const Tensor& c) { return nn::multilabel_margin_loss(a, c); });
  b("multi_margin_loss p 2 weight",
    [](const Tensor& a, const Tensor& c) { return nn::multi_margin_loss(a, c, {.p = 2, .weight = a.select(0, 0)}); });
  b("triplet_margin_loss swap",
    [](const Tensor& a, const Tensor& c) { return nn::triplet_margin_loss(a, c, a, {.swap = true}); });
  b("poisson_nll_loss full", [](const Tensor& a, const Tensor& c) { return nn::poisson_nll_loss(a, c, {.full = true}); });
  b("gaussian_nll_loss", [](const Tensor& a, const Tensor& c) { return nn::gaussian_nll_loss(a, a, c); });
  b("cosine_similarity", [](const Tensor& a, const Tensor& c) { return nn::cosine_similarity(a, c); });
  b("pairwise_distance", [](const Tensor& a, const Tensor& c) { return nn::pairwise_distance(a, c); });
  b("ctc_loss", [](const Tensor& a, const Tensor& c) { return nn::ctc_loss(a, c, c, c); });
  b("embedding_bag max", [](const Tensor& a, const Tensor& c) { return nn::embedding_bag(c, a, {.mode = "max"}); });
  b("embedding_bag offsets", [](const Tensor& a, const Tensor& c) {
    return nn::embedding_bag(c, a, {.offsets = c, .mode = "sum", .per_sample_weights = a, .padding_idx = 0});
  });
  b("pack_padded_sequence", [](const Tensor& a, const Tensor& c) {
    return std::get<0>(nn::utils::rnn::pad_packed_sequence(nn::utils::rnn::pack_padded_sequence(a, c, true, false)));
  });
  b("conv2d", [](const Tensor& a, const Tensor& c) { return conv2d(a, c); });
  b("conv1d stride 0", [](const Tensor& a, const Tensor& c) { return conv1d(a, c, {}, 0); });
  b("conv_transpose1d", [](const Tensor& a, const Tensor& c) { return conv_transpose1d(a, c); });
  b("layer_norm affine", [](const Tensor& a, const Tensor& c) { return layer_norm(a, {a.dim() ? a.size(-1) : 1}, c, c); });
  b("add_layer_norm", [](const Tensor& a, const Tensor& c) { return std::get<0>(add_layer_norm(a, c, {3})); });
  b("batch_norm", [](const Tensor& a, const Tensor& c) { return batch_norm(a, c, c, {}, {}, true); });
  b("group_norm affine", [](const Tensor& a, const Tensor& c) { return group_norm(a, 1, c, c); });
  b("attention", [](const Tensor& a, const Tensor& c) { return scaled_dot_product_attention(a, c, c); });
  b("max_unpool2d", [](const Tensor& a, const Tensor& c) { return nn::max_unpool2d(a, c, {2}); });
  b("max_unpool1d output_size", [](const Tensor& a, const Tensor& c) { return nn::max_unpool1d(a, c, 2, 1, 0, {4}); });
  b("max_unpool3d padding 2^61", [](const Tensor& a, const Tensor& c) {
    return nn::max_unpool3d(a, c, {1}, {1}, {int64_t{1} << 61});
  });
  b("bilinear", [](const Tensor& a, const Tensor& c) { return nn::bilinear(a, a, c); });
  b("bilinear bias", [](const Tensor& a, const Tensor& c) { return nn::bilinear(a, c, a.unsqueeze(0), c); });
  b("attention with a mask", [](const Tensor& a, const Tensor& c) { return scaled_dot_product_attention(a, a, a, c); });
  bd("index_select", [](const Tensor& a, const Tensor& c, int64_t d) { return index_select(a, d, c); });
  bd("gather", [](const Tensor& a, const Tensor& c, int64_t d) { return gather(a, d, c); });
  bd("scatter", [](const Tensor& a, const Tensor& c, int64_t d) { return scatter(a, d, c, a); });
  bd("scatter_add", [](const Tensor& a, const Tensor& c, int64_t d) { return scatter_add(a, d, c, a); });
  bd("index_add", [](const Tensor& a, const Tensor& c, int64_t d) { return index_add(a, d, c, a); });
  bd("cat", [](const Tensor& a, const Tensor& c, int64_t d) { return cat({a, c}, d); });
  bd("conv2d stride", [](const Tensor& a, const Tensor& c, int64_t d) { return conv2d(a, c, {}, {d, d}); });
  bd("conv2d groups", [](const Tensor& a, const Tensor& c, int64_t d) { return conv2d(a, c, {}, {1, 1}, {0, 0}, {1, 1}, d); });
  bd("conv2d dilation", [](const Tensor& a, const Tensor& c, int64_t d) { return conv2d(a, c, {}, {1, 1}, {0, 0}, {d, d}); });
  bd("cross_entropy ignore_index", [](const Tensor& a, const Tensor& c, int64_t d) {
    return nn::cross_entropy(a, c, {.ignore_index = d});
  });
  // dropout_part's p = 0.5 and the " train" ops draw random numbers; to_string's text names the device
  for (EdgeOp& op : v)
    op.device_specific = op.name.starts_with("dropout_part") || op.name.ends_with(" train") || op.name == "to_string";
  return v;
}


}  // namespace kiln::test
