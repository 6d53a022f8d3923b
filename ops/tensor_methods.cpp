// ops/tensor_methods.cpp: Tensor's computing methods and operators, each a one-line forward to the
// free function of the same name in ops/ops.h.
#include "ops/ops.h"

namespace kiln {

Tensor Tensor::neg() const { return ops::neg(*this); }
Tensor Tensor::abs() const { return ops::abs(*this); }
Tensor Tensor::sign() const { return ops::sign(*this); }
Tensor Tensor::exp() const { return ops::exp(*this); }
Tensor Tensor::log() const { return ops::log(*this); }
Tensor Tensor::log1p() const { return ops::log1p(*this); }
Tensor Tensor::expm1() const { return ops::expm1(*this); }
Tensor Tensor::sqrt() const { return ops::sqrt(*this); }
Tensor Tensor::rsqrt() const { return ops::rsqrt(*this); }
Tensor Tensor::reciprocal() const { return ops::reciprocal(*this); }
Tensor Tensor::sin() const { return ops::sin(*this); }
Tensor Tensor::cos() const { return ops::cos(*this); }
Tensor Tensor::tanh() const { return ops::tanh(*this); }
Tensor Tensor::sigmoid() const { return ops::sigmoid(*this); }
Tensor Tensor::relu() const { return ops::relu(*this); }
Tensor Tensor::square() const { return ops::square(*this); }
Tensor Tensor::tan() const { return ops::tan(*this); }
Tensor Tensor::asin() const { return ops::asin(*this); }
Tensor Tensor::acos() const { return ops::acos(*this); }
Tensor Tensor::atan() const { return ops::atan(*this); }
Tensor Tensor::sinh() const { return ops::sinh(*this); }
Tensor Tensor::cosh() const { return ops::cosh(*this); }
Tensor Tensor::asinh() const { return ops::asinh(*this); }
Tensor Tensor::acosh() const { return ops::acosh(*this); }
Tensor Tensor::atanh() const { return ops::atanh(*this); }
Tensor Tensor::log2() const { return ops::log2(*this); }
Tensor Tensor::log10() const { return ops::log10(*this); }
Tensor Tensor::exp2() const { return ops::exp2(*this); }
Tensor Tensor::erf() const { return ops::erf(*this); }
Tensor Tensor::erfc() const { return ops::erfc(*this); }
Tensor Tensor::erfinv() const { return ops::erfinv(*this); }
Tensor Tensor::lgamma() const { return ops::lgamma(*this); }
Tensor Tensor::digamma() const { return ops::digamma(*this); }
Tensor Tensor::logit(std::optional<double> eps) const { return ops::logit(*this, eps); }
Tensor Tensor::nan_to_num(std::optional<double> nan, std::optional<double> posinf, std::optional<double> neginf) const {
  return ops::nan_to_num(*this, nan, posinf, neginf);
}
Tensor Tensor::atan2(const Tensor& o) const { return ops::atan2(*this, o); }
Tensor Tensor::hypot(const Tensor& o) const { return ops::hypot(*this, o); }
Tensor Tensor::logaddexp(const Tensor& o) const { return ops::logaddexp(*this, o); }
Tensor Tensor::copysign(const Tensor& o) const { return ops::copysign(*this, o); }
Tensor Tensor::xlogy(const Tensor& o) const { return ops::xlogy(*this, o); }
Tensor Tensor::isclose(const Tensor& o, double rtol, double atol, bool equal_nan) const {
  return ops::isclose(*this, o, rtol, atol, equal_nan);
}
bool Tensor::allclose(const Tensor& o, double rtol, double atol, bool equal_nan) const {
  return ops::allclose(*this, o, rtol, atol, equal_nan);
}
Tensor Tensor::pow(const Scalar& e) const { return ops::pow(*this, e); }
Tensor Tensor::pow(const Tensor& e) const { return ops::pow(*this, e); }
Tensor Tensor::clamp(std::optional<Scalar> lo, std::optional<Scalar> hi) const { return ops::clamp(*this, lo, hi); }
Tensor Tensor::add(const Tensor& o, const Scalar& alpha) const { return ops::add(*this, o, alpha); }
Tensor Tensor::add(const Scalar& o) const { return ops::add(*this, o); }
Tensor Tensor::sub(const Tensor& o, const Scalar& alpha) const { return ops::sub(*this, o, alpha); }
Tensor Tensor::sub(const Scalar& o) const { return ops::sub(*this, o); }
Tensor Tensor::mul(const Tensor& o) const { return ops::mul(*this, o); }
Tensor Tensor::mul(const Scalar& o) const { return ops::mul(*this, o); }
Tensor Tensor::div(const Tensor& o) const { return ops::div(*this, o); }
Tensor Tensor::div(const Scalar& o) const { return ops::div(*this, o); }
Tensor Tensor::maximum(const Tensor& o) const { return ops::maximum(*this, o); }
Tensor Tensor::minimum(const Tensor& o) const { return ops::minimum(*this, o); }
Tensor Tensor::eq(const Tensor& o) const { return ops::eq(*this, o); }
Tensor Tensor::eq(const Scalar& o) const { return ops::eq(*this, o); }
Tensor Tensor::ne(const Tensor& o) const { return ops::ne(*this, o); }
Tensor Tensor::ne(const Scalar& o) const { return ops::ne(*this, o); }
Tensor Tensor::isnan() const { return ops::isnan(*this); }
Tensor Tensor::isinf() const { return ops::isinf(*this); }
Tensor Tensor::isfinite() const { return ops::isfinite(*this); }
Tensor Tensor::lt(const Tensor& o) const { return ops::lt(*this, o); }
Tensor Tensor::lt(const Scalar& o) const { return ops::lt(*this, o); }
Tensor Tensor::le(const Tensor& o) const { return ops::le(*this, o); }
Tensor Tensor::le(const Scalar& o) const { return ops::le(*this, o); }
Tensor Tensor::gt(const Tensor& o) const { return ops::gt(*this, o); }
Tensor Tensor::gt(const Scalar& o) const { return ops::gt(*this, o); }
Tensor Tensor::ge(const Tensor& o) const { return ops::ge(*this, o); }
Tensor Tensor::ge(const Scalar& o) const { return ops::ge(*this, o); }
Tensor Tensor::logical_and(const Tensor& o) const { return ops::logical_and(*this, o); }
Tensor Tensor::logical_or(const Tensor& o) const { return ops::logical_or(*this, o); }
Tensor Tensor::logical_not() const { return ops::logical_not(*this); }
Tensor Tensor::masked_fill(const Tensor& mask, const Scalar& v) const { return ops::masked_fill(*this, mask, v); }
Tensor Tensor::addcmul(const Tensor& t1, const Tensor& t2, const Scalar& v) const {
  return ops::addcmul(*this, t1, t2, v);
}
Tensor Tensor::addcdiv(const Tensor& t1, const Tensor& t2, const Scalar& v) const {
  return ops::addcdiv(*this, t1, t2, v);
}
Tensor Tensor::floor() const { return ops::floor(*this); }
Tensor Tensor::ceil() const { return ops::ceil(*this); }
Tensor Tensor::trunc() const { return ops::trunc(*this); }
Tensor Tensor::round() const { return ops::round(*this); }
Tensor Tensor::remainder(const Tensor& o) const { return ops::remainder(*this, o); }
Tensor Tensor::remainder(const Scalar& o) const { return ops::remainder(*this, o); }
Tensor Tensor::fmod(const Tensor& o) const { return ops::fmod(*this, o); }
Tensor Tensor::fmod(const Scalar& o) const { return ops::fmod(*this, o); }
Tensor Tensor::floor_divide(const Tensor& o) const { return ops::floor_divide(*this, o); }
Tensor Tensor::floor_divide(const Scalar& o) const { return ops::floor_divide(*this, o); }
Tensor Tensor::lerp(const Tensor& end, const Tensor& weight) const { return ops::lerp(*this, end, weight); }
Tensor Tensor::lerp(const Tensor& end, const Scalar& weight) const { return ops::lerp(*this, end, weight); }

Tensor Tensor::sum(std::optional<DType> dtype) const { return ops::sum(*this, {}, false, dtype); }
Tensor Tensor::sum(const Shape& dims, bool keepdim) const { return ops::sum(*this, dims, keepdim); }
Tensor Tensor::mean() const { return ops::mean(*this); }
Tensor Tensor::mean(const Shape& dims, bool keepdim) const { return ops::mean(*this, dims, keepdim); }
Tensor Tensor::prod() const { return ops::prod(*this); }
Tensor Tensor::prod(int64_t dim, bool keepdim) const { return ops::prod(*this, dim, keepdim); }
Tensor Tensor::max() const { return ops::max(*this); }
std::tuple<Tensor, Tensor> Tensor::sort(int64_t dim, bool descending) const {
  return ops::sort(*this, dim, descending);
}
Tensor Tensor::argsort(int64_t dim, bool descending) const { return ops::argsort(*this, dim, descending); }
std::tuple<Tensor, Tensor> Tensor::topk(int64_t k, int64_t dim, bool largest) const {
  return ops::topk(*this, k, dim, largest);
}
std::tuple<Tensor, Tensor> Tensor::kthvalue(int64_t k, int64_t dim, bool keepdim) const {
  return ops::kthvalue(*this, k, dim, keepdim);
}
Tensor Tensor::median() const { return ops::median(*this); }
std::tuple<Tensor, Tensor> Tensor::median(int64_t dim, bool keepdim) const { return ops::median(*this, dim, keepdim); }
Tensor Tensor::cumsum(int64_t dim, std::optional<DType> dtype) const { return ops::cumsum(*this, dim, dtype); }
Tensor Tensor::cumprod(int64_t dim, std::optional<DType> dtype) const { return ops::cumprod(*this, dim, dtype); }
std::tuple<Tensor, Tensor> Tensor::cummax(int64_t dim) const { return ops::cummax(*this, dim); }
std::tuple<Tensor, Tensor> Tensor::cummin(int64_t dim) const { return ops::cummin(*this, dim); }
Tensor Tensor::logcumsumexp(int64_t dim) const { return ops::logcumsumexp(*this, dim); }
Tensor Tensor::msort() const { return ops::msort(*this); }
Tensor Tensor::quantile(double q, std::optional<int64_t> dim, bool keepdim, const std::string& interpolation) const {
  return ops::quantile(*this, q, dim, keepdim, interpolation);
}
Tensor Tensor::nanquantile(double q, std::optional<int64_t> dim, bool keepdim, const std::string& interpolation) const {
  return ops::nanquantile(*this, q, dim, keepdim, interpolation);
}
Tensor Tensor::nonzero() const { return ops::nonzero(*this); }
Tensor Tensor::argwhere() const { return ops::argwhere(*this); }
Tensor Tensor::count_nonzero(const Shape& dims) const { return ops::count_nonzero(*this, dims); }
Tensor Tensor::masked_select(const Tensor& mask) const { return ops::masked_select(*this, mask); }
Tensor Tensor::masked_scatter(const Tensor& mask, const Tensor& source) const {
  return ops::masked_scatter(*this, mask, source);
}
std::tuple<Tensor, Tensor, Tensor> Tensor::unique(std::optional<int64_t> dim) const { return ops::unique(*this, dim); }
Tensor Tensor::bincount(const Tensor& weights, int64_t minlength) const {
  return ops::bincount(*this, weights, minlength);
}
Tensor Tensor::histc(int64_t bins, double min, double max) const { return ops::histc(*this, bins, min, max); }
std::tuple<Tensor, Tensor> Tensor::max(int64_t dim, bool keepdim) const { return ops::max(*this, dim, keepdim); }
Tensor Tensor::min() const { return ops::min(*this); }
std::tuple<Tensor, Tensor> Tensor::min(int64_t dim, bool keepdim) const { return ops::min(*this, dim, keepdim); }
Tensor Tensor::amax(const Shape& dims, bool keepdim) const { return ops::amax(*this, dims, keepdim); }
Tensor Tensor::amin(const Shape& dims, bool keepdim) const { return ops::amin(*this, dims, keepdim); }
Tensor Tensor::argmax(std::optional<int64_t> dim, bool keepdim) const { return ops::argmax(*this, dim, keepdim); }
Tensor Tensor::argmin(std::optional<int64_t> dim, bool keepdim) const { return ops::argmin(*this, dim, keepdim); }
Tensor Tensor::var(const Shape& dims, int64_t c, bool keepdim) const { return ops::var(*this, dims, c, keepdim); }
Tensor Tensor::std(const Shape& dims, int64_t c, bool keepdim) const { return ops::std(*this, dims, c, keepdim); }
Tensor Tensor::norm(double p, const Shape& dims, bool keepdim) const { return ops::norm(*this, p, dims, keepdim); }
Tensor Tensor::logsumexp(const Shape& dims, bool keepdim) const { return ops::logsumexp(*this, dims, keepdim); }
Tensor Tensor::all() const { return ops::all(*this); }
Tensor Tensor::all(int64_t dim, bool keepdim) const { return ops::all(*this, dim, keepdim); }
Tensor Tensor::any() const { return ops::any(*this); }
Tensor Tensor::any(int64_t dim, bool keepdim) const { return ops::any(*this, dim, keepdim); }

Tensor Tensor::matmul(const Tensor& o) const { return ops::matmul(*this, o); }
Tensor Tensor::mm(const Tensor& o) const { return ops::mm(*this, o); }
Tensor Tensor::bmm(const Tensor& o) const { return ops::bmm(*this, o); }
Tensor Tensor::softmax(int64_t dim) const { return ops::softmax(*this, dim); }
Tensor Tensor::log_softmax(int64_t dim) const { return ops::log_softmax(*this, dim); }
std::vector<Tensor> Tensor::split(int64_t size, int64_t dim) const { return ops::split(*this, size, dim); }
std::vector<Tensor> Tensor::chunk(int64_t chunks, int64_t dim) const { return ops::chunk(*this, chunks, dim); }
Tensor Tensor::flip(const Shape& dims) const { return ops::flip(*this, dims); }
Tensor Tensor::repeat(const Shape& repeats) const { return ops::repeat(*this, repeats); }
Tensor Tensor::tril(int64_t k) const { return ops::tril(*this, k); }
Tensor Tensor::triu(int64_t k) const { return ops::triu(*this, k); }
Tensor Tensor::index_select(int64_t dim, const Tensor& i) const { return ops::index_select(*this, dim, i); }
Tensor Tensor::gather(int64_t dim, const Tensor& i) const { return ops::gather(*this, dim, i); }
Tensor Tensor::scatter(int64_t dim, const Tensor& i, const Tensor& s) const { return ops::scatter(*this, dim, i, s); }
Tensor Tensor::scatter_add(int64_t dim, const Tensor& i, const Tensor& s) const {
  return ops::scatter_add(*this, dim, i, s);
}

Tensor operator-(const Tensor& a) { return ops::neg(a); }
Tensor operator+(const Tensor& a, const Tensor& b) { return ops::add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return ops::sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return ops::mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return ops::div(a, b); }
Tensor operator+(const Tensor& a, const Scalar& b) { return ops::add(a, b); }
Tensor operator-(const Tensor& a, const Scalar& b) { return ops::sub(a, b); }
Tensor operator*(const Tensor& a, const Scalar& b) { return ops::mul(a, b); }
Tensor operator/(const Tensor& a, const Scalar& b) { return ops::div(a, b); }
Tensor operator+(const Scalar& a, const Tensor& b) { return ops::add(b, a); }
Tensor operator-(const Scalar& a, const Tensor& b) { return ops::rsub(b, a); }
Tensor operator*(const Scalar& a, const Tensor& b) { return ops::mul(b, a); }
Tensor operator/(const Scalar& a, const Tensor& b) { return ops::rdiv(a, b); }
Tensor operator%(const Tensor& a, const Tensor& b) { return ops::remainder(a, b); }
Tensor operator%(const Tensor& a, const Scalar& b) { return ops::remainder(a, b); }
Tensor operator&(const Tensor& a, const Tensor& b) { return ops::bitwise_and(a, b); }
Tensor operator&(const Tensor& a, const Scalar& b) { return ops::bitwise_and(a, b); }
Tensor operator|(const Tensor& a, const Tensor& b) { return ops::bitwise_or(a, b); }
Tensor operator|(const Tensor& a, const Scalar& b) { return ops::bitwise_or(a, b); }
Tensor operator^(const Tensor& a, const Tensor& b) { return ops::bitwise_xor(a, b); }
Tensor operator^(const Tensor& a, const Scalar& b) { return ops::bitwise_xor(a, b); }
Tensor operator~(const Tensor& a) { return ops::bitwise_not(a); }
Tensor& operator+=(Tensor& a, const Tensor& b) { return a.add_(b); }
Tensor& operator-=(Tensor& a, const Tensor& b) { return a.sub_(b); }
Tensor& operator*=(Tensor& a, const Tensor& b) { return a.mul_(b); }
Tensor& operator/=(Tensor& a, const Tensor& b) { return a.div_(b); }
Tensor& operator+=(Tensor& a, const Scalar& b) { return a.add_(b); }
Tensor& operator-=(Tensor& a, const Scalar& b) { return a.sub_(b); }
Tensor& operator*=(Tensor& a, const Scalar& b) { return a.mul_(b); }
Tensor& operator/=(Tensor& a, const Scalar& b) { return a.div_(b); }

Tensor Tensor::movedim(const Shape& source, const Shape& destination) const {
  return ops::movedim(*this, source, destination);
}
Tensor Tensor::swapaxes(int64_t axis0, int64_t axis1) const { return ops::swapaxes(*this, axis0, axis1); }
Tensor Tensor::roll(const Shape& shifts, const Shape& dims) const { return ops::roll(*this, shifts, dims); }
Tensor Tensor::tile(const Shape& reps) const { return ops::tile(*this, reps); }
Tensor Tensor::repeat_interleave(int64_t repeats, std::optional<int64_t> dim) const {
  return ops::repeat_interleave(*this, repeats, dim);
}
Tensor Tensor::diag(int64_t diagonal) const { return ops::diag(*this, diagonal); }
Tensor Tensor::trace() const { return ops::trace(*this); }
Tensor Tensor::outer(const Tensor& o) const { return ops::outer(*this, o); }
Tensor Tensor::dot(const Tensor& o) const { return ops::dot(*this, o); }
Tensor Tensor::mv(const Tensor& v) const { return ops::mv(*this, v); }
Tensor Tensor::kron(const Tensor& o) const { return ops::kron(*this, o); }
Tensor Tensor::take_along_dim(const Tensor& indices, std::optional<int64_t> dim) const {
  return ops::take_along_dim(*this, indices, dim);
}

}  // namespace kiln
