// bench_special: the pointwise functions that Eigen does not vectorize (glibc's SIMD functions, or
// core/special_math.h's and core/bessel_math.h's element by element or a block at a time) on 2^22
// float32 elements: tan, asin, atan, sinh, log2, erfc, erfinv, lgamma, digamma, polygamma(1, x), atan2,
// hypot, logaddexp and xlogy, digamma in float64, and torch.special's i0, i1e, i0e (of x up to 30), i1
// in float64, erfcx, ndtr, log_ndtr, ndtri, entr, xlog1py, zeta, gammainc, bessel_j0, bessel_y1,
// modified_bessel_k0, spherical_bessel_j0, airy_ai and the orthogonal polynomials T (n = 10 and 50),
// U (50), H, P and L (10). ms: the median of 7 runs after 2 warm-up runs. One JSON line per result.
// Its PyTorch counterpart: benchmarks/torch_special.py (same shapes, distributions, parts and timing
// rule; the data are each library's own random draws). Usage: bench_special [threads] (default 2).
#include <kiln/kiln.h>

#include <functional>
#include <string>

#include "bench_util.h"

using namespace kiln;

int main(int argc, char** argv) {
  const int threads = kiln_bench::threads_arg(argc, argv);
  if (threads == 0) return 2;
  set_num_threads(threads);
  auto report = [&](const std::string& part, const std::function<void()>& fn) {
    kiln_bench::report_cpu_part("special", threads, part, fn);
  };
  Generator gen(0);
  const int64_t n = int64_t{1} << 22;
  const Tensor unit = rand({n}, {}, &gen) * 1.8 - 0.9;  // (-0.9, 0.9): inside asin's and erfinv's domains
  const Tensor positive = rand({n}, {}, &gen) * 10 + 0.1, other = randn({n}, {}, &gen);
  const Tensor positive64 = positive.to(kFloat64);
  NoGradGuard no_grad;
  report("tan_2^22", [&] { (void)tan(unit); });
  report("asin_2^22", [&] { (void)asin(unit); });
  report("atan_2^22", [&] { (void)atan(other); });
  report("sinh_2^22", [&] { (void)sinh(unit); });
  report("log2_2^22", [&] { (void)log2(positive); });
  report("erfc_2^22", [&] { (void)erfc(other); });
  report("erfinv_2^22", [&] { (void)erfinv(unit); });
  report("lgamma_2^22", [&] { (void)lgamma(positive); });
  report("digamma_2^22", [&] { (void)digamma(positive); });
  report("digamma_f64_2^22", [&] { (void)digamma(positive64); });
  report("polygamma1_2^22", [&] { (void)polygamma(1, positive); });
  report("atan2_2^22", [&] { (void)atan2(unit, other); });
  report("hypot_2^22", [&] { (void)hypot(unit, other); });
  report("logaddexp_2^22", [&] { (void)logaddexp(unit, other); });
  report("xlogy_2^22", [&] { (void)xlogy(other, positive); });
  const Tensor probability = unit / 2 + 0.5;  // (0.05, 0.95)
  report("i0_2^22", [&] { (void)special::i0(other); });
  report("i1e_2^22", [&] { (void)special::i1e(other); });
  const Tensor up_to_30 = positive * 3, other64 = other.to(kFloat64);  // (0.3, 30.3): both of I's series
  report("i0e_wide_2^22", [&] { (void)special::i0e(up_to_30); });
  report("i1_f64_2^22", [&] { (void)special::i1(other64); });
  report("erfcx_2^22", [&] { (void)special::erfcx(other); });
  report("ndtr_2^22", [&] { (void)special::ndtr(other); });
  report("log_ndtr_2^22", [&] { (void)special::log_ndtr(other); });
  report("ndtri_2^22", [&] { (void)special::ndtri(probability); });
  report("entr_2^22", [&] { (void)special::entr(positive); });
  report("xlog1py_2^22", [&] { (void)special::xlog1py(other, positive); });
  const Tensor shifted = positive + 1, flipped = flip(positive, {0});
  report("zeta_2^22", [&] { (void)special::zeta(shifted, positive); });
  report("gammainc_2^22", [&] { (void)special::gammainc(positive, flipped); });
  report("bessel_j0_2^22", [&] { (void)special::bessel_j0(positive); });
  report("bessel_y1_2^22", [&] { (void)special::bessel_y1(positive); });
  report("modified_bessel_k0_2^22", [&] { (void)special::modified_bessel_k0(positive); });
  report("spherical_bessel_j0_2^22", [&] { (void)special::spherical_bessel_j0(positive); });
  const Tensor wide = other * 4;  // Ai's three regions
  report("airy_ai_2^22", [&] { (void)special::airy_ai(wide); });
  report("chebyshev_t_n10_2^22", [&] { (void)special::chebyshev_polynomial_t(unit, 10); });
  report("chebyshev_t_n50_2^22", [&] { (void)special::chebyshev_polynomial_t(unit, 50); });
  report("chebyshev_u_n50_2^22", [&] { (void)special::chebyshev_polynomial_u(unit, 50); });
  report("hermite_h_n10_2^22", [&] { (void)special::hermite_polynomial_h(unit, 10); });
  report("legendre_p_n10_2^22", [&] { (void)special::legendre_polynomial_p(unit, 10); });
  report("laguerre_l_n10_2^22", [&] { (void)special::laguerre_polynomial_l(positive, 10); });
  return 0;
}
