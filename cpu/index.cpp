// cpu/index.cpp: index_select, index_add, gather and scatter along one dim. Every index is checked
// against the dim's size; a bad one is an Error naming the op, the index and the size. And nonzero:
// the positions of a mask's true elements.
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/loops.h"

namespace kiln::cpu {
namespace {

// Indices must lie in [0, size): negative ones are an Error, as in PyTorch's index ops.
inline int64_t checked(int64_t idx, int64_t size, const char* op, int dim) {
  if (idx < 0 || idx >= size) [[unlikely]] {
    KILN_FAIL("{}: index {} is out of bounds for dim {} with size {}", op, idx, dim, size);
  }
  return idx;
}

// checked() for idx[0..n): one pass without branches, which vectorizes, and checked()'s Error for the
// first index outside [0, size) when there is one (a check per element cost as much as the gather or
// scatter it guarded).
inline void check_all(const int64_t* idx, int64_t n, int64_t size, const char* op, int dim) {
  uint64_t top = 0;  // a negative index is a large unsigned one
  for (int64_t j = 0; j < n; ++j) top = std::max(top, static_cast<uint64_t>(idx[j]));
  if (top >= static_cast<uint64_t>(size)) [[unlikely]] {
    for (int64_t j = 0; j < n; ++j) checked(idx[j], size, op, dim);
  }
}

// Offsets of all positions of `v` with dim `dim` fixed at 0, in row-major order of the other dims.
// (outer, inner) split: position p = (o, i) where `dim` sits between them.
struct DimSplit {
  int64_t outer = 1, inner = 1;
  DimSplit(const Shape& sizes, int dim) {
    for (int d = 0; d < dim; ++d) outer *= sizes[d];
    for (int d = dim + 1; d < sizes.size(); ++d) inner *= sizes[d];
  }
};

// Element offset of (o, j, i) in a view, where o indexes dims before `dim` and i the dims after.
inline int64_t offset_of(const View& v, int dim, int64_t o, int64_t j, int64_t i) {
  int64_t off = j * v.strides[dim];
  for (int d = v.ndim() - 1; d > dim; --d) {
    off += (i % v.sizes[d]) * v.strides[d];
    i /= v.sizes[d];
  }
  for (int d = dim - 1; d >= 0; --d) {
    off += (o % v.sizes[d]) * v.strides[d];
    o /= v.sizes[d];
  }
  return off;
}

// True when a and b have the same sizes in every dim but `dim`: with both contiguous, position
// (o, j, i) of b then sits at (o * a.sizes[dim] + j) * inner + i in a, so no element's position needs
// dividing out (a division per element dominated gather and scatter).
bool same_but_dim(const View& a, const View& b, int dim) {
  if (a.ndim() != b.ndim()) return false;
  for (int d = 0; d < a.ndim(); ++d) {
    if (d != dim && a.sizes[d] != b.sizes[d]) return false;
  }
  return true;
}

// True when the dims after `dim` of v are laid out as in a contiguous tensor (dims of size 1 aside), so
// each (o, j) of offset_of is one run of DimSplit's `inner` elements from offset_of(v, dim, o, j, 0),
// whatever the strides before `dim` are (a permuted view, such as conv_transpose3d's slices).
bool dense_after(const View& v, int dim) {
  int64_t expected = 1;
  for (int d = v.ndim() - 1; d > dim; --d) {
    if (v.sizes[d] == 1) continue;
    if (v.strides[d] != expected) return false;
    expected *= v.sizes[d];
  }
  return true;
}

// a + b in the op-math type (or for bool).
template <typename T>
inline T add_values(T a, T b) {
  if constexpr (std::is_same_v<T, bool>) return a || b;
  else return static_cast<T>(static_cast<opmath_t<T>>(a) + static_cast<opmath_t<T>>(b));
}

// Integer sums do not depend on their order: with many sources into few targets (a histogram) each
// piece of the pool adds into its own zeroed copy of the targets, and the copies are summed after.
// Whether it took the sums (enough sources and few enough targets).
template <typename T>
bool add_in_pieces(T* y, int64_t so, const T* x, int64_t ss, const int64_t* idx, int64_t istride, int64_t n,
                   int64_t size, int dim) {
  const int pieces = parallel_pieces(n, 2 * kGrain);
  if (n < 4 * kGrain || size > (1 << 16) || pieces < 2) return false;
  std::vector<std::vector<T>> partial(static_cast<size_t>(pieces));
  const int64_t chunk = (n + pieces - 1) / pieces;
  parallel_for(0, pieces, 1, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      std::vector<T>& mine = partial[static_cast<size_t>(p)];
      mine.assign(static_cast<size_t>(size), T{0});
      for (int64_t j = p * chunk, end = std::min(n, j + chunk); j < end; ++j) {
        mine[static_cast<size_t>(checked(idx[j * istride], size, "index_add", dim))] += x[j * ss];
      }
    }
  });
  for (const std::vector<T>& mine : partial) {
    for (int64_t k = 0; k < size; ++k) y[k * so] = static_cast<T>(y[k * so] + mine[static_cast<size_t>(k)]);
  }
  return true;
}

}  // namespace

void index_select_kernel(const View& in, int dim, const View& index, const View& out) {
  const int64_t* idx = index.ptr<int64_t>();
  const int64_t istride = index.ndim() ? index.strides[0] : 0;
  DimSplit split(out.sizes, dim);
  const int64_t n = out.sizes[dim], size = in.sizes[dim];
  KILN_DISPATCH_ALL_TYPES(in.dtype, "index_select", [&] {
    const scalar_t* x = in.ptr<scalar_t>();
    scalar_t* y = out.ptr<scalar_t>();
    // Both contiguous (the common case): each (o, j) is a run of `inner` elements on both sides.
    const bool contiguous = in.is_contiguous() && out.is_contiguous();
    // One element per (o, j): the indices are checked here, once, and the pieces below gather unchecked
    // (a check per element took half of a 2x bilinear upsampling, which selects along the last dim).
    const bool gather_rows = contiguous && split.inner == 1;
    const bool rows = split.inner > 1 && dense_after(in, dim) && dense_after(out, dim);  // runs in strided views
    if (gather_rows) {
      for (int64_t j = 0; j < n; ++j) checked(idx[j * istride], size, "index_select", dim);
    }
    parallel_for(0, split.outer * n, std::max<int64_t>(1, kGrain / std::max<int64_t>(split.inner, 1)),
                 [&](int64_t b, int64_t e) {
                   if (gather_rows) {
                     for (int64_t p = b; p < e;) {
                       const int64_t o = p / n, j0 = p % n, run = std::min(e - p, n - j0);
                       const scalar_t* row = x + o * size;
                       scalar_t* to = y + p;
                       for (int64_t j = 0; j < run; ++j) to[j] = row[idx[(j0 + j) * istride]];
                       p += run;
                     }
                     return;
                   }
                   if (contiguous) {  // (o, j) stepped along, not divided out of p: a division per element dominated
                     for (int64_t p = b, o = b / n, j = b % n; p < e; ++p) {
                       const scalar_t* from = x + (o * size + checked(idx[j * istride], size, "index_select", dim)) *
                                                      split.inner;
                       if (split.inner == 1) y[p] = *from;  // so would a call to memmove per element
                       else std::copy(from, from + split.inner, y + p * split.inner);
                       if (++j == n) j = 0, ++o;
                     }
                     return;
                   }
                   for (int64_t p = b; p < e; ++p) {
                     int64_t o = p / n, j = p % n;
                     int64_t src = checked(idx[j * istride], size, "index_select", dim);
                     if (rows) {
                       const scalar_t* from = x + offset_of(in, dim, o, src, 0);
                       std::copy(from, from + split.inner, y + offset_of(out, dim, o, j, 0));
                       continue;
                     }
                     for (int64_t i = 0; i < split.inner; ++i) {
                       y[offset_of(out, dim, o, j, i)] = x[offset_of(in, dim, o, src, i)];
                     }
                   }
                 });
  });
}

void index_add_kernel(const View& out, int dim, const View& index, const View& src) {
  const int64_t* idx = index.ptr<int64_t>();
  const int64_t istride = index.ndim() ? index.strides[0] : 0;
  DimSplit split(src.sizes, dim);
  const int64_t n = src.sizes[dim], size = out.sizes[dim];
  KILN_DISPATCH_NUMERIC_TYPES(out.dtype, "index_add", [&] {
    using M = opmath_t<scalar_t>;
    const scalar_t* x = src.ptr<scalar_t>();
    scalar_t* y = out.ptr<scalar_t>();
    // Serial over the indexed dim (repeated indices add into the same row); parallel over `outer`.
    const bool contiguous = out.is_contiguous() && src.is_contiguous();
    const bool rows = dense_after(out, dim) && dense_after(src, dim);  // runs of `inner` on both sides
    if (split.outer == 1 && split.inner == 1) {  // 1-D, any strides (a histogram: bincount, histc, unique)
      const int64_t so = out.strides[dim], ss = src.strides[dim];
      if constexpr (std::is_integral_v<scalar_t>) {
        if (add_in_pieces(y, so, x, ss, idx, istride, n, size, dim)) return;
      }
      for (int64_t j = 0; j < n; ++j) {
        scalar_t& t = y[checked(idx[j * istride], size, "index_add", dim) * so];
        t = static_cast<scalar_t>(static_cast<M>(t) + static_cast<M>(x[j * ss]));
      }
      return;
    }
    if (contiguous && split.inner == 1) {  // one element per (o, j): the indices checked once, as index_select
      for (int64_t j = 0; j < n; ++j) checked(idx[j * istride], size, "index_add", dim);
      parallel_for(0, split.outer, std::max<int64_t>(1, kGrain / std::max<int64_t>(n, 1)), [&](int64_t b, int64_t e) {
        for (int64_t o = b; o < e; ++o) {
          scalar_t* to = y + o * size;
          const scalar_t* from = x + o * n;
          for (int64_t j = 0; j < n; ++j) {
            scalar_t& t = to[idx[j * istride]];
            t = static_cast<scalar_t>(static_cast<M>(t) + static_cast<M>(from[j]));
          }
        }
      });
      return;
    }
    parallel_for(0, split.outer, 1, [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o) {
        for (int64_t j = 0; j < n; ++j) {
          int64_t dst = checked(idx[j * istride], size, "index_add", dim);
          if (rows) {
            scalar_t* to = y + offset_of(out, dim, o, dst, 0);
            const scalar_t* from = x + offset_of(src, dim, o, j, 0);
            for (int64_t i = 0; i < split.inner; ++i) {
              to[i] = static_cast<scalar_t>(static_cast<M>(to[i]) + static_cast<M>(from[i]));
            }
            continue;
          }
          for (int64_t i = 0; i < split.inner; ++i) {
            scalar_t& t = y[offset_of(out, dim, o, dst, i)];
            t = static_cast<scalar_t>(static_cast<M>(t) + static_cast<M>(x[offset_of(src, dim, o, j, i)]));
          }
        }
      }
    });
  });
}

void gather_kernel(const View& in, int dim, const View& index, const View& out) {
  StridedLoop<2> loop({&out, &index});  // walks out and index together; in is addressed by hand
  const int64_t size = in.sizes[dim];
  const int nd = out.ndim();
  KILN_DISPATCH_ALL_TYPES(in.dtype, "gather", [&] {
    const scalar_t* x = in.ptr<scalar_t>();
    scalar_t* y = out.ptr<scalar_t>();
    const int64_t* ix = index.ptr<int64_t>();
    if (out.is_contiguous() && index.is_contiguous() && in.is_contiguous() && same_but_dim(in, out, dim)) {
      const DimSplit split(out.sizes, dim);
      const int64_t n = out.sizes[dim], inner = split.inner;
      // Rows r = (o, j) of `inner` elements; one division per o met, none per element.
      parallel_for(0, split.outer * n, std::max<int64_t>(1, kGrain / std::max<int64_t>(inner, 1)),
                   [&](int64_t b, int64_t e) {
                     for (int64_t r = b; r < e;) {
                       const int64_t o = r / n, r_end = std::min(e, (o + 1) * n);
                       const scalar_t* from = x + o * size * inner;
                       if (inner == 1) {
                         check_all(ix + r, r_end - r, size, "gather", dim);
                         for (; r < r_end; ++r) y[r] = from[ix[r]];
                         continue;
                       }
                       for (int64_t q = r * inner, q_end = r_end * inner, i = 0; q < q_end; ++q) {
                         y[q] = from[checked(ix[q], size, "gather", dim) * inner + i];
                         if (++i == inner) i = 0;
                       }
                       r = r_end;
                     }
                   });
      return;
    }
    parallel_for(0, out.numel(), kGrain, [&](int64_t b, int64_t e) {
      for (int64_t p = b; p < e; ++p) {
        int64_t rem = p, oo = 0, oi = 0, ox = 0;
        for (int d = nd - 1; d >= 0; --d) {
          int64_t c = rem % out.sizes[d];
          rem /= out.sizes[d];
          oo += c * out.strides[d];
          oi += c * index.strides[d];
          if (d != dim) ox += c * in.strides[d];
        }
        ox += checked(ix[oi], size, "gather", dim) * in.strides[dim];
        y[oo] = x[ox];
      }
    });
  });
}

void scatter_kernel(const View& out, int dim, const View& index, const View& src, bool accumulate) {
  const int64_t size = out.sizes[dim];
  const int nd = index.ndim();
  KILN_DISPATCH_ALL_TYPES(out.dtype, "scatter", [&] {
    const scalar_t* x = src.ptr<scalar_t>();
    scalar_t* y = out.ptr<scalar_t>();
    const int64_t* ix = index.ptr<int64_t>();
    const char* op = accumulate ? "scatter_add" : "scatter";
    if (out.is_contiguous() && index.is_contiguous() && src.is_contiguous() && index.sizes == src.sizes &&
        same_but_dim(out, index, dim)) {
      // Element (o, j, i) goes to (o, index, i): only positions that share o and i may meet, so the
      // threads split o (or i, when there is one o), and each keeps the order of j (the last write wins,
      // as in the serial loop below, whatever the number of threads). With several bad indices, the
      // Error names the one its thread met first.
      const DimSplit split(index.sizes, dim);
      const int64_t n = index.sizes[dim], inner = split.inner;
      auto rows = [=](auto add, int64_t o0, int64_t o1, int64_t i0, int64_t i1) {  // copies: kept in registers
        if (inner == 1) {  // a row's indices checked in one pass first
          for (int64_t o = o0; o < o1; ++o) {
            scalar_t* to = y + o * size;
            const int64_t* at = ix + o * n;
            const scalar_t* from = x + o * n;
            check_all(at, n, size, op, dim);
            for (int64_t j = 0; j < n; ++j) {
              if constexpr (decltype(add)::value) to[at[j]] = add_values(to[at[j]], from[j]);
              else to[at[j]] = from[j];
            }
          }
          return;
        }
        for (int64_t o = o0; o < o1; ++o) {
          scalar_t* to = y + o * size * inner;
          for (int64_t j = 0; j < n; ++j) {
            const int64_t row = (o * n + j) * inner;
            for (int64_t i = i0; i < i1; ++i) {
              scalar_t& t = to[checked(ix[row + i], size, op, dim) * inner + i];
              if constexpr (decltype(add)::value) t = add_values(t, x[row + i]);
              else t = x[row + i];
            }
          }
        }
      };
      auto run = [&](int64_t o0, int64_t o1, int64_t i0, int64_t i1) {
        if (accumulate) rows(std::true_type{}, o0, o1, i0, i1);
        else rows(std::false_type{}, o0, o1, i0, i1);
      };
      if (split.outer > 1) {
        parallel_for(0, split.outer, std::max<int64_t>(1, kGrain / std::max<int64_t>(n * inner, 1)),
                     [&](int64_t b, int64_t e) { run(b, e, 0, inner); });
      } else {
        parallel_for(0, inner, std::max<int64_t>(1, kGrain / std::max<int64_t>(n, 1)),
                     [&](int64_t b, int64_t e) { run(0, split.outer, b, e); });
      }
      return;
    }
    // Serial: two positions may scatter into the same element.
    for (int64_t p = 0, n = index.numel(); p < n; ++p) {
      int64_t rem = p, oi = 0, os = 0, oy = 0;
      for (int d = nd - 1; d >= 0; --d) {
        int64_t c = rem % index.sizes[d];
        rem /= index.sizes[d];
        oi += c * index.strides[d];
        os += c * src.strides[d];
        if (d != dim) oy += c * out.strides[d];
      }
      oy += checked(ix[oi], size, op, dim) * out.strides[dim];
      y[oy] = accumulate ? add_values(y[oy], x[os]) : x[os];
    }
  });
}

// Blocks of the mask counted in parallel, their starts in out summed up, then each block's positions
// written from its start: a block copies its positions out of a local run without a branch per
// element (the position always written, the run's end advanced by the mask's byte).
void nonzero_kernel(const View& mask, const View& out) {
  const int64_t n = mask.numel(), block = 1 << 16, blocks = (n + block - 1) / block;
  const uint8_t* m = mask.ptr<uint8_t>();
  std::vector<int64_t> start(static_cast<size_t>(blocks) + 1, 0);
  parallel_for(0, blocks, 1, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) {
      int64_t count = 0;
      for (int64_t i = k * block, end = std::min(n, i + block); i < end; ++i) count += m[i];
      start[k + 1] = count;
    }
  });
  for (int64_t k = 0; k < blocks; ++k) start[k + 1] += start[k];
  KILN_CHECK(start[blocks] == out.numel(), "nonzero: the mask has {} true elements but {} were expected", start[blocks],
             out.numel());
  int64_t* to = out.ptr<int64_t>();
  parallel_for(0, blocks, 1, [&](int64_t b, int64_t e) {
    int64_t run[256];
    for (int64_t k = b; k < e; ++k) {
      int64_t at = start[k];
      for (int64_t i = k * block, end = std::min(n, i + block); i < end; i += 256) {
        const int64_t len = std::min<int64_t>(256, end - i);
        int64_t c = 0;
        for (int64_t j = 0; j < len; ++j) {
          run[c] = i + j;
          c += m[i + j];
        }
        std::memcpy(to + at, run, static_cast<size_t>(c) * sizeof(int64_t));
        at += c;
      }
    }
  });
}

}  // namespace kiln::cpu
