#!/usr/bin/python3
# scripts/gen_chebyshev_tables.py: the Chebyshev coefficients of core/bessel_math.h's tables and of
# cpu/vector_special.cpp's log Gamma, computed with mpmath at 50 digits (Debian's python3-mpmath). Each
# table is the Chebyshev interpolant of a smooth function on [-1, 1] at 80 Chebyshev points (its
# coefficients are then the series' to far below float64's rounding), cut where the terms left add up
# to less than 1e-18 of the function's smallest value there, and written out as a function holding its
# array (c_0 halved: f(t) = sum_k c_k T_k(t)), with the shorter sum a float32 result needs (1e-11 of
# that value).
# The Airy function Ai and its derivative are Bessel functions of order 1/3 and 2/3; their tables are
# here too. log Gamma's table goes to its own header, core/gamma_tables.h, which only the CPU's block
# functions include. Usage: /usr/bin/python3 scripts/gen_chebyshev_tables.py (rewrites both headers).
import mpmath as mp

mp.mp.dps = 50
NODES = 80


def chebyshev(f, scale=None):
    ts = [mp.cos(mp.pi * (k + mp.mpf(1) / 2) / NODES) for k in range(NODES)]
    fs = [f(t) for t in ts]
    c = [2 * mp.fsum(fs[k] * mp.cos(mp.pi * j * (k + mp.mpf(1) / 2) / NODES) for k in range(NODES)) / NODES
         for j in range(NODES)]
    c[0] /= 2
    smallest = min(abs(v) for v in fs) if scale is None else mp.mpf(scale)
    n = NODES
    while n > 1 and mp.fsum(abs(v) for v in c[n - 1:]) < mp.mpf("1e-18") * smallest:
        n -= 1
    return c[:n + 1], smallest


def emit(out, name, doc, f, scale=None, host_only=False):
    """scale: what the cut is relative to, where not the function's smallest value (which nears 0 for a
    function with a zero, or one that is itself a small correction, measured absolutely). host_only: a
    function for the host alone, its table static."""
    c, smallest = chebyshev(f, scale)
    n32 = len(c)
    while n32 > 1 and mp.fsum(abs(v) for v in c[n32 - 1:]) < mp.mpf("1e-11") * smallest:
        n32 -= 1
    out.append("// %s: %d terms (%d for a float32 result)." % (doc, len(c), n32))
    out.append("template <typename T>")
    device = "" if host_only else "KILN_HOST_DEVICE "
    out.append("%sinline T %s(const T& t, bool float32_result) {" % (device, name))
    out.append("  %s double c[%d] = {" % ("static constexpr" if host_only else "KILN_BESSEL_TABLE", len(c)))
    for k in range(0, len(c), 3):
        out.append("      " + ", ".join(mp.nstr(v, 17, strip_zeros=False, min_fixed=0, max_fixed=0)
                                       for v in c[k:k + 3]) + ",")
    out.append("  };")
    out.append("  return chebyshev_sum(c, float32_result ? %d : %d, t);" % (n32, len(c)))
    out.append("}")
    out.append("")


def hankel_pq(nu, x):
    """P and x Q of Hankel's form J = sqrt(2 / pi x) (P cos chi - Q sin chi), Y = ... (P sin chi + Q cos chi)."""
    chi = x - (mp.mpf(nu) / 2 + mp.mpf(1) / 4) * mp.pi
    j, y = mp.besselj(nu, x), mp.bessely(nu, x)
    s = mp.sqrt(mp.pi * x / 2)
    return s * (j * mp.cos(chi) + y * mp.sin(chi)), s * (y * mp.cos(chi) - j * mp.sin(chi)) * x


AIRY_X0 = 2  # the middle series covers [-2, 2], the modulus-and-phase forms |x| >= 2


def airy_zeta(x):
    return 2 * x * mp.sqrt(x) / 3


def airy_x(t):  # |x| >= 2 from t = 2 u - 1, u = zeta(2) / zeta(|x|) in (0, 1]
    return AIRY_X0 * (2 / (t + 1)) ** (mp.mpf(2) / 3)


def airy_positive(t, d):
    """Ai(x) = e^-zeta / (2 sqrt(pi) x^(1/4)) f and Ai'(x) = -x^(1/4) e^-zeta / (2 sqrt pi) f: f."""
    x = airy_x(t)
    return (-1) ** d * mp.airyai(x, d) * 2 * mp.sqrt(mp.pi) * x ** (mp.mpf(1 - 2 * d) / 4) * mp.exp(airy_zeta(x))


def airy_negative(t, d):
    """Ai(-x) = M x^(-1/4) / sqrt(pi) cos(zeta - pi/4 + theta), Ai'(-x) = N x^(1/4) / sqrt(pi)
    sin(zeta - pi/4 + theta'): (M, theta) for d = 0, (N, theta') for d = 1, from Ai and Bi."""
    x = airy_x(t)
    a, b = mp.airyai(-x, d), mp.airybi(-x, d)
    modulus = mp.sqrt(a * a + b * b) * mp.sqrt(mp.pi) * x ** (mp.mpf(1 - 2 * d) / 4)
    phase = (mp.atan2(-b, a) if d == 0 else mp.atan2(a, b)) - (airy_zeta(x) - mp.pi / 4)
    return modulus, phase - 2 * mp.pi * mp.nint(phase / (2 * mp.pi))


def x_of_w(t):  # x >= 8 from t = 2 w - 1, w = 64 / x^2 in (0, 1]
    return mp.sqrt(64 / ((t + 1) / 2))


HEADER = """// core/bessel_tables.h: the Chebyshev series of core/bessel_math.h, written by
// scripts/gen_chebyshev_tables.py from mpmath's values (do not edit; rerun the script). Each function sums
// its series at t in [-1, 1] by Clenshaw's recurrence, all of it for a float64 result, the terms a
// float32 result needs otherwise. T is double, or on the CPU a fixed-size Eigen array of them, whose
// lanes then sum their series side by side (cpu/vector_special.cpp).
#pragma once

#include "core/half.h"

namespace kiln::math {

// On the host the tables are static, built once; a device function's statics would need device memory,
// so there each call builds its table (in registers or local memory).
#if defined(__CUDA_ARCH__)
#define KILN_BESSEL_TABLE constexpr
#else
#define KILN_BESSEL_TABLE static constexpr
#endif

// sum_{k < n} c_k T_k(t) by Clenshaw's recurrence. (b1 starts as 0 * t, which is 0 for the t in
// [-1, 1] it is called with, written so because an Eigen array has no conversion from 0.0.)
template <typename T>
KILN_HOST_DEVICE inline T chebyshev_sum(const double* c, int n, const T& t) {
  T b1 = 0.0 * t, b2 = b1;
  const T t2 = 2.0 * t;
  for (int k = n - 1; k >= 1; --k) {
    const T b0 = c[k] + t2 * b1 - b2;
    b2 = b1;
    b1 = b0;
  }
  return c[0] + t * b1 - b2;
}

"""

GAMMA_HEADER = """// core/gamma_tables.h: the Chebyshev series of log Gamma that cpu/vector_special.cpp sums a block at a
// time (Note [log Gamma a block at a time]), written by scripts/gen_chebyshev_tables.py from mpmath's
// values (do not edit; rerun the script). The Chebyshev nodes never fall on z = 1 or 2, where the
// quotient's limits are Euler's gamma and 1 - gamma. Host only: T is double or a fixed-size Eigen array.
#pragma once

#include "core/bessel_tables.h"  // chebyshev_sum

namespace kiln::math {

"""

if __name__ == "__main__":
    import os
    out = [HEADER.rstrip("\n"), ""]
    for nu in (0, 1):
        emit(out, "chebyshev_k%d" % nu, "sqrt(x) e^x K%d(x) for x >= 1, t = 2 / x - 1" % nu,
             lambda t, nu=nu: (lambda x: mp.sqrt(x) * mp.exp(x) * mp.besselk(nu, x))(2 / (t + 1)))
    for nu in (0, 1):
        emit(out, "chebyshev_i%d_small" % nu,
             "e^-x I%d(x)%s for 0 <= x <= 8, t = x / 4 - 1" % (nu, " / x" if nu else ""),
             lambda t, nu=nu: (lambda x: mp.exp(-x) * mp.besseli(nu, x) / x ** nu)(4 * (t + 1)))
        emit(out, "chebyshev_i%d_large" % nu, "sqrt(x) e^-x I%d(x) for x >= 8, t = 16 / x - 1" % nu,
             lambda t, nu=nu: (lambda x: mp.sqrt(x) * mp.exp(-x) * mp.besseli(nu, x))(16 / (t + 1)))
    for nu in (0, 1):
        emit(out, "chebyshev_j%d_middle" % nu, "J%d(x) for 2 <= x <= 8, t = (x - 5) / 3" % nu,
             lambda t, nu=nu: mp.besselj(nu, 5 + 3 * t))
        emit(out, "chebyshev_y%d_middle" % nu, "Y%d(x) for 2 <= x <= 8, t = (x - 5) / 3" % nu,
             lambda t, nu=nu: mp.bessely(nu, 5 + 3 * t))
    for nu in (0, 1):
        emit(out, "chebyshev_p%d" % nu, "Hankel's P%d(x) for x >= 8, t = 128 / x^2 - 1" % nu,
             lambda t, nu=nu: hankel_pq(nu, x_of_w(t))[0])
        emit(out, "chebyshev_xq%d" % nu, "x times Hankel's Q%d(x) for x >= 8, t = 128 / x^2 - 1" % nu,
             lambda t, nu=nu: hankel_pq(nu, x_of_w(t))[1])
    for d, what in ((0, "Ai"), (1, "Ai'")):
        name = "prime_" if d else ""
        # Ai' has a zero at -1.0188: its cut is against 1e-2, below its values elsewhere there.
        emit(out, "chebyshev_airy_%smiddle" % name, "%s(x) for -2 <= x <= 2, t = x / 2" % what,
             lambda t, d=d: mp.airyai(2 * t, d), scale=None if d == 0 else "1e-2")
        emit(out, "chebyshev_airy_%spositive" % name,
             "%s(x) e^zeta 2 sqrt(pi) x^(%s1/4), x >= 2, t = 2 (2 / x)^(3/2) - 1" % (what, "-" if d else ""),
             lambda t, d=d: airy_positive(t, d))
        emit(out, "chebyshev_airy_%smodulus" % name,
             "the modulus %s (Note [the Airy function]), x <= -2, t = 2 (2 / |x|)^(3/2) - 1" % ("N" if d else "M"),
             lambda t, d=d: airy_negative(t, d)[0])
        emit(out, "chebyshev_airy_%sphase" % name,
             "the phase %s, x <= -2, t = 2 (2 / |x|)^(3/2) - 1 (cut absolutely)" % ("phi" if d else "theta"),
             lambda t, d=d: airy_negative(t, d)[1], scale=1)
    out.append("#undef KILN_BESSEL_TABLE")
    out.append("")
    out.append("}  // namespace kiln::math")
    core = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "core")
    with open(os.path.join(core, "bessel_tables.h"), "w") as f:
        f.write("\n".join(out) + "\n")
    out = [GAMMA_HEADER.rstrip("\n"), ""]
    emit(out, "chebyshev_lgamma", "log Gamma(z) / ((z - 1) (z - 2)) for 1 <= z <= 3, t = z - 2",
         lambda t: (lambda z: mp.loggamma(z) / ((z - 1) * (z - 2)))(2 + t), host_only=True)
    out.append("}  // namespace kiln::math")
    with open(os.path.join(core, "gamma_tables.h"), "w") as f:
        f.write("\n".join(out) + "\n")
