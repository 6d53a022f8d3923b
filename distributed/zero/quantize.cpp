// distributed/zero/quantize.cpp: see quantize.h. Composed of tensor ops, so it runs on any device.
#include "distributed/zero/quantize.h"

#include "ops/ops.h"

namespace kiln::distributed {
namespace {
// x (1-D) as rows of kQuantBlock elements, zeros after its end.
Tensor padded_blocks(const Tensor& x) {
  const int64_t n = x.numel(), pad = quant_blocks(n) * kQuantBlock - n;
  const Tensor whole = pad == 0 ? x : cat({x, zeros({pad}, TensorOptions(x.dtype()).device(x.device()))});
  return whole.view({quant_blocks(n), kQuantBlock});
}
}  // namespace

Quantized quantize_blocks(const Tensor& x) {
  const auto on = [&](DType d) { return TensorOptions(d).device(x.device()); };
  if (x.numel() == 0) return {empty({0}, on(kInt8)), empty({0}, on(kFloat32))};
  const Tensor blocks = padded_blocks(x.to(kFloat32));
  const Tensor scales = amax(blocks.abs(), {1}) / 127.0;
  Tensor y = blocks / where(scales.gt(0), scales, 1.0).unsqueeze(1);
  // A block with an inf or a NaN (a float16 overflow) has a non-finite scale, which keeps its values
  // non-finite when dequantized (q s); its q are 0, as a NaN has no int8 (the conversion is undefined).
  y = where(y.isfinite(), y, 0.0);
  // The conversion to int8 truncates: adding half the sign first rounds halves away from zero.
  const Tensor q = clamp(y + y.sign() * 0.5, -127, 127).to(kInt8);
  return {q.view({-1}).narrow(0, 0, x.numel()).contiguous(), scales};
}

Tensor dequantize(const Tensor& q, const Tensor& scales) {
  if (q.numel() == 0) return empty({0}, TensorOptions(kFloat32).device(q.device()));
  const Tensor blocks = padded_blocks(q.to(kFloat32)) * scales.unsqueeze(1);
  return blocks.view({-1}).narrow(0, 0, q.numel());
}

void dequantize_into(const Tensor& q, const Tensor& scales, Tensor out) {
  if (q.numel() == 0) return;
  out.copy_(dequantize(q, scales));
}

}  // namespace kiln::distributed
