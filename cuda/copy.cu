// cuda/copy.cu: the on-device kernels of copying: copy with dtype conversion between two views on
// one device (any strides, the source broadcast to the destination), fill and arange. Host <-> device
// and device <-> device transfers around them are in copy.cpp. CPU sibling: cpu/copy.cpp.
#include "cuda/context.h"
#include "cuda/kernels.h"
#include "cuda/loops.cuh"

namespace kiln::cuda {

// ---- launchers ----
// Every kernel here is elementwise_kernel (cuda/loops.cuh) with a per-element lambda below.

void copy_on_device(const View& src, const View& dst, const Stream& s) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  const auto calc = make_offset_calc<2>({&dst, &src});
  const void* x = src.data;
  const DType src_dtype = src.dtype;
  KILN_DISPATCH_ALL_TYPES(dst.dtype, "copy", [&] {
    scalar_t* y = dst.ptr<scalar_t>();
    launch_elementwise(n, calc, stream_of(s), [=] __device__(int64_t, const int64_t* o) {
      y[o[0]] = load_as<scalar_t>(x, o[1], src_dtype);
    });
  });
}

void fill_launch(const View& out, const Scalar& value, const Stream& s) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const auto calc = make_offset_calc<1>({&out});
  KILN_DISPATCH_ALL_TYPES(out.dtype, "fill", [&] {
    const scalar_t v = value.to<scalar_t>();
    scalar_t* y = out.ptr<scalar_t>();
    launch_elementwise(n, calc, stream_of(s),
                       [=] __device__(int64_t, const int64_t* o) { y[o[0]] = v; });
  });
}

void arange_launch(const View& out, double start, double step, const Stream& s) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const auto calc = make_offset_calc<1>({&out});
  KILN_DISPATCH_NUMERIC_TYPES(out.dtype, "arange", [&] {
    using M = opmath_t<scalar_t>;
    scalar_t* y = out.ptr<scalar_t>();
    launch_elementwise(n, calc, stream_of(s), [=] __device__(int64_t i, const int64_t* o) {
      y[o[0]] = static_cast<scalar_t>(static_cast<M>(start + static_cast<double>(i) * step));
    });
  });
}

}  // namespace kiln::cuda
