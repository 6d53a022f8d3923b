// cuda/cuda.h: the CUDA backend's entry points. Built without CUDA (cuda/stub.cpp), is_available()
// is false and everything else throws an Error saying how to build with CUDA.
#pragma once

#include "core/backend.h"

namespace kiln::cuda {

bool is_available();  // a CUDA device is present and the driver works
int device_count();
void synchronize(int device_index = 0);
Backend& backend();   // for ops/dispatch.cpp

}  // namespace kiln::cuda
