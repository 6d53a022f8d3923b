// bench_linalg: the host linear algebra of ops/solve.cpp, ops/decompose.cpp, ops/lu.cpp, ops/svd.cpp
// and linalg::matrix_exp on the CPU, for the small matrices it is meant for and larger ones:
// linalg::solve, inv, det, cholesky, solve_triangular, cholesky_solve, eigh, qr, ops/lu.cpp's lu_factor
// and lu_solve, matrix_exp, and ops/svd.cpp's svd (reduced), svdvals, pinv and lstsq (driver gelsd)
// over a batch of 256 8 x 8 float64 matrices (8 right-hand sides); solve, cholesky, eigh, qr,
// lu_factor, lu_solve, matrix_exp, svd, svdvals, pinv and lstsq of one 128 x 128 matrix; svd, svdvals
// and lstsq of one 1024 x 64 matrix (8 right-hand sides). ms: the median of 7 runs after 2 warm-up
// runs. One JSON line per result. Its PyTorch counterpart: benchmarks/torch_linalg.py (same shapes,
// parts and timing rule; PyTorch calls LAPACK, Kiln its own loops, one matrix at a time).
// Usage: bench_linalg [threads] (default 2).
#include <kiln/kiln.h>

#include <cstdio>
#include <functional>
#include <string>

#include "bench_util.h"

using namespace kiln;

int main(int argc, char** argv) {
  const int threads = kiln_bench::threads_arg(argc, argv);
  if (threads == 0) return 2;
  set_num_threads(threads);
  auto report = [&](const std::string& part, const std::function<void()>& fn) {
    kiln_bench::report_cpu_part("linalg", threads, part, fn);
  };
  Generator gen(0);
  const TensorOptions f64(kFloat64);
  NoGradGuard no_grad;
  for (int64_t n : {8, 128}) {
    const int64_t batch = n == 8 ? 256 : 1;
    const std::string tag = n == 8 ? "256x8x8" : "128x128";
    const Tensor x = randn({batch, n, n}, f64, &gen), b = randn({batch, n, 8}, f64, &gen);
    const Tensor a = x + eye(n, {}, f64) * static_cast<double>(n);  // well-conditioned
    const Tensor spd = matmul(x, x.mT()) + eye(n, {}, f64) * static_cast<double>(n);
    const Tensor l = linalg::cholesky(spd);
    report("solve_" + tag, [&] { (void)linalg::solve(a, b); });
    if (n == 8) report("inv_" + tag, [&] { (void)linalg::inv(a); });
    if (n == 8) report("det_" + tag, [&] { (void)linalg::det(a); });
    report("cholesky_" + tag, [&] { (void)linalg::cholesky(spd); });
    if (n == 8) report("solve_triangular_" + tag, [&] { (void)linalg::solve_triangular(l, b, false); });
    if (n == 8) report("cholesky_solve_" + tag, [&] { (void)cholesky_solve(b, l); });
    report("eigh_" + tag, [&] { (void)linalg::eigh(spd); });
    report("qr_" + tag, [&] { (void)linalg::qr(a); });
    auto [lu, pivots] = linalg::lu_factor(a);
    report("lu_factor_" + tag, [&] { (void)linalg::lu_factor(a); });
    report("lu_solve_" + tag, [&] { (void)linalg::lu_solve(lu, pivots, b); });
    report("matrix_exp_" + tag, [&] { (void)linalg::matrix_exp(x); });
    report("svd_" + tag, [&] { (void)linalg::svd(x, false); });
    report("svdvals_" + tag, [&] { (void)linalg::svdvals(x); });
    report("pinv_" + tag, [&] { (void)linalg::pinv(x); });
    report("lstsq_" + tag, [&] { (void)linalg::lstsq(x, b, {}, "gelsd"); });
  }
  // A tall matrix, as in a least-squares fit: 1024 x 64.
  const Tensor tall = randn({1024, 64}, f64, &gen), rhs = randn({1024, 8}, f64, &gen);
  report("svd_1024x64", [&] { (void)linalg::svd(tall, false); });
  report("svdvals_1024x64", [&] { (void)linalg::svdvals(tall); });
  report("lstsq_1024x64", [&] { (void)linalg::lstsq(tall, rhs, {}, "gelsd"); });
  return 0;
}
