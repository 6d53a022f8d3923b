// cpu/cpu.h: the CPU backend's entry point. ops/dispatch.cpp calls cpu::backend() for CPU tensors.
#pragma once

#include "core/backend.h"
#include "cpu/parallel.h"

namespace kiln::cpu {

Backend& backend();

}  // namespace kiln::cpu
