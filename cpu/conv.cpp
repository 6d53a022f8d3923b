// cpu/conv.cpp: 2-D and 3-D convolution and their two backward kernels, by im2col + GEMM.
//
// For one image and one group, the (C_in/groups * kH * kW, H_out * W_out) "column" matrix holds, for
// each output position, the input patch it sees (zeros in the padding); then
//   forward:         out (C_out/g, P)  = W (C_out/g, K) @ col (K, P)
//   backward input:  col (K, P)        = W^T @ grad_out (C_out/g, P), scattered back (col2im)
//   backward weight: grad_W (C_out/g, K) += grad_out @ col^T
// An image is a sample in 2-D and one output depth of a sample in 3-D (Note [3-D convolution]).
// The GEMMs are gemm() of matmul.cpp (OpenBLAS, single-threaded, or sgemm.cpp's kernel: Note [which
// float32 GEMM] there; for bfloat16 the Note below); the pool of cpu/parallel.h splits the images,
// each piece with its own column buffer (and, for the weight gradient, its own accumulator, summed in
// piece order so the result does not depend on timing). With fewer images than threads, the columns
// of each GEMM are split instead. A 1x1 convolution with stride 1 and no padding needs no columns:
// the input plane is the column matrix; one with stride 1 and an output as wide as its input has its
// columns copied in spans (Note [im2col in spans]). For bfloat16, the forward and the input's
// gradient multiply the columns of several images at once (Note [images side by side]).
//
// Note [3-D convolution]: output depth t of a 3-D convolution reads input depths
// t * stride_d + kd * dilation_d - pad_d for kd < kD, so its columns are the 2-D columns of those kD
// depth planes stacked, (C_in/groups * kD * kH * kW, P), in the weight's (C_in/groups, kD, kH, kW)
// order, with zero rows for depths in the padding; its output plane is depth t of out, whose rows
// (output channels) lie D_out * P apart. So every (sample, output depth) pair is an image of the 2-D
// kernels, which read the depth's planes where they lie; a 2-D convolution is the 3-D one with every
// depth 1. ops/conv.cpp took a 3-D convolution to 2-D ones by copying each sample's kD depth windows
// into the channels (Note [conv3d as conv2d] there, still the way on CUDA) and the output back into
// NCDHW. On a 2-vCPU Sapphire Rapids Xeon, (4, 16, 16, 32, 32) to 32 channels, 3x3x3, padding 1,
// forward (best of 30 in a probe): 15.3 ms that way, 11.3 with its GEMMs unpacked (Note [short
// products] in sgemm.cpp), 9.2 with these kernels (the copies gone), 7.6 with the columns' rows
// padded (padded_ld) and the GEMM's prefetch; with the weight's gradient 31.3 -> 16.0 (Note [the
// weight's gradient transposed]). Against PyTorch 1.13 (oneDNN), three alternating rounds of
// bench_cnn_layers: 8.36 ms against 6.24 forward (2.72x before), 17.8 against 13.5 with the weight's
// gradient (2.49x before; benchmarks/results/cpu-2026-12-06-spr-conv3d.jsonl).
//
// Note [bfloat16 convolution]: bfloat16 inputs (autocast's convolutions) are read as they are, the
// columns are bfloat16 too, and every product is a float32 sum of exact products (cpu/bf16_products.h:
// bf16gemm.cpp's AMX or AVX512-BF16 kernel where matmul takes it, else float32 copies of the two
// operands), rounded to bfloat16 once: the forward's after the bias is added, the input gradient's
// after col2im has summed the columns in float32, the weight gradient's after the batch's pieces are
// summed in float32. These are the float32 kernel's sums on the same values, up to the order of the
// additions, which is what the CPU computed before, on float32 copies that ops/conv.cpp made of the
// whole tensors.
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "cpu/bf16_products.h"
#include "cpu/kernels.h"
#include "cpu/parallel.h"

namespace kiln::cpu {
namespace {

struct Geometry {
  int64_t N, C, H, W, Co, kH, kW, Ho, Wo, G, Cg, Cog, K, P;
  int64_t D = 1, kD = 1, Do = 1;  // depths: a 3-D convolution's (Note [3-D convolution]), else 1
  ConvArgs a;
  bool pointwise() const {
    return kD == 1 && kH == 1 && kW == 1 && a.stride_d == 1 && a.stride_h == 1 && a.stride_w == 1 &&
           a.pad_d == 0 && a.pad_h == 0 && a.pad_w == 0;
  }
  int64_t images() const { return N * Do; }
  // Image u's sample's group grp of the input (Cg, D, H, W) or output (Cog, Do, Ho, Wo), and that
  // output's image: its rows Do * P apart.
  template <typename T>
  T* input_group(T* x, int64_t u, int64_t grp) const {
    return x + (u / Do * C + grp * Cg) * D * H * W;
  }
  template <typename T>
  T* output_image(T* y, int64_t u, int64_t grp) const {
    return y + (u / Do * Co + grp * Cog) * Do * P + u % Do * P;
  }
};

Geometry geometry(const View& input, const View& weight, const View& out, const ConvArgs& a) {
  Geometry g;
  const int d = input.ndim() == 5 ? 1 : 0;  // a 3-D convolution's depth dim comes before H and W
  g.N = input.sizes[0], g.C = input.sizes[1], g.H = input.sizes[2 + d], g.W = input.sizes[3 + d];
  g.Co = weight.sizes[0], g.kH = weight.sizes[2 + d], g.kW = weight.sizes[3 + d];
  g.Ho = out.sizes[2 + d], g.Wo = out.sizes[3 + d];
  if (d == 1) g.D = input.sizes[2], g.kD = weight.sizes[2], g.Do = out.sizes[2];
  g.G = a.groups, g.Cg = g.C / a.groups, g.Cog = g.Co / a.groups;
  g.K = g.Cg * g.kD * g.kH * g.kW, g.P = g.Ho * g.Wo;
  g.a = a;
  return g;
}

// The depth plane of channel c of a sample's group xs (Cg, D, H, W) that output depth t reads
// through kernel depth kd, or nullptr where that depth lies in the padding.
template <typename T>
T* depth_plane(T* xs, const Geometry& g, int64_t c, int64_t t, int64_t kd) {
  const int64_t z = t * g.a.stride_d + kd * g.a.dilation_d - g.a.pad_d;
  return z >= 0 && z < g.D ? xs + (c * g.D + z) * g.H * g.W : nullptr;
}

// The output columns [lo, hi) whose input column ow * stride_w + w_off lies in [0, W), and likewise
// the output rows whose input row oh * stride_h + h_off lies in [0, H).
struct Inside {
  int64_t lo, hi;
};
Inside inside(int64_t out, int64_t stride, int64_t off, int64_t in) {
  int64_t lo = 0, hi = out;
  while (lo < out && lo * stride + off < 0) ++lo;
  while (hi > lo && (hi - 1) * stride + off >= in) --hi;
  return {lo, hi};
}

// Whether im2col and col2im move whole planes at once (Note [im2col in spans]).
bool spans(const Geometry& g) { return g.a.stride_h == 1 && g.a.stride_w == 1 && g.Wo == g.W; }

// Note [im2col in spans]: with stride 1 and an output as wide as the input (a "same" convolution, as
// the CNN's), a column row's valid part, rows oh_lo..oh_hi, is the input plane shifted by whole rows
// and columns: consecutive output rows read consecutive input rows, Wo = W apart on both sides. So
// one copy moves it all, from the first row's first valid column to the last row's last one; it also
// carries, at each row's ends, the neighbouring row's elements, which are then overwritten with the
// padding's zeros. col2im does the same in reverse: it zeroes those columns of its own scratch first
// and adds the span in one loop. Rows of 14 elements, as the CNN's second convolution has, went
// through a copy call each before. The sums are the same, in the same order: what the span adds
// beyond them is zeros, and x + 0 = x for every x a sum from +0 can reach (never -0).

// Zeroes columns [0, cols.lo) and [cols.hi, Wo) of rows [r0, r1) of a column row (Wo wide), column
// by column: a row at a time, std::fill (or a loop, which GCC turns into the same) became two calls
// of memset for one element each (a 3x3 window's padding of 1), which took a quarter of the time of
// the CNN's second bfloat16 convolution.
template <typename T>
void zero_padding_columns(T* row, int64_t Wo, int64_t r0, int64_t r1, const Inside& cols) {
  for (int64_t c = 0; c < cols.lo; ++c)
    for (int64_t r = r0; r < r1; ++r) row[r * Wo + c] = T(0);
  for (int64_t c = cols.hi; c < Wo; ++c)
    for (int64_t r = r0; r < r1; ++r) row[r * Wo + c] = T(0);
}

// col (K, P) = the patches that output depth t (0 in 2-D) sees in a sample's group xs (Cg, D, H, W),
// one row per (channel, kernel depth, kernel row, kernel column), rows ld apart (P, or more where the
// columns of several images lie side by side: Note [images side by side]).
template <typename T>
void im2col(const T* xs, const Geometry& g, int64_t t, T* col, int64_t ld) {
  const auto& a = g.a;
  const bool whole = spans(g);
  for (int64_t c = 0; c < g.Cg; ++c) {
    for (int64_t kd = 0; kd < g.kD; ++kd) {
      const T* plane = depth_plane(xs, g, c, t, kd);
      for (int64_t i = 0; i < g.kH; ++i) {
        for (int64_t j = 0; j < g.kW; ++j) {
          T* row = col + (((c * g.kD + kd) * g.kH + i) * g.kW + j) * ld;
          if (plane == nullptr) {  // a depth in the padding
            std::fill(row, row + g.P, T(0));
            continue;
          }
          const int64_t h_off = i * a.dilation_h - a.pad_h, w_off = j * a.dilation_w - a.pad_w;
          const Inside cols = inside(g.Wo, a.stride_w, w_off, g.W);
          const Inside rows = inside(g.Ho, a.stride_h, h_off, g.H);
          std::fill(row, row + rows.lo * g.Wo, T(0));
          std::fill(row + rows.hi * g.Wo, row + g.P, T(0));
          if (whole) {  // stride 1 both ways: one copy (Note [im2col in spans])
            if (rows.lo < rows.hi && cols.lo < cols.hi) {
              const int64_t first = rows.lo * g.Wo + cols.lo, last = (rows.hi - 1) * g.Wo + cols.hi;
              std::memcpy(row + first, plane + (first + h_off * g.W + w_off), sizeof(T) * (last - first));
            }
          } else {
            for (int64_t oh = rows.lo; oh < rows.hi; ++oh) {
              T* dst = row + oh * g.Wo;
              const T* src = plane + (oh * a.stride_h + h_off) * g.W;  // input column ow * stride_w + w_off
              if (a.stride_w == 1) {
                if (cols.hi > cols.lo)
                  std::memcpy(dst + cols.lo, src + cols.lo + w_off, sizeof(T) * (cols.hi - cols.lo));
              } else {
                for (int64_t ow = cols.lo; ow < cols.hi; ++ow) dst[ow] = src[ow * a.stride_w + w_off];
              }
            }
          }
          zero_padding_columns(row, g.Wo, rows.lo, rows.hi, cols);
        }
      }
    }
  }
}

// xs (Cg, D, H, W) += output depth t's columns (rows ld apart, as im2col's) scattered back to where
// im2col read them. The columns are scratch: in spans (Note [im2col in spans]) the padding's
// columns are zeroed in them.
template <typename T>
void col2im(T* col, const Geometry& g, int64_t t, T* xs, int64_t ld) {
  const auto& a = g.a;
  const bool whole = spans(g);
  for (int64_t c = 0; c < g.Cg; ++c) {
    for (int64_t kd = 0; kd < g.kD; ++kd) {
      T* plane = depth_plane(xs, g, c, t, kd);
      if (plane == nullptr) continue;
      for (int64_t i = 0; i < g.kH; ++i) {
        for (int64_t j = 0; j < g.kW; ++j) {
          T* row = col + (((c * g.kD + kd) * g.kH + i) * g.kW + j) * ld;
          const int64_t h_off = i * a.dilation_h - a.pad_h, w_off = j * a.dilation_w - a.pad_w;
          const Inside cols = inside(g.Wo, a.stride_w, w_off, g.W);
          if (whole) {
            const Inside rows = inside(g.Ho, 1, h_off, g.H);
            if (rows.lo == rows.hi || cols.lo == cols.hi) continue;
            const int64_t first = rows.lo * g.Wo + cols.lo, last = (rows.hi - 1) * g.Wo + cols.hi;
            zero_padding_columns(row, g.Wo, rows.lo, rows.hi, cols);  // what the span would add there
            T* dst = plane + (first + h_off * g.W + w_off);  // summed first: in the plane, unlike first alone
            const T* src = row + first;
            for (int64_t e = 0; e < last - first; ++e) dst[e] += src[e];
            continue;
          }
          for (int64_t oh = 0; oh < g.Ho; ++oh) {
            const int64_t ih = oh * a.stride_h + h_off;
            if (ih < 0 || ih >= g.H) continue;
            const T* src = row + oh * g.Wo;
            T* dst = plane + ih * g.W;
            for (int64_t ow = cols.lo; ow < cols.hi; ++ow) dst[ow * a.stride_w + w_off] += src[ow];
          }
        }
      }
    }
  }
}

// How the batch is split: into `pieces` runs of samples, at most one per thread; or, when there are
// fewer samples than threads (one image) and the work is large, one piece whose GEMMs split the columns
// of each product over the threads instead (split_gemm).
struct BatchSplit {
  int pieces = 1;
  bool split_gemm = false;
};
BatchSplit batch_split(int64_t N, int64_t work_per_sample) {
  if (N < get_num_threads() && work_per_sample >= (1 << 18)) return {1, true};
  return {parallel_pieces(N, std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(work_per_sample, 1))), false};
}

// Runs fn(piece, n0, n1, gemm) for each piece of the batch, where gemm has mixed_gemm's signature
// without its first argument: c (m, n) of T's compute type F (+)= op(a) @ op(b) for a and b of T.
template <typename T, typename Fn>
void run_batch(const BatchSplit& split, int64_t N, bool own_bf16, const Fn& fn) {
  using F = typename ComputeOf<T>::type;
  if (split.split_gemm) {
    fn(0, 0, N, [own_bf16](bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
                           const T* b, int64_t ldb, bool accumulate, F* c, int64_t ldc) {
      // The GEMM is chosen once for the whole product, so the choice does not depend on the pieces.
      [[maybe_unused]] const bool own = gemm_uses_own<T>(ta, tb, m, n, k, lda, ldb);  // float32 only
      const int64_t grain = std::max<int64_t>(16, (1 << 16) / std::max<int64_t>(m * k, 1));
      parallel_for(0, n, grain, [&](int64_t j0, int64_t j1) {
        const T* bj = tb ? b + j0 * ldb : b + j0;
        if constexpr (std::is_same_v<T, F>) {
          gemm_chosen<T>(own, ta, tb, m, j1 - j0, k, a, lda, bj, ldb, accumulate, c + j0, ldc);
        } else {
          mixed_gemm(own_bf16, ta, tb, m, j1 - j0, k, a, lda, bj, ldb, accumulate, c + j0, ldc);
        }
      });
    });
    return;
  }
  const int pieces = split.pieces;
  auto gemm = [own_bf16](bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
                         const T* b, int64_t ldb, bool accumulate, F* c, int64_t ldc) {
    mixed_gemm(own_bf16, ta, tb, m, n, k, a, lda, b, ldb, accumulate, c, ldc);
  };
  parallel_for(0, pieces, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) fn(p, N * p / pieces, N * (p + 1) / pieces, gemm);
  });
}

// Note [images side by side]: a convolution's products are small where its output planes are (the
// CNN's second: 64 x 196 from k = 288, per image), and bf16gemm.cpp's kernel then spends a share of
// its time outside full micro-tiles: 196 columns are four panels of 48 and a fifth of 4, whose call
// costs about what a full one does. So a bfloat16 forward lays the columns of several images of its
// piece side by side, (K, nb * P), and multiplies them in one product (784 columns: sixteen panels
// and one of 16); the input's gradient multiplies the images' output gradients, copied side by
// side, into such columns. On bf16gemm.cpp's kernels each element of c is the same sum in the same
// order whatever c's width, so the results are those of one product per image. nb gives the product
// at least kSideBySideColumns columns, the columns at most kSideBySideBytes. float32 and float64 go
// on one image at a time, straight into the output (their products are OpenBLAS's or sgemm.cpp's).
// On a Zen 4 this and zero_padding_columns took the CNN's second convolution from 4.50 to 3.03 ms
// forward and 5.45 to 3.93 for the input's gradient (2 threads, medians of 5 rounds); the weight's
// gradient, 4.04 to 3.19, by zero_padding_columns alone (its products sum over the columns, whose
// 196 are already long enough).
constexpr int64_t kSideBySideColumns = 768;
constexpr int64_t kSideBySideBytes = int64_t(1) << 20;

// The row stride of the forward's columns, ld elements wide: a whole number of 64-byte lines, odd, so
// that the GEMM's walk down a column panel (sgemm.cpp's unpacked kernel, a line per row) spreads over
// the cache's sets; rows 4 KiB apart (a 32 x 32 output plane) all fall into one. On a Sapphire Rapids
// Xeon this took conv3d's forward (Note [3-D convolution]) from 8.1-8.5 to 7.6-8.1 ms.
template <typename T>
int64_t padded_ld(int64_t ld) {
  constexpr int64_t kPerLine = 64 / sizeof(T);
  const int64_t lines = (ld + kPerLine - 1) / kPerLine;
  return (lines % 2 == 0 ? lines + 1 : lines) * kPerLine;
}

int64_t images_side_by_side(const Geometry& g, int64_t element_bytes) {
  const int64_t wanted = (kSideBySideColumns + g.P - 1) / g.P;
  const int64_t fit = kSideBySideBytes / std::max<int64_t>(1, g.K * g.P * element_bytes);
  return std::max<int64_t>(1, std::min(wanted, fit));
}

template <typename T>
void conv_typed(const View& input, const View& weight, const View& bias, const View& out, const ConvArgs& args) {
  using F = typename ComputeOf<T>::type;
  constexpr bool kNarrow = !std::is_same_v<T, F>;  // sums in float32 scratch, rounded into out
  const bool own_bf16 = own_bf16_products<T>();
  const Geometry g = geometry(input, weight, out, args);
  const T* x = input.ptr<T>();
  const T* w = weight.ptr<T>();
  const T* b = bias.data ? bias.ptr<T>() : nullptr;
  T* y = out.ptr<T>();
  const bool direct = g.pointwise();
  const int64_t nb = kNarrow && !direct ? images_side_by_side(g, sizeof(T)) : 1;  // Note [images side by side]
  const int64_t out_rows = g.Do * g.P;  // how far apart an output image's rows lie
  run_batch<T>(batch_split(g.images(), g.Co * g.K * g.P), g.images(), own_bf16,
               [&](int64_t, int64_t u0, int64_t u1, const auto& gemm) {
    const int64_t widest = std::min(nb, u1 - u0) * g.P;
    ScratchBuffer<T> col(direct ? 0 : static_cast<size_t>(g.K * padded_ld<T>(widest)));
    ScratchBuffer<F> sums(kNarrow ? static_cast<size_t>(g.Cog * widest) : 0);
    for (int64_t u = u0; u < u1; u += nb) {
      const int64_t images = std::min(nb, u1 - u), ld = images * g.P;  // ld: the product's width
      const int64_t ld_col = padded_ld<T>(ld);
      for (int64_t grp = 0; grp < g.G; ++grp) {
        if (!direct)
          for (int64_t i = 0; i < images; ++i)
            im2col(g.input_group(x, u + i, grp), g, (u + i) % g.Do, col.data() + i * g.P, ld_col);
        // A pointwise convolution's columns are the input's depth plane itself, its rows D H W apart.
        const T* cols = direct ? g.input_group(x, u, grp) + u % g.Do * g.P : col.data();
        const int64_t ld_cols = direct ? g.D * g.P : ld_col;
        F* yf;  // where the group's output is summed: its images side by side in scratch, or out itself
        int64_t ld_y;
        if constexpr (kNarrow) {
          yf = sums.data(), ld_y = ld;
        } else {
          yf = g.output_image(y, u, grp), ld_y = out_rows;  // one image (nb is 1)
        }
        gemm(false, false, g.Cog, ld, g.K, w + grp * g.Cog * g.K, g.K, cols, ld_cols, false, yf, ld_y);
        for (int64_t i = 0; i < images; ++i) {
          for (int64_t co = 0; co < g.Cog; ++co) {
            F* row = yf + co * ld_y + i * g.P;
            if (b) {
              const F bv = static_cast<F>(b[grp * g.Cog + co]);
              for (int64_t p = 0; p < g.P; ++p) row[p] += bv;
            }
            if constexpr (kNarrow) narrow(row, g.output_image(y, u + i, grp) + co * out_rows, g.P, own_bf16);
          }
        }
      }
    }
  });
}

// The batch is split by samples, not images: a 3-D convolution's output depths add into the same
// input planes.
template <typename T>
void conv_backward_input_typed(const View& grad_out, const View& weight, const View& grad_input,
                               const ConvArgs& args) {
  using F = typename ComputeOf<T>::type;
  constexpr bool kNarrow = !std::is_same_v<T, F>;  // col2im sums in float32 scratch, rounded into gx
  const bool own_bf16 = own_bf16_products<T>();
  const Geometry g = geometry(grad_input, weight, grad_out, args);
  const T* gy = grad_out.ptr<T>();
  const T* w = weight.ptr<T>();
  T* gx = grad_input.ptr<T>();
  const bool direct = g.pointwise();
  const int64_t group_size = g.Cg * g.D * g.H * g.W;  // one sample's group of gx
  const int64_t out_rows = g.Do * g.P;
  // bfloat16: the columns of several images side by side (Note [images side by side]), from their
  // gradients copied side by side, each image's then summed back by col2im on its own.
  const int64_t nb = kNarrow && !direct ? images_side_by_side(g, sizeof(F)) : 1;
  run_batch<T>(batch_split(g.N, g.Co * g.K * g.P * g.Do), g.N, own_bf16,
               [&](int64_t, int64_t n0, int64_t n1, const auto& gemm) {
    const int64_t u0 = n0 * g.Do, u1 = n1 * g.Do;
    const int64_t widest = std::min(nb, u1 - u0) * g.P;
    ScratchBuffer<F> col(direct ? 0 : static_cast<size_t>(g.K * widest));
    ScratchBuffer<T> gys(nb > 1 ? static_cast<size_t>(g.Cog * widest) : 0);
    ScratchBuffer<F> sums(kNarrow ? static_cast<size_t>(g.G * group_size) : 0);  // one sample's gx
    for (int64_t u = u0; u < u1; u += nb) {
      const int64_t images = std::min(nb, u1 - u), ld = images * g.P;  // ld: the product's width
      for (int64_t grp = 0; grp < g.G; ++grp) {
        const T* wg = w + grp * g.Cog * g.K;
        const T* gyb = g.output_image(gy, u, grp);  // the product's b: one image's gradient, or the images'
        int64_t ld_gy = out_rows;                   // side by side
        if (images > 1) {
          for (int64_t co = 0; co < g.Cog; ++co)
            for (int64_t i = 0; i < images; ++i)
              std::memcpy(gys.data() + co * ld + i * g.P, g.output_image(gy, u + i, grp) + co * out_rows,
                          sizeof(T) * g.P);
          gyb = gys.data(), ld_gy = ld;
        }
        if (!direct) gemm(true, false, g.K, ld, g.Cog, wg, g.K, gyb, ld_gy, false, col.data(), ld);  // the columns
        for (int64_t i = 0; i < images; ++i) {
          const int64_t t = (u + i) % g.Do;
          T* gxg = g.input_group(gx, u + i, grp);
          F* gxf;  // where the sample's group's gradient is summed
          if constexpr (kNarrow) {
            gxf = sums.data() + grp * group_size;
          } else {
            gxf = gxg;
          }
          if (direct) {  // one image (nb is 1), into its own depth plane
            gemm(true, false, g.K, g.P, g.Cog, wg, g.K, gyb, ld_gy, false, gxf + t * g.P, g.D * g.P);
          } else {
            if (t == 0) std::memset(gxf, 0, sizeof(F) * group_size);
            col2im(col.data() + i * g.P, g, t, gxf, ld);
          }
          if constexpr (kNarrow) {
            if (t == g.Do - 1) narrow(gxf, gxg, group_size, own_bf16);
          }
        }
      }
    }
  });
}

// dst (cols, rows) = the transpose of src's (rows, cols), src's rows ld apart.
template <typename T>
void transpose_into(const T* src, int64_t ld, int64_t rows, int64_t cols, T* dst) {
  constexpr int64_t kBlock = 64;  // columns of src per pass: the destination's lines stay in L1
  for (int64_t p0 = 0; p0 < cols; p0 += kBlock) {
    const int64_t p1 = std::min(cols, p0 + kBlock);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t p = p0; p < p1; ++p) dst[p * rows + r] = src[r * ld + p];
  }
}

// Note [the weight's gradient transposed]: grad_W (C_out/g, K) += grad_out (C_out/g, P) @ col^T sums
// along P, the contiguous dim of both operands, so neither is a row-major operand of the other's rows
// and OpenBLAS packs both (the columns, K x P, at every image). Its transpose, grad_W^T (K, C_out/g)
// += col (K, P) @ grad_out^T (P, C_out/g), is a product with contiguous rows whose b is narrow, which
// sgemm.cpp multiplies without packing (Note [short products] there) where matmul.cpp gives it the
// product: float32 then copies each image's grad_out transposed (C_out/g x P, a fraction of the
// columns) and sums grad_W^T, transposed into grad_weight at the end. On a Sapphire Rapids Xeon the
// product of conv3d's (32 x 432 from P = 1024 per image) ran at 73 GFLOP/s on one thread as it was
// and 135 transposed (a probe of the two products), and conv3d's forward with the weight's gradient
// took 16.0 ms instead of 22.3; the CNN's second convolution's weight gradient 4.49 ms instead of
// 5.03 (bench_cnn_layers, medians of 3 rounds).

template <typename T>
void conv_backward_weight_typed(const View& grad_out, const View& input, const View& grad_weight,
                                const ConvArgs& args) {
  using F = typename ComputeOf<T>::type;
  constexpr bool kNarrow = !std::is_same_v<T, F>;  // every piece sums in float32 scratch
  const bool own_bf16 = own_bf16_products<T>();
  const Geometry g = geometry(input, grad_weight, grad_out, args);
  const T* gy = grad_out.ptr<T>();
  const T* x = input.ptr<T>();
  T* gw = grad_weight.ptr<T>();
  const int64_t wsize = g.Co * g.K;
  const bool direct = g.pointwise();
  const int64_t ld_col = direct ? g.D * g.P : padded_ld<T>(g.P);  // the columns' rows, or the input planes'
  // Note [the weight's gradient transposed]
  bool transposed = false;
  if constexpr (std::is_same_v<T, float>) transposed = gemm_uses_own<T>(false, false, g.K, g.Cog, g.P, ld_col, g.Cog);
  const BatchSplit split = batch_split(g.images(), wsize * g.P);
  const int pieces = split.pieces;
  // Piece 0 accumulates straight into grad_weight (for bfloat16, or transposed, into scratch too);
  // the others into their own buffers.
  const int own_buffers = kNarrow || transposed ? pieces : pieces - 1;
  ScratchBuffer<F> partial(static_cast<size_t>(wsize) * own_buffers);
  if (own_buffers > 0) std::memset(partial.data(), 0, sizeof(F) * wsize * own_buffers);
  F* total = partial.data();  // piece 0's sums, to which the others' are added
  if constexpr (!kNarrow) {
    if (!transposed) {
      total = gw;
      std::memset(gw, 0, sizeof(T) * wsize);
    }
  }
  auto buffer_of = [&](int p) { return p == 0 ? total : partial.data() + (kNarrow || transposed ? p : p - 1) * wsize; };
  run_batch<T>(split, g.images(), own_bf16, [&](int64_t p, int64_t u0, int64_t u1, const auto& gemm) {
    ScratchBuffer<T> col(direct ? 0 : static_cast<size_t>(g.K * ld_col));
    ScratchBuffer<T> gy_t(transposed ? static_cast<size_t>(g.P * g.Cog) : 0);
    F* acc = buffer_of(static_cast<int>(p));
    for (int64_t u = u0; u < u1; ++u) {
      for (int64_t grp = 0; grp < g.G; ++grp) {
        const T* xg = g.input_group(x, u, grp);
        if (!direct) im2col(xg, g, u % g.Do, col.data(), ld_col);
        const T* cols = direct ? xg + u % g.Do * g.P : col.data();
        const T* gyg = g.output_image(gy, u, grp);
        if (transposed) {  // grad_W^T (K, Cog) += col (K, P) @ grad_out^T (P, Cog)
          transpose_into(gyg, g.Do * g.P, g.Cog, g.P, gy_t.data());
          gemm(false, false, g.K, g.Cog, g.P, cols, ld_col, gy_t.data(), g.Cog, true, acc + grp * g.K * g.Cog, g.Cog);
        } else {
          gemm(false, true, g.Cog, g.K, g.P, gyg, g.Do * g.P, cols, ld_col, true, acc + grp * g.Cog * g.K, g.K);
        }
      }
    }
  });
  for (int p = 1; p < pieces; ++p) {
    const F* part = buffer_of(p);
    for (int64_t i = 0; i < wsize; ++i) total[i] += part[i];
  }
  if constexpr (kNarrow) {
    narrow(total, gw, wsize, own_bf16);
  } else if (transposed) {
    for (int64_t grp = 0; grp < g.G; ++grp)
      transpose_into(total + grp * g.K * g.Cog, g.Cog, g.K, g.Cog, gw + grp * g.Cog * g.K);
  }
}

// The kernels' element types: float32, float64 and bfloat16 (Note [bfloat16 convolution]).
template <typename Fn>
void dispatch(DType dtype, const char* name, const Fn& fn) {
  switch (dtype) {
    case DType::Float32: return fn(float{});
    case DType::Float64: return fn(double{});
    case DType::BFloat16: return fn(BFloat16{});
    default: KILN_FAIL("{}: the CPU kernel takes float32, float64 or bfloat16, got {}", name, dtype_name(dtype));
  }
}

}  // namespace

void conv_kernel(const View& input, const View& weight, const View& bias, const View& out, const ConvArgs& args) {
  dispatch(out.dtype, "conv", [&](auto t) { conv_typed<decltype(t)>(input, weight, bias, out, args); });
}

void conv_backward_input_kernel(const View& grad_out, const View& weight, const View& grad_input,
                                const ConvArgs& args) {
  dispatch(grad_input.dtype, "conv_backward_input",
           [&](auto t) { conv_backward_input_typed<decltype(t)>(grad_out, weight, grad_input, args); });
}

void conv_backward_weight_kernel(const View& grad_out, const View& input, const View& grad_weight,
                                 const ConvArgs& args) {
  dispatch(grad_weight.dtype, "conv_backward_weight",
           [&](auto t) { conv_backward_weight_typed<decltype(t)>(grad_out, input, grad_weight, args); });
}

}  // namespace kiln::cpu
