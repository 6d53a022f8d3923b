// tests/ops/op_table.h: the op table (DESIGN.md §8), one row per op of ops/ops.h that computes values,
// each a function of a golden case's inputs and arguments (tests/ops/golden_fixture.h). The rows are in
// op_rows.cpp; tests/ops/op_table.cpp checks them on the CPU against PyTorch's values and with gradcheck,
// tests/cuda/test_cuda_op_table.cpp on the GPU against the same values and the CPU's gradients.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "golden_fixture.h"

namespace kiln::test {

enum class Deriv { None, Grad, GradGrad };  // not differentiable | gradcheck | gradcheck and gradgradcheck

using OpFn = std::function<autograd::TensorList(const autograd::TensorList&, const GoldenCase&)>;
struct OpRow {
  std::string op;
  Deriv deriv;
  OpFn fn;
};

const std::vector<OpRow>& op_table();

// The cases of `op` in the fixture, in file order.
std::vector<const GoldenCase*> cases_of(const std::string& op);

// Compares a row's outputs for case c with PyTorch's: count, dtype, shape, then values within
// DESIGN's tolerance of the expected dtype (integer and bool results exact); with `device`, each
// output must also be on it.
void check_outputs(const autograd::TensorList& outs, const GoldenCase& c, std::optional<Device> device = {});

}  // namespace kiln::test
