// nn/qr.h: Householder QR on the host in float64, shared by nn::init::orthogonal_ and
// nn::utils::parametrizations::orthogonal (Note [orthogonal_ by Householder QR] in nn/init.cpp).
#pragma once

#include <cstdint>
#include <vector>

namespace kiln::nn::init::detail {

// The Q (m x n, column j at q[j * m]) of A = QR with R's diagonal positive, for A m x n (m >= n),
// column j at a[j * m].
std::vector<double> orthonormal_columns(std::vector<double> a, int64_t m, int64_t n);

}  // namespace kiln::nn::init::detail
