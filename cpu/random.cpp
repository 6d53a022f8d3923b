// cpu/random.cpp: uniform, normal, randint and bernoulli draws. Element i is random_value() of
// (seed, offset, args.draw_index(i)) (core/philox.h, Note [random element mapping] in
// core/generator.h; draw_index(i) is i for a whole draw): the split across threads does not change
// the numbers, and cuda/random.cu computes the same ones. All but randint take their words from
// Philox4x32::words8, 8 counters at a time.
#include "core/philox.h"
#include "core/convert.h"
#include "cpu/kernels.h"
#include "cpu/loops.h"

namespace kiln::cpu {

void random_kernel(RandomKind kind, const View& out, uint64_t seed, uint64_t offset,
                   const RandomArgs& args) {
  KILN_CHECK(out.is_contiguous(), "random: the CPU kernel writes contiguous outputs only");
  KILN_CHECK(kind != RandomKind::Randint || args.range > 0, "randint: the range is empty");
  KILN_DISPATCH_ALL_TYPES(out.dtype, "random", [&] {
    scalar_t* y = out.ptr<scalar_t>();
    constexpr bool kDouble = std::is_same_v<scalar_t, double>;
    parallel_for(0, out.numel(), kGrain / 4, [&](int64_t begin, int64_t end) {
      if (kind == RandomKind::Randint) {
        for (int64_t i = begin; i < end; ++i) {
          const uint64_t e = args.draw_index(static_cast<uint64_t>(i));
          y[i] = convert<scalar_t>(random_integer(seed, offset, e, args.low, args.range));
        }
        return;
      }
      // The words of 8 counters at a time (16 elements of a whole draw; a part's run may jump).
      uint32_t w[4][8];
      uint64_t first_counter = 0;
      bool made = false;
      for (int64_t i = begin; i < end; ++i) {
        const uint64_t e = args.draw_index(static_cast<uint64_t>(i)), counter = offset + e / 2;
        if (!made || counter - first_counter >= 8) {  // (below first_counter, the difference wraps)
          Philox4x32::words8(seed, counter, w);
          first_counter = counter;
          made = true;
        }
        const uint64_t c = counter - first_counter, k = 2 * (e % 2);  // words 0-1 or 2-3
        y[i] = convert<scalar_t>(random_value_of_words<kDouble>(kind, w[k][c], w[k + 1][c], args.a, args.b));
      }
    });
  });
}

}  // namespace kiln::cpu
