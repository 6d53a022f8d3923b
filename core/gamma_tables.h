// core/gamma_tables.h: the Chebyshev series of log Gamma that cpu/vector_special.cpp sums a block at a
// time (Note [log Gamma a block at a time]), written by scripts/gen_chebyshev_tables.py from mpmath's
// values (do not edit; rerun the script). The Chebyshev nodes never fall on z = 1 or 2, where the
// quotient's limits are Euler's gamma and 1 - gamma. Host only: T is double or a fixed-size Eigen array.
#pragma once

#include "core/bessel_tables.h"  // chebyshev_sum

namespace kiln::math {

// log Gamma(z) / ((z - 1) (z - 2)) for 1 <= z <= 3, t = z - 2: 31 terms (18 for a float32 result).
template <typename T>
inline T chebyshev_lgamma(const T& t, bool float32_result) {
  static constexpr double c[31] = {
      4.4148902545501421e-1, -1.1119580321752522e-1, 1.9510448260688841e-2,
      -3.9224614630252640e-3, 8.4789898959538574e-4, -1.9153855341365592e-4,
      4.4544701849756064e-5, -1.0572874373594300e-5, 2.5474336873408415e-6,
      -6.2085358807763160e-7, 1.5268677399071547e-7, -3.7826376602913261e-8,
      9.4281008236242844e-9, -2.3619997021846449e-9, 5.9435419058175461e-10,
      -1.5013129770728669e-10, 3.8050196458110537e-11, -9.6724852996563246e-12,
      2.4653481983556609e-12, -6.2988681407917115e-13, 1.6128460030283786e-13,
      -4.1379492068140421e-14, 1.0635701227757898e-14, -2.7382420786652825e-15,
      7.0606705072148925e-16, -1.8232177141662119e-16, 4.7141690067562716e-17,
      -1.2204107319639855e-17, 3.1630451661790254e-18, -8.2067465441667277e-19,
      2.1314428625638425e-19,
  };
  return chebyshev_sum(c, float32_result ? 18 : 31, t);
}

}  // namespace kiln::math
