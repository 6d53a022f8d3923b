// cpu/copy.cpp: copy with dtype conversion (strided, broadcasting), fill and arange.
#include <cstring>

#include "core/convert.h"
#include "cpu/kernels.h"
#include "cpu/loops.h"

namespace kiln::cpu {

void copy_kernel(const View& src, const View& dst) {
  if (src.dtype == dst.dtype && src.is_contiguous() && dst.is_contiguous() &&
      src.sizes == dst.sizes) {
    int64_t bytes = dst.numel() * itemsize(dst.dtype);
    parallel_for(0, bytes, 1 << 20, [&](int64_t b, int64_t e) {
      std::memcpy(static_cast<char*>(dst.data) + b, static_cast<const char*>(src.data) + b,
                  static_cast<size_t>(e - b));
    });
    return;
  }
  StridedLoop<2> loop({&dst, &src});
  KILN_DISPATCH_ALL_TYPES(dst.dtype, "copy", [&] {
    using dst_t = scalar_t;
    KILN_DISPATCH_ALL_TYPES(src.dtype, "copy", [&] {
      using src_t = scalar_t;
      loop.parallel_run([](char* const* p, const int64_t* s, int64_t n) {
        if (s[0] == static_cast<int64_t>(sizeof(dst_t)) && s[1] == static_cast<int64_t>(sizeof(src_t))) {
          // A contiguous run (any cast of contiguous tensors, such as autocast's): a plain loop over
          // arrays, which the compiler vectorizes. On 2^21 float32 elements here: to bfloat16 1.39
          // -> 0.16 ms, back 0.56 -> 0.14 ms, to float16 1.10 -> 0.29 ms.
          dst_t* d = reinterpret_cast<dst_t*>(p[0]);
          const src_t* x = reinterpret_cast<const src_t*>(p[1]);
          for (int64_t i = 0; i < n; ++i) d[i] = convert<dst_t>(x[i]);
          return;
        }
        char* d = p[0];
        const char* x = p[1];
        for (int64_t i = 0; i < n; ++i) {
          *reinterpret_cast<dst_t*>(d + i * s[0]) =
              convert<dst_t>(*reinterpret_cast<const src_t*>(x + i * s[1]));
        }
      });
    });
  });
}

void fill_kernel(const View& out, const Scalar& value) {
  StridedLoop<1> loop({&out});
  KILN_DISPATCH_ALL_TYPES(out.dtype, "fill", [&] {
    const scalar_t v = value.to<scalar_t>();
    loop.parallel_run([v](char* const* p, const int64_t* s, int64_t n) {
      if (s[0] == static_cast<int64_t>(sizeof(scalar_t))) {
        scalar_t* d = reinterpret_cast<scalar_t*>(p[0]);
        for (int64_t i = 0; i < n; ++i) d[i] = v;
      } else {
        for (int64_t i = 0; i < n; ++i) *reinterpret_cast<scalar_t*>(p[0] + i * s[0]) = v;
      }
    });
  });
}

void arange_kernel(const View& out, double start, double step) {
  KILN_DISPATCH_NUMERIC_TYPES(out.dtype, "arange", [&] {
    scalar_t* d = out.ptr<scalar_t>();
    parallel_for(0, out.numel(), kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        d[i] = static_cast<scalar_t>(static_cast<opmath_t<scalar_t>>(start + static_cast<double>(i) * step));
      }
    });
  });
}

}  // namespace kiln::cpu
