// tests/cuda/test_cuda_op_table.cpp: the op table (tests/ops/op_table.h) on the GPU. Every case of every
// row runs with its inputs moved to cuda:0 in the case's layout (transposed, strided, expanded, permuted
// views stay views on the GPU), and each output must be on the GPU, with PyTorch's dtype and shape, and
// within DESIGN's tolerance of PyTorch's golden values: the same check the CPU passes in
// tests/ops/op_table.cpp. For every differentiable row, the float64 gradients of its grad cases (a fixed
// random cotangent on each floating output) must equal the CPU's to 1e-9. The factory rows take no inputs
// and make CPU tensors; the GPU's fill and arange are covered by tests/cuda/test_cuda.cpp.
#include "ops/op_table.h"
#include "support.h"

using namespace kiln;
using namespace kiln::test;
using autograd::TensorList;

namespace {

const Device kGpu = Device::cuda(0);

TensorList gpu_inputs(const GoldenCase& c) {
  const GoldenFile& file = GoldenFile::get();
  TensorList inputs;
  for (size_t k = 0; k < c.inputs.size(); ++k) {
    Tensor base = file.base_input(c, k).to(kGpu);
    inputs.push_back(GoldenFile::apply_layout(base, c.inputs[k].layout));
  }
  return inputs;
}

void check_golden_gpu(const OpRow& row, const GoldenCase& c) {
  INFO("case " << c.describe());
  try {
    check_outputs(row.fn(gpu_inputs(c), c), c, kGpu);
  } catch (const Catch::TestFailureException&) {
    throw;
  } catch (const std::exception& e) {
    FAIL_CHECK("threw: " << e.what());
  }
}

// The gradients of sum_k <out_k, cot_k> with respect to every floating input's stored base.
TensorList gradients(const OpRow& row, const GoldenCase& c, const TensorList& leaves) {
  TensorList views;
  for (size_t k = 0; k < leaves.size(); ++k) views.push_back(GoldenFile::apply_layout(leaves[k], c.inputs[k].layout));
  TensorList outs = row.fn(views, c);
  Generator g(1234);
  Tensor loss;
  for (const Tensor& out : outs) {
    if (!out.is_floating_point() || !out.requires_grad()) continue;
    Tensor cot = randn(out.sizes(), TensorOptions(out.dtype()), &g).to(out.device());
    Tensor term = (out * cot).sum();
    loss = loss.defined() ? loss + term : term;
  }
  TensorList grads;
  if (!loss.defined()) return grads;
  loss.backward();
  for (const Tensor& leaf : leaves) grads.push_back(leaf.requires_grad() ? leaf.grad() : Tensor());
  return grads;
}

void check_grad_gpu(const OpRow& row, const GoldenCase& c) {
  const GoldenFile& file = GoldenFile::get();
  INFO("gradients of case " << c.describe());
  try {
    TensorList cpu_leaves, gpu_leaves;
    for (size_t k = 0; k < c.inputs.size(); ++k) {
      Tensor base = file.base_input(c, k);
      Tensor on_gpu = base.to(kGpu);
      if (base.is_floating_point()) {
        base.requires_grad_();
        on_gpu.requires_grad_();
      }
      cpu_leaves.push_back(base);
      gpu_leaves.push_back(on_gpu);
    }
    TensorList expected = gradients(row, c, cpu_leaves), actual = gradients(row, c, gpu_leaves);
    REQUIRE(actual.size() == expected.size());
    for (size_t k = 0; k < actual.size(); ++k) {
      INFO("gradient of input " << k);
      REQUIRE(actual[k].defined() == expected[k].defined());
      if (!expected[k].defined()) continue;
      CHECK(actual[k].device() == kGpu);
      check_close(actual[k].cpu(), expected[k], Tolerance{1e-9, 1e-9});
    }
  } catch (const Catch::TestFailureException&) {
    throw;
  } catch (const std::exception& e) {
    FAIL_CHECK("threw: " << e.what());
  }
}

}  // namespace

TEST_CASE("op table on CUDA: every op matches PyTorch's golden values", "[gpu][op_table]") {
  int rows = 0;
  for (const auto& row : op_table()) {
    DYNAMIC_SECTION(row.op) {
      for (const auto* c : cases_of(row.op))
        if (!c->inputs.empty()) check_golden_gpu(row, *c);
    }
    ++rows;
  }
  CHECK(rows >= 100);
}

TEST_CASE("op table on CUDA: float64 gradients equal the CPU's", "[gpu][op_table][grad]") {
  for (const auto& row : op_table()) {
    if (row.deriv == Deriv::None) continue;
    DYNAMIC_SECTION(row.op) {
      int checked = 0;
      for (const auto* c : cases_of(row.op)) {
        if (c->grad_level() == 0 || c->inputs.empty()) continue;
        ++checked;
        check_grad_gpu(row, *c);
      }
      CHECK(checked > 0);
    }
  }
}
