// nn/init.cpp: see nn/init.h. Draws are made with the random factories of ops/ and copied in.
#include "nn/init.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/grad_mode.h"
#include "nn/qr.h"
#include "ops/ops.h"

namespace kiln::nn::init {

namespace {

void check_floating(const Tensor& t, const char* op) {
  KILN_CHECK(t.defined() && t.is_floating_point(), "nn::init::{}: needs a defined floating tensor, got {}", op,
             t.defined() ? dtype_name(t.dtype()) : "an undefined tensor");
}

int64_t fan(const Tensor& t, const std::string& mode, const char* op) {
  Fans f = calculate_fan_in_and_fan_out(t);
  if (mode == "fan_in") return f.fan_in;
  if (mode == "fan_out") return f.fan_out;
  KILN_FAIL("nn::init::{}: mode '{}' is not 'fan_in' or 'fan_out'", op, mode);
}

}  // namespace

double calculate_gain(const std::string& nonlinearity, std::optional<double> param) {
  if (nonlinearity == "linear" || nonlinearity == "conv1d" || nonlinearity == "conv2d" ||
      nonlinearity == "conv3d" || nonlinearity == "conv_transpose1d" || nonlinearity == "conv_transpose2d" ||
      nonlinearity == "conv_transpose3d" || nonlinearity == "sigmoid") {
    return 1;
  }
  if (nonlinearity == "tanh") return 5.0 / 3;
  if (nonlinearity == "relu") return std::sqrt(2.0);
  if (nonlinearity == "leaky_relu") {
    double slope = param.value_or(0.01);
    return std::sqrt(2.0 / (1 + slope * slope));
  }
  if (nonlinearity == "selu") return 3.0 / 4;
  KILN_FAIL("nn::init::calculate_gain: unsupported nonlinearity '{}' (linear, conv*, sigmoid, tanh, relu, "
            "leaky_relu, selu)", nonlinearity);
}

Fans calculate_fan_in_and_fan_out(const Tensor& t) {
  KILN_CHECK(t.dim() >= 2,
             "nn::init: fan in and fan out cannot be computed for a tensor of fewer than 2 dimensions "
             "(shape {})", t.sizes().str());
  int64_t receptive = 1;
  for (int d = 2; d < t.dim(); ++d) receptive *= t.size(d);
  return {t.size(1) * receptive, t.size(0) * receptive};
}

Tensor& uniform_(Tensor& t, double a, double b, Generator* gen) {
  check_floating(t, "uniform_");
  KILN_CHECK(a <= b && std::isfinite(a) && std::isfinite(b),
             "nn::init::uniform_: needs finite a <= b (the range [a, b)), got a={}, b={}", a, b);
  NoGradGuard no_grad;
  // Drawn in float64 and rounded once, so the bounds hold in the tensor's dtype as well.
  Tensor u = rand(t.sizes(), TensorOptions(kFloat64).device(t.device()), gen);
  t.copy_(u * (b - a) + a);
  return t;
}

Tensor& normal_(Tensor& t, double mean, double std, Generator* gen) {
  check_floating(t, "normal_");
  KILN_CHECK(std >= 0 && std::isfinite(std) && std::isfinite(mean),
             "nn::init::normal_: needs a finite mean and a finite std >= 0, got mean={}, std={}", mean, std);
  NoGradGuard no_grad;
  t.copy_(randn(t.sizes(), TensorOptions(kFloat64).device(t.device()), gen) * std + mean);
  return t;
}

namespace {

// Note [trunc_normal_ by the inverse CDF]: z = Phi^-1(u) with u uniform on [Phi(lo), Phi(hi)] follows
// N(0, 1) restricted to [lo, hi], in one draw whatever the interval (redrawing until inside took
// seconds for [3, 3.001]). PyTorch does the same with erfinv in the tensor's dtype; here it runs in
// float64 on the host, an interval above 0 is mirrored below it so that Phi's values are small and keep
// their digits, and the quantile is Acklam's rational approximation (relative error 1.2e-9) refined by
// one Halley step on Phi(z) - u, with Phi from erfc: float64-accurate, tails included.
double normal_cdf(double z) { return 0.5 * std::erfc(-z * 0.70710678118654752440); }

double normal_quantile(double u) {
  static constexpr double a[] = {-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
                                 1.383577518672690e+02,  -3.066479806614716e+01, 2.506628277459239e+00};
  static constexpr double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                                 6.680131188771972e+01,  -1.328068155288572e+01};
  static constexpr double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                                 -2.549732539343734e+00, 4.374664141464968e+00,  2.938163982698783e+00};
  static constexpr double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                                 3.754408661907416e+00};
  if (u <= 0) return -INFINITY;
  if (u >= 1) return INFINITY;
  auto tail = [&](double q) {  // the lower tail's form, q = sqrt(-2 log p)
    return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
           ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  };
  double z;
  if (u < 0.02425) {
    z = tail(std::sqrt(-2 * std::log(u)));
  } else if (u > 1 - 0.02425) {
    z = -tail(std::sqrt(-2 * std::log1p(-u)));
  } else {
    const double q = u - 0.5, r = q * q;
    z = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
  }
  const double e = (normal_cdf(z) - u) * 2.50662827463100050242 * std::exp(z * z / 2);  // sqrt(2 pi)
  // Beyond |z| of about 37.6 exp(z^2 / 2) overflows: Acklam's 1.2e-9 stands there.
  return std::isfinite(e) ? z - e / (1 + z * e / 2) : z;
}

}  // namespace

Tensor& trunc_normal_(Tensor& t, double mean, double std, double a, double b, Generator* gen) {
  check_floating(t, "trunc_normal_");
  KILN_CHECK(a < b && std > 0 && std::isfinite(mean) && std::isfinite(std),
             "nn::init::trunc_normal_: needs a < b, a finite mean and a finite std > 0, got mean={}, std={}, a={}, "
             "b={}", mean, std, a, b);
  double lo = (a - mean) / std, hi = (b - mean) / std;
  const bool mirrored = lo + hi > 0;  // Note [trunc_normal_ by the inverse CDF]
  if (mirrored) {
    const double old_lo = lo;
    lo = -hi;
    hi = -old_lo;
  }
  const double p_lo = normal_cdf(lo), p_hi = normal_cdf(hi);
  KILN_CHECK(p_hi > 0,
             "nn::init::trunc_normal_: [a, b] = [{}, {}] lies {} std from the mean {}, where the normal "
             "distribution's probability is below float64's smallest number; choose bounds nearer the mean",
             a, b, -hi, mean);
  NoGradGuard no_grad;
  std::vector<double> z = rand(t.sizes(), TensorOptions(kFloat64).device(t.device()), gen).cpu().to_vector<double>();
  for (double& v : z) {
    const double q = std::clamp(normal_quantile(p_lo + v * (p_hi - p_lo)), lo, hi);
    v = mean + std * (mirrored ? -q : q);
  }
  t.copy_(from_vector(z, t.sizes()).to(t.device()).clamp(a, b));
  return t;
}

Tensor& constant_(Tensor& t, double value) {
  KILN_CHECK(t.defined(), "nn::init::constant_: the tensor is undefined");
  NoGradGuard no_grad;
  t.fill_(value);
  return t;
}
Tensor& zeros_(Tensor& t) { return constant_(t, 0); }
Tensor& ones_(Tensor& t) { return constant_(t, 1); }

Tensor& kaiming_uniform_(Tensor& t, double a, const std::string& mode, const std::string& nonlinearity,
                         Generator* gen) {
  check_floating(t, "kaiming_uniform_");
  if (t.numel() == 0) return t;  // as PyTorch: a no-op (the fan is 0)
  double gain = calculate_gain(nonlinearity, a);
  double bound = gain * std::sqrt(3.0 / static_cast<double>(fan(t, mode, "kaiming_uniform_")));
  return uniform_(t, -bound, bound, gen);
}

Tensor& kaiming_normal_(Tensor& t, double a, const std::string& mode, const std::string& nonlinearity,
                        Generator* gen) {
  check_floating(t, "kaiming_normal_");
  if (t.numel() == 0) return t;  // as PyTorch: a no-op (the fan is 0)
  double gain = calculate_gain(nonlinearity, a);
  return normal_(t, 0, gain / std::sqrt(static_cast<double>(fan(t, mode, "kaiming_normal_"))), gen);
}

Tensor& xavier_uniform_(Tensor& t, double gain, Generator* gen) {
  check_floating(t, "xavier_uniform_");
  Fans f = calculate_fan_in_and_fan_out(t);  // an Error below 2 dims, empty or not (PyTorch's)
  if (t.numel() == 0) return t;  // nothing to draw (PyTorch divides by a fan of 0 for a (0, 0) tensor)
  double bound = gain * std::sqrt(6.0 / static_cast<double>(f.fan_in + f.fan_out));
  return uniform_(t, -bound, bound, gen);
}

Tensor& xavier_normal_(Tensor& t, double gain, Generator* gen) {
  check_floating(t, "xavier_normal_");
  Fans f = calculate_fan_in_and_fan_out(t);  // an Error below 2 dims, empty or not (PyTorch's)
  if (t.numel() == 0) return t;  // nothing to draw (PyTorch divides by a fan of 0 for a (0, 0) tensor)
  return normal_(t, 0, gain * std::sqrt(2.0 / static_cast<double>(f.fan_in + f.fan_out)), gen);
}

Tensor& eye_(Tensor& t) {
  check_floating(t, "eye_");
  KILN_CHECK(t.dim() == 2, "nn::init::eye_: needs a 2-D tensor, got shape {}", t.sizes().str());
  NoGradGuard no_grad;
  t.copy_(eye(t.size(0), t.size(1), TensorOptions(t.dtype()).device(t.device())));
  return t;
}

Tensor& dirac_(Tensor& t, int64_t groups) {
  check_floating(t, "dirac_");
  KILN_CHECK(t.dim() >= 3 && t.dim() <= 5,
             "nn::init::dirac_: needs a 3-D, 4-D or 5-D convolution weight (out, in, *kernel), got shape {}",
             t.sizes().str());
  KILN_CHECK(groups >= 1 && t.size(0) % groups == 0,
             "nn::init::dirac_: the {} output channels (dim 0) must be divisible by groups {}", t.size(0), groups);
  const int64_t out_per_group = t.size(0) / groups, in = t.size(1);
  int64_t kernel = 1, centre = 0;  // the kernel's element count and its centre's offset
  for (int d = 2; d < t.dim(); ++d) {
    centre = centre * t.size(d) + t.size(d) / 2;
    kernel *= t.size(d);
  }
  std::vector<double> v(static_cast<size_t>(t.numel()), 0.0);
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t d = 0; d < std::min(out_per_group, in); ++d) v[((g * out_per_group + d) * in + d) * kernel + centre] = 1;
  }
  NoGradGuard no_grad;
  t.copy_(from_vector(v, t.sizes()).to(t.device()));
  return t;
}

// Note [orthogonal_ by Householder QR]: W is the Q of the QR of a normal draw A (of A^T when it has
// fewer rows than columns, W then Q^T), with R's diagonal made positive: PyTorch's
// `q *= sign(diag(r))`. The QR is LAPACK's Householder one, on the host in float64 (nn/qr.h).
Tensor& orthogonal_(Tensor& t, double gain, Generator* gen) {
  check_floating(t, "orthogonal_");
  KILN_CHECK(t.dim() >= 2, "nn::init::orthogonal_: needs a tensor of at least 2 dimensions, got shape {}",
             t.sizes().str());
  if (t.numel() == 0) return t;  // as PyTorch: nothing to fill
  const int64_t rows = t.size(0), cols = t.numel() / rows;
  NoGradGuard no_grad;
  std::vector<double> a = randn({rows, cols}, TensorOptions(kFloat64), gen).to_vector<double>();  // row-major
  std::vector<double> w(a.size());
  if (rows >= cols) {
    const std::vector<double> q = nn::detail::q_factor(std::move(a), rows, cols);
    for (size_t i = 0; i < q.size(); ++i) w[i] = gain * q[i];
  } else {
    std::vector<double> transposed(a.size());  // A^T, cols x rows
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) transposed[j * rows + i] = a[i * cols + j];
    }
    const std::vector<double> q = nn::detail::q_factor(std::move(transposed), cols, rows);  // cols x rows
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) w[i * cols + j] = gain * q[j * rows + i];
    }
  }
  t.copy_(from_vector(w, t.sizes()).to(t.device()));
  return t;
}

}  // namespace kiln::nn::init
