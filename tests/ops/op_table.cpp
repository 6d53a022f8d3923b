// tests/ops/op_table.cpp: the table-driven op test (DESIGN.md §8). One row per op of ops/ops.h that computes
// values (the rows: op_rows.cpp); each row runs its cases from the golden fixture (tests/fixtures/op_golden.{txt,bin}, made with
// PyTorch by tests/fixtures/gen_golden.py): broadcast shapes, non-contiguous inputs (transposed, strided,
// expanded, permuted views), size-0 and size-1 dims, 0-d tensors, float32/float64 and, for many ops,
// float16/bfloat16 and integer dtypes, special values, and a few sizes that cross vector widths
// (72x73x74, 9x17x33, 7x37). Every output's dtype and shape must equal PyTorch's, and its values must be
// within DESIGN's tolerances of PyTorch's (computed in float64, rounded once to the result dtype).
// Every differentiable op also runs kiln::autograd::gradcheck in float64 (random cotangent) on the cases
// the fixture marks grad=1, and gradgradcheck on those marked grad=2 (the smooth ops).
#include <algorithm>
#include <functional>
#include <set>
#include <sstream>

#include "op_table.h"
#include "support.h"

namespace kiln::test {
namespace {

using autograd::TensorList;

// ---------------------------------------------------------------------------------------------------------
// Running a case

// Runs one case's forward and compares every output with PyTorch's: dtype, shape, then values.
void check_golden(const OpRow& row, const GoldenCase& c) {
  const GoldenFile& file = GoldenFile::get();
  INFO("case " << c.describe());
  try {
    TensorList inputs;
    for (size_t k = 0; k < c.inputs.size(); ++k) {
      Tensor x = file.input(c, k);
      // A layout that should make a view non-contiguous must do so (PyTorch agreed when the case was made).
      if (c.inputs[k].layout != "-" && x.numel() > 1) {
        INFO("input " << k << " with layout " << c.inputs[k].layout << ": strides " << x.strides().str());
        CHECK_FALSE(x.is_contiguous());
      }
      inputs.push_back(x);
    }
    check_outputs(row.fn(inputs, c), c);
  } catch (const Catch::TestFailureException&) {
    throw;
  } catch (const std::exception& e) {
    FAIL_CHECK("threw: " << e.what());
  }
}

// gradcheck (and gradgradcheck for grad=2) in float64 with respect to every floating input's stored base;
// the layout views are part of the function, so non-contiguous inputs are differentiated too.
void check_grad(const OpRow& row, const GoldenCase& c) {
  const GoldenFile& file = GoldenFile::get();
  INFO("gradcheck of case " << c.describe());
  try {
    TensorList leaves;
    for (size_t k = 0; k < c.inputs.size(); ++k) {
      Tensor base = file.base_input(c, k);
      if (base.is_floating_point()) {
        REQUIRE(base.dtype() == kFloat64);
        base.requires_grad_();
      }
      leaves.push_back(base);
    }
    const OpFn fn = row.fn;
    const GoldenCase* cp = &c;
    autograd::DifferentiableFn f = [fn, cp](const TensorList& xs) {
      TensorList views;
      for (size_t k = 0; k < xs.size(); ++k) views.push_back(GoldenFile::apply_layout(xs[k], cp->inputs[k].layout));
      return fn(views, *cp);
    };
    CHECK(autograd::gradcheck(f, leaves));
    if (c.grad_level() >= 2) CHECK(autograd::gradgradcheck(f, leaves));
  } catch (const Catch::TestFailureException&) {
    throw;
  } catch (const std::exception& e) {
    FAIL_CHECK("threw: " << e.what());
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// Test cases

TEST_CASE("op table: the fixture and the table agree (every op has cases, every case an op)", "[ops][op_table]") {
  const auto& cases = GoldenFile::get().cases();
  std::set<std::string> ops;
  for (const auto& r : op_table()) {
    INFO("row " << r.op);
    CHECK(ops.insert(r.op).second);  // one row per op
    auto mine = cases_of(r.op);
    CHECK(mine.size() >= 3);
    int max_grad = 0;
    for (const auto* c : mine) max_grad = std::max(max_grad, c->grad_level());
    // The table says which ops are differentiable; the fixture must give each its checks, and none to others.
    CHECK(max_grad == (r.deriv == Deriv::None ? 0 : r.deriv == Deriv::Grad ? 1 : 2));
  }
  std::set<std::string> ids;
  for (const auto& c : cases) {
    INFO("case " << c.id());
    CHECK(ids.insert(c.id()).second);
    if (c.op == "_sample") continue;
    CHECK(ops.count(c.op) == 1);
    CHECK(!c.outputs.empty());
  }
  CHECK(ops.size() >= 100);
  CHECK(cases.size() >= 1000);
}

TEST_CASE("op table: sample() makes the inputs gen_golden.py makes (bit for bit)", "[ops][op_table]") {
  for (const auto& c : GoldenFile::get().cases()) {
    if (c.op != "_sample") continue;
    Tensor expected = GoldenFile::get().output(c, 0);
    check_close(sample(expected.sizes(), kFloat64, c.real("seed")), expected, Tolerance{0, 0});
    return;
  }
  FAIL("op_golden.txt has no _sample case");
}

TEST_CASE("op table: every op matches PyTorch's golden values", "[ops][op_table]") {
  for (const auto& row : op_table()) {
    DYNAMIC_SECTION(row.op) {
      for (const auto* c : cases_of(row.op))
        check_golden(row, *c);
    }
  }
}

TEST_CASE("op table: gradcheck and gradgradcheck in float64 for every differentiable op", "[ops][op_table][grad]") {
  for (const auto& row : op_table()) {
    if (row.deriv == Deriv::None) continue;
    DYNAMIC_SECTION(row.op) {
      int checked = 0;
      for (const auto* c : cases_of(row.op)) {
        if (c->grad_level() == 0) continue;
        ++checked;
        check_grad(row, *c);
      }
      CHECK(checked > 0);
    }
  }
}


}  // namespace kiln::test
