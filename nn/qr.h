// nn/qr.h: Householder QR on the host in float64 (LAPACK's geqrf and orgqr), shared by
// nn::init::orthogonal_ and nn::utils::parametrizations::orthogonal.
#pragma once

#include <cstdint>
#include <vector>

namespace kiln::nn::detail {

// LAPACK's geqrf on a row-major m x n matrix (m >= n), in place: R in the upper triangle; below the
// diagonal of column j the vector v_j (v_j[j] = 1 implied), and tau[j] returned, so that with
// H_j = I - tau_j v_j v_j^T, A = H_0 ... H_{n-1} R. R's diagonal element is -sign(a_jj) |a[j:, j]|,
// which keeps v_j free of cancellation; a column already zero below its diagonal gets tau 0 (H = I).
std::vector<double> geqrf(std::vector<double>& a, int64_t m, int64_t n);

// The Q (row-major m x n) of A = QR, A row-major m x n (m >= n), with each column scaled by the sign
// of R's diagonal element (0 for 0): PyTorch's `q * sign(diag(r))`, the QR with a positive diagonal.
std::vector<double> q_factor(std::vector<double> a, int64_t m, int64_t n);

}  // namespace kiln::nn::detail
