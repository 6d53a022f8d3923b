// cpu/conv.cpp: 2-D convolution and its two backward kernels (not written yet).
#include "core/error.h"
#include "cpu/kernels.h"

namespace kiln::cpu {
void conv2d_kernel(const View&, const View&, const View&, const View&, const Conv2dArgs&) {
  KILN_FAIL("conv2d: not implemented yet");
}
void conv2d_backward_input_kernel(const View&, const View&, const View&, const Conv2dArgs&) {
  KILN_FAIL("conv2d_backward_input: not implemented yet");
}
void conv2d_backward_weight_kernel(const View&, const View&, const View&, const Conv2dArgs&) {
  KILN_FAIL("conv2d_backward_weight: not implemented yet");
}
}  // namespace kiln::cpu
