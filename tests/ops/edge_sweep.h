// tests/ops/edge_sweep.h: odd inputs (no elements, 0-dimensional, strided, expanded, every dtype,
// NaN and inf, out-of-range indices, undefined) and a few hundred ops called on them, one or every
// pair at a time. tests/ops/test_edge_inputs.cpp runs them on the CPU, where each call must return a
// tensor or raise a kiln::Error; tests/cuda/test_cuda_edge_inputs.cpp runs them on a GPU against the CPU.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "ops/ops.h"

namespace kiln::test {

struct EdgeInput {
  const char* name;
  std::function<Tensor()> make;  // on the CPU
};
std::vector<EdgeInput> edge_inputs();

struct EdgeOp {
  std::string name;
  bool binary;  // takes both inputs; else only the first
  std::function<Tensor(const Tensor&, const Tensor&)> call;
  bool device_specific = false;  // draws random numbers or prints the device: not compared across devices
};
std::vector<EdgeOp> edge_ops();

}  // namespace kiln::test
