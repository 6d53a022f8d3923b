// cpu/bf16gemm.cpp: Kiln's own bfloat16 GEMMs, c = a @ b, every element of c a float32 sum of
// exact products, rounded to bfloat16 once at the end: one kernel for CPUs with AVX512-BF16 and one
// for CPUs with AMX (Note [AMX]), in the same loops. Each also writes (or adds) its float32 sums
// unrounded into a float32 c (bf16gemm_avx512_f32, bf16gemm_amx_f32), for the block products of the
// attention and convolution kernels (cpu/bf16_products.h).
//
// Without them a bfloat16 matmul converts a and b to float32, multiplies with the float32 GEMM and
// rounds c (matmul.cpp, matmul_via_float): three conversion passes, float32 operands twice the
// size, and float32's arithmetic. Here the operands stay bfloat16 up to the instruction that
// multiplies them. Which one matmul takes is Note [which bfloat16 GEMM] in matmul.cpp: AMX where
// the CPU has it; else the AVX512-BF16 kernel where the CPU has that and runs it at the FMA's rate
// (AMD from Zen 4 on), since on the Intel CPU measured it was slower than the way through float32
// and on an AMD Zen 4 and Zen 5 it was about twice as fast.
//
// VDPBF16PS (AVX512-BF16) takes 16 lanes of bfloat16 *pairs* from each of two registers and adds
// both products of each lane's pair to that lane's float32 accumulator,
//   acc[j] += a0 * b0[j] + a1 * b1[j],
// 32 multiply-adds an instruction, twice a float32 FMA's 16. (The product of two bfloat16 is exact
// in float32; the instruction rounds each addition to nearest even and, unlike the FMA, treats
// denormal inputs and results as zero: bfloat16's denormals lie below 1.2e-38. AMX's TDPBF16PS
// does the same.)
//
// The loops are sgemm.cpp's (Goto/BLIS; read that file first); what differs is the pairing of k:
//   - b's block is packed into panels of NR = 48 columns, kc/2 rows of 48 32-bit words, the word
//     for pair q and column j holding b[2q][j] in its low half and b[2q + 1][j] in its high half.
//     With an odd kc the last word's high half is zero. (For AMX the rows are padded with zero rows
//     to a multiple of 16.)
//   - a's pair (a[i][2q], a[i][2q + 1]) is one 32-bit word where a's rows are contiguous, broadcast
//     straight from a (nothing packed); otherwise (a transposed, as in a weight's gradient x^T @ dy)
//     a's block is packed into micro-panels of MR = 8 rows, kc/2 rows of 8 words. (AMX packs a
//     always, into 16 x 32 blocks.)
//   - the micro-kernel holds an 8 x 48 tile of float32 sums in 24 zmm registers; each step of a pair
//     loads three vectors of b's words and broadcasts a's eight words: 24 VDPBF16PS for 11 loads.
//   - with k longer than one block (KC = 2048), the tile's partial sums wait in a float32 copy of c
//     between blocks; the last block adds them and rounds. (A float32 c holds them itself.)
// Rounding to bfloat16 is to nearest even, NaN kept quiet: bit for bit what the float-to-bfloat16
// conversion of core/half.h does, so a product here equals matmul_via_float's wherever the float32
// sums agree (they differ only in the order of additions).
//
// Every element of c is the same sum in the same order whatever the thread count or the split.
// This file is compiled with -mavx512f -mavx512bw -mavx512vl -mavx512bf16 -mamx-tile -mamx-bf16
// (cpu/CMakeLists.txt); matmul.cpp calls a kernel only after asking the CPU (cpu_has_avx512_bf16,
// cpu_has_amx_bf16).
#include <algorithm>
#include <cstring>

#include "cpu/avx512.h"
#include "cpu/kernels.h"
#include "cpu/parallel.h"

namespace kiln::cpu {
namespace {

using avx512::lanes;
using avx512::split_by_rows;
using avx512::transpose16;

constexpr int64_t MR = 8;        // rows of a micro-tile
constexpr int64_t NR = 48;       // columns of a micro-tile: three zmm vectors of words
constexpr int64_t KC = 2048;     // rows of b per packed block (1,024 pairs: a panel is 192 KiB)
constexpr int64_t MC = 64;       // rows of a per block of a thread's rows
constexpr int64_t NC = 48 * 43;  // columns of b per packed block (2,064; 8 MiB packed)
constexpr int64_t kGrainFlops = int64_t(1) << 17;  // multiply-adds below which one thread is enough

// One operand: element (i, j)'s bits at data[i * rs + j * cs].
struct Operand {
  const uint16_t* data;
  int64_t rs, cs;
  const uint16_t* at(int64_t i, int64_t j) const { return data + i * rs + j * cs; }
};

uint32_t load_word(const uint16_t* p) {  // two consecutive bfloat16, the first in the low half
  // (memcpy: the packed a is written as 32-bit words and read here through uint16_t pointers)
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

// What a micro-kernel does with its tile: partial (m x n float32, leading dim ldp; null when k is
// one block) holds the sums of earlier blocks of k when add_partial; the tile goes to c rounded when
// last, else to partial. For a float32 c (bf16gemm_*_f32) partial is c itself, c is null and last
// never set: add_partial from the second block of k on, or from the first when adding to c.
struct TileOut {
  uint16_t* c;
  int64_t ldc;
  float* partial;
  int64_t ldp;
  bool add_partial, last;
  TileOut at(int64_t i, int64_t j) const {  // the same, from element (i, j) of c on
    return {c == nullptr ? nullptr : c + i * ldc + j, ldc, partial == nullptr ? nullptr : partial + i * ldp + j, ldp,
            add_partial, last};
  }
};

// c[:mr, :nr] (at out) gets the tile whose 16 columns from 16 v of row i are sum(i, v).
template <typename Sum>
__attribute__((always_inline)) inline void store_tile(const TileOut& out, int64_t mr, int64_t nr, const Sum& sum) {
  for (int64_t i = 0; i < mr; ++i)
    for (int64_t v = 0; v * 16 < nr; ++v) {
      const __mmask16 m = lanes(nr - v * 16);
      __m512 x = sum(i, v);
      if (out.add_partial) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(m, out.partial + i * out.ldp + v * 16));
      if (out.last) {
        _mm256_mask_storeu_epi16(out.c + i * out.ldc + v * 16, m, round_to_bf16(x));
      } else {
        _mm512_mask_storeu_ps(out.partial + i * out.ldp + v * 16, m, x);
      }
    }
}

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
      uint16_t lone;  // 2 bytes: in the direct path this can be a's last element
      std::memcpy(&lone, row[i] + kp * a_pair, sizeof lone);
      const __m512i av = _mm512_set1_epi32(lone);
      for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], (__m512bh)av, (__m512bh)b[j]);
    }
  }
  store_tile(out, mr, nr, [&](int64_t i, int64_t v) { return acc[i][v]; });
}

// Packs b's block (rows p0..p0+kc, columns jc..jc+nc), panels j0..j1, into out: panel jp at
// out + jp * NR * rows (kp = ceil(kc / 2) rows of nv*16 words, nv = ceil(width / 16), zeros right
// of the width and in the high half of an odd kc's last row; then zero rows up to rows >= kp).
void pack_b_panels(const Operand& b, int64_t p0, int64_t kc, int64_t jc, int64_t nc, int64_t j0, int64_t j1,
                   int64_t rows, uint32_t* out) {
  const int64_t kp = (kc + 1) / 2;
  for (int64_t jp = j0; jp < j1; ++jp) {
    const int64_t w = std::min(NR, nc - jp * NR), nv = (w + 15) / 16, stride = nv * 16;
    uint32_t* panel = out + jp * NR * rows;
    std::memset(panel + kp * stride, 0, sizeof(uint32_t) * (rows - kp) * stride);
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
// jc..jc+nc of c, kp rows a panel).
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
        const int64_t mr = std::min(MR, mc - ir);
        const TileOut tile = out.at(ic + ir, jc + jr);
        // a's words: rows a.rs apart, pairs 2 apart; packed, rows one word apart, pairs MR words.
        const uint16_t* arow = direct ? a.at(ic + ir, p0) : reinterpret_cast<const uint16_t*>(ap.data() + ir * kp);
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

// ---- AMX ----
// Note [AMX]: Intel's Advanced Matrix Extensions add eight tile registers of up to 16 rows x 64
// bytes and TDPBF16PS, which adds to a tile C of 16 x 16 float32 the product of a tile A of 16 rows
// x 32 bfloat16 (each row 32 consecutive k) and a tile B of 16 rows of 16 words, row q holding the
// pairs (b[2q][j], b[2q + 1][j]): exactly a packed panel's rows, 16 columns of it. One instruction
// is 8,192 multiply-adds. The micro-kernel keeps a 16 x 48 block of c in three C tiles (0-2); each
// step of 32 k loads a's 16 x 32 block (tile 3) and three B tiles (4-6) straight from the panel
// (rows a panel's width apart) and issues three TDPBF16PS. a is packed into 16 x 32 blocks, zero-
// padded below its last row and right of k's end, and a panel's rows are padded with zero rows to
// a multiple of 16, so every tile is full and the configuration never changes. The tiles go to a
// 16 x 48 float32 scratch and from there to c like the other kernel's registers.
// Linux hands a process the tiles' 8 KiB of state only when asked (arch_prctl, cpu_has_amx_bf16 in
// matmul.cpp); each thread loads the configuration before its first tile instruction and releases
// the tiles when its block is done.
constexpr int64_t AMR = 16;     // rows of an AMX micro-tile
constexpr int64_t AKB = 32;     // k per tile step
constexpr int64_t AMC = 64;     // rows of a per packed block
constexpr int64_t kABlock = AMR * AKB;  // elements in one packed 16 x 32 block of a

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};  // bytes a row
  uint8_t rows[16] = {};
};

// Packs a's rows i0..i0+mc, columns p0..p0+kc, into 16-row tiles of ceil(kc / 32) blocks of 16 x 32
// elements (row-major, 64 bytes a row), zeros below the last row and right of kc.
void pack_a_amx(const Operand& a, int64_t i0, int64_t mc, int64_t p0, int64_t kc, uint16_t* out) {
  const int64_t nkb = (kc + AKB - 1) / AKB;
  for (int64_t t = 0; t < mc; t += AMR, out += nkb * kABlock) {
    const int64_t rows = std::min(AMR, mc - t);
    for (int64_t kb = 0; kb < nkb; ++kb) {
      uint16_t* blk = out + kb * kABlock;
      const int64_t left = kc - kb * AKB;  // columns of k from this block's first on
      if (a.cs == 1) {  // rows contiguous: 32 elements a row, masked at k's end
        const __mmask32 m = left >= 32 ? ~__mmask32(0) : __mmask32((uint64_t(1) << left) - 1);
        for (int64_t r = 0; r < AMR; ++r)
          _mm512_store_si512(blk + r * AKB, r < rows ? _mm512_maskz_loadu_epi16(m, a.at(i0 + t + r, p0 + kb * AKB))
                                                     : _mm512_setzero_si512());
      } else if (a.rs == 1) {  // a transposed: a column's 16 rows are contiguous; pair them, transpose
        __m512 w[16];  // w[q]: the words (a[i][2q], a[i][2q + 1]) of the 16 rows i, then transposed
        const __mmask16 m = lanes(rows);
        for (int64_t q = 0; q < 16; ++q) {
          const int64_t p = kb * AKB + 2 * q;
          const __m512i lo = p < kc ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, a.at(i0 + t, p0 + p)))
                                    : _mm512_setzero_si512();
          const __m512i hi = p + 1 < kc ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, a.at(i0 + t, p0 + p + 1)))
                                        : _mm512_setzero_si512();
          w[q] = _mm512_castsi512_ps(_mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
        }
        transpose16(w);  // w[r]: row r's 16 words, its 32 elements in k's order
        for (int64_t r = 0; r < AMR; ++r) _mm512_store_ps(reinterpret_cast<float*>(blk + r * AKB), w[r]);
      } else {
        for (int64_t r = 0; r < AMR; ++r)
          for (int64_t e = 0; e < AKB; ++e) blk[r * AKB + e] = r < rows && e < left ? *a.at(i0 + t + r, p0 + kb * AKB + e) : 0;
      }
    }
  }
}

// The 16 x NV*16 block of sums over nkb steps of 32 k: a's packed blocks at ap, b's panel at bp
// (rows stride words apart); into scratch (16 rows of 48 floats).
template <int NV>
void amx_kernel(int64_t nkb, const uint16_t* ap, const uint32_t* bp, int64_t stride, float* scratch) {
  _tile_zero(0);
  if constexpr (NV > 1) _tile_zero(1);
  if constexpr (NV > 2) _tile_zero(2);
  const int64_t b_bytes = stride * 4;
  for (int64_t kb = 0; kb < nkb; ++kb) {
    const uint32_t* brow = bp + kb * 16 * stride;
    _tile_loadd(3, ap + kb * kABlock, 64);
    _tile_loadd(4, brow, b_bytes);
    _tile_dpbf16ps(0, 3, 4);
    if constexpr (NV > 1) {
      _tile_loadd(5, brow + 16, b_bytes);
      _tile_dpbf16ps(1, 3, 5);
    }
    if constexpr (NV > 2) {
      _tile_loadd(6, brow + 32, b_bytes);
      _tile_dpbf16ps(2, 3, 6);
    }
  }
  _tile_stored(0, scratch, NR * 4);
  if constexpr (NV > 1) _tile_stored(1, scratch + 16, NR * 4);
  if constexpr (NV > 2) _tile_stored(2, scratch + 32, NR * 4);
}

// compute_block with AMX: b's panels have rows (a multiple of 16) rows.
void compute_block_amx(const Operand& a, int64_t i0, int64_t i1, int64_t p0, int64_t kc, const uint32_t* bp,
                       int64_t rows, int64_t jc, int64_t nc, int64_t pa, int64_t pb, const TileOut& out) {
  const int64_t nkb = (kc + AKB - 1) / AKB;
  ScratchBuffer<uint16_t> ap(static_cast<size_t>(std::min(AMC, (i1 - i0 + AMR - 1) / AMR * AMR) * nkb * AKB));
  alignas(64) float scratch[AMR * NR];
  TileConfig cfg;  // loaded after the allocation, which may throw, so the tiles are always released
  for (int t = 0; t < 7; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
  for (int64_t ic = i0; ic < i1; ic += AMC) {
    const int64_t mc = std::min(AMC, i1 - ic);
    pack_a_amx(a, ic, mc, p0, kc, ap.data());
    asm volatile("" ::: "memory");  // GCC's _tile_loadd does not say it reads memory: order the stores first
    for (int64_t jp = pa; jp < pb; ++jp) {
      const int64_t jr = jp * NR, w = std::min(NR, nc - jr), nv = (w + 15) / 16;
      const uint32_t* panel = bp + jr * rows;
      for (int64_t ir = 0; ir < mc; ir += AMR) {
        const uint16_t* at = ap.data() + ir / AMR * nkb * kABlock;
        if (nv == 3) {
          amx_kernel<3>(nkb, at, panel, nv * 16, scratch);
        } else if (nv == 2) {
          amx_kernel<2>(nkb, at, panel, nv * 16, scratch);
        } else {
          amx_kernel<1>(nkb, at, panel, nv * 16, scratch);
        }
        store_tile(out.at(ic + ir, jc + jr), std::min(AMR, mc - ir), w,
                   [&](int64_t i, int64_t v) { return _mm512_load_ps(scratch + i * NR + v * 16); });
      }
    }
  }
  _tile_release();
}

// The loops over blocks of n and k, shared by the two kernels: b's block packed by all threads
// together, then each thread its rows of c (tiles of tile_rows) or, when c has too few rows for
// that, its panels. c is bfloat16 (c16, rounded once at the end) or float32 (c32, leading dim ldc
// too, added to when accumulate): a float32 c holds the partial sums between blocks of k itself.
template <bool kAmx>
void blocked_gemm(const Operand& A, const Operand& B, int64_t m, int64_t n, int64_t k, uint16_t* c16, float* c32,
                  bool accumulate, int64_t ldc) {
  constexpr int64_t tile_rows = kAmx ? AMR : MR;
  ScratchBuffer<float> partial(c16 != nullptr && k > KC ? static_cast<size_t>(m * n) : 0);  // sums between blocks of k
  const int64_t m_tiles = (m + tile_rows - 1) / tile_rows;
  const int64_t kp_max = (std::min(KC, k) + 1) / 2;
  for (int64_t jc = 0; jc < n; jc += NC) {
    const int64_t nc = std::min(NC, n - jc), panels = (nc + NR - 1) / NR;
    ScratchBuffer<uint32_t> bp(static_cast<size_t>(panels * NR * (kAmx ? (kp_max + 15) / 16 * 16 : kp_max)));
    for (int64_t pc = 0; pc < k; pc += KC) {
      const int64_t kc = std::min(KC, k - pc), kp = (kc + 1) / 2, rows = kAmx ? (kp + 15) / 16 * 16 : kp;
      const TileOut out = c16 != nullptr ? TileOut{c16, ldc, partial.data(), n, pc > 0, pc + kc == k}
                                         : TileOut{nullptr, 0, c32, ldc, pc > 0 || accumulate, false};
      parallel_for(0, panels, 2, [&](int64_t j0, int64_t j1) { pack_b_panels(B, pc, kc, jc, nc, j0, j1, rows, bp.data()); });
      auto block = [&](int64_t r0, int64_t r1, int64_t j0, int64_t j1) {
        if constexpr (kAmx) {
          compute_block_amx(A, r0, r1, pc, kc, bp.data(), rows, jc, nc, j0, j1, out);
        } else {
          compute_block(A, r0, r1, pc, kc, bp.data(), jc, nc, j0, j1, out);
        }
      };
      if (split_by_rows(m_tiles, panels)) {
        parallel_for(0, m_tiles, std::max<int64_t>(1, kGrainFlops / (tile_rows * nc * kc)), [&](int64_t t0, int64_t t1) {
          block(t0 * tile_rows, std::min(m, t1 * tile_rows), 0, panels);
        });
      } else {
        parallel_for(0, panels, std::max<int64_t>(1, kGrainFlops / (m * NR * kc)),
                     [&](int64_t j0, int64_t j1) { block(0, m, j0, j1); });
      }
    }
  }
}

template <bool kAmx>
void bf16gemm(int64_t m, int64_t n, int64_t k, const BFloat16* a, int64_t a_rs, int64_t a_cs, const BFloat16* b,
              int64_t b_rs, int64_t b_cs, BFloat16* c, int64_t ldc) {
  static_assert(sizeof(BFloat16) == sizeof(uint16_t));
  if (m <= 0 || n <= 0) return;
  auto* cbits = reinterpret_cast<uint16_t*>(c);
  if (k <= 0) {
    for (int64_t i = 0; i < m; ++i) std::memset(cbits + i * ldc, 0, sizeof(uint16_t) * n);
    return;
  }
  blocked_gemm<kAmx>({reinterpret_cast<const uint16_t*>(a), a_rs, a_cs}, {reinterpret_cast<const uint16_t*>(b), b_rs, b_cs},
                     m, n, k, cbits, nullptr, false, ldc);
}

template <bool kAmx>
void bf16gemm_f32(int64_t m, int64_t n, int64_t k, const BFloat16* a, int64_t a_rs, int64_t a_cs, const BFloat16* b,
                  int64_t b_rs, int64_t b_cs, bool accumulate, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    if (!accumulate)
      for (int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, 0.0f);
    return;
  }
  blocked_gemm<kAmx>({reinterpret_cast<const uint16_t*>(a), a_rs, a_cs}, {reinterpret_cast<const uint16_t*>(b), b_rs, b_cs},
                     m, n, k, nullptr, c, accumulate, ldc);
}

}  // namespace

void bf16gemm_avx512(int64_t m, int64_t n, int64_t k, const BFloat16* a, int64_t a_rs, int64_t a_cs,
                     const BFloat16* b, int64_t b_rs, int64_t b_cs, BFloat16* c, int64_t ldc) {
  bf16gemm<false>(m, n, k, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc);
}

void bf16gemm_amx(int64_t m, int64_t n, int64_t k, const BFloat16* a, int64_t a_rs, int64_t a_cs,
                  const BFloat16* b, int64_t b_rs, int64_t b_cs, BFloat16* c, int64_t ldc) {
  bf16gemm<true>(m, n, k, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc);
}

void bf16gemm_avx512_f32(int64_t m, int64_t n, int64_t k, const BFloat16* a, int64_t a_rs, int64_t a_cs,
                         const BFloat16* b, int64_t b_rs, int64_t b_cs, bool accumulate, float* c, int64_t ldc) {
  bf16gemm_f32<false>(m, n, k, a, a_rs, a_cs, b, b_rs, b_cs, accumulate, c, ldc);
}

void bf16gemm_amx_f32(int64_t m, int64_t n, int64_t k, const BFloat16* a, int64_t a_rs, int64_t a_cs,
                      const BFloat16* b, int64_t b_rs, int64_t b_cs, bool accumulate, float* c, int64_t ldc) {
  bf16gemm_f32<true>(m, n, k, a, a_rs, a_cs, b, b_rs, b_cs, accumulate, c, ldc);
}

void round_to_bf16_run(const float* x, BFloat16* y, int64_t n) {
  auto* out = reinterpret_cast<uint16_t*>(y);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes(n - i);
    _mm256_mask_storeu_epi16(out + i, m, round_to_bf16(_mm512_maskz_loadu_ps(m, x + i)));
  }
}

}  // namespace kiln::cpu
