// cuda/conv.cu: 2-D convolution and its two backward kernels (gradient with respect to the input and
// to the weight) through cuDNN 9's convolution API (cudnnConvolutionForward, ...BackwardData,
// ...BackwardFilter). CPU sibling: cpu/conv.cpp (im2col + GEMM), whose semantics these follow:
// NCHW, contiguous, float32 or float64 (ops/conv.cpp runs 16-bit floats in float32), groups,
// stride, padding and dilation as in core/backend.h's ConvArgs, cross-correlation (no kernel
// flip), the bias added per output channel (cudnnAddTensor). Siblings: backend.cu, matmul.cu (the
// other library-backed file), pool.cu, norm.cu. Without cuDNN, conv_stub.cpp takes its place.
//
// Note [cuDNN algorithm choice]
// Each (device, kernel, dtype, shapes, geometry) gets its algorithm from cuDNN's heuristics
// (cudnnGet*Algorithm_v7: no trial runs, so the choice does not depend on timing) once, cached in
// a mutex-guarded map. The first suggestion that cuDNN reports as supported, is deterministic when
// use_deterministic_algorithms(true) is set (core/deterministic.h), uses no TF32 (float32
// must match the CPU within float32 tolerance: the descriptor asks for CUDNN_FMA_MATH and only
// suggestions with that math type are taken) and whose workspace is at most kMaxWorkspace wins; if
// every supported one needs more, the first supported one. Its workspace comes from the device's
// allocator (DeviceBuffer, cuda/context.h) for the call. Backward-filter algorithms may sum with
// atomics, so a weight gradient's last bits may vary from run to run (as in PyTorch without
// deterministic mode); with deterministic mode on, only suggestions that cuDNN marks
// CUDNN_DETERMINISTIC are taken, and the mode is part of the cache key.
//
// Note [cuDNN handles]
// One cudnnHandle_t per device, made on first use (with the device current) and never destroyed,
// like matmul.cu's cuBLAS handles. A handle is not safe to share between threads, so each call
// holds the handle's mutex while it sets the handle's stream and enqueues its work.
//
// Note [cuDNN 32-bit sizes]
// cuDNN takes every size as an int and indexes tensors of up to 2^31 - 1 elements. A batch whose
// input or output is larger runs as pieces of whole samples (the weight gradient sums the pieces
// with beta = 1); a single sample, or a weight, beyond that is an Error.
#include <cudnn.h>

#include <algorithm>
#include <array>
#include <climits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "core/deterministic.h"
#include "cuda/context.h"
#include "cuda/kernels.h"
#include "cuda/loops.cuh"

namespace kiln::cuda {
namespace {

constexpr size_t kMaxWorkspace = size_t{1} << 30;  // 1 GiB: see Note [cuDNN algorithm choice]

// ---- handles and descriptors ----

struct CudnnHandle {
  cudnnHandle_t handle = nullptr;
  std::mutex mutex;  // held while the handle is in use: see Note [cuDNN handles]
};

// The device's handle (the device must be current: the caller holds a DeviceGuard).
CudnnHandle& cudnn_handle(int device_index) {
  static std::mutex mutex;
  static std::vector<std::unique_ptr<CudnnHandle>>* handles =
      new std::vector<std::unique_ptr<CudnnHandle>>();  // never destroyed: Note [cuDNN handles]
  std::lock_guard<std::mutex> lock(mutex);
  if (static_cast<int>(handles->size()) <= device_index) {
    handles->resize(static_cast<size_t>(device_index) + 1);
  }
  std::unique_ptr<CudnnHandle>& h = (*handles)[static_cast<size_t>(device_index)];
  if (!h) {
    auto made = std::make_unique<CudnnHandle>();
    KILN_CUDNN_CHECK(cudnnCreate(&made->handle));
    h = std::move(made);
  }
  return *h;
}

// RAII owners of cuDNN descriptors (destroyed at scope exit; a failing destroy is ignored).
class TensorDesc {
 public:
  TensorDesc() { KILN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&desc_)); }
  ~TensorDesc() { (void)cudnnDestroyTensorDescriptor(desc_); }
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
  void set(cudnnDataType_t t, int n, int c, int h, int w) {
    KILN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(desc_, CUDNN_TENSOR_NCHW, t, n, c, h, w));
  }
  cudnnTensorDescriptor_t get() const { return desc_; }

 private:
  cudnnTensorDescriptor_t desc_ = nullptr;
};

class FilterDesc {
 public:
  FilterDesc() { KILN_CUDNN_CHECK(cudnnCreateFilterDescriptor(&desc_)); }
  ~FilterDesc() { (void)cudnnDestroyFilterDescriptor(desc_); }
  FilterDesc(const FilterDesc&) = delete;
  FilterDesc& operator=(const FilterDesc&) = delete;
  void set(cudnnDataType_t t, int k, int c, int h, int w) {
    KILN_CUDNN_CHECK(cudnnSetFilter4dDescriptor(desc_, t, CUDNN_TENSOR_NCHW, k, c, h, w));
  }
  cudnnFilterDescriptor_t get() const { return desc_; }

 private:
  cudnnFilterDescriptor_t desc_ = nullptr;
};

class ConvDesc {
 public:
  ConvDesc() { KILN_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&desc_)); }
  ~ConvDesc() { (void)cudnnDestroyConvolutionDescriptor(desc_); }
  ConvDesc(const ConvDesc&) = delete;
  ConvDesc& operator=(const ConvDesc&) = delete;
  cudnnConvolutionDescriptor_t get() const { return desc_; }

 private:
  cudnnConvolutionDescriptor_t desc_ = nullptr;
};

// ---- geometry ----

// The sizes of one convolution, checked against each other (ops/conv.cpp has checked them for the
// user; these checks catch a caller that bypasses ops/).
struct Geometry {
  int64_t N, C, H, W;  // input (N, C, H, W)
  int64_t Co, Cg, kH, kW;  // weight (Co, Cg = C / groups, kH, kW)
  int64_t Ho, Wo;  // out (N, Co, Ho, Wo)
  ConvArgs a;
};

int64_t out_size(int64_t in, int64_t k, int64_t pad, int64_t dil, int64_t stride) {
  return (in + 2 * pad - dil * (k - 1) - 1) / stride + 1;
}

// x (N, C, H, W), w (Co, C / groups, kH, kW), y (N, Co, Ho, Wo): 4-D, contiguous, one float dtype.
Geometry geometry(const View& x, const View& w, const View& y, const ConvArgs& a,
                  const char* op) {
  check_nn_dtype(x.dtype, op);
  KILN_CHECK(w.dtype == x.dtype && y.dtype == x.dtype,
             "{}: input, weight and output must share one dtype, got {}, {} and {}", op,
             dtype_name(x.dtype), dtype_name(w.dtype), dtype_name(y.dtype));
  KILN_CHECK(x.ndim() == 4 && w.ndim() == 4 && y.ndim() == 4,
             "{}: expected 4-D input, weight and output (NCHW), got {}, {} and {}", op,
             x.sizes.str(), w.sizes.str(), y.sizes.str());
  KILN_CHECK(x.is_contiguous() && w.is_contiguous() && y.is_contiguous(),
             "{}: the CUDA kernel expects contiguous NCHW views", op);
  KILN_CHECK(a.groups >= 1 && a.stride_h >= 1 && a.stride_w >= 1 && a.dilation_h >= 1 &&
                 a.dilation_w >= 1 && a.pad_h >= 0 && a.pad_w >= 0,
             "{}: bad geometry: stride ({}, {}), padding ({}, {}), dilation ({}, {}), groups {}", op,
             a.stride_h, a.stride_w, a.pad_h, a.pad_w, a.dilation_h, a.dilation_w, a.groups);
  Geometry g;
  g.N = x.sizes[0], g.C = x.sizes[1], g.H = x.sizes[2], g.W = x.sizes[3];
  g.Co = w.sizes[0], g.Cg = w.sizes[1], g.kH = w.sizes[2], g.kW = w.sizes[3];
  g.Ho = y.sizes[2], g.Wo = y.sizes[3];
  g.a = a;
  KILN_CHECK(g.C == g.Cg * a.groups && g.Co % a.groups == 0,
             "{}: input {} and weight {} do not fit groups = {} (input channels = weight dim 1 "
             "times groups, output channels divisible by groups)",
             op, x.sizes.str(), w.sizes.str(), a.groups);
  KILN_CHECK(y.sizes[0] == g.N && y.sizes[1] == g.Co &&
                 g.Ho == out_size(g.H, g.kH, a.pad_h, a.dilation_h, a.stride_h) &&
                 g.Wo == out_size(g.W, g.kW, a.pad_w, a.dilation_w, a.stride_w),
             "{}: output {} is not the convolution of input {} with weight {}", op, y.sizes.str(),
             x.sizes.str(), w.sizes.str());
  return g;
}

int as_int(int64_t v, const char* what, const char* op) {
  KILN_CHECK(v <= INT_MAX, "{}: {} = {} is beyond cuDNN's 32-bit limit ({})", op, what, v, INT_MAX);
  return static_cast<int>(v);
}

// How many samples one cuDNN call takes: see Note [cuDNN 32-bit sizes].
int64_t samples_per_call(const Geometry& g, const char* op) {
  const int64_t per_sample = std::max({g.C * g.H * g.W, g.Co * g.Ho * g.Wo, int64_t{1}});
  KILN_CHECK(per_sample <= INT_MAX,
             "{}: one sample's input or output has {} elements, beyond cuDNN's 32-bit limit ({})",
             op, per_sample, INT_MAX);
  as_int(g.Co * g.Cg * g.kH * g.kW, "the weight's element count", op);
  return std::max<int64_t>(1, std::min<int64_t>(g.N, INT_MAX / per_sample));
}

cudnnDataType_t cudnn_dtype(DType t) { return t == kFloat64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT; }

// float32: only FMA kernels (no TF32), on the descriptor and so in every call; suggestions that
// name a tensor-op math type are passed over. float64 has no reduced-precision mode to rule out.
cudnnMathType_t math_type(DType t) { return t == kFloat64 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH; }
bool math_allowed(DType t, cudnnMathType_t m) {
  return t == kFloat64 || (m != CUDNN_TENSOR_OP_MATH && m != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION);
}

// The descriptors of one call over `n` samples.
struct Descriptors {
  TensorDesc x, y;
  FilterDesc w;
  ConvDesc conv;
};

void describe(Descriptors& d, const Geometry& g, int64_t n, DType dtype, const char* op) {
  const cudnnDataType_t t = cudnn_dtype(dtype);
  const ConvArgs& a = g.a;
  d.x.set(t, as_int(n, "the batch", op), as_int(g.C, "C_in", op), as_int(g.H, "H", op),
          as_int(g.W, "W", op));
  d.y.set(t, as_int(n, "the batch", op), as_int(g.Co, "C_out", op), as_int(g.Ho, "H_out", op),
          as_int(g.Wo, "W_out", op));
  d.w.set(t, as_int(g.Co, "C_out", op), as_int(g.Cg, "C_in / groups", op), as_int(g.kH, "kH", op),
          as_int(g.kW, "kW", op));
  KILN_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
      d.conv.get(), as_int(a.pad_h, "pad_h", op), as_int(a.pad_w, "pad_w", op),
      as_int(a.stride_h, "stride_h", op), as_int(a.stride_w, "stride_w", op),
      as_int(a.dilation_h, "dilation_h", op), as_int(a.dilation_w, "dilation_w", op),
      CUDNN_CROSS_CORRELATION, t));
  KILN_CUDNN_CHECK(cudnnSetConvolutionGroupCount(d.conv.get(), as_int(a.groups, "groups", op)));
  KILN_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv.get(), math_type(dtype)));
}

// ---- algorithm choice: see Note [cuDNN algorithm choice] ----

enum class Pass : int { Forward, BackwardData, BackwardFilter };

// The three passes' cuDNN entry points behind one interface.
template <Pass P> struct Algos;
template <> struct Algos<Pass::Forward> {
  using perf_t = cudnnConvolutionFwdAlgoPerf_t;
  using algo_t = cudnnConvolutionFwdAlgo_t;
  static int max_count(cudnnHandle_t h) {
    int n = 0;
    KILN_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(h, &n));
    return n;
  }
  static void suggest(cudnnHandle_t h, const Descriptors& d, int n, int* count, perf_t* perf) {
    KILN_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, d.x.get(), d.w.get(), d.conv.get(),
                                                            d.y.get(), n, count, perf));
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const Descriptors& d, algo_t algo, size_t* bytes) {
    return cudnnGetConvolutionForwardWorkspaceSize(h, d.x.get(), d.w.get(), d.conv.get(), d.y.get(),
                                                   algo, bytes);
  }
};
template <> struct Algos<Pass::BackwardData> {
  using perf_t = cudnnConvolutionBwdDataAlgoPerf_t;
  using algo_t = cudnnConvolutionBwdDataAlgo_t;
  static int max_count(cudnnHandle_t h) {
    int n = 0;
    KILN_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &n));
    return n;
  }
  static void suggest(cudnnHandle_t h, const Descriptors& d, int n, int* count, perf_t* perf) {
    KILN_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
        h, d.w.get(), d.y.get(), d.conv.get(), d.x.get(), n, count, perf));
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const Descriptors& d, algo_t algo, size_t* bytes) {
    return cudnnGetConvolutionBackwardDataWorkspaceSize(h, d.w.get(), d.y.get(), d.conv.get(),
                                                        d.x.get(), algo, bytes);
  }
};
template <> struct Algos<Pass::BackwardFilter> {
  using perf_t = cudnnConvolutionBwdFilterAlgoPerf_t;
  using algo_t = cudnnConvolutionBwdFilterAlgo_t;
  static int max_count(cudnnHandle_t h) {
    int n = 0;
    KILN_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &n));
    return n;
  }
  static void suggest(cudnnHandle_t h, const Descriptors& d, int n, int* count, perf_t* perf) {
    KILN_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
        h, d.x.get(), d.y.get(), d.conv.get(), d.w.get(), n, count, perf));
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const Descriptors& d, algo_t algo, size_t* bytes) {
    return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d.x.get(), d.y.get(), d.conv.get(),
                                                          d.w.get(), algo, bytes);
  }
};

const char* pass_name(Pass p) {
  switch (p) {
    case Pass::Forward: return "conv2d";
    case Pass::BackwardData: return "conv2d_backward_input";
    case Pass::BackwardFilter: return "conv2d_backward_weight";
  }
  return "conv2d";
}

struct Choice {
  int algo = 0;  // the pass's algo_t
  size_t workspace = 0;
};

// (pass, device, dtype, samples, C, H, W, Co, kH, kW, stride, padding, dilation, groups): the
// output size and C / groups follow from these.
using Key = std::array<int64_t, 18>;  // ... and whether deterministic algorithms were required

// The algorithm for pass P on descriptors d of `n` samples of geometry g (cached). Called with the
// handle's mutex held.
template <Pass P>
Choice choose(cudnnHandle_t h, const Descriptors& d, int device, DType dtype, const Geometry& g,
              int64_t n) {
  const ConvArgs& a = g.a;
  const bool deterministic = are_deterministic_algorithms_enabled();
  const Key key{static_cast<int64_t>(P), device, static_cast<int64_t>(dtype), n, g.C, g.H, g.W,
                g.Co, g.kH, g.kW, a.stride_h, a.stride_w, a.pad_h, a.pad_w, a.dilation_h,
                a.dilation_w, a.groups, deterministic ? 1 : 0};
  static std::mutex mutex;
  static std::map<Key, Choice>* cache = new std::map<Key, Choice>();  // never destroyed
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache->find(key);
    if (it != cache->end()) return it->second;
  }
  using A = Algos<P>;
  const int max_count = A::max_count(h);
  std::vector<typename A::perf_t> perf(static_cast<size_t>(std::max(max_count, 1)));
  int count = 0;
  A::suggest(h, d, max_count, &count, perf.data());
  std::optional<Choice> best, fallback;
  for (int i = 0; i < count && !best; ++i) {
    const auto& p = perf[static_cast<size_t>(i)];
    if (p.status != CUDNN_STATUS_SUCCESS || !math_allowed(dtype, p.mathType)) continue;
    if (deterministic && p.determinism != CUDNN_DETERMINISTIC) continue;
    size_t bytes = 0;
    if (A::workspace(h, d, p.algo, &bytes) != CUDNN_STATUS_SUCCESS) continue;
    const Choice c{static_cast<int>(p.algo), bytes};
    if (bytes <= kMaxWorkspace) best = c;
    else if (!fallback) fallback = c;
  }
  if (!best) best = fallback;
  KILN_CHECK(best.has_value(),
             "{}: cuDNN suggests no supported algorithm without TF32{} for {} input [{}, {}, {}, {}], "
             "weight [{}, {}, {}, {}], stride ({}, {}), padding ({}, {}), dilation ({}, {}), "
             "groups {}",
             pass_name(P), deterministic ? " that is deterministic (use_deterministic_algorithms is on)" : "",
             dtype_name(dtype), n, g.C, g.H, g.W, g.Co, g.Cg, g.kH, g.kW, a.stride_h,
             a.stride_w, a.pad_h, a.pad_w, a.dilation_h, a.dilation_w, a.groups);
  std::lock_guard<std::mutex> lock(mutex);
  cache->emplace(key, *best);
  return *best;
}

// alpha and beta in the type cuDNN reads them as: double for float64 data, float otherwise.
struct Scale {
  float f;
  double d;
  explicit Scale(double v) : f(static_cast<float>(v)), d(v) {}
  const void* for_dtype(DType t) const { return t == kFloat64 ? static_cast<const void*>(&d) : &f; }
};

void zero_fill(const View& v, const Stream& s) {
  KILN_CUDA_CHECK(cudaMemsetAsync(v.data, 0, static_cast<size_t>(v.numel() * itemsize(v.dtype)),
                                  stream_of(s)));
}

// out[:, c] += bias[c] over samples [n0, n0 + n) of out. Called with the handle's mutex held.
void add_bias(cudnnHandle_t h, const Geometry& g, const View& bias, const View& out, int64_t n0,
              int64_t n, const char* op) {
  const cudnnDataType_t t = cudnn_dtype(out.dtype);
  TensorDesc b, y;
  b.set(t, 1, as_int(g.Co, "C_out", op), 1, 1);
  y.set(t, as_int(n, "the batch", op), as_int(g.Co, "C_out", op), as_int(g.Ho, "H_out", op),
        as_int(g.Wo, "W_out", op));
  const Scale one(1.0);
  char* y_data = static_cast<char*>(out.data) + n0 * g.Co * g.Ho * g.Wo * itemsize(out.dtype);
  KILN_CUDNN_CHECK(cudnnAddTensor(h, one.for_dtype(out.dtype), b.get(), bias.data,
                                  one.for_dtype(out.dtype), y.get(), y_data));
}

// Runs fn(handle, n0, n, descriptors, choice, workspace) for each piece [n0, n0 + n) of the batch
// (Note [cuDNN 32-bit sizes]), with the handle locked and set to the stream.
template <Pass P, typename F>
void for_each_piece(const Geometry& g, DType dtype, int device, const Stream& s, const F& fn) {
  const char* op = pass_name(P);
  const int64_t per_call = samples_per_call(g, op);
  CudnnHandle& handle = cudnn_handle(device);
  std::lock_guard<std::mutex> lock(handle.mutex);
  KILN_CUDNN_CHECK(cudnnSetStream(handle.handle, stream_of(s)));
  for (int64_t n0 = 0; n0 < g.N; n0 += per_call) {
    const int64_t n = std::min(per_call, g.N - n0);
    Descriptors d;
    describe(d, g, n, dtype, op);
    const Choice c = choose<P>(handle.handle, d, device, dtype, g, n);
    std::optional<DeviceBuffer> workspace;
    if (c.workspace > 0) workspace.emplace(device, c.workspace);
    fn(handle.handle, n0, n, d, c, workspace ? workspace->data() : nullptr);
  }
}

}  // namespace

// ---- launchers ----

void conv2d_launch(const View& input, const View& weight, const View& bias, const View& out,
                   const ConvArgs& args, int device, const Stream& s) {
  const char* op = "conv2d";
  const Geometry g = geometry(input, weight, out, args, op);
  if (bias.data) {
    KILN_CHECK(bias.dtype == out.dtype && bias.ndim() == 1 && bias.sizes[0] == g.Co &&
                   bias.is_contiguous(),
               "{}: bias must be contiguous {} of shape [{}], got {} {}", op,
               dtype_name(out.dtype), g.Co, dtype_name(bias.dtype), bias.sizes.str());
  }
  if (out.numel() == 0) return;
  const DType dt = out.dtype;
  const int64_t item = itemsize(dt);
  if (input.numel() == 0 || weight.numel() == 0) {  // an empty sum (no channels, or all padding)
    zero_fill(out, s);
    if (!bias.data) return;
    CudnnHandle& handle = cudnn_handle(device);
    std::lock_guard<std::mutex> lock(handle.mutex);
    KILN_CUDNN_CHECK(cudnnSetStream(handle.handle, stream_of(s)));
    const int64_t per_call = samples_per_call(g, op);
    for (int64_t n0 = 0; n0 < g.N; n0 += per_call) {
      add_bias(handle.handle, g, bias, out, n0, std::min(per_call, g.N - n0), op);
    }
    return;
  }
  const Scale one(1.0), zero(0.0);
  for_each_piece<Pass::Forward>(g, dt, device, s, [&](cudnnHandle_t h, int64_t n0, int64_t n,
                                                      const Descriptors& d, const Choice& c,
                                                      void* ws) {
    const char* x = static_cast<const char*>(input.data) + n0 * g.C * g.H * g.W * item;
    char* y = static_cast<char*>(out.data) + n0 * g.Co * g.Ho * g.Wo * item;
    KILN_CUDNN_CHECK(cudnnConvolutionForward(
        h, one.for_dtype(dt), d.x.get(), x, d.w.get(), weight.data, d.conv.get(),
        static_cast<cudnnConvolutionFwdAlgo_t>(c.algo), ws, c.workspace, zero.for_dtype(dt),
        d.y.get(), y));
    if (bias.data) add_bias(h, g, bias, out, n0, n, op);
  });
}

void conv2d_backward_input_launch(const View& grad_out, const View& weight, const View& grad_input,
                                  const ConvArgs& args, int device, const Stream& s) {
  const Geometry g = geometry(grad_input, weight, grad_out, args, "conv2d_backward_input");
  if (grad_input.numel() == 0) return;
  const DType dt = grad_input.dtype;
  if (grad_out.numel() == 0 || weight.numel() == 0) return zero_fill(grad_input, s);
  const int64_t item = itemsize(dt);
  const Scale one(1.0), zero(0.0);
  for_each_piece<Pass::BackwardData>(g, dt, device, s, [&](cudnnHandle_t h, int64_t n0, int64_t,
                                                           const Descriptors& d, const Choice& c,
                                                           void* ws) {
    const char* dy = static_cast<const char*>(grad_out.data) + n0 * g.Co * g.Ho * g.Wo * item;
    char* dx = static_cast<char*>(grad_input.data) + n0 * g.C * g.H * g.W * item;
    KILN_CUDNN_CHECK(cudnnConvolutionBackwardData(
        h, one.for_dtype(dt), d.w.get(), weight.data, d.y.get(), dy, d.conv.get(),
        static_cast<cudnnConvolutionBwdDataAlgo_t>(c.algo), ws, c.workspace,
        zero.for_dtype(dt), d.x.get(), dx));
  });
}

void conv2d_backward_weight_launch(const View& grad_out, const View& input,
                                   const View& grad_weight, const ConvArgs& args, int device,
                                   const Stream& s) {
  const Geometry g = geometry(input, grad_weight, grad_out, args, "conv2d_backward_weight");
  if (grad_weight.numel() == 0) return;
  const DType dt = grad_weight.dtype;
  if (grad_out.numel() == 0 || input.numel() == 0) return zero_fill(grad_weight, s);
  const int64_t item = itemsize(dt);
  const Scale one(1.0), zero(0.0);
  for_each_piece<Pass::BackwardFilter>(g, dt, device, s, [&](cudnnHandle_t h, int64_t n0, int64_t,
                                                             const Descriptors& d, const Choice& c,
                                                             void* ws) {
    const char* x = static_cast<const char*>(input.data) + n0 * g.C * g.H * g.W * item;
    const char* dy = static_cast<const char*>(grad_out.data) + n0 * g.Co * g.Ho * g.Wo * item;
    // The first piece writes the gradient, later ones add to it.
    KILN_CUDNN_CHECK(cudnnConvolutionBackwardFilter(
        h, one.for_dtype(dt), d.x.get(), x, d.y.get(), dy, d.conv.get(),
        static_cast<cudnnConvolutionBwdFilterAlgo_t>(c.algo), ws, c.workspace,
        n0 == 0 ? zero.for_dtype(dt) : one.for_dtype(dt), d.w.get(), grad_weight.data));
  });
}

}  // namespace kiln::cuda
