// cuda/random.cu: random draws. Element i is random_value() of (seed, offset, args.draw_index(i))
// (core/philox.h, Note [random element mapping] in core/generator.h), the very function
// cpu/random.cpp uses, so a seed gives the same tensor on both devices (bit for bit for integers,
// bools and float32 uniforms; normals and float64 uniforms may differ in the last bit, since the
// GPU's log/sqrt/cos are not glibc's). CPU sibling: cpu/random.cpp.
#include <type_traits>

#include "core/philox.h"
#include "cuda/context.h"
#include "cuda/kernels.h"
#include "cuda/loops.cuh"

namespace kiln::cuda {

void random_launch(RandomKind kind, const View& out, uint64_t seed, uint64_t offset,
                   const RandomArgs& args, const Stream& s) {
  const int64_t n = out.numel();
  if (n == 0) return;
  KILN_CHECK(kind != RandomKind::Randint || args.range > 0, "randint: the range is empty");
  // Element i is the i-th in row-major order of out, whatever out's strides.
  const auto calc = make_offset_calc<1>({&out});
  const RandomArgs where = args;  // its draw_index(), by value into the kernels
  KILN_DISPATCH_ALL_TYPES(out.dtype, "random", [&] {
    scalar_t* y = out.ptr<scalar_t>();
    if (kind == RandomKind::Randint) {
      const int64_t low = args.low;
      const uint64_t range = args.range;
      launch_elementwise(n, calc, stream_of(s), [=] __device__(int64_t i, const int64_t* o) {
        const int64_t v = random_integer(seed, offset, where.draw_index(static_cast<uint64_t>(i)), low, range);
        y[o[0]] = static_cast<scalar_t>(static_cast<opmath_t<scalar_t>>(v));
      });
      return;
    }
    const double a = args.a, b = args.b;
    launch_elementwise(n, calc, stream_of(s), [=] __device__(int64_t i, const int64_t* o) {
      const uint64_t e = where.draw_index(static_cast<uint64_t>(i));
      const double v = random_value<std::is_same_v<scalar_t, double>>(kind, seed, offset, e, a, b);
      y[o[0]] = static_cast<scalar_t>(static_cast<opmath_t<scalar_t>>(v));
    });
  });
}

}  // namespace kiln::cuda
