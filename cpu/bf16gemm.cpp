// cpu/bf16gemm.cpp: Kiln's own bfloat16 GEMM for CPUs with AVX512-BF16, c = a @ b, every element
// of c a float32 sum of exact products, rounded to bfloat16 once at the end.
//
// By default a bfloat16 matmul converts a and b to float32, multiplies with the float32 GEMM and
// rounds c (matmul.cpp, matmul_via_float): three conversion passes and float32 operands twice the
// size. Here the operands stay bfloat16 up to the instruction that multiplies them (matmul takes
// this path only with KILN_CPU_BF16_GEMM=own: on the one such CPU measured it was the slower one,
// Note [which bfloat16 GEMM] in matmul.cpp): VDPBF16PS takes 16 lanes of bfloat16 *pairs* from each of two
// registers and adds both products of each lane's pair to that lane's float32 accumulator,
//   acc[j] += a0 * b0[j] + a1 * b1[j],
// so one instruction does 32 multiply-adds, twice a float32 FMA's 16. (The product of two bfloat16
// is exact in float32; the instruction rounds each addition to nearest even and, unlike the FMA,
// treats denormal inputs and results as zero: bfloat16's denormals lie below 1.2e-38.)
//
// The loops are sgemm.cpp's (Goto/BLIS; read that file first); what differs is the pairing of k:
//   - b's block is packed into panels of NR = 48 columns, kc/2 rows of 48 32-bit words, the word
//     for pair q and column j holding b[2q][j] in its low half and b[2q + 1][j] in its high half.
//     With an odd kc the last word's high half is zero.
//   - a's pair (a[i][2q], a[i][2q + 1]) is one 32-bit word where a's rows are contiguous, broadcast
//     straight from a (nothing packed); otherwise (a transposed, as in a weight's gradient x^T @ dy)
//     a's block is packed into micro-panels of MR = 8 rows, kc/2 rows of 8 words.
//   - the micro-kernel holds an 8 x 48 tile of float32 sums in 24 zmm registers; each step of a pair
//     loads three vectors of b's words and broadcasts a's eight words: 24 VDPBF16PS for 24 loads.
//   - with k longer than one block (KC = 2048), the tile's partial sums wait in a float32 copy of c
//     between blocks; the last block adds them and rounds.
// Rounding to bfloat16 is to nearest even, NaN kept quiet: bit for bit what the float-to-bfloat16
// conversion of core/half.h does, so a product here equals matmul_via_float's wherever the float32
// sums agree (they differ only in the order of additions).
//
// Every element of c is the same sum in the same order whatever the thread count or the split.
// This file is compiled with -mavx512f -mavx512bw -mavx512vl -mavx512bf16 (cpu/CMakeLists.txt);
// matmul.cpp calls it only after asking the CPU (cpu_has_avx512_bf16, use_own_bf16gemm).
#include <algorithm>
#include <cstring>

#include "cpu/avx512.h"
#include "cpu/kernels.h"
#include "cpu/parallel.h"

namespace kiln::cpu {
namespace {

using avx512::lanes;
using avx512::transpose16;

constexpr int64_t MR = 8;        // rows of a micro-tile
constexpr int64_t NR = 48;       // columns of a micro-tile: three zmm vectors of words
constexpr int64_t KC = 2048;     // rows of b per packed block (1,024 pairs: a panel is 192 KiB)
constexpr int64_t MC = 64;       // rows of a per block of a thread's rows
constexpr int64_t NC = 48 * 43;  // columns of b per packed block (2,064; 8 MiB packed)
constexpr int64_t kGrainFlops = int64_t(1) << 17;  // multiply-adds below which one thread is enough

bool split_by_rows(int64_t m_tiles, int64_t panels) {  // as in sgemm.cpp
  const int threads = get_num_threads();
  return m_tiles >= 2 * threads || panels < threads;
}

// One operand: element (i, j)'s bits at data[i * rs + j * cs].
struct Operand {
  const uint16_t* data;
  int64_t rs, cs;
  const uint16_t* at(int64_t i, int64_t j) const { return data + i * rs + j * cs; }
};

uint32_t load_word(const uint16_t* p) {  // two consecutive bfloat16, the first in the low half
  uint32_t w;
  std::memcpy(&w, p, sizeof w);
  return w;
}

// 16 float32 to bfloat16, to nearest even, a NaN made quiet (core/half.h's float_to_bf16_bits).
__m256i round_to_bf16(__m512 v) {
  const __m512i x = _mm512_castps_si512(v);
  const __m512i high = _mm512_srli_epi32(x, 16);
  const __m512i lsb = _mm512_and_si512(high, _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(x, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(high, _mm512_set1_epi32(0x40)));
  return _mm512_cvtepi32_epi16(r);
}

// What a micro-kernel does with its tile: partial (m x n float32, leading dim n; null when k is one
// block) holds the sums of earlier blocks of k when add_partial; the tile goes to c rounded when
// last, else to partial.
struct TileOut {
  uint16_t* c;
  int64_t ldc;
  float* partial;
  int64_t ldp;
  bool add_partial, last;
};

// The tile (MR x NV*16) of sums over kp pairs (and one lone last row of k when odd): a's word for
// row i and pair q at row[i] + q * a_pair (rows from mr on read row mr - 1 again, unstored); b's
// packed panel at bp, NV*16 words a pair. Then c[:mr, :nr] (at out, tile-relative) gets the tile.
template <int NV>
void micro_kernel(int64_t kp, bool odd, const uint16_t* a, int64_t a_row, int64_t a_pair, const uint32_t* bp,
                  const TileOut& out, int64_t mr, int64_t nr) {
  __m512 acc[MR][NV];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_setzero_ps();
  const uint16_t* row[MR];
  for (int i = 0; i < MR; ++i) row[i] = a + std::min<int64_t>(i, mr - 1) * a_row;
  for (int64_t q = 0; q < kp; ++q) {
    __m512i b[NV];
    for (int j = 0; j < NV; ++j) b[j] = _mm512_load_si512(bp + j * 16);
    _mm_prefetch(reinterpret_cast<const char*>(bp + 8 * NV * 16), _MM_HINT_T0);
    for (int i = 0; i < MR; ++i) {
      const __m512i av = _mm512_set1_epi32(static_cast<int>(load_word(row[i] + q * a_pair)));
      for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], (__m512bh)av, (__m512bh)b[j]);
    }
    bp += NV * 16;
  }
  if (odd) {  // the lone last row of k: a's high half zero (b's is zero in the packing)
    __m512i b[NV];
    for (int j = 0; j < NV; ++j) b[j] = _mm512_load_si512(bp + j * 16);
    for (int i = 0; i < MR; ++i) {
      const __m512i av = _mm512_set1_epi32(static_cast<int>(row[i][kp * a_pair]));
      for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], (__m512bh)av, (__m512bh)b[j]);
    }
  }
  for (int64_t i = 0; i < mr; ++i)
    for (int j = 0; j < NV; ++j) {
      const __mmask16 m = lanes(nr - j * 16);
      if (m == 0) break;
      __m512 v = acc[i][j];
      if (out.add_partial) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, out.partial + i * out.ldp + j * 16));
      if (out.last) {
        _mm256_mask_storeu_epi16(out.c + i * out.ldc + j * 16, m, round_to_bf16(v));
      } else {
        _mm512_mask_storeu_ps(out.partial + i * out.ldp + j * 16, m, v);
      }
    }
}

// Packs b's block (rows p0..p0+kc, columns jc..jc+nc), panels j0..j1, into out: panel jp at
// out + jp * NR * kp (kp = ceil(kc / 2) rows of nv*16 words, nv = ceil(width / 16), zeros right of
// the width and in the high half of an odd kc's last row).
void pack_b_panels(const Operand& b, int64_t p0, int64_t kc, int64_t jc, int64_t nc, int64_t j0, int64_t j1,
                   uint32_t* out) {
  const int64_t kp = (kc + 1) / 2;
  for (int64_t jp = j0; jp < j1; ++jp) {
    const int64_t w = std::min(NR, nc - jp * NR), nv = (w + 15) / 16, stride = nv * 16;
    uint32_t* panel = out + jp * NR * kp;
    const int64_t col0 = jc + jp * NR;
    if (b.cs == 1) {  // rows contiguous: interleave two rows' 16 columns into 16 words
      for (int64_t q = 0; q < kp; ++q) {
        const uint16_t* r0 = b.at(p0 + 2 * q, col0);
        const uint16_t* r1 = 2 * q + 1 < kc ? b.at(p0 + 2 * q + 1, col0) : nullptr;
        for (int64_t v = 0; v < nv; ++v) {
          const __mmask16 m = lanes(w - v * 16);
          const __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, r0 + v * 16));
          const __m512i hi = r1 == nullptr ? _mm512_setzero_si512()
                                           : _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, r1 + v * 16));
          _mm512_store_si512(panel + q * stride + v * 16, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
        }
      }
    } else if (b.rs == 1) {  // b transposed (x @ w^T): a column's pairs are words; transpose 16 x 16
      for (int64_t v = 0; v < nv; ++v) {
        const int64_t cols = std::min<int64_t>(16, w - v * 16);
        for (int64_t q0 = 0; q0 < kp; q0 += 16) {
          const int64_t left = kc - 2 * q0;  // rows of k from q0's first on
          const __mmask32 m = left >= 32 ? ~__mmask32(0) : __mmask32((uint64_t(1) << left) - 1);
          __m512 r[16];  // r[j]: column col0 + v*16 + j's words q0..q0+15; transposed, r[q]: pair q0 + q
          for (int64_t j = 0; j < 16; ++j)
            r[j] = j < cols ? _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(m, b.at(p0 + 2 * q0, col0 + v * 16 + j)))
                            : _mm512_setzero_ps();
          transpose16(r);
          for (int64_t q = 0; q < std::min<int64_t>(16, kp - q0); ++q)
            _mm512_store_ps(reinterpret_cast<float*>(panel + (q0 + q) * stride + v * 16), r[q]);
        }
      }
    } else {
      for (int64_t q = 0; q < kp; ++q)
        for (int64_t j = 0; j < stride; ++j) {
          const uint32_t lo = j < w ? *b.at(p0 + 2 * q, col0 + j) : 0;
          const uint32_t hi = j < w && 2 * q + 1 < kc ? *b.at(p0 + 2 * q + 1, col0 + j) : 0;
          panel[q * stride + j] = lo | hi << 16;
        }
    }
  }
}

// Packs a's block (rows i0..i0+mc, columns p0..p0+kc) for an a whose rows are not contiguous:
// micro-panels of MR rows, each kp rows of MR words, zeros below the last row and in the high half
// of an odd kc's last word.
void pack_a(const Operand& a, int64_t i0, int64_t mc, int64_t p0, int64_t kc, uint32_t* out) {
  const int64_t kp = (kc + 1) / 2;
  for (int64_t i = 0; i < mc; i += MR, out += kp * MR) {
    const int64_t rows = std::min(MR, mc - i);
    if (a.rs == 1 && rows == MR) {  // a transposed: the MR values of one column are contiguous
      for (int64_t q = 0; q < kp; ++q) {
        const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a.at(i0 + i, p0 + 2 * q)));
        const __m128i hi = 2 * q + 1 < kc ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(a.at(i0 + i, p0 + 2 * q + 1)))
                                          : _mm_setzero_si128();
        _mm_store_si128(reinterpret_cast<__m128i*>(out + q * MR), _mm_unpacklo_epi16(lo, hi));
        _mm_store_si128(reinterpret_cast<__m128i*>(out + q * MR + 4), _mm_unpackhi_epi16(lo, hi));
      }
    } else {
      for (int64_t q = 0; q < kp; ++q)
        for (int64_t r = 0; r < MR; ++r) {
          const uint32_t lo = r < rows ? *a.at(i0 + i + r, p0 + 2 * q) : 0;
          const uint32_t hi = r < rows && 2 * q + 1 < kc ? *a.at(i0 + i + r, p0 + 2 * q + 1) : 0;
          out[q * MR + r] = lo | hi << 16;
        }
    }
  }
}

// Rows i0..i1 and panels pa..pb of c from one packed block of b (rows p0..p0+kc of k, columns
// jc..jc+nc of c).
void compute_block(const Operand& a, int64_t i0, int64_t i1, int64_t p0, int64_t kc, const uint32_t* bp,
                   int64_t jc, int64_t nc, int64_t pa, int64_t pb, const TileOut& out) {
  const int64_t kp = (kc + 1) / 2;
  const bool odd = kc % 2 == 1;
  const bool direct = a.cs == 1;  // a's pairs read where they lie
  ScratchBuffer<uint32_t> ap(direct ? 0 : static_cast<size_t>(std::min(MC, (i1 - i0 + MR - 1) / MR * MR) * kp));
  for (int64_t ic = i0; ic < i1; ic += MC) {
    const int64_t mc = std::min(MC, i1 - ic);
    if (!direct) pack_a(a, ic, mc, p0, kc, ap.data());
    for (int64_t jp = pa; jp < pb; ++jp) {
      const int64_t jr = jp * NR, w = std::min(NR, nc - jr);
      const uint32_t* panel = bp + jr * kp;
      for (int64_t ir = 0; ir < mc; ir += MR) {
        const int64_t mr = std::min(MR, mc - ir), i = ic + ir, j = jc + jr;
        float* partial = out.partial == nullptr ? nullptr : out.partial + i * out.ldp + j;
        const TileOut tile{out.c + i * out.ldc + j, out.ldc, partial, out.ldp, out.add_partial, out.last};
        // a's words: rows a.rs apart, pairs 2 apart; packed, rows one word apart, pairs MR words.
        const uint16_t* arow = direct ? a.at(i, p0) : reinterpret_cast<const uint16_t*>(ap.data() + ir * kp);
        const int64_t a_row = direct ? a.rs : 2, a_pair = direct ? 2 : 2 * MR;
        if (w > 32) {
          micro_kernel<3>(kp - odd, odd, arow, a_row, a_pair, panel, tile, mr, w);
        } else if (w > 16) {
          micro_kernel<2>(kp - odd, odd, arow, a_row, a_pair, panel, tile, mr, w);
        } else {
          micro_kernel<1>(kp - odd, odd, arow, a_row, a_pair, panel, tile, mr, w);
        }
      }
    }
  }
}

}  // namespace

void bf16gemm_avx512(int64_t m, int64_t n, int64_t k, const BFloat16* a, int64_t a_rs, int64_t a_cs,
                     const BFloat16* b, int64_t b_rs, int64_t b_cs, BFloat16* c, int64_t ldc) {
  static_assert(sizeof(BFloat16) == sizeof(uint16_t));
  if (m <= 0 || n <= 0) return;
  auto* cbits = reinterpret_cast<uint16_t*>(c);
  if (k <= 0) {
    for (int64_t i = 0; i < m; ++i) std::memset(cbits + i * ldc, 0, sizeof(uint16_t) * n);
    return;
  }
  const Operand A{reinterpret_cast<const uint16_t*>(a), a_rs, a_cs};
  const Operand B{reinterpret_cast<const uint16_t*>(b), b_rs, b_cs};
  ScratchBuffer<float> partial(k > KC ? static_cast<size_t>(m * n) : 0);  // sums between blocks of k
  const int64_t m_tiles = (m + MR - 1) / MR;
  for (int64_t jc = 0; jc < n; jc += NC) {
    const int64_t nc = std::min(NC, n - jc), panels = (nc + NR - 1) / NR;
    ScratchBuffer<uint32_t> bp(static_cast<size_t>(panels * NR * ((std::min(KC, k) + 1) / 2)));
    for (int64_t pc = 0; pc < k; pc += KC) {
      const int64_t kc = std::min(KC, k - pc);
      const TileOut out{cbits, ldc, partial.data(), n, pc > 0, pc + kc == k};
      parallel_for(0, panels, 2, [&](int64_t j0, int64_t j1) { pack_b_panels(B, pc, kc, jc, nc, j0, j1, bp.data()); });
      if (split_by_rows(m_tiles, panels)) {
        parallel_for(0, m_tiles, std::max<int64_t>(1, kGrainFlops / (MR * nc * kc)), [&](int64_t t0, int64_t t1) {
          compute_block(A, t0 * MR, std::min(m, t1 * MR), pc, kc, bp.data(), jc, nc, 0, panels, out);
        });
      } else {
        parallel_for(0, panels, std::max<int64_t>(1, kGrainFlops / (m * NR * kc)), [&](int64_t j0, int64_t j1) {
          compute_block(A, 0, m, pc, kc, bp.data(), jc, nc, j0, j1, out);
        });
      }
    }
  }
}

}  // namespace kiln::cpu
