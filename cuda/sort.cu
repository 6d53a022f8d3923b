// cuda/sort.cu: Backend::sort and Backend::scan along one dim, and Backend::searchsorted (a thread
// per value, PyTorch's binary search, as cpu/sort.cpp's) (core/backend.h has the contract). CPU
// sibling: cpu/sort.cpp; the order and the running step are core/scan_math.h's, shared with it, so
// both devices give the same order and, for the integer and extreme scans, the same values.
//
// Note [sorting by rank]
// sort gives a block to a line (grid-stride over lines). Under sorts_before's total order every
// element's place in the sorted line is its rank: the number of elements that go before it. Each
// thread takes elements of the line, counts for each the elements before it, reading the line a tile
// of kSortTile keys at a time from shared memory (every thread compares against the same key, so
// a tile serves the whole block), and writes the element to its rank when the rank is below k. That
// is n^2 comparisons a line, no merging and no scratch memory, and the result is the stable sort's
// by construction: fine for the lines of tests, top-k sampling over a vocabulary (50257 keys: about
// 2.5e9 comparisons) and sorts of a few thousand keys; a radix or merge sort for long lines is left
// to do.
//
// scan gives a thread to a line and walks it in order, as the CPU does: exact for the integer sums
// and the extremes, the floating sums in the CPU's accumulator type and order, so the same values;
// slow where there are few long lines (a cumsum over one line of 10^6 elements runs on one thread).
#include <type_traits>

#include "core/scan_math.h"
#include "cuda/context.h"
#include "cuda/kernels.h"
#include "cuda/loops.cuh"

namespace kiln::cuda {
namespace {

constexpr int kSortThreads = 256;
constexpr int kSortTile = 1024;

// Line offsets of up to three views: the dims other than `dim`, one stride list per view.
template <int N>
OffsetCalc<N> line_calc(const Shape& sizes, int dim, const std::array<const View*, N>& views) {
  Shape other;
  std::array<Shape, N> strides;
  for (int d = 0; d < sizes.size(); ++d) {
    if (d == dim) continue;
    other.push_back(sizes[d]);
    for (int k = 0; k < N; ++k) strides[k].push_back(views[k]->strides[d]);
  }
  return make_offset_calc<N>(other, strides);
}

// With select >= 0 (kthvalue) only the element of that rank is written, at position 0 of its line.
template <typename T>
__global__ void sort_rank_kernel(int64_t lines, int64_t n, int64_t k, int64_t select, OffsetCalc<3> calc, const T* in,
                                 int64_t si, T* values, int64_t sv, int64_t* indices, int64_t sx, bool descending) {
  using K = sort_key_t<T>;
  __shared__ K tile[kSortTile];
  for (int64_t line = blockIdx.x; line < lines; line += gridDim.x) {
    int64_t off[3];
    calc.get(line, off);
    const T* x = in + off[0];
    // Rounds of blockDim.x elements; every thread takes part in each round's tiles (barriers).
    for (int64_t first = 0; first < n; first += blockDim.x) {
      const int64_t i = first + threadIdx.x;
      const bool mine = i < n;
      const K key = mine ? static_cast<K>(x[i * si]) : K{};
      int64_t rank = 0;
      for (int64_t start = 0; start < n; start += kSortTile) {
        const int64_t len = n - start < kSortTile ? n - start : kSortTile;
        __syncthreads();  // the previous tile is read
        for (int64_t t = threadIdx.x; t < len; t += blockDim.x) tile[t] = static_cast<K>(x[(start + t) * si]);
        __syncthreads();
        if (mine) {
          for (int64_t t = 0; t < len; ++t) rank += sorts_before(tile[t], start + t, key, i, descending);
        }
      }
      if (mine && (select >= 0 ? rank == select : rank < k)) {
        const int64_t to = select >= 0 ? 0 : rank;
        values[off[1] + to * sv] = x[i * si];
        indices[off[2] + to * sx] = i;
      }
    }
    __syncthreads();  // the tile is free for the next line
  }
}

template <typename T>
__global__ void scan_line_kernel(ScanKind kind, int64_t lines, int64_t n, OffsetCalc<3> calc, const T* in, int64_t si,
                                 T* out, int64_t so, int64_t* indices, int64_t sx) {
  const int64_t step = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t line = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; line < lines; line += step) {
    int64_t off[3];
    calc.get(line, off);
    ScanStep<T> run(kind);
    for (int64_t j = 0; j < n; ++j) {
      out[off[1] + j * so] = run.step(in[off[0] + j * si], j);
      if (indices != nullptr) indices[off[2] + j * sx] = run.index;
    }
  }
}

template <typename T, typename Out>
__global__ void search_kernel(int64_t total, int64_t n, int64_t m, bool one_row, const T* sorted, const T* values,
                              bool right, Out* out) {
  using A = opmath_t<T>;
  const int64_t step = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < total; p += step) {
    const T* row = sorted + (one_row ? 0 : p / n * m);
    const A v = static_cast<A>(values[p]);
    int64_t lo = 0, hi = m;
    while (lo < hi) {
      const int64_t mid = lo + ((hi - lo) >> 1);
      const A x = static_cast<A>(row[mid]);
      if (right ? !(x > v) : !(x >= v)) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    out[p] = static_cast<Out>(lo);
  }
}

void launch_rank(const View& in, int dim, bool descending, int64_t select, const View& values, const View& indices,
                 const Stream& s) {
  if (in.numel() == 0 || values.numel() == 0) return;
  const int64_t n = in.sizes[dim], k = values.sizes[dim], lines = in.numel() / n;
  const OffsetCalc<3> calc = line_calc<3>(in.sizes, dim, {&in, &values, &indices});
  KILN_DISPATCH_ALL_TYPES(in.dtype, "sort", [&] {
    sort_rank_kernel<scalar_t>
        <<<static_cast<unsigned>(std::min<int64_t>(lines, kMaxBlocks)), kSortThreads, 0, stream_of(s)>>>(
            lines, n, k, select, calc, in.ptr<scalar_t>(), in.strides[dim], values.ptr<scalar_t>(), values.strides[dim],
            indices.ptr<int64_t>(), indices.strides[dim], descending);
    KILN_CUDA_CHECK(cudaGetLastError());
  });
}

}  // namespace

void sort_launch(const View& in, int dim, bool descending, const View& values, const View& indices, const Stream& s) {
  launch_rank(in, dim, descending, -1, values, indices, s);
}

void kthvalue_launch(const View& in, int dim, int64_t k, const View& values, const View& indices, const Stream& s) {
  launch_rank(in, dim, false, k - 1, values, indices, s);
}

void scan_launch(ScanKind kind, const View& in, int dim, const View& out, const View& indices, const Stream& s) {
  if (in.numel() == 0) return;
  const bool with_index = kind == ScanKind::Max || kind == ScanKind::Min;
  const int64_t n = in.sizes[dim], lines = in.numel() / n;
  const View& index_view = with_index ? indices : out;  // a stand-in for the offsets when there is no index
  const OffsetCalc<3> calc = line_calc<3>(in.sizes, dim, {&in, &out, &index_view});
  const auto run = [&](auto tag) {
    using T = decltype(tag);
    scan_line_kernel<T><<<blocks_for(lines, 128), 128, 0, stream_of(s)>>>(
        kind, lines, n, calc, in.ptr<T>(), in.strides[dim], out.ptr<T>(), out.strides[dim],
        with_index ? indices.ptr<int64_t>() : nullptr, with_index ? indices.strides[dim] : 0);
    KILN_CUDA_CHECK(cudaGetLastError());
  };
  if (kind == ScanKind::LogSumExp) {
    KILN_DISPATCH_FLOAT_TYPES(in.dtype, "logcumsumexp", [&] { run(scalar_t{}); });
  } else if (with_index) {
    KILN_DISPATCH_ALL_TYPES(in.dtype, "cummax", [&] { run(scalar_t{}); });
  } else {
    KILN_DISPATCH_NUMERIC_TYPES(in.dtype, "cumsum", [&] { run(scalar_t{}); });
  }
}

void searchsorted_launch(const View& sorted, const View& values, bool right, const View& out, const Stream& s) {
  const int64_t total = values.numel();
  if (total == 0) return;
  const int64_t n = values.sizes[1], m = sorted.sizes[1];
  KILN_DISPATCH_NUMERIC_TYPES(values.dtype, "searchsorted", [&] {
    const auto run = [&](auto* to) {
      search_kernel<<<blocks_for(total, 256), 256, 0, stream_of(s)>>>(
          total, n, m, sorted.sizes[0] == 1, sorted.ptr<scalar_t>(), values.ptr<scalar_t>(), right, to);
      KILN_CUDA_CHECK(cudaGetLastError());
    };
    if (out.dtype == kInt32) {
      run(out.ptr<int32_t>());
    } else {
      run(out.ptr<int64_t>());
    }
  });
}

}  // namespace kiln::cuda
