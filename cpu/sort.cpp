// cpu/sort.cpp: Backend::sort, kthvalue and scan along one dim of a strided view (core/backend.h has
// the contract). A line is every element of one dim with the others fixed; the pool takes whole
// lines. The running step is core/scan_math.h's ScanStep, shared with cuda/sort.cu; the order is its
// sorts_before's, here by integer keys (Note [sort keys]). And searchsorted: a binary search per value.
//
// sort copies a line's keys with their positions out (Note [sort keys]), orders them with std::sort,
// or only the first k with std::partial_sort (k at most n / 64: top-k sampling) or std::nth_element
// and a sort of the first k (topk), or takes one rank with std::nth_element (kthvalue), and writes the
// elements and positions back. Keys break ties by position, so every path gives the stable sort's
// order.
#include <algorithm>
#include <bit>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/scan_math.h"
#include "cpu/kernels.h"
#include "cpu/loops.h"
#include "cpu/parallel.h"

namespace kiln::cpu {
namespace {

// The offset in v of element 0 of line `line`: the line's index runs over v's dims other than `dim`
// in row-major order.
int64_t line_offset(const View& v, int dim, int64_t line) {
  int64_t off = 0;
  for (int d = v.ndim() - 1; d >= 0; --d) {
    if (d == dim) continue;
    off += (line % v.sizes[d]) * v.strides[d];
    line /= v.sizes[d];
  }
  return off;
}

// Lines per piece of the pool: about kGrain elements' worth, at least one line.
int64_t line_grain(int64_t n) { return std::max<int64_t>(1, kGrain / std::max<int64_t>(n, 1)); }

// Note [sort keys]
// The CPU sorts unsigned integers, not values under sorts_before's comparison with its NaN and tie
// branches: a value's key orders like the value (the sign bit flipped for a non-negative float, every
// bit for a negative one; integers with the sign bit flipped), -0 keyed as 0, every NaN as the
// largest key, and every bit inverted for descending. Equal keys are then broken by position. Where
// the key fits in 32 bits (all dtypes but float64 and int64) and a line has fewer than 2^32 elements,
// key and position are one 64-bit integer (key << 32 | position), so std::sort compares plain
// integers; otherwise (key, position) pairs. Both give exactly sorts_before's order (the CUDA kernels
// compare with sorts_before itself), which the tests check against a stable sort of the values.
template <typename T>
uint64_t order_key(T value, bool descending) {
  uint64_t u;
  if constexpr (std::is_same_v<T, double>) {
    if (value != value) {
      u = ~uint64_t{0};
    } else {
      const uint64_t bits = std::bit_cast<uint64_t>(value == 0 ? 0.0 : value);
      u = (bits >> 63) != 0 ? ~bits : bits | (uint64_t{1} << 63);
    }
  } else if constexpr (std::is_same_v<T, int64_t>) {
    u = static_cast<uint64_t>(value) ^ (uint64_t{1} << 63);
  } else if constexpr (std::is_floating_point_v<sort_key_t<T>>) {  // float32, float16, bfloat16
    const float f = static_cast<float>(value);
    if (f != f) {
      u = 0xffffffffu;
    } else {
      const uint32_t bits = std::bit_cast<uint32_t>(f == 0 ? 0.0f : f);
      u = (bits >> 31) != 0 ? ~bits : bits | 0x80000000u;
    }
  } else {  // int32, int8, uint8, bool
    u = static_cast<uint32_t>(static_cast<int32_t>(value)) ^ 0x80000000u;
  }
  if (descending) u = std::is_same_v<T, double> || std::is_same_v<T, int64_t> ? ~u : (~u & 0xffffffffu);
  return u;
}

template <typename T>
constexpr bool kWideKey = std::is_same_v<T, double> || std::is_same_v<T, int64_t>;

// One line's items: (key << 32 | position), or (key, position) pairs; both ordered by operator<.
template <typename T, typename Item>
void fill_items(const T* from, int64_t n, int64_t si, bool descending, Item* items) {
  for (int64_t j = 0; j < n; ++j) {
    const uint64_t key = order_key(from[j * si], descending);
    if constexpr (std::is_same_v<Item, uint64_t>)
      items[j] = key << 32 | static_cast<uint64_t>(j);
    else
      items[j] = {key, static_cast<uint64_t>(j)};
  }
}
template <typename Item>
int64_t position_of(const Item& item) {
  if constexpr (std::is_same_v<Item, uint64_t>)
    return static_cast<int64_t>(item & 0xffffffffu);
  else
    return static_cast<int64_t>(item.second);
}

// For each line: its first k items in order (select < 0), or only the item of rank `select`.
template <typename T, typename Item>
void order_lines(const View& in, int dim, bool descending, int64_t select, const View& values, const View& indices) {
  const int64_t n = in.sizes[dim], k = values.sizes[dim], lines = in.numel() / n;
  const int64_t si = in.strides[dim], sv = values.strides[dim], sx = indices.strides[dim];
  parallel_for(0, lines, line_grain(n), [&](int64_t b, int64_t e) {
    std::vector<Item> items(static_cast<size_t>(n));
    for (int64_t l = b; l < e; ++l) {
      const T* from = in.ptr<T>() + line_offset(in, dim, l);
      fill_items(from, n, si, descending, items.data());
      const auto first = items.begin(), last = items.end();
      int64_t count = k;
      if (select >= 0) {  // kthvalue: the item of that rank, written at 0
        std::nth_element(first, first + select, last);
        std::swap(items[0], items[select]);
        count = 1;
      } else if (k == n) {
        std::sort(first, last);
      } else if (k * 64 <= n) {  // a few of many (top-k sampling): a heap of k
        std::partial_sort(first, first + k, last);
      } else {
        std::nth_element(first, first + k, last);
        std::sort(first, first + k);
      }
      T* to = values.ptr<T>() + line_offset(values, dim, l);
      int64_t* to_index = indices.ptr<int64_t>() + line_offset(indices, dim, l);
      for (int64_t j = 0; j < count; ++j) {
        const int64_t pos = position_of(items[j]);
        to[j * sv] = from[pos * si];  // the element itself, not a value made from its key
        to_index[j * sx] = pos;
      }
    }
  });
}

template <typename T>
void order_dispatch(const View& in, int dim, bool descending, int64_t select, const View& values, const View& indices) {
  if (kWideKey<T> || in.sizes[dim] > int64_t{0xffffffff}) {
    order_lines<T, std::pair<uint64_t, uint64_t>>(in, dim, descending, select, values, indices);
  } else {
    order_lines<T, uint64_t>(in, dim, descending, select, values, indices);
  }
}

template <typename T>
void scan_lines(ScanKind kind, const View& in, int dim, const View& out, const View& indices) {
  const int64_t n = in.sizes[dim], lines = in.numel() / n;
  const int64_t si = in.strides[dim], so = out.strides[dim];
  const bool with_index = kind == ScanKind::Max || kind == ScanKind::Min;
  const int64_t sx = with_index ? indices.strides[dim] : 0;
  int64_t inner = 1;
  for (int d = dim + 1; d < in.ndim(); ++d) inner *= in.sizes[d];
  if (inner > 1 && in.is_contiguous() && out.is_contiguous() && (!with_index || indices.is_contiguous())) {
    // Lines across a contiguous tensor (dim not the last): the lines of one outer index go side by
    // side, a run of `inner` at each step j, so each step reads and writes whole rows (a line at a
    // time would stride `inner` elements per step); every line's own steps stay in order.
    const int64_t outer = lines / inner, chunk = std::min<int64_t>(inner, 1024);
    const int64_t chunks = (inner + chunk - 1) / chunk;
    parallel_for(0, outer * chunks, std::max<int64_t>(1, kGrain / (n * chunk)), [&](int64_t b, int64_t e) {
      std::vector<ScanStep<T>> runs;
      for (int64_t p = b; p < e; ++p) {
        const int64_t o = p / chunks, i0 = (p % chunks) * chunk, width = std::min(chunk, inner - i0);
        runs.assign(static_cast<size_t>(width), ScanStep<T>(kind));
        const int64_t base = o * n * inner + i0;
        for (int64_t j = 0; j < n; ++j) {
          const T* from = in.ptr<T>() + base + j * inner;
          T* to = out.ptr<T>() + base + j * inner;
          for (int64_t i = 0; i < width; ++i) to[i] = runs[i].step(from[i], j);
          if (with_index) {
            int64_t* to_index = indices.ptr<int64_t>() + base + j * inner;
            for (int64_t i = 0; i < width; ++i) to_index[i] = runs[i].index;
          }
        }
      }
    });
    return;
  }
  parallel_for(0, lines, line_grain(n), [&](int64_t b, int64_t e) {
    for (int64_t l = b; l < e; ++l) {
      const T* from = in.ptr<T>() + line_offset(in, dim, l);
      T* to = out.ptr<T>() + line_offset(out, dim, l);
      int64_t* to_index = with_index ? indices.ptr<int64_t>() + line_offset(indices, dim, l) : nullptr;
      ScanStep<T> run(kind);
      const auto walk = [&](auto kind_tag) {
        constexpr ScanKind kKind = decltype(kind_tag)::value;
        for (int64_t j = 0; j < n; ++j) {
          to[j * so] = run.template step_as<kKind>(from[j * si], j);
          if constexpr (kKind == ScanKind::Max || kKind == ScanKind::Min) to_index[j * sx] = run.index;
        }
      };
      switch (kind) {
        case ScanKind::Sum:
          walk(std::integral_constant<ScanKind, ScanKind::Sum>{});
          break;
        case ScanKind::Prod:
          walk(std::integral_constant<ScanKind, ScanKind::Prod>{});
          break;
        case ScanKind::LogSumExp:
          walk(std::integral_constant<ScanKind, ScanKind::LogSumExp>{});
          break;
        case ScanKind::Max:
          walk(std::integral_constant<ScanKind, ScanKind::Max>{});
          break;
        case ScanKind::Min:
          walk(std::integral_constant<ScanKind, ScanKind::Min>{});
          break;
      }
    }
  });
}

// PyTorch's binary search (Backend::searchsorted): halve [lo, hi) while lo < hi, stepping right where
// the middle element is not >= v (not > v with right), in T's arithmetic type. Each step's load waits
// for the step before, so one search at a time leaves the core idle; here kLanes probes go through
// the steps side by side, each step a pair of selects (no branch to mispredict), for bit_width(m)
// steps (each at least halves [lo, hi), which stays put once empty): the same lo as PyTorch's loop.
template <typename T, typename Out, bool kRight>
void search_rows(const View& sorted, const View& values, const View& out) {
  using A = opmath_t<T>;
  constexpr int64_t kLanes = 16;
  const int64_t m = sorted.sizes[1], n = values.sizes[1], rows = values.sizes[0];
  const int steps = std::bit_width(static_cast<uint64_t>(m));
  const bool one_row = sorted.sizes[0] == 1;
  const T* probes = values.ptr<T>();
  Out* to = out.ptr<Out>();
  parallel_for(0, rows * n, kGrain / 8, [&](int64_t b, int64_t e) {
    for (int64_t p0 = b; p0 < e; p0 += kLanes) {
      const int64_t lanes = std::min(kLanes, e - p0);
      int64_t lo[kLanes], hi[kLanes];
      A v[kLanes];
      const T* row[kLanes];
      for (int64_t l = 0; l < lanes; ++l) {
        lo[l] = 0;
        hi[l] = m;
        v[l] = static_cast<A>(probes[p0 + l]);
        row[l] = sorted.ptr<T>() + (one_row ? 0 : (p0 + l) / n * m);
      }
      for (int s = 0; s < steps; ++s) {
        for (int64_t l = 0; l < lanes; ++l) {
          const int64_t mid = lo[l] + ((hi[l] - lo[l]) >> 1);
          const A x = static_cast<A>(row[l][std::min(mid, m - 1)]);
          const bool go_right = kRight ? !(x > v[l]) : !(x >= v[l]);
          const bool open = lo[l] < hi[l];
          lo[l] = open && go_right ? mid + 1 : lo[l];
          hi[l] = open && !go_right ? mid : hi[l];
        }
      }
      for (int64_t l = 0; l < lanes; ++l) to[p0 + l] = static_cast<Out>(lo[l]);
    }
  });
}

}  // namespace

void sort_kernel(const View& in, int dim, bool descending, const View& values, const View& indices) {
  if (in.numel() == 0 || values.numel() == 0) return;
  KILN_DISPATCH_ALL_TYPES(in.dtype, "sort",
                          [&] { order_dispatch<scalar_t>(in, dim, descending, -1, values, indices); });
}

void kthvalue_kernel(const View& in, int dim, int64_t k, const View& values, const View& indices) {
  if (in.numel() == 0) return;
  KILN_DISPATCH_ALL_TYPES(in.dtype, "kthvalue",
                          [&] { order_dispatch<scalar_t>(in, dim, false, k - 1, values, indices); });
}

void scan_kernel(ScanKind kind, const View& in, int dim, const View& out, const View& indices) {
  if (in.numel() == 0) return;
  if (kind == ScanKind::LogSumExp) {
    KILN_DISPATCH_FLOAT_TYPES(in.dtype, "logcumsumexp", [&] { scan_lines<scalar_t>(kind, in, dim, out, indices); });
  } else if (kind == ScanKind::Max || kind == ScanKind::Min) {
    KILN_DISPATCH_ALL_TYPES(in.dtype, "cummax", [&] { scan_lines<scalar_t>(kind, in, dim, out, indices); });
  } else {
    KILN_DISPATCH_NUMERIC_TYPES(in.dtype, "cumsum", [&] { scan_lines<scalar_t>(kind, in, dim, out, indices); });
  }
}

void searchsorted_kernel(const View& sorted, const View& values, bool right, const View& out) {
  if (values.numel() == 0) return;
  KILN_DISPATCH_NUMERIC_TYPES(values.dtype, "searchsorted", [&] {
    if (out.dtype == kInt32) {
      right ? search_rows<scalar_t, int32_t, true>(sorted, values, out)
            : search_rows<scalar_t, int32_t, false>(sorted, values, out);
    } else {
      right ? search_rows<scalar_t, int64_t, true>(sorted, values, out)
            : search_rows<scalar_t, int64_t, false>(sorted, values, out);
    }
  });
}

}  // namespace kiln::cpu
