// cpu/pool.cpp: 2-D pooling kernels (not written yet).
#include "core/error.h"
#include "cpu/kernels.h"

namespace kiln::cpu {
void max_pool2d_kernel(const View&, const View&, const View&, const Pool2dArgs&) { KILN_FAIL("max_pool2d: not implemented yet"); }
void max_pool2d_backward_kernel(const View&, const View&, const View&) { KILN_FAIL("max_pool2d: not implemented yet"); }
void avg_pool2d_kernel(const View&, const View&, const Pool2dArgs&) { KILN_FAIL("avg_pool2d: not implemented yet"); }
void avg_pool2d_backward_kernel(const View&, const View&, const Pool2dArgs&) { KILN_FAIL("avg_pool2d: not implemented yet"); }
void adaptive_avg_pool2d_kernel(const View&, const View&) { KILN_FAIL("adaptive_avg_pool2d: not implemented yet"); }
void adaptive_avg_pool2d_backward_kernel(const View&, const View&) { KILN_FAIL("adaptive_avg_pool2d: not implemented yet"); }
}  // namespace kiln::cpu
