// cpu/norm.cpp: row normalisation (not written yet).
#include "core/error.h"
#include "cpu/kernels.h"

namespace kiln::cpu {
void norm_rows_kernel(const View&, const View&, const View&, const View&, double, bool) {
  KILN_FAIL("norm: not implemented yet");
}
}  // namespace kiln::cpu
