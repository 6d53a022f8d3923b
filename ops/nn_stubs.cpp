// ops/nn_stubs.cpp: the nn ops, declared; their implementations follow.
#include "ops/ops.h"

namespace kiln {
inline namespace ops {
Tensor conv2d(const Tensor&, const Tensor&, const Tensor&, const Shape&, const Shape&, const Shape&, int64_t) { KILN_FAIL("conv2d: not implemented yet"); }
Tensor conv1d(const Tensor&, const Tensor&, const Tensor&, int64_t, int64_t, int64_t, int64_t) { KILN_FAIL("conv1d: not implemented yet"); }
Tensor conv2d_backward_input(const Tensor&, const Tensor&, const Shape&, const Shape&, const Shape&, const Shape&, int64_t) { KILN_FAIL("conv2d_backward_input: not implemented yet"); }
Tensor conv2d_backward_weight(const Tensor&, const Tensor&, const Shape&, const Shape&, const Shape&, const Shape&, int64_t) { KILN_FAIL("conv2d_backward_weight: not implemented yet"); }
Tensor max_pool2d(const Tensor&, const Shape&, const Shape&, const Shape&, const Shape&, bool) { KILN_FAIL("max_pool2d: not implemented yet"); }
std::tuple<Tensor, Tensor> max_pool2d_with_indices(const Tensor&, const Shape&, const Shape&, const Shape&, const Shape&, bool) { KILN_FAIL("max_pool2d: not implemented yet"); }
Tensor avg_pool2d(const Tensor&, const Shape&, const Shape&, const Shape&, bool, bool, std::optional<int64_t>) { KILN_FAIL("avg_pool2d: not implemented yet"); }
Tensor adaptive_avg_pool2d(const Tensor&, const Shape&) { KILN_FAIL("adaptive_avg_pool2d: not implemented yet"); }
Tensor batch_norm(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool, double, double) { KILN_FAIL("batch_norm: not implemented yet"); }
Tensor layer_norm(const Tensor&, const Shape&, const Tensor&, const Tensor&, double) { KILN_FAIL("layer_norm: not implemented yet"); }
Tensor rms_norm(const Tensor&, const Shape&, const Tensor&, std::optional<double>) { KILN_FAIL("rms_norm: not implemented yet"); }
Tensor group_norm(const Tensor&, int64_t, const Tensor&, const Tensor&, double) { KILN_FAIL("group_norm: not implemented yet"); }
Tensor dropout(const Tensor&, double, bool, Generator*) { KILN_FAIL("dropout: not implemented yet"); }
}  // namespace ops
}  // namespace kiln
