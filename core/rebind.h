// core/rebind.h: rebind, Python's `module.weight = tensor` for a C++ handle that a layer keeps.
//
// A C++ layer reads its weight through its own member handle, which no one else can reassign. rebind
// changes what every holder of that handle sees: afterwards the handle's tensor is `value` (its data,
// its shape and its autograd history), and what it was (its data, gradient, hooks and accumulator) is
// gone from it. nn::utils::weight_norm puts the recomputed weight into the layer this way before each
// forward. Graphs recorded before are not changed: they saved an alias of what the handle held then
// (SavedTensor, core/tensor.cpp), not the handle (Note [a weight recomputed into the layer's handle] in
// nn/weight_norm.cpp).
#pragma once

#include "core/tensor.h"

namespace kiln {

void rebind(const Tensor& handle, const Tensor& value);

}  // namespace kiln
