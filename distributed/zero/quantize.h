// distributed/zero/quantize.h: ZeRO++'s block quantization, shared by its quantized weights (qwZ,
// param_gatherer.cpp) and quantized gradients (qgZ, grad_reducer.cpp).
//
// A 1-D floating tensor is cut into blocks of kQuantBlock elements from its start (the last block
// padded with zeros); each block gets a float32 scale s = max |x| / 127 (0 for a block of zeros)
// and int8 values q = x / s rounded to nearest, halves away from zero, so |x - q s| <= s / 2. A
// tensor of n elements travels as n bytes and 4 ceil(n / kQuantBlock) more: a quarter of float32,
// about half of a 16-bit dtype.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace kiln::distributed {

inline constexpr int64_t kQuantBlock = 2048;

// ceil(n / kQuantBlock): how many scales n elements have.
inline int64_t quant_blocks(int64_t n) { return (n + kQuantBlock - 1) / kQuantBlock; }

struct Quantized {
  Tensor q;       // int8, x's elements
  Tensor scales;  // float32, quant_blocks(x.numel())
};
// x: 1-D, floating, any device; q and scales on x's device.
Quantized quantize_blocks(const Tensor& x);
// out = q s, block by block (out: q's elements, any floating dtype).
void dequantize_into(const Tensor& q, const Tensor& scales, Tensor out);
// q s in float32.
Tensor dequantize(const Tensor& q, const Tensor& scales);

}  // namespace kiln::distributed
