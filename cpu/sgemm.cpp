// cpu/sgemm.cpp: Kiln's own float32 GEMM for CPUs with AVX-512, c = a @ b (+ c).
//
// When it is used: matmul.cpp, Note [which float32 GEMM]. On this Zen 5 (two 512-bit FMAs per cycle,
// about 256 GFLOP/s per core), single-threaded at n = 1024..2048, it runs at about 92% of that peak,
// 3-5% ahead of OpenBLAS 0.3.21's AVX-512 kernel, and 1.8-1.9x OpenBLAS's AVX2 kernel
// (benchmarks/results/README.md). It is also the readable version of what a BLAS does.
//
// The loops are the Goto/BLIS ones. For each block of KC rows of b (the "pc" loop):
//   1. b's block is packed once, by all threads together (but see Note [sharing b]), into panels
//      of NR = 48 columns, each stored k-major (row p of a panel is 48 consecutive floats),
//      zero-padded at the right edge; contiguous rows of b are read row by row, across the panels;
//   2. each thread takes its own rows of c (or, when c is short, its own panels), packs MC rows of
//      a at a time into micro-panels of MR = 8 rows, k-major and zero-padded at the bottom, and
//   3. runs the micro-kernel over every (micro-panel of a, panel of b) pair: an 8 x 48 tile of c
//      held in 24 zmm registers while p runs over the block, a broadcast of a times three loads of b
//      per step. The tile is added to c (or stored, for the first block when not accumulating).
// A packed panel of b (KC x 48 floats = 192 KiB) is read by each of a's 8 micro-panels in turn from
// L2 (1 MiB here), where a's packed block (MC x KC = 256 KiB) and the next panel of b stay too; the
// packed b (up to 8 MiB) stays in L3. Streaming b from L2 costs the micro-kernel nothing: alone, on
// a panel in L2, it runs at the FMA peak. What a long KC buys is fewer passes over c.
//
// Note [the next panel of b]: the first micro-panel of a to use a panel would wait for it to come
// from L3 (measured: that call took 1.3-1.5x as long as the others; with the prefetch, 1.03x). So
// the last three calls on each panel prefetch the next panel's slot into L2, a third each, one line
// per step of k. Narrow last panels (16 or 32 columns) use only the start of their slot but gain
// most: their kernels do 8 or 16 multiply-adds per line of b loaded.
//
// KC, MC and the prefetch were chosen by measurement on this machine, single-threaded at n = 2048,
// against the previous KC = 512, MC = 128 (in one process, calls alternating): packing b row by row
// took b's packing from 3.3% to 1.4% of the time, the prefetch of the next panel 1.5-3% more, and
// KC = 1024 with MC = 64 5% more (KC 768 / 1536 / 2048 and MC 32 / 48 / 128 were level or slower).
// Sharing b's packing between the threads is what OpenBLAS's threaded driver does as well.
//
// Note [sharing b]: sharing b costs two fork-joins per block of k; threads that each pack all of b
// for themselves need one fork-join in all, but each packs all of b instead of its share, a packed
// element costing about as much as 20 multiply-adds. Measured on this Zen 5, two threads, old and
// new alternately: for cubes of n = 128 (2M multiply-adds, about 12 us) the private copy is
// 1.1-1.8x as fast (three runs), equal at n = 256; a rule that also gave it the MLP benchmark's
// products (m = 128, k*n = 400K) made that 5% slower. So each thread packs its own b only in
// products of at most kPrivateUpTo (4M) multiply-adds, where the fork-joins are what costs.
//
// The micro-kernel prefetches its tile of c into L1 48 steps of k before the end, where the tile is
// loaded and added to: single-threaded that took n = 1024 and 2048 from 197 to 207 and 213 GFLOP/s.
// (One prefetch per 16 floats: a row of c that is not 64-byte aligned has a line left out, which
// costs only speed.)
//
// Products whose b is at most 512 columns wide, with a and b in contiguous rows, are mostly not
// packed at all: Note [unpacked products]; nor are those with at most 64 rows: Note [short products].
//
// Every element of c is the same sum in the same order whatever the thread count or the split, so
// results are reproducible. This file is compiled with -mavx512f (cpu/CMakeLists.txt); matmul.cpp
// calls it only after asking the CPU.

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
constexpr int64_t NR = 48;       // columns of a micro-tile: three zmm vectors
constexpr int64_t KC = 1024;     // rows of b per packed block
constexpr int64_t MC = 64;       // rows of a per packed block
constexpr int64_t NC = 48 * 43;  // columns of b per packed block (2,064; 8 MiB packed)
constexpr int64_t kPrivateUpTo = int64_t(1) << 22;  // multiply-adds up to which each thread packs all of b
constexpr int64_t kGrainFlops = int64_t(1) << 17;    // multiply-adds below which one thread is enough

// c[:mr, :nr] gets the tile acc (load_c: added to what c holds). Inlined into the kernels, whose
// accumulators stay in registers until here.
template <int NV>
__attribute__((always_inline)) inline void store_tile(const __m512 (&acc)[MR][NV], float* c, int64_t ldc, int64_t mr,
                                                      int64_t nr, bool load_c) {
  if (mr == MR && nr == NV * 16) {
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NV; ++j) {
        float* cp = c + i * ldc + j * 16;
        _mm512_storeu_ps(cp, load_c ? _mm512_add_ps(_mm512_loadu_ps(cp), acc[i][j]) : acc[i][j]);
      }
    return;
  }
  for (int i = 0; i < mr; ++i)
    for (int j = 0; j < NV; ++j) {
      const __mmask16 m = lanes(nr - j * 16);
      if (m == 0) break;
      float* cp = c + i * ldc + j * 16;
      const __m512 v = load_c ? _mm512_add_ps(_mm512_maskz_loadu_ps(m, cp), acc[i][j]) : acc[i][j];
      _mm512_mask_storeu_ps(cp, m, v);
    }
}

// The micro-kernel: tile (MR x NV*16) = ap (k x MR) @ bp (k x NV*16); then c[:mr, :nr] gets the tile
// (load_c: added to what c holds). ap and bp are packed and 64-byte aligned.
// Unless next is null, the k lines (64 bytes) from next are prefetched into L2 while it runs, one per
// step of k (Note [the next panel of b]).
template <int NV>
void micro_kernel(int64_t k, const float* ap, const float* bp, float* c, int64_t ldc, int64_t mr,
                  int64_t nr, bool load_c, const char* next) {
  __m512 acc[MR][NV];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_setzero_ps();
  const int64_t c_prefetch_at = std::max<int64_t>(0, k - 48);
  for (int64_t p = 0; p < k; ++p) {
    if (p == c_prefetch_at)  // the tile of c is wanted when p reaches k: start bringing it into L1
      for (int64_t i = 0; i < mr; ++i)
        for (int j = 0; j < NV; ++j) _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc + j * 16), _MM_HINT_T0);
    __m512 b[NV];
    for (int j = 0; j < NV; ++j) b[j] = _mm512_load_ps(bp + j * 16);
    _mm_prefetch(reinterpret_cast<const char*>(bp + 8 * NV * 16), _MM_HINT_T0);
    if (next != nullptr) _mm_prefetch(next + p * 64, _MM_HINT_T1);
    for (int i = 0; i < MR; ++i) {
      const __m512 a = _mm512_set1_ps(ap[i]);
      for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_fmadd_ps(a, b[j], acc[i][j]);
    }
    ap += MR;
    bp += NV * 16;
  }
  store_tile<NV>(acc, c, ldc, mr, nr, load_c);
}

// Loads rows 0..nrows-1 (row(j) points at its first float) of a 16 x 16 block, the first ncols
// floats of each, zeros elsewhere, and transposes it: afterwards r[p] holds float p of every row.
template <typename RowPtr>
void load_transposed(const RowPtr& row, int64_t nrows, int64_t ncols, __m512 r[16]) {
  const __mmask16 m = lanes(ncols);
  for (int64_t j = 0; j < 16; ++j) r[j] = j < nrows ? _mm512_maskz_loadu_ps(m, row(j)) : _mm512_setzero_ps();
  transpose16(r);
}

// One operand: element (i, j) at data[i * rs + j * cs].
struct Operand {
  const float* data;
  int64_t rs, cs;
  const float* at(int64_t i, int64_t j) const { return data + i * rs + j * cs; }
};

// Packs b's block (rows p0..p0+kc, columns j0..j0+w, w <= NR) into one panel: kc rows of
// nv*16 floats (nv = ceil(w / 16)), zeros right of w. For a b whose rows are not contiguous;
// pack_b_panels reads contiguous rows itself.
void pack_b_panel(const Operand& b, int64_t p0, int64_t kc, int64_t j0, int64_t w, float* out) {
  const int64_t nv = (w + 15) / 16, stride = nv * 16;
  if (b.rs == 1) {  // b is a transposed row-major matrix: its columns are contiguous
    for (int64_t v = 0; v < nv; ++v) {
      const int64_t cols = std::min<int64_t>(16, w - v * 16);
      for (int64_t q = 0; q < kc; q += 16) {
        __m512 r[16];  // r[p]: row p0 + q + p of the panel's 16 columns
        load_transposed([&](int64_t j) { return b.at(p0 + q, j0 + v * 16 + j); }, cols, kc - q, r);
        for (int64_t p = 0; p < std::min<int64_t>(16, kc - q); ++p) _mm512_store_ps(out + (q + p) * stride + v * 16, r[p]);
      }
    }
  } else {
    for (int64_t p = 0; p < kc; ++p)
      for (int64_t j = 0; j < stride; ++j) out[p * stride + j] = j < w ? *b.at(p0 + p, j0 + j) : 0.0f;
  }
}

// Packs panels j0..j1 of b's block (rows p0..p0+kc, columns jc..jc+nc) into out, panel jp at
// out + jp * NR * kc. Rows of b that are contiguous are read row by row across the panels (one
// sequential stream, rather than kc rows a page apart for each panel).
void pack_b_panels(const Operand& b, int64_t p0, int64_t kc, int64_t jc, int64_t nc, int64_t j0, int64_t j1,
                   float* out) {
  if (b.cs != 1) {
    for (int64_t jp = j0; jp < j1; ++jp) pack_b_panel(b, p0, kc, jc + jp * NR, std::min(NR, nc - jp * NR), out + jp * NR * kc);
    return;
  }
  for (int64_t p = 0; p < kc; ++p) {
    const float* src = b.at(p0 + p, jc);
    for (int64_t jp = j0; jp < j1; ++jp) {
      const int64_t w = std::min(NR, nc - jp * NR), nv = (w + 15) / 16;
      float* dst = out + jp * NR * kc + p * nv * 16;
      for (int64_t v = 0; v < nv; ++v)
        _mm512_store_ps(dst + v * 16, _mm512_maskz_loadu_ps(lanes(w - v * 16), src + jp * NR + v * 16));
    }
  }
}

// Packs a's block (rows i0..i0+mc, columns p0..p0+kc) into micro-panels of MR rows, each kc x MR,
// zeros below the last row.
void pack_a(const Operand& a, int64_t i0, int64_t mc, int64_t p0, int64_t kc, float* out) {
  for (int64_t i = 0; i < mc; i += MR, out += kc * MR) {
    const int64_t rows = std::min(MR, mc - i);
    if (a.rs == 1 && rows == MR) {  // a transposed: the MR values of one p are contiguous
      for (int64_t p = 0; p < kc; ++p)
        _mm256_store_ps(out + p * MR, _mm256_loadu_ps(a.at(i0 + i, p0 + p)));
    } else if (a.cs == 1) {  // rows of a are contiguous: read them 16 columns at a time
      for (int64_t q = 0; q < kc; q += 16) {
        __m512 r[16];  // r[p]: column p0 + q + p of the rows, in the first MR lanes
        load_transposed([&](int64_t j) { return a.at(i0 + i + j, p0 + q); }, rows, kc - q, r);
        for (int64_t p = 0; p < std::min<int64_t>(16, kc - q); ++p)
          _mm256_store_ps(out + (q + p) * MR, _mm512_castps512_ps256(r[p]));
      }
    } else {
      for (int64_t p = 0; p < kc; ++p)
        for (int64_t r = 0; r < MR; ++r) out[p * MR + r] = r < rows ? *a.at(i0 + i + r, p0 + p) : 0.0f;
    }
  }
}

// c[i0..i1, panels pa..pb) += (or =) a[i0..i1, block] @ packed b panels, packing a as it goes.
void compute_block(const Operand& a, int64_t i0, int64_t i1, int64_t p0, int64_t kc, const float* bp,
                   int64_t j0, int64_t n, int64_t pa, int64_t pb, float* c, int64_t ldc, bool load_c) {
  ScratchBuffer<float> ap(static_cast<size_t>(std::min(MC, (i1 - i0 + MR - 1) / MR * MR) * kc));
  for (int64_t ic = i0; ic < i1; ic += MC) {
    const int64_t mc = std::min(MC, i1 - ic);
    pack_a(a, ic, mc, p0, kc, ap.data());
    const int64_t calls = (mc + MR - 1) / MR;  // micro-kernel calls per panel of b
    for (int64_t jp = pa; jp < pb; ++jp) {
      const int64_t jr = jp * NR, w = std::min(NR, n - jr);
      const float* panel = bp + jr * kc;
      for (int64_t ir = 0, call = 0; ir < mc; ir += MR, ++call) {
        const float* apanel = ap.data() + ir * kc;
        float* cp = c + (ic + ir) * ldc + j0 + jr;
        const int64_t mr = std::min(MR, mc - ir);
        // Note [the next panel of b]: the last three calls on this panel prefetch the next panel's
        // slot, kc lines (a third of it) each.
        const int64_t third = call - (calls - 3);
        const char* pf = jp + 1 < pb && third >= 0 ? reinterpret_cast<const char*>(panel + NR * kc + third * kc * 16) : nullptr;
        if (w > 32) {
          micro_kernel<3>(kc, apanel, panel, cp, ldc, mr, w, load_c, pf);
        } else if (w > 16) {
          micro_kernel<2>(kc, apanel, panel, cp, ldc, mr, w, load_c, pf);
        } else {
          micro_kernel<1>(kc, apanel, panel, cp, ldc, mr, w, load_c, pf);
        }
      }
    }
  }
}

// Note [unpacked products]: packing costs about as much as 20 multiply-adds an element, once for
// each element of a and of b; in a cube of n = 256 each packed element then feeds only 256
// multiply-adds, and on two threads each thread packs b's block or waits for the other at a
// fork-join. So where b is narrow (n <= kUnpackedUpToN) and a and b have contiguous rows, nothing is
// packed: the micro-kernel below reads a's 8 rows and b's rows where they lie. A block of b (kc x n,
// at most 512 KiB) stays in L2 while a thread walks its rows of c, each tile's 8 rows of a in L1
// while it walks b's panels. Each block of b is one more pass over all of c, so a product with
// several blocks of k goes unpacked only while c is small (m x n <= kUnpackedCUpTo floats, 1 MiB);
// a large c takes the packed loops, whose blocks of k are 1,024 rows deep.
// A narrow last panel (n not a multiple of 48) is the one thing copied, zero-padded to whole
// vectors: a masked load in the loop would make GCC keep the accumulators in memory (it cannot
// tell that the load does not read them), which ran 2.7x slower.
// Measured on this Zen 5, in one process with calls alternating, against OpenBLAS's AVX-512 kernel:
// single-threaded 3-6% ahead at n = 208..304 and level at 496..512; on two threads (OpenBLAS split
// by Kiln's pool) 8-9% ahead at n = 256 and 5% at 512 (two blocks of k). Against the packed loops,
// level at n = 768 and 0.84x at 1024, where b's block no longer fits L2 beside a's rows. Other
// shapes, two threads, n = 256 and 512: (m, k) = (4096, 256), (256, 4096), (512, 2048), (300, 300)
// 3-12% ahead of OpenBLAS; (2048, 512) 5% ahead at n = 256, and level at n = 512 on the packed
// loops (c of 4 MiB, two blocks of k).
constexpr int64_t kUnpackedUpToN = 512;
constexpr int64_t kUnpackedBlockFloats = int64_t(1) << 17;  // b's block: kc x n <= 512 KiB
constexpr int64_t kUnpackedCUpTo = int64_t(1) << 18;        // c: m x n <= 1 MiB, when k has several blocks

int64_t unpacked_block_rows(int64_t n) { return std::clamp<int64_t>(kUnpackedBlockFloats / n, 16, KC); }

// Note [short products]: with few rows of c (m <= 64: a convolution's output channels per group,
// multiplying its im2col columns) each element of b feeds only m multiply-adds, so packing b, as
// OpenBLAS does for every product, costs about as much as the arithmetic: in conv3d's forward
// (cpu/conv.cpp) OpenBLAS's packing of the columns took as much time as its kernel. Such products go
// unpacked at any width: b in chunks of 11 panels (528 columns; a chunk of kc rows stays in L2 while
// c's tiles walk it), each chunk's blocks of k in turn, so c's chunk (m x 528 floats) stays in cache
// across them. A panel's rows are a line each, far apart, which no hardware prefetcher follows: the
// kernel prefetches the row kPrefetchRows ahead (past b's last row too: a prefetch never faults).
// Measured on a 2-vCPU Sapphire Rapids Xeon against OpenBLAS's AVX-512 kernel split by Kiln's pool
// (best of 7, two processes alternating, two rounds, GFLOP/s on one thread / two): m, n, k = 32,
// 1024, 432 (conv3d's columns) 87 / 185 -> 154-158 / 280-284; 64, 196, 288 (the CNN's second
// convolution) 132 / 157-181 -> 147-151 / 251-269; 64, 4096, 576 113 / 218-222 -> 136-142 / 244-251;
// 8, 4096, 256 38 / 81 -> 98 / 229; 32, 784, 9 (the CNN's first) 79-82 / 75-81 -> 95-96 / 76-83. The
// prefetch alone took 32, 1024, 432 from 120-138 to 167-173 on one thread, and left 256^3 and 512^3
// (unpacked products before) level. Measured on that Xeon only: on the Zen 4 and 5 where the
// unpacked path was tuned, the choice is unmeasured.
constexpr int64_t kShortRows = 64;
constexpr int64_t kPrefetchRows = 6;  // how far ahead the unpacked kernel prefetches b's rows
constexpr int64_t kChunkPanels = (kUnpackedUpToN + NR - 1) / NR;  // 11 panels, 528 columns

// c[:mr, :nr] (+)= a[:mr, :k] @ b[:k, :nr] from unpacked rows: a's row i at a + i * lda (rows from mr
// on read row mr - 1 again and are not stored), b's row p at b + p * ldb, NV*16 floats of which are
// read (nr <= NV*16). Each element of the tile is one sum over p in order, as in micro_kernel. Not
// inlined: GCC inlines the one-vector kernel into unpacked_block, where it ran 14% slower at
// n = 256 (a 16-column last panel).
template <int NV>
__attribute__((noinline)) void unpacked_kernel(int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                                               float* c, int64_t ldc, int64_t mr, int64_t nr, bool load_c) {
  __m512 acc[MR][NV];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_setzero_ps();
  const float* row[MR];
  for (int i = 0; i < MR; ++i) row[i] = a + std::min<int64_t>(i, mr - 1) * lda;
  const int64_t c_prefetch_at = std::max<int64_t>(0, k - 48);
  for (int64_t p = 0; p < k; ++p) {
    if (p == c_prefetch_at)
      for (int64_t i = 0; i < mr; ++i)
        for (int j = 0; j < NV; ++j) _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc + j * 16), _MM_HINT_T0);
    __m512 bv[NV];
    for (int j = 0; j < NV; ++j)  // Note [short products]
      _mm_prefetch(reinterpret_cast<const char*>(b + kPrefetchRows * ldb + j * 16), _MM_HINT_T0);
    for (int j = 0; j < NV; ++j) bv[j] = _mm512_loadu_ps(b + j * 16);  // unmasked: see the Note
    for (int i = 0; i < MR; ++i) {
      const __m512 av = _mm512_set1_ps(row[i][p]);
      for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_fmadd_ps(av, bv[j], acc[i][j]);
    }
    b += ldb;
  }
  store_tile<NV>(acc, c, ldc, mr, nr, load_c);
}

// Rows i0..i1 and panels jp0..jp1 of c (m x n) from a block of k rows of b, nothing packed but the
// narrow last panel (columns n_full..n, fewer than NR), which is read from edge: k rows of
// 16 * ceil((n - n_full) / 16) floats.
void unpacked_block(const Operand& a, const Operand& b, int64_t i0, int64_t i1, int64_t jp0, int64_t jp1,
                    int64_t n, int64_t k, bool load_c, float* c, int64_t ldc, int64_t n_full, const float* edge) {
  const int64_t w = n - n_full;
  for (int64_t i = i0; i < i1; i += MR) {
    const int64_t mr = std::min(MR, i1 - i);
    const float* ar = a.at(i, 0);
    for (int64_t jp = jp0; jp < jp1; ++jp) {
      const int64_t j = jp * NR;
      float* cp = c + i * ldc + j;
      if (j < n_full) {
        unpacked_kernel<3>(k, ar, a.rs, b.at(0, j), b.rs, cp, ldc, mr, NR, load_c);
      } else if (w > 32) {
        unpacked_kernel<3>(k, ar, a.rs, edge, 48, cp, ldc, mr, w, load_c);
      } else if (w > 16) {
        unpacked_kernel<2>(k, ar, a.rs, edge, 32, cp, ldc, mr, w, load_c);
      } else {
        unpacked_kernel<1>(k, ar, a.rs, edge, 16, cp, ldc, mr, w, load_c);
      }
    }
  }
}

// One fork-join in all (Note [unpacked products]): each thread its rows of c or, when c has too few
// rows for that, its panels; b in blocks of kc rows. Which thread computes a tile never changes its
// sums, so the bits do not depend on the thread count.
void unpacked_gemm(const Operand& A, const Operand& B, int64_t m, int64_t n, int64_t k, bool accumulate, float* c,
                   int64_t ldc) {
  const int64_t kc_max = unpacked_block_rows(std::min(n, kChunkPanels * NR));
  const int64_t n_full = n / NR * NR, w = n - n_full, edge_width = (w + 15) / 16 * 16;
  const int64_t m_tiles = (m + MR - 1) / MR, panels = (n + NR - 1) / NR;
  auto block = [&](int64_t i0, int64_t i1, int64_t jp0, int64_t jp1) {
    const bool edge_in = w > 0 && jp1 == panels;
    ScratchBuffer<float> edge(static_cast<size_t>(edge_in ? std::min(kc_max, k) * edge_width : 1));
    for (int64_t jq0 = jp0; jq0 < jp1; jq0 += kChunkPanels) {  // a wide b in chunks (Note [short products])
      const int64_t jq1 = std::min(jp1, jq0 + kChunkPanels);
      for (int64_t pc = 0; pc < k; pc += kc_max) {
        const int64_t kc = std::min(kc_max, k - pc);
        if (edge_in && jq1 == panels) pack_b_panels(B, pc, kc, n_full, w, 0, 1, edge.data());
        unpacked_block({A.at(0, pc), A.rs, 1}, {B.at(pc, 0), B.rs, 1}, i0, i1, jq0, jq1, n, kc,
                       accumulate || pc > 0, c, ldc, n_full, edge.data());
      }
    }
  };
  if (split_by_rows(m_tiles, panels)) {
    parallel_for(0, m_tiles, std::max<int64_t>(1, kGrainFlops / (MR * n * k)),
                 [&](int64_t t0, int64_t t1) { block(t0 * MR, std::min(m, t1 * MR), 0, panels); });
  } else {
    parallel_for(0, panels, std::max<int64_t>(1, kGrainFlops / (m * NR * k)),
                 [&](int64_t j0, int64_t j1) { block(0, m, j0, j1); });
  }
}

// The Goto/BLIS loops over all of c (m x n), b's blocks packed by all threads together. Inside a
// parallel_for its own parallel_for calls run serially.
void blocked_gemm(const Operand& A, const Operand& B, int64_t m, int64_t n, int64_t k, bool accumulate, float* c,
                  int64_t ldc) {
  const int64_t m_tiles = (m + MR - 1) / MR;
  for (int64_t jc = 0; jc < n; jc += NC) {
    const int64_t nc = std::min(NC, n - jc), panels = (nc + NR - 1) / NR;
    ScratchBuffer<float> bp(static_cast<size_t>(panels * NR * std::min(KC, k)));
    for (int64_t pc = 0; pc < k; pc += KC) {
      const int64_t kc = std::min(KC, k - pc);
      const bool load_c = accumulate || pc > 0;
      // 1. Pack b's block, the panels shared out between the threads.
      parallel_for(0, panels, 2, [&](int64_t j0, int64_t j1) { pack_b_panels(B, pc, kc, jc, nc, j0, j1, bp.data()); });
      // 2-3. Each thread its rows of c or, when c has too few rows for that, its panels.
      if (split_by_rows(m_tiles, panels)) {
        const int64_t tile_flops = MR * nc * kc;
        parallel_for(0, m_tiles, std::max<int64_t>(1, kGrainFlops / tile_flops), [&](int64_t t0, int64_t t1) {
          compute_block(A, t0 * MR, std::min(m, t1 * MR), pc, kc, bp.data(), jc, nc, 0, panels, c, ldc, load_c);
        });
      } else {
        const int64_t panel_flops = m * NR * kc;
        parallel_for(0, panels, std::max<int64_t>(1, kGrainFlops / panel_flops), [&](int64_t j0, int64_t j1) {
          compute_block(A, 0, m, pc, kc, bp.data(), jc, nc, j0, j1, c, ldc, load_c);
        });
      }
    }
  }
}

}  // namespace

bool sgemm_avx512_unpacked(int64_t m, int64_t n, int64_t k, int64_t a_cs, int64_t b_cs) {
  if (a_cs != 1 || b_cs != 1 || n <= 0) return false;
  if (n > kUnpackedUpToN) return m <= kShortRows;  // Note [short products]
  return k <= unpacked_block_rows(n) || m * n <= kUnpackedCUpTo;
}

void sgemm_avx512(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs,
                  const float* b, int64_t b_rs, int64_t b_cs, bool accumulate, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    if (!accumulate)
      for (int64_t i = 0; i < m; ++i) std::memset(c + i * ldc, 0, sizeof(float) * n);
    return;
  }
  const Operand A{a, a_rs, a_cs}, B{b, b_rs, b_cs};
  if (sgemm_avx512_unpacked(m, n, k, a_cs, b_cs)) {
    unpacked_gemm(A, B, m, n, k, accumulate, c, ldc);
    return;
  }
  const int threads = get_num_threads();
  const int64_t m_tiles = (m + MR - 1) / MR;
  // Small products (Note [sharing b]): each thread its rows of c, all of b packed by itself (the
  // blocked loops of a thread's rows run serially, inside this parallel_for).
  if (threads > 1 && m * n * k <= kPrivateUpTo && m_tiles >= 2 * threads) {
    parallel_for(0, m_tiles, std::max<int64_t>(1, kGrainFlops / (MR * n * k)), [&](int64_t t0, int64_t t1) {
      const int64_t i0 = t0 * MR;
      blocked_gemm({A.at(i0, 0), A.rs, A.cs}, B, std::min(m, t1 * MR) - i0, n, k, accumulate, c + i0 * ldc, ldc);
    });
    return;
  }
  blocked_gemm(A, B, m, n, k, accumulate, c, ldc);
}

}  // namespace kiln::cpu
