// cuda/index.cu: index_select, index_add, gather and scatter (with or without accumulation) along
// one dim: the indexing kernels of the CUDA backend. CPU sibling: cpu/index.cpp, whose semantics
// these follow (negative indices count from the end; a bad index is an Error naming the op, the
// index and the size). Siblings: backend.cu, elementwise.cu, reduce.cu; helpers in loops.cuh.
//
// Each op is one elementwise pass (cuda/loops.cuh) over the shape that is walked: out for
// index_select and gather, src for index_add, index for scatter. The indexed view's stride along
// `dim` is set to 0 in the OffsetCalc and the looked-up index times that stride is added per
// element. Accumulation (index_add, scatter_add) uses atomics: native atomicAdd for float, double,
// int32 and int64, a compare-and-swap loop on the enclosing 32-bit word for float16 and bfloat16.
// The order of the additions is therefore not fixed: floating sums may differ from the CPU's in
// the last bits. Plain scatter with a repeated index stores one of the candidates (PyTorch: "the
// result is undefined"); the CPU stores the last.
//
// Note [index checks on the device]
// A CUDA thread cannot throw, and a device-side assert would poison the CUDA context for the rest
// of the process. So a thread that meets an out-of-range index records it in a small per-device
// flag (the first one wins) and skips its element; after the kernel the launcher copies the flag
// back, which synchronizes the stream, and throws the CPU's Error. ops/ works on fresh outputs, so
// the partial result is never seen. The price is one stream synchronization per indexing op; a
// later version can check asynchronously.
#include <mutex>
#include <type_traits>
#include <vector>

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

// out[..., index[j], ...] += src[..., j, ...]
void index_add_launch(const View& out, int dim, const View& index, const View& src,
                      const Stream& s) {
  const int64_t n = src.numel();
  if (n == 0) return;
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

}  // namespace kiln::cuda
