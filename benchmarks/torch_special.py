#!/usr/bin/python3
# benchmarks/torch_special.py: PyTorch's side of bench_special.cpp (same shapes, distributions, parts and
# timing rule: median of 7 runs after 2 warm-up runs), for Debian's /usr/bin/python3 with torch.
# Usage: /usr/bin/python3 benchmarks/torch_special.py [threads] (default 2).
import json
import sys

import torch
import torch_timing

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
torch.set_num_threads(threads)


def report(part, fn):
    ms = torch_timing.median_ms(fn, 2, 7)
    print(json.dumps({"bench": "special", "impl": "torch " + torch.__version__, "device": "cpu",
                      "threads": threads, "part": part, "ms": round(ms, 3)}), flush=True)


torch.manual_seed(0)
n = 1 << 22
unit = torch.rand(n) * 1.8 - 0.9
positive, other = torch.rand(n) * 10 + 0.1, torch.randn(n)
positive64 = positive.double()
with torch.no_grad():
    report("tan_2^22", lambda: torch.tan(unit))
    report("asin_2^22", lambda: torch.asin(unit))
    report("atan_2^22", lambda: torch.atan(other))
    report("sinh_2^22", lambda: torch.sinh(unit))
    report("log2_2^22", lambda: torch.log2(positive))
    report("erfc_2^22", lambda: torch.erfc(other))
    report("erfinv_2^22", lambda: torch.erfinv(unit))
    report("lgamma_2^22", lambda: torch.lgamma(positive))
    report("digamma_2^22", lambda: torch.digamma(positive))
    report("digamma_f64_2^22", lambda: torch.digamma(positive64))
    report("polygamma1_2^22", lambda: torch.polygamma(1, positive))
    report("atan2_2^22", lambda: torch.atan2(unit, other))
    report("hypot_2^22", lambda: torch.hypot(unit, other))
    report("logaddexp_2^22", lambda: torch.logaddexp(unit, other))
    report("xlogy_2^22", lambda: torch.xlogy(other, positive))
    sp = torch.special
    probability = unit / 2 + 0.5
    report("i0_2^22", lambda: sp.i0(other))
    report("i1e_2^22", lambda: sp.i1e(other))
    up_to_30, other64 = positive * 3, other.double()
    report("i0e_wide_2^22", lambda: sp.i0e(up_to_30))
    report("i1_f64_2^22", lambda: sp.i1(other64))
    report("erfcx_2^22", lambda: sp.erfcx(other))
    report("ndtr_2^22", lambda: sp.ndtr(other))
    report("log_ndtr_2^22", lambda: sp.log_ndtr(other))
    report("ndtri_2^22", lambda: sp.ndtri(probability))
    report("entr_2^22", lambda: sp.entr(positive))
    report("xlog1py_2^22", lambda: sp.xlog1py(other, positive))
    shifted, flipped = positive + 1, positive.flip(0)
    report("zeta_2^22", lambda: sp.zeta(shifted, positive))
    report("gammainc_2^22", lambda: sp.gammainc(positive, flipped))
    report("bessel_j0_2^22", lambda: sp.bessel_j0(positive))
    report("bessel_y1_2^22", lambda: sp.bessel_y1(positive))
    report("modified_bessel_k0_2^22", lambda: sp.modified_bessel_k0(positive))
    report("spherical_bessel_j0_2^22", lambda: sp.spherical_bessel_j0(positive))
    wide = other * 4
    report("airy_ai_2^22", lambda: sp.airy_ai(wide))
    report("chebyshev_t_n10_2^22", lambda: sp.chebyshev_polynomial_t(unit, 10))
    report("chebyshev_t_n50_2^22", lambda: sp.chebyshev_polynomial_t(unit, 50))
    report("chebyshev_u_n50_2^22", lambda: sp.chebyshev_polynomial_u(unit, 50))
    report("hermite_h_n10_2^22", lambda: sp.hermite_polynomial_h(unit, 10))
    report("legendre_p_n10_2^22", lambda: sp.legendre_polynomial_p(unit, 10))
    report("laguerre_l_n10_2^22", lambda: sp.laguerre_polynomial_l(positive, 10))
