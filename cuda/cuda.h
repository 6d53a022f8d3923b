// cuda/cuda.h: the CUDA backend's entry points. Built without CUDA (cuda/stub.cpp), is_available()
// is false and everything else throws an Error saying how to build with CUDA.
#pragma once

#include "core/backend.h"

namespace kiln::cuda {

bool is_available();  // a CUDA device is present and the driver works
int device_count();
void synchronize(int device_index = 0);
// float32 matmuls on TF32 tensor cores (10-bit mantissa inputs, float32 accumulation): off by default,
// as torch.backends.cuda.matmul.allow_tf32 is. Process-wide.
void set_matmul_allow_tf32(bool allow);
bool matmul_allow_tf32();
Backend& backend();   // for ops/dispatch.cpp

}  // namespace kiln::cuda
