// cuda/matmul.cu: the CUDA matmul. CPU sibling: cpu/matmul.cpp.
//
// Matmul: c[..., M, N] = a[..., M, K] @ b[..., K, N] through cuBLAS for the floating dtypes:
// float32 with cublasSgemm (strict float32; with cuda::set_matmul_allow_tf32(true), cublasGemmEx
// on TF32 tensor cores), float64 with cublasDgemm, float16 and
// bfloat16 with cublasGemmEx accumulating in float32 (all in their strided-batched forms). cuBLAS
// is column-major; a row-major C is a column-major C^T, so Kiln asks for C^T = B^T A^T. A
// transposed operand (strides (1, M)) is handed over with the transpose flag, not copied; an
// operand with no BLAS layout (two non-unit strides, or a broadcast row) is first copied into a
// contiguous buffer. The batch dims are merged where their strides allow; the innermost merged dim
// is cuBLAS's batch (its stride may be 0: a broadcast operand) and any others loop on the host.
// Integer matmul is a plain kernel, one thread per output element. Every cuBLAS call goes through
// KILN_CUBLAS(fn), which opens the library on first use (Note [cuBLAS opened on first use], check.h).
//
// Note [cuBLASLt bias epilogue]
// nn::linear's y = x W^T + b is a GEMM and then a pass over y that adds b. cuBLASLt can add b in
// the GEMM's epilogue, while each tile of y is still in registers: one kernel and one write of y
// instead of a GEMM, a read and a write. Row-major c = a b + bias is column-major
// c^T = b^T a^T + bias with the bias running down c^T's rows, which is CUBLASLT_EPILOGUE_BIAS (a
// vector as long as D has rows, added to every column). matmul_bias_launch uses it for 2-D float32,
// float16 and bfloat16 operands with BLAS layouts and a contiguous c: float32 computes in
// CUBLAS_COMPUTE_32F (CUBLAS_COMPUTE_32F_FAST_TF32 under set_matmul_allow_tf32(true)), the 16-bit
// types in CUBLAS_COMPUTE_32F with float scales, as the plain GEMMs above. The algorithm is
// cuBLASLt's first heuristic answer for the pointers' alignment and a workspace of at most
// kLtWorkspace bytes; where there is none, or the operands do not fit (a bias not 16-byte aligned
// among them), or cublasLtMatmul refuses, it returns false and the caller (ops::addmm_out) composes
// matmul and add. The heuristic's answer is cached per shape, dtype, layout and alignment; the
// descriptors are made afresh on every call (host-side mallocs only).
//
// Note [cuBLASLt GELU epilogue]
// A GPT MLP's first layer is gelu(x W^T + b). With CUBLASLT_EPILOGUE_GELU_AUX_BIAS the same GEMM
// adds the bias, applies GELU (the tanh form, the only one cuBLASLt has) and writes two matrices
// from registers: the output and, through the epilogue's aux pointer, the GELU's input x W^T + b,
// which the backward needs (ops::addmm_gelu saves it). That replaces a GEMM plus a pass that reads
// y and writes gelu(y + b) (ops::bias_gelu), so one read of the largest activation of the block is
// saved in the forward. The aux matrix has D's layout (leading dimension N, which cuBLASLt wants
// divisible by 8); N % 8 != 0, like every other misfit above, returns false and the caller
// composes. Both epilogues share lt_matmul below and its heuristic cache (the epilogue in the key).
#include <cublasLt.h>

#include <atomic>
#include <climits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <vector>

#include "cuda/context.h"
#include "cuda/cuda.h"
#include "cuda/kernels.h"
#include "cuda/loops.cuh"

namespace kiln::cuda {
namespace {

std::atomic<bool> g_allow_tf32{false};

// ---- kernels ----
// The integer matmul is elementwise_kernel (cuda/loops.cuh) with the lambda in matmul_integer().

// ---- matmul: host side ----

// One handle per device, made on first use by `create` and never destroyed (destroying it after the
// driver has shut down at exit would fail). Threads share it, which is safe for cuBLASLt, whose
// calls take their stream; cuBLAS's handles are per thread (Note [cuBLAS handles per thread]).
template <typename Handle, typename Create>
Handle device_handle(int device_index, Create create) {
  static std::mutex mutex;  // one per instantiation: per handle type and call site
  static std::vector<Handle> handles;
  std::lock_guard<std::mutex> lock(mutex);
  if (static_cast<int>(handles.size()) <= device_index) {
    handles.resize(static_cast<size_t>(device_index) + 1, nullptr);
  }
  Handle& handle = handles[static_cast<size_t>(device_index)];
  if (handle == nullptr) KILN_CUBLAS_CHECK(create(&handle));
  return handle;
}

// Note [cuBLAS handles per thread]
// cublasSetStream binds a stream to a handle until the next call, so two threads sharing a handle
// could each set their own stream and then run their GEMM on the other's. Each thread therefore has
// its own cuBLAS handle per device. A thread that exits gives its handles back to a pool, never
// destroying them (see device_handle), and a thread started later takes them from there, so that
// threads started and ended over and over (a DataLoader's workers, a test's threads) make no more
// handles than ever ran at once.
cublasHandle_t cublas_handle(int device_index) {
  struct Pool {  // handles given back by exited threads, per device
    std::mutex mutex;
    std::vector<std::vector<cublasHandle_t>> free;
  };
  static Pool* pool = new Pool();  // never destroyed: a thread may exit after static destructors ran
  struct Mine {
    std::vector<cublasHandle_t> handles;  // this thread's, per device
    ~Mine() {
      std::lock_guard<std::mutex> lock(pool->mutex);
      for (size_t d = 0; d < handles.size(); ++d) {
        if (handles[d] != nullptr) pool->free[d].push_back(handles[d]);
      }
    }
  };
  thread_local Mine mine;
  const auto d = static_cast<size_t>(device_index);
  if (mine.handles.size() <= d) mine.handles.resize(d + 1, nullptr);
  cublasHandle_t& handle = mine.handles[d];
  if (handle == nullptr) {
    {
      std::lock_guard<std::mutex> lock(pool->mutex);
      if (pool->free.size() <= d) pool->free.resize(d + 1);
      if (!pool->free[d].empty()) {
        handle = pool->free[d].back();
        pool->free[d].pop_back();
      }
    }
    if (handle == nullptr) KILN_CUBLAS_CHECK(KILN_CUBLAS(cublasCreate)(&handle));
  }
  return handle;
}

// A flipped batch dim: cuBLAS documents no negative batch strides, so such an operand is staged.
bool negative_batch_stride(const View& v) {
  for (int d = 0; d < v.ndim() - 2; ++d) {
    if (v.strides[d] < 0 && v.sizes[d] > 1) return true;
  }
  return false;
}

// v copied into a contiguous buffer, except that broadcast batch dims stay broadcast (stride 0):
// the matrix dims get a BLAS layout without the batch being expanded.
View stage_operand(const View& v, std::optional<DeviceBuffer>& buffer, int device,
                   const Stream& s) {
  const int nd = v.ndim();
  Shape sizes = v.sizes;
  for (int d = 0; d < nd - 2; ++d) {
    if (v.strides[d] == 0) sizes[d] = 1;
  }
  View staged;
  staged.dtype = v.dtype;
  staged.sizes = sizes;
  staged.strides = contiguous_strides(sizes);
  buffer.emplace(device, static_cast<size_t>(sizes.numel() * itemsize(v.dtype)));
  staged.data = buffer->data();
  View source = v;
  source.sizes = sizes;
  copy_on_device(source, staged, s);
  staged.sizes = v.sizes;
  for (int d = 0; d < nd - 2; ++d) {
    if (sizes[d] != v.sizes[d]) staged.strides[d] = 0;
  }
  return staged;
}

// The batch dims of a, b and c, size-1 dims dropped and neighbours merged where all three allow,
// outermost first.
struct Batch {
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[3][kMaxDims] = {};  // a, b, c
};

Batch collapse_batch(const View& a, const View& b, const View& c) {
  Batch batch;
  const View* views[3] = {&a, &b, &c};
  for (int d = 0; d < c.ndim() - 2; ++d) {
    if (c.sizes[d] == 1) continue;
    const int n = batch.ndim;
    bool merge = n > 0;
    for (int k = 0; k < 3 && merge; ++k) {
      merge = batch.strides[k][n - 1] == views[k]->strides[d] * c.sizes[d];
    }
    if (merge) {
      batch.sizes[n - 1] *= c.sizes[d];
      for (int k = 0; k < 3; ++k) batch.strides[k][n - 1] = views[k]->strides[d];
    } else {
      batch.sizes[n] = c.sizes[d];
      for (int k = 0; k < 3; ++k) batch.strides[k][n] = views[k]->strides[d];
      ++batch.ndim;
    }
  }
  return batch;
}

int as_int(int64_t v, const char* what) {
  KILN_CHECK(v <= INT_MAX, "matmul: {} = {} is beyond cuBLAS's 32-bit limit ({})", what, v,
             INT_MAX);
  return static_cast<int>(v);
}

// One strided-batched cuBLAS call: C^T (N x M) = op(B) op(A) for `count` matrices.
struct Gemm {
  cublasOperation_t op_a, op_b;
  int m, n, k, lda, ldb, ldc;  // in cuBLAS's terms: m = N, n = M
  int64_t stride_a, stride_b, stride_c;
  int count;
};

// cublas_api.h also declares, for C++, an inline overload of cublasGemmStridedBatchedEx that takes
// the compute type as a cudaDataType; the library's own function takes a cublasComputeType_t.
using GemmStridedBatchedEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                                const void*, const void*, cudaDataType, int, long long, const void*,
                                                cudaDataType, int, long long, const void*, void*, cudaDataType, int,
                                                long long, int, cublasComputeType_t, cublasGemmAlgo_t);

void run_gemm(cublasHandle_t h, DType dtype, const Gemm& g, const void* a, const void* b, void* c) {
  switch (dtype) {
    case DType::Float32: {
      const float alpha = 1, beta = 0;
      if (g_allow_tf32.load(std::memory_order_relaxed)) {
        KILN_CUBLAS_CHECK(KILN_CUBLAS_AS(cublasGemmStridedBatchedEx, GemmStridedBatchedEx)(
            h, g.op_b, g.op_a, g.m, g.n, g.k, &alpha, b, CUDA_R_32F, g.ldb, g.stride_b, a, CUDA_R_32F, g.lda,
            g.stride_a, &beta, c, CUDA_R_32F, g.ldc, g.stride_c, g.count, CUBLAS_COMPUTE_32F_FAST_TF32,
            CUBLAS_GEMM_DEFAULT));
        return;
      }
      KILN_CUBLAS_CHECK(KILN_CUBLAS(cublasSgemmStridedBatched)(
          h, g.op_b, g.op_a, g.m, g.n, g.k, &alpha, static_cast<const float*>(b), g.ldb,
          g.stride_b, static_cast<const float*>(a), g.lda, g.stride_a, &beta,
          static_cast<float*>(c), g.ldc, g.stride_c, g.count));
      return;
    }
    case DType::Float64: {
      const double alpha = 1, beta = 0;
      KILN_CUBLAS_CHECK(KILN_CUBLAS(cublasDgemmStridedBatched)(
          h, g.op_b, g.op_a, g.m, g.n, g.k, &alpha, static_cast<const double*>(b), g.ldb,
          g.stride_b, static_cast<const double*>(a), g.lda, g.stride_a, &beta,
          static_cast<double*>(c), g.ldc, g.stride_c, g.count));
      return;
    }
    case DType::Float16:
    case DType::BFloat16: {
      const float alpha = 1, beta = 0;  // the compute type's
      const cudaDataType_t t = dtype == DType::Float16 ? CUDA_R_16F : CUDA_R_16BF;
      KILN_CUBLAS_CHECK(KILN_CUBLAS_AS(cublasGemmStridedBatchedEx, GemmStridedBatchedEx)(
          h, g.op_b, g.op_a, g.m, g.n, g.k, &alpha, b, t, g.ldb, g.stride_b, a, t, g.lda,
          g.stride_a, &beta, c, t, g.ldc, g.stride_c, g.count, CUBLAS_COMPUTE_32F,
          CUBLAS_GEMM_DEFAULT));
      return;
    }
    default: KILN_FAIL("matmul: cuBLAS path called for {}", dtype_name(dtype));
  }
}

void matmul_blas(const View& a_in, const View& b_in, const View& c, int device, const Stream& s) {
  const int nd = c.ndim();
  const int64_t M = c.sizes[nd - 2], N = c.sizes[nd - 1], K = a_in.sizes[nd - 1];
  std::optional<DeviceBuffer> a_buf, b_buf, c_buf;
  bool ta = false, tb = false, tc = false;
  int64_t lda = 0, ldb = 0, ldc = 0;
  View a = a_in, b = b_in;
  if (!blas_layout(M, K, a.strides[nd - 2], a.strides[nd - 1], ta, lda) ||
      negative_batch_stride(a)) {
    a = stage_operand(a_in, a_buf, device, s);
    blas_layout(M, K, a.strides[nd - 2], a.strides[nd - 1], ta, lda);
  }
  if (!blas_layout(K, N, b.strides[nd - 2], b.strides[nd - 1], tb, ldb) ||
      negative_batch_stride(b)) {
    b = stage_operand(b_in, b_buf, device, s);
    blas_layout(K, N, b.strides[nd - 2], b.strides[nd - 1], tb, ldb);
  }
  // C must be row-major; otherwise compute into a contiguous buffer and copy it over at the end.
  View cw = c;
  if (!blas_layout(M, N, c.strides[nd - 2], c.strides[nd - 1], tc, ldc) || tc) {
    c_buf.emplace(device, static_cast<size_t>(c.numel() * itemsize(c.dtype)));
    cw.data = c_buf->data();
    cw.strides = contiguous_strides(c.sizes);
    blas_layout(M, N, cw.strides[nd - 2], cw.strides[nd - 1], tc, ldc);
  }
  const Batch batch = collapse_batch(a, b, cw);
  Gemm g;
  g.op_a = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  g.op_b = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  g.m = as_int(N, "N");
  g.n = as_int(M, "M");
  g.k = as_int(K, "K");
  g.lda = as_int(lda, "the leading dimension of a");
  g.ldb = as_int(ldb, "the leading dimension of b");
  g.ldc = as_int(ldc, "the leading dimension of c");
  // The innermost merged batch dim is cuBLAS's batch; the outer ones loop here.
  const int inner = batch.ndim - 1;
  g.count = inner >= 0 ? as_int(batch.sizes[inner], "the batch") : 1;
  g.stride_a = inner >= 0 ? batch.strides[0][inner] : 0;
  g.stride_b = inner >= 0 ? batch.strides[1][inner] : 0;
  g.stride_c = inner >= 0 ? batch.strides[2][inner] : 0;
  int64_t outer = 1;
  for (int d = 0; d < inner; ++d) outer *= batch.sizes[d];

  cublasHandle_t handle = cublas_handle(device);
  KILN_CUBLAS_CHECK(KILN_CUBLAS(cublasSetStream)(handle, stream_of(s)));
  const int64_t item = itemsize(c.dtype);
  for (int64_t i = 0; i < outer; ++i) {
    int64_t rem = i, off[3] = {0, 0, 0};
    for (int d = inner - 1; d >= 0; --d) {
      const int64_t idx = rem % batch.sizes[d];
      rem /= batch.sizes[d];
      for (int k = 0; k < 3; ++k) off[k] += idx * batch.strides[k][d];
    }
    run_gemm(handle, c.dtype, g, static_cast<const char*>(a.data) + off[0] * item,
             static_cast<const char*>(b.data) + off[1] * item,
             static_cast<char*>(cw.data) + off[2] * item);
  }
  if (c_buf) copy_on_device(cw, c, s);
}

// int32 / int64: one thread per element of c, a dot product of length K in the integer type.
void matmul_integer(const View& a, const View& b, const View& c, const Stream& s) {
  const int nd = c.ndim();
  const int64_t K = a.sizes[nd - 1];
  // Over c's shape: a's offset ignores the column, b's the row.
  Shape sa = a.strides, sb = b.strides;
  sa[nd - 1] = 0;
  sb[nd - 2] = 0;
  const auto calc = make_offset_calc<3>(c.sizes, {c.strides, sa, sb});
  const int64_t a_step = a.strides[nd - 1], b_step = b.strides[nd - 2];
  KILN_DISPATCH_NUMERIC_TYPES(c.dtype, "matmul", [&] {
    const scalar_t* x = a.ptr<scalar_t>();
    const scalar_t* z = b.ptr<scalar_t>();
    scalar_t* y = c.ptr<scalar_t>();
    launch_elementwise(c.numel(), calc, stream_of(s), [=] __device__(int64_t, const int64_t* o) {
      scalar_t acc = 0;
      for (int64_t k = 0; k < K; ++k) {
        acc = static_cast<scalar_t>(acc + x[o[1] + k * a_step] * z[o[2] + k * b_step]);
      }
      y[o[0]] = acc;
    });
  });
}

// ---- matmul with the bias in the epilogue: see Note [cuBLASLt bias epilogue] ----

constexpr size_t kLtWorkspace = size_t{32} << 20;

cublasLtHandle_t lt_handle(int device_index) {
  return device_handle<cublasLtHandle_t>(device_index,
                                         [](cublasLtHandle_t* h) { return KILN_CUBLAS(cublasLtCreate)(h); });
}

// The largest power of two up to 256 that divides the address: what cuBLASLt may assume of it.
uint32_t alignment_of(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && address % a != 0) a >>= 1;
  return a;
}

using MatmulDesc = std::unique_ptr<cublasLtMatmulDescOpaque_t, decltype(&cublasLtMatmulDescDestroy)>;
using MatrixLayout = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, decltype(&cublasLtMatrixLayoutDestroy)>;
using Preference = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, decltype(&cublasLtMatmulPreferenceDestroy)>;

MatrixLayout layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld) {
  cublasLtMatrixLayout_t l = nullptr;
  KILN_CUBLAS_CHECK(KILN_CUBLAS(cublasLtMatrixLayoutCreate)(&l, type, static_cast<uint64_t>(rows),
                                                             static_cast<uint64_t>(cols), ld));
  return {l, KILN_CUBLAS(cublasLtMatrixLayoutDestroy)};
}

template <typename T>
void set_attribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const T& value) {
  KILN_CUBLAS_CHECK(KILN_CUBLAS(cublasLtMatmulDescSetAttribute)(desc, attribute, &value, sizeof(value)));
}
template <typename T>
void set_preference(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attribute, const T& value) {
  KILN_CUBLAS_CHECK(KILN_CUBLAS(cublasLtMatmulPreferenceSetAttribute)(pref, attribute, &value, sizeof(value)));
}

struct LtKey {
  int device;
  int64_t dtype;
  cublasLtEpilogue_t epilogue;
  bool tf32, ta, tb;
  int64_t M, N, K, lda, ldb;
  // of cuBLASLt's A (our b), B (our a), C = D, the bias and the aux matrix (1 when there is none)
  uint32_t align_a, align_b, align_c, align_bias, align_aux;
  auto tie() const {
    return std::tie(device, dtype, epilogue, tf32, ta, tb, M, N, K, lda, ldb, align_a, align_b, align_c, align_bias,
                    align_aux);
  }
  bool operator<(const LtKey& o) const { return tie() < o.tie(); }
};
// nullopt: cuBLASLt had no algorithm for the key. Never destroyed, like the handles.
std::map<LtKey, std::optional<cublasLtMatmulHeuristicResult_t>>& lt_cache() {
  static auto* cache = new std::map<LtKey, std::optional<cublasLtMatmulHeuristicResult_t>>();
  return *cache;
}
std::mutex& lt_cache_mutex() {
  static std::mutex m;
  return m;
}

// c = a @ b + bias with `epilogue` (BIAS, or GELU_AUX_BIAS writing the GELU's input to aux, a view
// shaped as c or null), or false, having done nothing: the shared body of the two launches below.
bool lt_matmul(const View& a, const View& b, const View& bias, const View& c, const View* aux,
               cublasLtEpilogue_t epilogue, int device, const Stream& s) {
  if (c.dtype != kFloat32 && c.dtype != kFloat16 && c.dtype != kBFloat16) return false;
  if (a.ndim() != 2 || b.ndim() != 2 || c.ndim() != 2 || bias.ndim() != 1) return false;
  if (a.dtype != c.dtype || b.dtype != c.dtype || bias.dtype != c.dtype) return false;
  const int64_t M = c.sizes[0], N = c.sizes[1], K = a.sizes[1];
  if (M == 0 || N == 0 || K == 0 || bias.sizes[0] != N || (N > 1 && bias.strides[0] != 1)) return false;
  // The bias has no alignment preference to tell the heuristic: ask for 16 bytes (a fresh tensor has 512).
  if (!c.is_contiguous() || alignment_of(bias.data) < 16) return false;
  if (aux) {  // D's layout, its leading dimension N divisible by 8 (cublasLt.h, EPILOGUE_AUX_LD)
    if (aux->dtype != c.dtype || aux->ndim() != 2 || aux->sizes[0] != M || aux->sizes[1] != N ||
        !aux->is_contiguous() || N % 8 != 0 || alignment_of(aux->data) < 16) {
      return false;
    }
  }
  bool ta = false, tb = false;
  int64_t lda = 0, ldb = 0;
  if (!blas_layout(M, K, a.strides[0], a.strides[1], ta, lda) || !blas_layout(K, N, b.strides[0], b.strides[1], tb, ldb)) {
    return false;
  }
  // In cuBLASLt's column-major terms, D (N x M) = op(A) op(B) + bias with A = b and B = a: the
  // stored matrices are b as N x K (or K x N, transposed) and a as K x M (or M x K).
  const cudaDataType_t type = c.dtype == kFloat32 ? CUDA_R_32F : c.dtype == kFloat16 ? CUDA_R_16F : CUDA_R_16BF;
  const bool tf32 = c.dtype == kFloat32 && g_allow_tf32.load(std::memory_order_relaxed);
  cublasLtMatmulDesc_t raw_desc = nullptr;
  KILN_CUBLAS_CHECK(KILN_CUBLAS(cublasLtMatmulDescCreate)(
      &raw_desc, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const MatmulDesc desc(raw_desc, KILN_CUBLAS(cublasLtMatmulDescDestroy));
  set_attribute(raw_desc, CUBLASLT_MATMUL_DESC_TRANSA, tb ? CUBLAS_OP_T : CUBLAS_OP_N);
  set_attribute(raw_desc, CUBLASLT_MATMUL_DESC_TRANSB, ta ? CUBLAS_OP_T : CUBLAS_OP_N);
  set_attribute(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
  set_attribute(raw_desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias.data);
  if (aux) {
    set_attribute(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux->data);
    set_attribute(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, N);
  }
  const MatrixLayout la = tb ? layout(type, K, N, ldb) : layout(type, N, K, ldb);
  const MatrixLayout lb = ta ? layout(type, M, K, lda) : layout(type, K, M, lda);
  const MatrixLayout ld = layout(type, N, M, N);
  cublasLtHandle_t handle = lt_handle(device);
  // The heuristic's answer, once per (device, dtype, TF32, transposes, sizes, leading dimensions,
  // alignments, the bias's among them, which the heuristic reads from the descriptor): it depends on
  // nothing else, and asking costs more host time than the descriptors.
  const LtKey key{device, static_cast<int64_t>(c.dtype), epilogue, tf32, ta, tb, M, N, K, lda, ldb,
                  alignment_of(b.data), alignment_of(a.data), alignment_of(c.data), alignment_of(bias.data),
                  aux ? alignment_of(aux->data) : 1};
  std::optional<cublasLtMatmulHeuristicResult_t> best;
  {
    std::lock_guard<std::mutex> lock(lt_cache_mutex());
    auto it = lt_cache().find(key);
    if (it != lt_cache().end()) {
      if (!it->second) return false;  // cuBLASLt had nothing for these
      best = *it->second;
    }
  }
  if (!best) {
    cublasLtMatmulPreference_t raw_pref = nullptr;
    KILN_CUBLAS_CHECK(KILN_CUBLAS(cublasLtMatmulPreferenceCreate)(&raw_pref));
    const Preference pref(raw_pref, KILN_CUBLAS(cublasLtMatmulPreferenceDestroy));
    set_preference(raw_pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(kLtWorkspace));
    set_preference(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a);
    set_preference(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b);
    set_preference(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c);
    set_preference(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t asked = KILN_CUBLAS(cublasLtMatmulAlgoGetHeuristic)(
        handle, raw_desc, la.get(), lb.get(), ld.get(), ld.get(), raw_pref, 1, &result, &found);
    const bool usable = asked == CUBLAS_STATUS_SUCCESS && found > 0;
    // Only an answer about these sizes is kept: no algorithm, or CUBLAS_STATUS_NOT_SUPPORTED. A
    // passing failure (out of memory, say) is not, so the next call asks again.
    const bool lasting = usable || (asked == CUBLAS_STATUS_SUCCESS && found == 0) ||
                         asked == CUBLAS_STATUS_NOT_SUPPORTED;
    if (lasting) {
      std::lock_guard<std::mutex> lock(lt_cache_mutex());
      lt_cache().emplace(key, usable ? std::optional(result) : std::nullopt);
    }
    if (!usable) return false;
    best = result;
  }
  DeviceBuffer workspace(device, std::max<size_t>(best->workspaceSize, 1));
  const float alpha = 1, beta = 0;
  // A refusal here (an algorithm that turns out not to run these sizes, say) leaves c to the
  // caller's composed path, which overwrites all of it. A failed launch inside cuBLASLt would leave
  // the runtime's last error set, for the next kernel's check to report under its own name: cleared.
  const cublasStatus_t ran = KILN_CUBLAS(cublasLtMatmul)(
      handle, raw_desc, &alpha, b.data, la.get(), a.data, lb.get(), &beta, c.data, ld.get(), c.data, ld.get(),
      &best->algo, workspace.data(), best->workspaceSize, stream_of(s));
  if (ran != CUBLAS_STATUS_SUCCESS) (void)cudaGetLastError();
  return ran == CUBLAS_STATUS_SUCCESS;
}

}  // namespace

bool matmul_bias_launch(const View& a, const View& b, const View& bias, const View& c, int device, const Stream& s) {
  return lt_matmul(a, b, bias, c, nullptr, CUBLASLT_EPILOGUE_BIAS, device, s);
}

bool matmul_bias_gelu_launch(const View& a, const View& b, const View& bias, const View& c, const View& pre,
                             int device, const Stream& s) {
  return lt_matmul(a, b, bias, c, &pre, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, device, s);
}

void matmul_launch(const View& a, const View& b, const View& c, int device, const Stream& s) {
  const int nd = c.ndim();
  KILN_CHECK(nd >= 2 && a.ndim() == nd && b.ndim() == nd,
             "matmul: the CUDA kernel expects operands of c's rank ({}), got {} and {} dims", nd,
             a.ndim(), b.ndim());
  KILN_CHECK(a.dtype == c.dtype && b.dtype == c.dtype,
             "matmul: operands must share the output dtype {}, got {} and {}",
             dtype_name(c.dtype), dtype_name(a.dtype), dtype_name(b.dtype));
  if (c.numel() == 0) return;
  if (a.sizes[nd - 1] == 0) return fill_launch(c, 0, s);  // an empty sum
  switch (c.dtype) {
    case DType::Float32:
    case DType::Float64:
    case DType::Float16:
    case DType::BFloat16: return matmul_blas(a, b, c, device, s);
    case DType::Int32:
    case DType::Int64: return matmul_integer(a, b, c, s);
    default: KILN_FAIL("matmul: not implemented for {}", dtype_name(c.dtype));
  }
}

void set_matmul_allow_tf32(bool allow) { g_allow_tf32.store(allow); }
bool matmul_allow_tf32() { return g_allow_tf32.load(); }

}  // namespace kiln::cuda
