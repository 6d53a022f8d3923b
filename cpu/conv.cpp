// cpu/conv.cpp: 2-D convolution and its two backward kernels, by im2col + GEMM.
//
// For one sample and one group, the (C_in/groups * kH * kW, H_out * W_out) "column" matrix holds, for
// each output position, the input patch it sees (zeros in the padding); then
//   forward:         out (C_out/g, P)  = W (C_out/g, K) @ col (K, P)
//   backward input:  col (K, P)        = W^T @ grad_out (C_out/g, P), scattered back (col2im)
//   backward weight: grad_W (C_out/g, K) += grad_out @ col^T
// The GEMMs are gemm() of matmul.cpp (OpenBLAS, single-threaded; for bfloat16 the Note below); the
// pool of cpu/parallel.h splits the batch, each piece with its own column buffer (and, for the weight
// gradient, its own accumulator, summed in piece order so the result does not depend on timing). With
// fewer images than threads, the columns of each GEMM are split instead. A 1x1 convolution with
// stride 1 and no padding needs no columns: the input plane is the column matrix; one with stride 1
// and an output as wide as its input has its columns copied in spans (Note [im2col in spans]). For
// bfloat16, the forward and the input's gradient multiply the columns of several images at once
// (Note [images side by side]).
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
  Conv2dArgs a;
  bool pointwise() const {
    return kH == 1 && kW == 1 && a.stride_h == 1 && a.stride_w == 1 && a.pad_h == 0 && a.pad_w == 0;
  }
};

Geometry geometry(const View& input, const View& weight, const View& out, const Conv2dArgs& a) {
  Geometry g;
  g.N = input.sizes[0], g.C = input.sizes[1], g.H = input.sizes[2], g.W = input.sizes[3];
  g.Co = weight.sizes[0], g.kH = weight.sizes[2], g.kW = weight.sizes[3];
  g.Ho = out.sizes[2], g.Wo = out.sizes[3];
  g.G = a.groups, g.Cg = g.C / a.groups, g.Cog = g.Co / a.groups;
  g.K = g.Cg * g.kH * g.kW, g.P = g.Ho * g.Wo;
  g.a = a;
  return g;
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

// col (K, P) = the patches of x (Cg, H, W), one row per (channel, kernel row, kernel column), rows
// ld apart (P, or more where the columns of several images lie side by side: Note [images side by
// side]).
template <typename T>
void im2col(const T* x, const Geometry& g, T* col, int64_t ld) {
  const auto& a = g.a;
  const bool whole = spans(g);
  for (int64_t c = 0; c < g.Cg; ++c) {
    for (int64_t i = 0; i < g.kH; ++i) {
      for (int64_t j = 0; j < g.kW; ++j) {
        T* row = col + ((c * g.kH + i) * g.kW + j) * ld;
        const T* plane = x + c * g.H * g.W;
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
              if (cols.hi > cols.lo) std::memcpy(dst + cols.lo, src + cols.lo + w_off, sizeof(T) * (cols.hi - cols.lo));
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

// x (Cg, H, W) += the columns (rows ld apart, as im2col's) scattered back to where im2col read them
// (x zeroed by the caller). The columns are scratch: in spans (Note [im2col in spans]) the padding's
// columns are zeroed in them.
template <typename T>
void col2im(T* col, const Geometry& g, T* x, int64_t ld) {
  const auto& a = g.a;
  const bool whole = spans(g);
  for (int64_t c = 0; c < g.Cg; ++c) {
    for (int64_t i = 0; i < g.kH; ++i) {
      for (int64_t j = 0; j < g.kW; ++j) {
        T* row = col + ((c * g.kH + i) * g.kW + j) * ld;
        T* plane = x + c * g.H * g.W;
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

int64_t images_side_by_side(const Geometry& g, int64_t element_bytes) {
  const int64_t wanted = (kSideBySideColumns + g.P - 1) / g.P;
  const int64_t fit = kSideBySideBytes / std::max<int64_t>(1, g.K * g.P * element_bytes);
  return std::max<int64_t>(1, std::min(wanted, fit));
}

template <typename T>
void conv2d_typed(const View& input, const View& weight, const View& bias, const View& out,
                  const Conv2dArgs& args) {
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
  run_batch<T>(batch_split(g.N, g.Co * g.K * g.P), g.N, own_bf16,
               [&](int64_t, int64_t n0, int64_t n1, const auto& gemm) {
    const int64_t widest = std::min(nb, n1 - n0) * g.P;
    ScratchBuffer<T> col(direct ? 0 : static_cast<size_t>(g.K * widest));
    ScratchBuffer<F> sums(kNarrow ? static_cast<size_t>(g.Cog * widest) : 0);
    for (int64_t n = n0; n < n1; n += nb) {
      const int64_t images = std::min(nb, n1 - n), ld = images * g.P;  // ld: the product's width
      for (int64_t grp = 0; grp < g.G; ++grp) {
        auto x_of = [&](int64_t i) { return x + ((n + i) * g.C + grp * g.Cg) * g.H * g.W; };
        if (!direct)
          for (int64_t i = 0; i < images; ++i) im2col(x_of(i), g, col.data() + i * g.P, ld);
        F* yf;  // where the group's output is summed: its images side by side in scratch, or out itself
        if constexpr (kNarrow) {
          yf = sums.data();
        } else {
          yf = y + (n * g.Co + grp * g.Cog) * g.P;  // one image (nb is 1)
        }
        gemm(false, false, g.Cog, ld, g.K, w + grp * g.Cog * g.K, g.K, direct ? x_of(0) : col.data(), ld, false,
             yf, ld);
        for (int64_t i = 0; i < images; ++i) {
          for (int64_t co = 0; co < g.Cog; ++co) {
            F* row = yf + co * ld + i * g.P;
            if (b) {
              const F bv = static_cast<F>(b[grp * g.Cog + co]);
              for (int64_t p = 0; p < g.P; ++p) row[p] += bv;
            }
            if constexpr (kNarrow) narrow(row, y + ((n + i) * g.Co + grp * g.Cog + co) * g.P, g.P, own_bf16);
          }
        }
      }
    }
  });
}

template <typename T>
void conv2d_backward_input_typed(const View& grad_out, const View& weight, const View& grad_input,
                                 const Conv2dArgs& args) {
  using F = typename ComputeOf<T>::type;
  constexpr bool kNarrow = !std::is_same_v<T, F>;  // col2im sums in float32 scratch, rounded into gx
  const bool own_bf16 = own_bf16_products<T>();
  const Geometry g = geometry(grad_input, weight, grad_out, args);
  const T* gy = grad_out.ptr<T>();
  const T* w = weight.ptr<T>();
  T* gx = grad_input.ptr<T>();
  const bool direct = g.pointwise();
  const int64_t plane = g.Cg * g.H * g.W;  // one sample's group of gx
  // bfloat16: the columns of several images side by side (Note [images side by side]), from their
  // gradients copied side by side, each image's then summed back by col2im on its own.
  const int64_t nb = kNarrow && !direct ? images_side_by_side(g, sizeof(F)) : 1;
  run_batch<T>(batch_split(g.N, g.Co * g.K * g.P), g.N, own_bf16,
               [&](int64_t, int64_t n0, int64_t n1, const auto& gemm) {
    const int64_t widest = std::min(nb, n1 - n0) * g.P;
    ScratchBuffer<F> col(direct ? 0 : static_cast<size_t>(g.K * widest));
    ScratchBuffer<T> gys(nb > 1 ? static_cast<size_t>(g.Cog * widest) : 0);
    ScratchBuffer<F> sums(kNarrow ? static_cast<size_t>(plane) : 0);
    for (int64_t n = n0; n < n1; n += nb) {
      const int64_t images = std::min(nb, n1 - n), ld = images * g.P;  // ld: the product's width
      for (int64_t grp = 0; grp < g.G; ++grp) {
        auto gy_of = [&](int64_t i) { return gy + ((n + i) * g.Co + grp * g.Cog) * g.P; };
        const T* wg = w + grp * g.Cog * g.K;
        const T* gyb = gy_of(0);  // the product's b: one image's gradient, or the images' side by side
        if (images > 1) {
          for (int64_t co = 0; co < g.Cog; ++co)
            for (int64_t i = 0; i < images; ++i)
              std::memcpy(gys.data() + co * ld + i * g.P, gy_of(i) + co * g.P, sizeof(T) * g.P);
          gyb = gys.data();
        }
        if (!direct) gemm(true, false, g.K, ld, g.Cog, wg, g.K, gyb, ld, false, col.data(), ld);  // the images' columns
        for (int64_t i = 0; i < images; ++i) {
          T* gxg = gx + ((n + i) * g.C + grp * g.Cg) * g.H * g.W;
          F* gxf;  // where the image's group's gradient is summed
          if constexpr (kNarrow) {
            gxf = sums.data();
          } else {
            gxf = gxg;
          }
          if (direct) {  // one image (nb is 1)
            gemm(true, false, g.K, g.P, g.Cog, wg, g.K, gyb, g.P, false, gxf, g.P);
          } else {
            std::memset(gxf, 0, sizeof(F) * plane);
            col2im(col.data() + i * g.P, g, gxf, ld);
          }
          if constexpr (kNarrow) narrow(gxf, gxg, plane, own_bf16);
        }
      }
    }
  });
}

template <typename T>
void conv2d_backward_weight_typed(const View& grad_out, const View& input, const View& grad_weight,
                                  const Conv2dArgs& args) {
  using F = typename ComputeOf<T>::type;
  constexpr bool kNarrow = !std::is_same_v<T, F>;  // every piece sums in float32 scratch
  const bool own_bf16 = own_bf16_products<T>();
  const Geometry g = geometry(input, grad_weight, grad_out, args);
  const T* gy = grad_out.ptr<T>();
  const T* x = input.ptr<T>();
  T* gw = grad_weight.ptr<T>();
  const int64_t wsize = g.Co * g.K;
  const BatchSplit split = batch_split(g.N, wsize * g.P);
  const int pieces = split.pieces;
  // Piece 0 accumulates straight into grad_weight (for bfloat16, into scratch too); the others into
  // their own buffers.
  const int own_buffers = kNarrow ? pieces : pieces - 1;
  ScratchBuffer<F> partial(static_cast<size_t>(wsize) * own_buffers);
  if (own_buffers > 0) std::memset(partial.data(), 0, sizeof(F) * wsize * own_buffers);
  F* total;  // piece 0's sums, to which the others' are added
  if constexpr (kNarrow) {
    total = partial.data();
  } else {
    total = gw;
    std::memset(gw, 0, sizeof(T) * wsize);
  }
  const bool direct = g.pointwise();
  run_batch<T>(split, g.N, own_bf16, [&](int64_t p, int64_t n0, int64_t n1, const auto& gemm) {
    ScratchBuffer<T> col(direct ? 0 : static_cast<size_t>(g.K * g.P));
    F* acc = p == 0 ? total : partial.data() + (kNarrow ? p : p - 1) * wsize;
    for (int64_t n = n0; n < n1; ++n) {
      for (int64_t grp = 0; grp < g.G; ++grp) {
        const T* xg = x + (n * g.C + grp * g.Cg) * g.H * g.W;
        if (!direct) im2col(xg, g, col.data(), g.P);
        gemm(false, true, g.Cog, g.K, g.P, gy + (n * g.Co + grp * g.Cog) * g.P, g.P, direct ? xg : col.data(),
             g.P, true, acc + grp * g.Cog * g.K, g.K);
      }
    }
  });
  for (int p = 1; p < pieces; ++p) {
    const F* part = partial.data() + (kNarrow ? p : p - 1) * wsize;
    for (int64_t i = 0; i < wsize; ++i) total[i] += part[i];
  }
  if constexpr (kNarrow) narrow(total, gw, wsize, own_bf16);
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

void conv2d_kernel(const View& input, const View& weight, const View& bias, const View& out,
                   const Conv2dArgs& args) {
  dispatch(out.dtype, "conv2d", [&](auto t) { conv2d_typed<decltype(t)>(input, weight, bias, out, args); });
}

void conv2d_backward_input_kernel(const View& grad_out, const View& weight, const View& grad_input,
                                  const Conv2dArgs& args) {
  dispatch(grad_input.dtype, "conv2d_backward_input",
           [&](auto t) { conv2d_backward_input_typed<decltype(t)>(grad_out, weight, grad_input, args); });
}

void conv2d_backward_weight_kernel(const View& grad_out, const View& input, const View& grad_weight,
                                   const Conv2dArgs& args) {
  dispatch(grad_weight.dtype, "conv2d_backward_weight",
           [&](auto t) { conv2d_backward_weight_typed<decltype(t)>(grad_out, input, grad_weight, args); });
}

}  // namespace kiln::cpu
