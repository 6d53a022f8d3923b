// cuda/index.cu: index_select, index_add, gather and scatter (with or without accumulation) along
// one dim, and nonzero: the indexing kernels of the CUDA backend. CPU sibling: cpu/index.cpp, whose
// semantics these follow (a bad index is an Error naming the op, the index and the size), except that a
// negative index counts from the end here, where the CPU rejects it. Siblings: backend.cu,
// elementwise.cu, reduce.cu; helpers in loops.cuh.
//
// Each op is one elementwise pass (cuda/loops.cuh) over the shape that is walked: out for
// index_select and gather, src for index_add, index for scatter. The indexed view's stride along
// `dim` is set to 0 in the OffsetCalc and the looked-up index times that stride is added per
// element. Accumulation (index_add, scatter_add) uses atomics: native atomicAdd for float, double,
// int32 and int64, a compare-and-swap loop on the enclosing 32-bit word for float16 and bfloat16.
// The order of the additions is therefore not fixed: floating sums may differ from the CPU's in
// the last bits. Plain scatter with a repeated index stores one of the candidates (PyTorch: "the
// result is undefined"); the CPU stores the last. Deterministic mode changes both: below.
//
// Note [deterministic index_add]
// With use_deterministic_algorithms(true) (core/deterministic.h), index_add adds without atomics,
// in the CPU's order. The index comes to the host (one synchronizing copy; the index check
// synchronizes anyway), where a stable sort groups the positions j by their target row k: the
// distinct targets (keys), where each one's positions start (offsets), and the positions in
// increasing j (order). One thread per (target row, element of the slice) then adds its sources in
// increasing j into the target, rounding to the dtype after each addition as cpu/index.cpp does. The
// result has the same bits on every run, and the same as the CPU's. Embedding's backward (an
// index_add into the weight's gradient) is the op this is for; its cost is the host round trip and
// the sort of the index (B x T entries for a language model), not of the gradient. scatter and
// scatter_add (gather's backward) work the same way over their index's elements: each element's
// target offset in out is computed on the host, a stable sort groups them by target, and one thread
// per target adds its sources in the CPU's (row-major) order, or, for scatter, stores the last one,
// as the CPU does. Negative indices wrap, as in the atomic kernels (the CPU rejects them), so for
// them the "CPU's bits" are those of the wrapped index.
//
// Note [index checks on the device]
// A CUDA thread cannot throw, and a device-side assert would poison the CUDA context for the rest
// of the process. So a thread that meets an out-of-range index records it in a small per-device
// flag (the first one wins) and skips its element; after the kernel the launcher copies the flag
// back, which synchronizes the stream, and throws the CPU's Error. ops/ works on fresh outputs, so
// the partial result is never seen. The price is one stream synchronization per indexing op; a
// later version can check asynchronously.
#include <algorithm>
#include <mutex>
#include <numeric>
#include <type_traits>
#include <vector>

#include <cub/device/device_select.cuh>  // nonzero
#include <thrust/iterator/counting_iterator.h>

#include "core/deterministic.h"
#include "cuda/context.h"
#include "cuda/kernels.h"
#include "cuda/loops.cuh"

namespace kiln::cuda {
namespace {

struct IndexFlag {
  unsigned long long set;  // 0, or 1 once a bad index was seen
  int64_t index;           // the first bad index seen
};

// ---- per-element helpers ----

// Wraps a negative index; false (and the flag raised) when it is out of range.
__device__ inline bool checked_index(int64_t& idx, int64_t size, IndexFlag* flag) {
  if (idx < -size || idx >= size) {
    if (atomicCAS(&flag->set, 0ull, 1ull) == 0ull) flag->index = idx;
    return false;
  }
  if (idx < 0) idx += size;
  return true;
}

// *p += v, atomically, rounding as cpu/index.cpp's add (in opmath_t, or logical or for bool).
template <typename T>
__device__ inline void atomic_add(T* p, T v) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> ||
                std::is_same_v<T, int32_t>) {
    atomicAdd(p, v);
  } else if constexpr (std::is_same_v<T, int64_t>) {  // two's complement: unsigned add is the same
    atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
  } else if constexpr (std::is_same_v<T, bool>) {
    if (v) *p = true;  // every racing store writes the same value
  } else if constexpr (std::is_same_v<T, uint8_t> || std::is_same_v<T, int8_t>) {
    // Compare-and-swap the aligned 32-bit word that holds the byte; the sum wraps, as on the CPU.
    const auto addr = reinterpret_cast<uintptr_t>(p);
    auto* word = reinterpret_cast<unsigned int*>(addr & ~static_cast<uintptr_t>(3));
    const unsigned int shift = static_cast<unsigned int>(addr & 3) * 8u;
    unsigned int old = *word, assumed;
    do {
      assumed = old;
      const auto sum = static_cast<uint8_t>(((assumed >> shift) & 0xffu) + static_cast<uint8_t>(v));
      const unsigned int next = (assumed & ~(0xffu << shift)) | (static_cast<unsigned int>(sum) << shift);
      old = atomicCAS(word, assumed, next);
    } while (old != assumed);
  } else {  // Half, BFloat16: compare-and-swap the aligned 32-bit word that holds the element
    const auto addr = reinterpret_cast<uintptr_t>(p);
    auto* word = reinterpret_cast<unsigned int*>(addr & ~static_cast<uintptr_t>(3));
    const unsigned int shift = (addr & 2) ? 16u : 0u;
    unsigned int old = *word, assumed;
    do {
      assumed = old;
      const T current = T::from_bits(static_cast<uint16_t>(assumed >> shift));
      const T sum = T(static_cast<float>(current) + static_cast<float>(v));
      const unsigned int next =
          (assumed & ~(0xffffu << shift)) | (static_cast<unsigned int>(sum.bits) << shift);
      old = atomicCAS(word, assumed, next);
    } while (old != assumed);
  }
}

// ---- the check around a launch: see Note [index checks on the device] ----

std::mutex& flag_mutex() {
  static std::mutex m;
  return m;
}

// The device's flag, made once and never freed. The caller holds flag_mutex() and a DeviceGuard.
IndexFlag* flag_for(int device_index) {
  static std::vector<IndexFlag*> flags;
  if (static_cast<int>(flags.size()) <= device_index) {
    flags.resize(static_cast<size_t>(device_index) + 1, nullptr);
  }
  IndexFlag*& flag = flags[static_cast<size_t>(device_index)];
  if (flag == nullptr) KILN_CUDA_CHECK(cudaMalloc(&flag, sizeof(IndexFlag)));
  return flag;
}

class IndexCheck {
 public:
  explicit IndexCheck(const Stream& s)
      : lock_(flag_mutex()), stream_(stream_of(s)), flag_(flag_for(s.device.index)) {
    KILN_CUDA_CHECK(cudaMemsetAsync(flag_, 0, sizeof(IndexFlag), stream_));
  }
  IndexFlag* flag() const { return flag_; }
  // After the kernel: throws the CPU's Error if a thread saw a bad index.
  void finish(const char* op, int dim, int64_t size) {
    IndexFlag host{};
    KILN_CUDA_CHECK(
        cudaMemcpyAsync(&host, flag_, sizeof(IndexFlag), cudaMemcpyDeviceToHost, stream_));
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    KILN_CHECK(host.set == 0, "{}: index {} is out of bounds for dim {} with size {}", op,
               host.index, dim, size);
  }

 private:
  std::lock_guard<std::mutex> lock_;
  cudaStream_t stream_;
  IndexFlag* flag_;
};

// Strides that step only along `dim` (by `step`): how a 1-D index is addressed from a full shape.
Shape along_dim(int ndim, int dim, int64_t step) {
  Shape s = Shape::filled(ndim, 0);
  s[dim] = step;
  return s;
}
Shape without_dim(const Shape& strides, int dim) {
  Shape s = strides;
  s[dim] = 0;
  return s;
}

}  // namespace

// ---- launchers (the kernels are elementwise_kernel with the lambdas below) ----

// out[..., j, ...] = in[..., index[j], ...]
void index_select_launch(const View& in, int dim, const View& index, const View& out,
                         const Stream& s) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const int64_t size = in.sizes[dim], step = in.strides[dim];
  const auto calc = make_offset_calc<3>(
      out.sizes, {out.strides, without_dim(in.strides, dim),
                  along_dim(out.ndim(), dim, index.ndim() ? index.strides[0] : 0)});
  const int64_t* ix = index.ptr<int64_t>();
  IndexCheck check(s);
  IndexFlag* flag = check.flag();
  KILN_DISPATCH_BY_SIZE(in.dtype, "index_select", [&] {
    const bits_t* x = in.ptr<bits_t>();
    bits_t* y = out.ptr<bits_t>();
    launch_elementwise(n, calc, stream_of(s), [=] __device__(int64_t, const int64_t* o) {
      int64_t idx = ix[o[2]];
      if (checked_index(idx, size, flag)) y[o[0]] = x[o[1] + idx * step];
    });
  });
  check.finish("index_select", dim, size);
}

namespace {
// Positions 0..m-1 grouped by key, stably (Note [deterministic index_add]), as one table on the
// device: the u distinct keys in increasing order, where each group starts (u + 1 offsets, the last
// m), and value[position] for the positions in group order.
class KeyGroups {
 public:
  KeyGroups(const std::vector<int64_t>& key, const std::vector<int64_t>& value, const Stream& s)
      : packed_(pack(key, value)), table_(s.device.index, packed_.size() * sizeof(int64_t)) {
    KILN_CUDA_CHECK(cudaMemcpyAsync(table_.data(), packed_.data(), packed_.size() * sizeof(int64_t),
                                    cudaMemcpyHostToDevice, stream_of(s)));
  }
  int64_t count() const { return u_; }
  const int64_t* keys() const { return static_cast<const int64_t*>(table_.data()); }
  const int64_t* offsets() const { return keys() + u_; }
  const int64_t* values() const { return offsets() + u_ + 1; }

 private:
  std::vector<int64_t> pack(const std::vector<int64_t>& key, const std::vector<int64_t>& value) {
    const auto m = static_cast<int64_t>(key.size());
    std::vector<int64_t> order(static_cast<size_t>(m));
    std::iota(order.begin(), order.end(), int64_t{0});
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return key[a] < key[b]; });
    std::vector<int64_t> keys, offsets, values;
    values.reserve(static_cast<size_t>(m));
    for (int64_t r = 0; r < m; ++r) {
      const int64_t k = key[order[r]];
      if (keys.empty() || keys.back() != k) {
        keys.push_back(k);
        offsets.push_back(r);
      }
      values.push_back(value[order[r]]);
    }
    offsets.push_back(m);
    u_ = static_cast<int64_t>(keys.size());
    keys.insert(keys.end(), offsets.begin(), offsets.end());
    keys.insert(keys.end(), values.begin(), values.end());
    return keys;
  }

  int64_t u_ = 0;
  std::vector<int64_t> packed_;  // kept until the table is filled (the copy reads it)
  DeviceBuffer table_;
};

// The index's entries on the host, in row-major order (one synchronizing copy), each checked
// against `size` and, if negative, wrapped, as the atomic kernels do.
std::vector<int64_t> index_on_host(const View& index, int64_t size, const char* op, int dim, const Stream& s) {
  std::vector<int64_t> idx(static_cast<size_t>(index.numel()));
  View host;
  host.data = idx.data();
  host.dtype = kInt64;
  host.sizes = index.sizes;
  host.strides = contiguous_strides(index.sizes);
  copy_between(index, s.device, host, Device::cpu(), s);
  for (int64_t& k : idx) {
    KILN_CHECK(k >= -size && k < size, "{}: index {} is out of bounds for dim {} with size {}", op, k, dim, size);
    if (k < 0) k += size;
  }
  return idx;
}

// See Note [deterministic index_add].
void index_add_deterministic(const View& out, int dim, const View& index, const View& src, const Stream& s) {
  const int64_t m = src.sizes[dim];
  const std::vector<int64_t> idx = index_on_host(index, out.sizes[dim], "index_add", dim, s);
  // The positions j grouped by target row (keys), in increasing j.
  std::vector<int64_t> positions(static_cast<size_t>(m));
  std::iota(positions.begin(), positions.end(), int64_t{0});
  const KeyGroups groups(idx, positions, s);
  const int64_t u = groups.count();
  const int64_t* d_keys = groups.keys();
  const int64_t* d_offsets = groups.offsets();
  const int64_t* d_order = groups.values();
  // One thread per (distinct target, element of the slice): src's shape with `dim` shrunk to u.
  Shape sizes = src.sizes;
  sizes[dim] = u;
  const int64_t n = sizes.numel();
  const int64_t out_step = out.strides[dim], src_step = src.strides[dim];
  const auto calc = make_offset_calc<3>(
      sizes, {without_dim(out.strides, dim), without_dim(src.strides, dim), along_dim(src.ndim(), dim, 1)});
  KILN_DISPATCH_NUMERIC_TYPES(out.dtype, "index_add", [&] {
    using M = typename OpMath<scalar_t>::type;
    const scalar_t* x = src.ptr<scalar_t>();
    scalar_t* y = out.ptr<scalar_t>();
    launch_elementwise(n, calc, stream_of(s), [=] __device__(int64_t, const int64_t* o) {
      const int64_t q = o[2];
      scalar_t* target = y + o[0] + d_keys[q] * out_step;
      scalar_t sum = *target;
      for (int64_t r = d_offsets[q]; r < d_offsets[q + 1]; ++r) {
        sum = static_cast<scalar_t>(static_cast<M>(sum) + static_cast<M>(x[o[1] + d_order[r] * src_step]));
      }
      *target = sum;
    });
  });
}

// See Note [deterministic index_add]: scatter (the last source wins) and scatter_add (the sources
// added in order), one thread per distinct target.
void scatter_deterministic(const View& out, int dim, const View& index, const View& src, bool accumulate,
                           const Stream& s) {
  const char* name = accumulate ? "scatter_add" : "scatter";
  const int nd = index.ndim();
  const int64_t m = index.numel();
  const std::vector<int64_t> idx = index_on_host(index, out.sizes[dim], name, dim, s);
  // Each element's target in out and source in src, in row-major order of the index (the CPU's).
  std::vector<int64_t> target(static_cast<size_t>(m)), source(static_cast<size_t>(m));
  for (int64_t p = 0; p < m; ++p) {
    int64_t rem = p, ot = 0, os = 0;
    for (int d = nd - 1; d >= 0; --d) {
      const int64_t c = rem % index.sizes[d];
      rem /= index.sizes[d];
      os += c * src.strides[d];
      if (d != dim) ot += c * out.strides[d];
    }
    target[p] = ot + idx[p] * out.strides[dim];
    source[p] = os;
  }
  const KeyGroups groups(target, source, s);
  const int64_t u = groups.count();
  const int64_t* d_targets = groups.keys();
  const int64_t* d_offsets = groups.offsets();
  const int64_t* d_sources = groups.values();
  const auto calc = make_offset_calc<1>(Shape{u}, {Shape{1}});
  KILN_DISPATCH_ALL_TYPES(out.dtype, name, [&] {
    using M = typename OpMath<scalar_t>::type;
    const scalar_t* x = src.ptr<scalar_t>();
    scalar_t* y = out.ptr<scalar_t>();
    launch_elementwise(u, calc, stream_of(s), [=] __device__(int64_t q, const int64_t*) {
      scalar_t* t = y + d_targets[q];
      const int64_t first = d_offsets[q], last = d_offsets[q + 1];
      if (!accumulate) {
        *t = x[d_sources[last - 1]];
        return;
      }
      scalar_t sum = *t;
      for (int64_t r = first; r < last; ++r) {
        if constexpr (std::is_same_v<scalar_t, bool>) {
          sum = sum || x[d_sources[r]];
        } else {
          sum = static_cast<scalar_t>(static_cast<M>(sum) + static_cast<M>(x[d_sources[r]]));
        }
      }
      *t = sum;
    });
  });
}
}  // namespace

// out[..., index[j], ...] += src[..., j, ...]
void index_add_launch(const View& out, int dim, const View& index, const View& src,
                      const Stream& s) {
  const int64_t n = src.numel();
  if (n == 0) return;
  if (are_deterministic_algorithms_enabled()) return index_add_deterministic(out, dim, index, src, s);
  const int64_t size = out.sizes[dim], step = out.strides[dim];
  const auto calc = make_offset_calc<3>(
      src.sizes, {src.strides, without_dim(out.strides, dim),
                  along_dim(src.ndim(), dim, index.ndim() ? index.strides[0] : 0)});
  const int64_t* ix = index.ptr<int64_t>();
  IndexCheck check(s);
  IndexFlag* flag = check.flag();
  KILN_DISPATCH_NUMERIC_TYPES(out.dtype, "index_add", [&] {
    const scalar_t* x = src.ptr<scalar_t>();
    scalar_t* y = out.ptr<scalar_t>();
    launch_elementwise(n, calc, stream_of(s), [=] __device__(int64_t, const int64_t* o) {
      int64_t idx = ix[o[2]];
      if (checked_index(idx, size, flag)) atomic_add(y + o[1] + idx * step, x[o[0]]);
    });
  });
  check.finish("index_add", dim, size);
}

// out[i][j] = in[i][index[i][j]] (dim 1)
void gather_launch(const View& in, int dim, const View& index, const View& out, const Stream& s) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const int64_t size = in.sizes[dim], step = in.strides[dim];
  const auto calc =
      make_offset_calc<3>(out.sizes, {out.strides, index.strides, without_dim(in.strides, dim)});
  const int64_t* ix = index.ptr<int64_t>();
  IndexCheck check(s);
  IndexFlag* flag = check.flag();
  KILN_DISPATCH_BY_SIZE(in.dtype, "gather", [&] {
    const bits_t* x = in.ptr<bits_t>();
    bits_t* y = out.ptr<bits_t>();
    launch_elementwise(n, calc, stream_of(s), [=] __device__(int64_t, const int64_t* o) {
      int64_t idx = ix[o[1]];
      if (checked_index(idx, size, flag)) y[o[0]] = x[o[2] + idx * step];
    });
  });
  check.finish("gather", dim, size);
}

// out[i][index[i][j]] = src[i][j] (dim 1), or += when accumulate
void scatter_launch(const View& out, int dim, const View& index, const View& src, bool accumulate,
                    const Stream& s) {
  const int64_t n = index.numel();
  if (n == 0) return;
  const int64_t size = out.sizes[dim], step = out.strides[dim];
  const auto calc =
      make_offset_calc<3>(index.sizes, {index.strides, src.strides, without_dim(out.strides, dim)});
  const int64_t* ix = index.ptr<int64_t>();
  const char* name = accumulate ? "scatter_add" : "scatter";
  if (are_deterministic_algorithms_enabled()) return scatter_deterministic(out, dim, index, src, accumulate, s);
  IndexCheck check(s);
  IndexFlag* flag = check.flag();
  if (accumulate) {
    KILN_DISPATCH_ALL_TYPES(out.dtype, name, [&] {
      const scalar_t* x = src.ptr<scalar_t>();
      scalar_t* y = out.ptr<scalar_t>();
      launch_elementwise(n, calc, stream_of(s), [=] __device__(int64_t, const int64_t* o) {
        int64_t idx = ix[o[0]];
        if (checked_index(idx, size, flag)) atomic_add(y + o[2] + idx * step, x[o[1]]);
      });
    });
  } else {
    KILN_DISPATCH_BY_SIZE(out.dtype, name, [&] {
      const bits_t* x = src.ptr<bits_t>();
      bits_t* y = out.ptr<bits_t>();
      launch_elementwise(n, calc, stream_of(s), [=] __device__(int64_t, const int64_t* o) {
        int64_t idx = ix[o[0]];
        if (checked_index(idx, size, flag)) y[o[2] + idx * step] = x[o[1]];
      });
    });
  }
  check.finish(name, dim, size);
}

// The positions 0, 1, ... n - 1 kept where the mask is true, in order, by CUB's DeviceSelect::Flagged;
// its scratch and the count it writes come from the caching allocator (ops/ counted the true
// elements already, so the count is not read back).
void nonzero_launch(const View& mask, const View& out, const Stream& s) {
  const int64_t n = mask.numel();
  if (n == 0 || out.numel() == 0) return;
  const auto positions = thrust::make_counting_iterator<int64_t>(0);
  const bool* flags = mask.ptr<bool>();
  DeviceBuffer count(s.device.index, sizeof(int64_t));
  size_t bytes = 0;
  KILN_CUDA_CHECK(cub::DeviceSelect::Flagged(nullptr, bytes, positions, flags, out.ptr<int64_t>(),
                                             static_cast<int64_t*>(count.data()), n, stream_of(s)));
  DeviceBuffer scratch(s.device.index, std::max<size_t>(bytes, 1));
  KILN_CUDA_CHECK(cub::DeviceSelect::Flagged(scratch.data(), bytes, positions, flags, out.ptr<int64_t>(),
                                             static_cast<int64_t*>(count.data()), n, stream_of(s)));
}

}  // namespace kiln::cuda
