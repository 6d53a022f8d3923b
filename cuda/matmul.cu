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
// Integer matmul is a plain kernel, one thread per output element.
#include <atomic>
#include <climits>
#include <mutex>
#include <optional>
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

cublasHandle_t cublas_handle(int device_index) {
  // One handle per device, made on first use and never destroyed (destroying it after the driver
  // has shut down at exit would fail). A first version: threads share it; each call sets its
  // stream.
  static std::mutex mutex;
  static std::vector<cublasHandle_t> handles;
  std::lock_guard<std::mutex> lock(mutex);
  if (static_cast<int>(handles.size()) <= device_index) {
    handles.resize(static_cast<size_t>(device_index) + 1, nullptr);
  }
  cublasHandle_t& handle = handles[static_cast<size_t>(device_index)];
  if (handle == nullptr) KILN_CUBLAS_CHECK(cublasCreate(&handle));
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

void run_gemm(cublasHandle_t h, DType dtype, const Gemm& g, const void* a, const void* b, void* c) {
  switch (dtype) {
    case DType::Float32: {
      const float alpha = 1, beta = 0;
      if (g_allow_tf32.load(std::memory_order_relaxed)) {
        KILN_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
            h, g.op_b, g.op_a, g.m, g.n, g.k, &alpha, b, CUDA_R_32F, g.ldb, g.stride_b, a, CUDA_R_32F, g.lda,
            g.stride_a, &beta, c, CUDA_R_32F, g.ldc, g.stride_c, g.count, CUBLAS_COMPUTE_32F_FAST_TF32,
            CUBLAS_GEMM_DEFAULT));
        return;
      }
      KILN_CUBLAS_CHECK(cublasSgemmStridedBatched(
          h, g.op_b, g.op_a, g.m, g.n, g.k, &alpha, static_cast<const float*>(b), g.ldb,
          g.stride_b, static_cast<const float*>(a), g.lda, g.stride_a, &beta,
          static_cast<float*>(c), g.ldc, g.stride_c, g.count));
      return;
    }
    case DType::Float64: {
      const double alpha = 1, beta = 0;
      KILN_CUBLAS_CHECK(cublasDgemmStridedBatched(
          h, g.op_b, g.op_a, g.m, g.n, g.k, &alpha, static_cast<const double*>(b), g.ldb,
          g.stride_b, static_cast<const double*>(a), g.lda, g.stride_a, &beta,
          static_cast<double*>(c), g.ldc, g.stride_c, g.count));
      return;
    }
    case DType::Float16:
    case DType::BFloat16: {
      const float alpha = 1, beta = 0;  // the compute type's
      const cudaDataType_t t = dtype == DType::Float16 ? CUDA_R_16F : CUDA_R_16BF;
      KILN_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
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
  KILN_CUBLAS_CHECK(cublasSetStream(handle, stream_of(s)));
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

}  // namespace

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
