// cpu/random.cpp: uniform, normal, randint and bernoulli draws by the element mapping of
// Note [random element mapping] (core/generator.h): element i depends only on (seed, offset, i), so
// the split across threads does not change the numbers, and cuda/ computes the same ones.
#include <cmath>

#include "core/philox.h"
#include "cpu/kernels.h"
#include "cpu/loops.h"

namespace kiln::cpu {

void random_kernel(RandomKind kind, const View& out, uint64_t seed, uint64_t offset, double a,
                   double b) {
  KILN_CHECK(out.is_contiguous(), "random: the CPU kernel writes contiguous outputs only");
  KILN_DISPATCH_ALL_TYPES(out.dtype, "random", [&] {
    scalar_t* y = out.ptr<scalar_t>();
    parallel_for(0, out.numel(), kGrain / 4, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        uint32_t w0, w1;
        Philox4x32::element_words(seed, offset, static_cast<uint64_t>(i), w0, w1);
        double v = 0;
        switch (kind) {
          case RandomKind::Uniform:
            if constexpr (std::is_same_v<scalar_t, double>) {
              v = static_cast<double>((static_cast<uint64_t>(w0) << 21) ^ (w1 >> 11)) * 0x1.0p-53;
            } else {
              v = static_cast<double>(w0 >> 8) * 0x1.0p-24;
            }
            v = a + (b - a) * v;
            break;
          case RandomKind::Normal: {
            double u1 = static_cast<double>((w0 >> 8) + 1) * 0x1.0p-24;
            double u2 = static_cast<double>(w1 >> 8) * 0x1.0p-24;
            v = a + b * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
            break;
          }
          case RandomKind::Randint: {
            uint64_t word = (static_cast<uint64_t>(w0) << 32) | w1;
            auto range = static_cast<uint64_t>(b - a);
            v = a + static_cast<double>(word % range);
            break;
          }
          case RandomKind::Bernoulli: v = (static_cast<double>(w0 >> 8) * 0x1.0p-24) < a ? 1 : 0; break;
        }
        if constexpr (std::is_same_v<scalar_t, bool>) y[i] = v != 0;
        else y[i] = static_cast<scalar_t>(static_cast<opmath_t<scalar_t>>(v));
      }
    });
  });
}

}  // namespace kiln::cpu
