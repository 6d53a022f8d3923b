// cpu/matmul.cpp: batched matrix multiply c[..., M, N] = a[..., M, K] @ b[..., K, N].
//
// float32 and float64 go to OpenBLAS's sgemm/dgemm when Kiln was built with it, else to Eigen's
// GEMM; on AVX-512 CPUs float32 goes to Kiln's own GEMM (sgemm.cpp) where that is the faster one
// (Note [which float32 GEMM]). OpenBLAS runs single-threaded (cpu/parallel.cpp) and Kiln's pool
// splits the work: each thread multiplies a block of rows (or columns) of c, or a share of the
// batch, so there is one pool and nothing spins against it. sgemm.cpp threads through the same
// pool, its threads sharing the packed b (except in small products, Note [sharing b], and in those
// it does not pack at all, Note [unpacked products]).
// A transposed operand (a view with strides (1, M)) is passed to BLAS as "transposed", not copied.
// float16 is converted to float32, multiplied and rounded back; bfloat16 too, unless it goes to
// Kiln's AMX or AVX512-BF16 GEMM (Note [which bfloat16 GEMM]); integers use a wrapping loop
// (gemm_integer).
#include <Eigen/Core>
#if defined(KILN_HAVE_BF16GEMM_AVX512) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <latch>
#include <memory>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include "core/convert.h"
#include "cpu/kernels.h"
#include "cpu/loops.h"

#ifdef KILN_HAVE_OPENBLAS
extern "C" {
// The two CBLAS entry points used (declared here so no particular cblas.h is needed).
void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                 const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc);
void cblas_dgemm(int order, int trans_a, int trans_b, int m, int n, int k, double alpha,
                 const double* a, int lda, const double* b, int ldb, double beta, double* c, int ldc);
char* openblas_get_corename();  // the kernel family OpenBLAS picked for this CPU ("Haswell", "SkylakeX")
}
#endif

namespace kiln::cpu {
namespace {

// One matrix operand: pointer, rows x cols, strides in elements.
template <typename T>
struct Mat {
  T* data;
  int64_t rows, cols, rs, cs;
  bool blas_layout(bool& transposed, int64_t& ld) const {  // core/backend.h
    return kiln::blas_layout(rows, cols, rs, cs, transposed, ld);
  }
};

template <typename T>
using EigenStrided = Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, 0,
                                Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>>;

template <typename T>
void gemm_eigen(const Mat<T>& a, const Mat<T>& b, const Mat<T>& c) {
  EigenStrided<T> A(a.data, a.rows, a.cols, {a.rs, a.cs});
  EigenStrided<T> B(b.data, b.rows, b.cols, {b.rs, b.cs});
  EigenStrided<T> C(c.data, c.rows, c.cols, {c.rs, c.cs});
  C.noalias() = A * B;
}

// Note [warming OpenBLAS's buffers]: OpenBLAS packs its operands into a buffer it maps once per
// concurrent caller (a 256 MiB anonymous mapping here, of which a call touches only what it packs).
// Its AVX2 float32 kernel (the Haswell and Zen cores) prefetches the next packed panel of b as it
// goes, and in a product with at most about 320 columns of c it packs every panel into the same
// place, so the prefetches run on into pages of the buffer that no call has touched yet: mapped
// but never faulted in. On the Zen 1 of benchmarks/results/README.md each such prefetch costs a
// page walk that finds nothing (a prefetch does not fault the page in), again and again: sgemm with
// 256 columns ran at 9.7 GFLOP/s on one thread against 37 once the pages were there (perf put the
// time on the kernel's prefetcht1). A larger product packs its panels one after another and
// touches those pages, so a process whose first products are large never sees it; bench_gemm,
// whose first products are its 256 x 256 ones, ran at that speed throughout. So the first OpenBLAS
// sgemm of a process is preceded by one product of 64 x 512 by 512 x 2048 on zeros, on as many
// threads at once as the pool then has (each concurrent caller gets a buffer of its own): about
// 4-8 ms, once, in which the pages are touched; later calls pay one initialized-static check. (A
// pool enlarged later by set_num_threads has its extra buffers warmed by its first large products.)
// Sizes with fewer columns left the pages cold in some runs; this one warmed them in every run tried.
#ifdef KILN_HAVE_OPENBLAS
void warm_openblas_buffers_once() {
  const int threads = get_num_threads();
  constexpr int kM = 64, kK = 512, kN = 2048;
  // Zeros (only the packing matters), from calloc: fresh zero pages that cost no memory to read.
  std::unique_ptr<float, decltype(&std::free)> a(static_cast<float*>(std::calloc(size_t{kM} * kK, sizeof(float))),
                                                 &std::free),
      b(static_cast<float*>(std::calloc(size_t{kK} * kN, sizeof(float))), &std::free);
  if (a == nullptr || b == nullptr) return;  // no memory to spare: skip it, it only costs speed
  std::latch start(threads);
  auto one = [&] {
    std::vector<float> c(size_t{kM} * kN);
    start.arrive_and_wait();  // all at once, so that each call takes a buffer of its own
    cblas_sgemm(101, 111, 111, kM, kN, kK, 1.0f, a.get(), kK, b.get(), kN, 0.0f, c.data(), kN);
  };
  std::vector<std::thread> others;
  try {
    for (int i = 1; i < threads; ++i) others.emplace_back(one);
  } catch (const std::system_error&) {  // no thread to spare: warm the buffers of those that started
    start.count_down(threads - 1 - static_cast<std::ptrdiff_t>(others.size()));
  }
  one();
  for (auto& t : others) t.join();
}
void warm_openblas_buffers() {
  static const bool warmed = (warm_openblas_buffers_once(), true);  // once; concurrent callers wait
  (void)warmed;
}
#endif

// Note [beta = 1]: asked for c = a @ b (beta = 0), OpenBLAS 0.3.21 first clears c with its own
// beta routine, at less than half of memset's speed on this Zen 3: 6.0% of the MLP benchmark's
// profile, mostly on the weight gradients (K = the batch, so c is large for its FLOPs), where
// memset takes 2.6%. So c is cleared here with memset and OpenBLAS is asked for c += a @ b
// (beta = 1), which skips its pass; the sums are the same.
template <typename T>
void zero_rows(T* c, int64_t rows, int64_t cols, int64_t row_stride) {
  if (row_stride == cols) {
    std::memset(c, 0, sizeof(T) * rows * cols);
    return;
  }
  for (int64_t i = 0; i < rows; ++i) std::memset(c + i * row_stride, 0, sizeof(T) * cols);
}

}  // namespace

// Note [which float32 GEMM]: measured on this Zen 5 (benchmarks/results/README.md), 2 threads,
// three programs in turn each round: OpenBLAS 0.3.21 with its AVX-512 (SkylakeX) kernel, split by
// Kiln's pool, ran 411-446 GFLOP/s at n = 256..2048 and sgemm.cpp's packed loops 342-458: they are
// 3% faster at n = 1024 and 2048 (packing one b for both threads, a long KC: sgemm.cpp's header)
// but 7-17% slower at 256 and 512, where packing and the fork-joins weigh more. Its unpacked path
// (Note [unpacked products] in sgemm.cpp), for a and b with contiguous rows and b at most 512 wide,
// packs nothing: in one process, calls alternating, it is 8-9% faster than OpenBLAS at n = 256 and
// 5% at 512 (bench_gemm against LibTorch: benchmarks/results/README.md, session 17). OpenBLAS with
// an AVX2 kernel runs about 220; Eigen's own GEMM 111-146. sgemm.cpp taking every float32 GEMM made
// the CNN benchmark 8-11% slower (its convolutions' GEMMs have 32-64 rows, where packing b costs
// sgemm.cpp most). So where OpenBLAS runs an AVX-512 kernel it keeps float32 except for products
// with m, n and k all at least kOwnFrom, unpacked ones with m, n and k all at least
// kOwnUnpackedFrom (the sizes measured), unpacked ones with 8 to 64 rows, which pack nothing at
// any width (Note [short products] in sgemm.cpp), and the unpacked ones at most 64 columns wide (a
// convolution's weight gradient, Note [the weight's gradient transposed] in conv.cpp). On a Sapphire
// Rapids Xeon (session 72) those ran faster than OpenBLAS at every shape measured (GFLOP/s, one
// thread / two): m, n, k = 432, 32, 1024 109 / 214 -> 153 / 281; 1024, 32, 1024 100 / 209 -> 151 /
// 273; 4096, 16, 512 73 / 142 -> 114 / 214; 256, 64, 256 137 / 231 -> 163 / 281; 1000, 48, 2000
// 116 / 223 -> 171 / 324; and the CNN's second convolution's forward took 3.89 ms instead of 4.55
// (bench_cnn_layers). sgemm.cpp takes every float32 GEMM on an AVX-512 CPU where OpenBLAS is absent
// or runs an AVX2 kernel (as it does under OPENBLAS_CORETYPE=Haswell, which some shells set).
// KILN_CPU_GEMM=own|blas overrides the choice.
namespace {
constexpr int64_t kOwnFrom = 1024;
constexpr int64_t kOwnUnpackedFrom = 256;
constexpr int64_t kOwnThinFrom = 8, kOwnThinUpTo = 64;  // short or narrow products, unpacked
enum class SgemmChoice { kBlas, kOwnLarge, kOwn };
}  // namespace

bool use_own_sgemm(int64_t m, int64_t n, int64_t k, int64_t a_cs, int64_t b_cs) {
  static const SgemmChoice choice = [] {
    const char* v = std::getenv("KILN_CPU_GEMM");
    if (v != nullptr && std::string_view(v) != "blas" && std::string_view(v) != "own")
      KILN_FAIL("KILN_CPU_GEMM={}: expected 'own' (Kiln's AVX-512 GEMM) or 'blas' (OpenBLAS, else Eigen)", v);
    if (!cpu_has_avx512()) return SgemmChoice::kBlas;
    if (v != nullptr) return std::string_view(v) == "own" ? SgemmChoice::kOwn : SgemmChoice::kBlas;
#ifdef KILN_HAVE_OPENBLAS
    const std::string_view core = openblas_get_corename();
    for (std::string_view avx512_core : {"SkylakeX", "Cooperlake", "SapphireRapids"})
      if (core.find(avx512_core) != std::string_view::npos) return SgemmChoice::kOwnLarge;
#endif
    return SgemmChoice::kOwn;
  }();
  switch (choice) {
    case SgemmChoice::kBlas: return false;
    case SgemmChoice::kOwnLarge:
      return (m >= kOwnFrom && n >= kOwnFrom && k >= kOwnFrom) ||
             (((m >= kOwnUnpackedFrom && n >= kOwnUnpackedFrom && k >= kOwnUnpackedFrom) ||
               (m >= kOwnThinFrom && n >= 16 && (m <= kOwnThinUpTo || n <= kOwnThinUpTo))) &&
              sgemm_avx512_unpacked(m, n, k, a_cs, b_cs));
    case SgemmChoice::kOwn: return m >= 8 && n >= 16;
  }
  return false;
}

namespace {

// Whether the whole product c = a @ b goes to sgemm.cpp (Note [which float32 GEMM]); its pieces,
// when it is split over threads, are then told, not asked again.
template <typename T>
bool own_gemm(const Mat<T>& a, const Mat<T>& b, const Mat<T>& c) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    return true;
  } else if constexpr (std::is_same_v<T, float>) {
    return c.cs == 1 && use_own_sgemm(c.rows, c.cols, a.cols, a.cs, b.cs);
  } else {
    return false;
  }
}

// Integers: row by row in the unsigned type, so that products and sums wrap as two's complement,
// PyTorch's integer matmul (in the signed type, as Eigen computes, the overflow is undefined).
template <typename T>
void gemm_integer(const Mat<T>& a, const Mat<T>& b, const Mat<T>& c) {
  using U = std::make_unsigned_t<T>;
  std::vector<U> row(static_cast<size_t>(c.cols));
  for (int64_t i = 0; i < c.rows; ++i) {
    std::fill(row.begin(), row.end(), U(0));
    for (int64_t k = 0; k < a.cols; ++k) {
      const U aik = static_cast<U>(a.data[i * a.rs + k * a.cs]);
      for (int64_t j = 0; j < c.cols; ++j) {
        row[j] = static_cast<U>(row[j] + static_cast<U>(aik * static_cast<U>(b.data[k * b.rs + j * b.cs])));
      }
    }
    for (int64_t j = 0; j < c.cols; ++j) c.data[i * c.rs + j * c.cs] = static_cast<T>(row[j]);
  }
}

// c = a @ b for float, double and the integers (gemm_serial).
template <typename T>
void gemm_serial_blas(const Mat<T>& a, const Mat<T>& b, const Mat<T>& c, bool own) {
  if constexpr (std::is_same_v<T, float>) {
    if (own) {
      sgemm_avx512(c.rows, c.cols, a.cols, a.data, a.rs, a.cs, b.data, b.rs, b.cs, false, c.data, c.rs);
      return;
    }
  }
  if (a.cols == 0) {
    for (int64_t i = 0; i < c.rows; ++i)
      for (int64_t j = 0; j < c.cols; ++j) c.data[i * c.rs + j * c.cs] = T(0);
    return;
  }
#ifdef KILN_HAVE_OPENBLAS
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    bool ta, tb;
    int64_t lda, ldb;
    if (c.cs == 1 && c.rs >= c.cols && a.blas_layout(ta, lda) && b.blas_layout(tb, ldb)) {
      constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
      auto m = static_cast<int>(c.rows), n = static_cast<int>(c.cols), k = static_cast<int>(a.cols);
      zero_rows(c.data, c.rows, c.cols, c.rs);  // See Note [beta = 1]
      if constexpr (std::is_same_v<T, float>) {
        warm_openblas_buffers();
        cblas_sgemm(kRowMajor, ta ? kTrans : kNoTrans, tb ? kTrans : kNoTrans, m, n, k, 1.0f, a.data,
                    static_cast<int>(lda), b.data, static_cast<int>(ldb), 1.0f, c.data,
                    static_cast<int>(std::max<int64_t>(c.rs, 1)));
      } else {
        cblas_dgemm(kRowMajor, ta ? kTrans : kNoTrans, tb ? kTrans : kNoTrans, m, n, k, 1.0, a.data,
                    static_cast<int>(lda), b.data, static_cast<int>(ldb), 1.0, c.data,
                    static_cast<int>(std::max<int64_t>(c.rs, 1)));
      }
      return;
    }
  }
#endif
  if constexpr (std::is_integral_v<T>) {
    gemm_integer(a, b, c);
  } else {
    gemm_eigen(a, b, c);
  }
}

// c = a @ b: by sgemm.cpp when own (which threads through the pool unless called from a
// parallel_for), else by one BLAS or Eigen call on this thread; bfloat16 always by bf16gemm.cpp's
// chosen kernel (matmul_kernel sends it here only then). c is row-major (ops/ allocates it).
template <typename T>
void gemm_serial(const Mat<T>& a, const Mat<T>& b, const Mat<T>& c, bool own) {
  if (c.rows == 0 || c.cols == 0) return;
  if constexpr (std::is_same_v<T, BFloat16>) {
    const auto gemm = bf16gemm_choice() == Bf16Gemm::kAmx ? bf16gemm_amx : bf16gemm_avx512;
    gemm(c.rows, c.cols, a.cols, a.data, a.rs, a.cs, b.data, b.rs, b.cs, c.data, c.rs);
  } else {
    gemm_serial_blas(a, b, c, own);
  }
}

// Row block [r0, r1) of a and c, or column block of b and c.
template <typename T>
Mat<T> rows_of(const Mat<T>& m, int64_t r0, int64_t r1) {
  return {m.data + r0 * m.rs, r1 - r0, m.cols, m.rs, m.cs};
}
template <typename T>
Mat<T> cols_of(const Mat<T>& m, int64_t c0, int64_t c1) {
  return {m.data + c0 * m.cs, m.rows, c1 - c0, m.rs, m.cs};
}

constexpr int64_t kParallelFlops = 1 << 18;  // below this many multiply-adds, one thread

template <typename T>
void matmul_typed(const View& av, const View& bv, const View& cv) {
  const int nd = cv.ndim();
  const int64_t M = cv.sizes[nd - 2], N = cv.sizes[nd - 1], K = av.sizes[nd - 1];
  const int64_t batch = cv.numel() / std::max<int64_t>(M * N, 1);
  View batch_view;  // the batch dims of c, to walk a, b and c together
  batch_view.sizes = Shape(std::span<const int64_t>(cv.sizes.data(), nd - 2));
  auto mat = [&](const View& v, int64_t offset, int64_t rows, int64_t cols) {
    return Mat<T>{v.ptr<T>() + offset, rows, cols, v.strides[nd - 2], v.strides[nd - 1]};
  };
  auto batch_offsets = [&](int64_t i, int64_t& oa, int64_t& ob, int64_t& oc) {
    oa = ob = oc = 0;
    for (int d = nd - 3; d >= 0; --d) {
      int64_t idx = i % cv.sizes[d];
      i /= cv.sizes[d];
      oa += idx * av.strides[d];
      ob += idx * bv.strides[d];
      oc += idx * cv.strides[d];
    }
  };
  const int64_t flops = M * N * K;
  if (batch >= 2 && (flops < kParallelFlops * 4 || batch >= 2 * get_num_threads())) {
    // Many small products: split the batch.
    parallel_for(0, batch, std::max<int64_t>(1, kParallelFlops / std::max<int64_t>(flops, 1)),
                 [&](int64_t b0, int64_t b1) {
                   for (int64_t i = b0; i < b1; ++i) {
                     int64_t oa, ob, oc;
                     batch_offsets(i, oa, ob, oc);
                     const Mat<T> A = mat(av, oa, M, K), B = mat(bv, ob, K, N), C = mat(cv, oc, M, N);
                     gemm_serial(A, B, C, own_gemm(A, B, C));
                   }
                 });
    return;
  }
  for (int64_t i = 0; i < batch; ++i) {
    int64_t oa, ob, oc;
    batch_offsets(i, oa, ob, oc);
    Mat<T> A = mat(av, oa, M, K), B = mat(bv, ob, K, N), C = mat(cv, oc, M, N);
    if (own_gemm(A, B, C)) {  // its own threading (Note [sharing b] in sgemm.cpp)
      gemm_serial(A, B, C, true);
      continue;
    }
    // One big product for BLAS: split the larger of M and N into one block per thread, each block
    // told to use BLAS too (a block can be small enough for sgemm.cpp's unpacked path when the
    // whole was not; asking again would make the choice depend on the thread count).
    int pieces = flops < kParallelFlops ? 1 : parallel_pieces(std::max(M, N), 16);
    if (pieces <= 1) {
      gemm_serial(A, B, C, false);
    } else if (M >= N) {
      parallel_for(0, M, (M + pieces - 1) / pieces,
                   [&](int64_t r0, int64_t r1) { gemm_serial(rows_of(A, r0, r1), B, rows_of(C, r0, r1), false); });
    } else {
      parallel_for(0, N, (N + pieces - 1) / pieces,
                   [&](int64_t c0, int64_t c1) { gemm_serial(A, cols_of(B, c0, c1), cols_of(C, c0, c1), false); });
    }
  }
}

// The 16-bit floats through float32: multiply in float32, round the result once.
void matmul_via_float(const View& a, const View& b, const View& c) {
  // The float32 copies come from the caching allocator (ScratchBuffer): a std::vector would zero
  // them first and, at these sizes, take fresh pages from the system on every call.
  auto float_view = [](const View& v, const ScratchBuffer<float>& buf) {
    View f;
    f.data = buf.data();
    f.dtype = kFloat32;
    f.sizes = v.sizes;
    f.strides = contiguous_strides(v.sizes);
    return f;
  };
  ScratchBuffer<float> ab(static_cast<size_t>(a.numel())), bb(static_cast<size_t>(b.numel())),
      cb(static_cast<size_t>(c.numel()));
  View af = float_view(a, ab), bf = float_view(b, bb), cf = float_view(c, cb);
  copy_kernel(a, af);
  copy_kernel(b, bf);
  matmul_typed<float>(af, bf, cf);  // writes every element of cf, zeros for an empty sum (K = 0)
  copy_kernel(cf, c);
}

}  // namespace

template <typename T>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b,
          int64_t ldb, bool accumulate, T* c, int64_t ldc) {
  gemm_chosen(gemm_uses_own<T>(ta, tb, m, n, k, lda, ldb), ta, tb, m, n, k, a, lda, b, ldb, accumulate, c, ldc);
}

template <typename T>
void gemm_chosen(bool own_sgemm, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
                 const T* b, int64_t ldb, bool accumulate, T* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if constexpr (std::is_same_v<T, float>) {
    if (own_sgemm) {
      sgemm_avx512(m, n, k, a, ta ? 1 : lda, ta ? lda : 1, b, tb ? 1 : ldb, tb ? ldb : 1, accumulate, c, ldc);
      return;
    }
  }
#ifdef KILN_HAVE_OPENBLAS
  constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
  auto i = [](int64_t v) { return static_cast<int>(v); };
  if (k > 0) {
    if (!accumulate) zero_rows(c, m, n, ldc);  // See Note [beta = 1]
    if constexpr (std::is_same_v<T, float>) {
      warm_openblas_buffers();
      cblas_sgemm(kRowMajor, ta ? kTrans : kNoTrans, tb ? kTrans : kNoTrans, i(m), i(n), i(k), 1.0f, a,
                  i(lda), b, i(ldb), 1.0f, c, i(ldc));
    } else {
      cblas_dgemm(kRowMajor, ta ? kTrans : kNoTrans, tb ? kTrans : kNoTrans, i(m), i(n), i(k), 1.0, a,
                  i(lda), b, i(ldb), 1.0, c, i(ldc));
    }
    return;
  }
#endif
  // op(a) as a strided (m, k) matrix: element (r, j) at a[r * lda + j], or a[j * lda + r] when ta.
  EigenStrided<T> A(const_cast<T*>(a), m, k, {ta ? 1 : lda, ta ? lda : 1});
  EigenStrided<T> B(const_cast<T*>(b), k, n, {tb ? 1 : ldb, tb ? ldb : 1});
  EigenStrided<T> C(c, m, n, {ldc, 1});
  if (accumulate) {
    C.noalias() += A * B;
  } else {
    C.noalias() = A * B;
  }
}
template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, const float*, int64_t, const float*,
                          int64_t, bool, float*, int64_t);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, const double*, int64_t, const double*,
                           int64_t, bool, double*, int64_t);
template void gemm_chosen<float>(bool, bool, bool, int64_t, int64_t, int64_t, const float*, int64_t, const float*,
                                 int64_t, bool, float*, int64_t);
template void gemm_chosen<double>(bool, bool, bool, int64_t, int64_t, int64_t, const double*, int64_t,
                                  const double*, int64_t, bool, double*, int64_t);

bool cpu_has_avx512() {
#ifdef KILN_HAVE_SGEMM_AVX512
  static const bool has = __builtin_cpu_supports("avx512f");
  return has;
#else
  return false;
#endif
}

#ifndef KILN_HAVE_BF16GEMM_AVX512
// Built without bf16gemm.cpp (cpu/CMakeLists.txt): cpu_has_avx512_bf16 and cpu_has_amx_bf16 say
// false, so these are never reached; they keep the callers linking.
void bf16gemm_avx512(int64_t, int64_t, int64_t, const BFloat16*, int64_t, int64_t, const BFloat16*, int64_t, int64_t,
                     BFloat16*, int64_t) {
  KILN_FAIL("bf16gemm_avx512: Kiln was built without its AVX512-BF16 kernels (a compiler without -mavx512bf16)");
}
void bf16gemm_amx(int64_t, int64_t, int64_t, const BFloat16*, int64_t, int64_t, const BFloat16*, int64_t, int64_t,
                  BFloat16*, int64_t) {
  KILN_FAIL("bf16gemm_amx: Kiln was built without its AMX kernels (a compiler without -mamx-tile -mamx-bf16)");
}
void bf16gemm_avx512_f32(int64_t, int64_t, int64_t, const BFloat16*, int64_t, int64_t, const BFloat16*, int64_t,
                         int64_t, bool, float*, int64_t) {
  KILN_FAIL("bf16gemm_avx512_f32: Kiln was built without its AVX512-BF16 kernels (a compiler without -mavx512bf16)");
}
void bf16gemm_amx_f32(int64_t, int64_t, int64_t, const BFloat16*, int64_t, int64_t, const BFloat16*, int64_t,
                      int64_t, bool, float*, int64_t) {
  KILN_FAIL("bf16gemm_amx_f32: Kiln was built without its AMX kernels (a compiler without -mamx-tile -mamx-bf16)");
}
void round_to_bf16_run(const float*, BFloat16*, int64_t) {
  KILN_FAIL("round_to_bf16_run: Kiln was built without its AVX512-BF16 kernels (a compiler without -mavx512bf16)");
}
#endif

bool cpu_has_avx512_bf16() {
#ifdef KILN_HAVE_BF16GEMM_AVX512
  static const bool has = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl");
  return has;
#else
  return false;
#endif
}

bool cpu_has_amx_bf16() {
#if defined(KILN_HAVE_BF16GEMM_AVX512) && defined(__linux__)
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
    const bool amx_bf16 = (edx >> 22) & 1, amx_tile = (edx >> 24) & 1;
    if (!amx_bf16 || !amx_tile || !cpu_has_avx512_bf16()) return false;
    // Linux gives a process the tiles' state only on request (ARCH_REQ_XCOMP_PERM for
    // XFEATURE_XTILEDATA, number 18); a kernel without AMX support refuses.
    constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return has;
#else
  return false;
#endif
}

bool bf16_dot_at_fma_rate(bool amd, uint32_t cpuid1_eax) {
  if (!amd) return false;
  const uint32_t base = (cpuid1_eax >> 8) & 0xf, extended = (cpuid1_eax >> 20) & 0xff;  // the family fields
  // Zen 4 is family 0x19 (25), the first AMD with AVX512-BF16; Zen 5 is 0x1a (26).
  return (base == 0xf ? base + extended : base) >= 0x19;
}

bool cpu_bf16_dot_at_fma_rate() {
#if defined(KILN_HAVE_BF16GEMM_AVX512) && defined(__linux__)
  static const bool fast = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return false;
    return bf16_dot_at_fma_rate(__builtin_cpu_is("amd"), eax);
  }();
  return fast;
#else
  return false;
#endif
}

// Note [which bfloat16 GEMM]: bf16gemm.cpp's AMX kernel where the CPU has AMX-BF16 (and Linux lets
// this process use it); else its AVX512-BF16 kernel where the CPU has AVX512-BF16 and its VDPBF16PS
// is known to run at the FMA's rate (cpu_bf16_dot_at_fma_rate: AMD from Zen 4 on); else
// matmul_via_float. KILN_CPU_BF16_GEMM=own takes the AVX512-BF16 kernel on any CPU with AVX512-BF16
// and no AMX, and KILN_CPU_BF16_GEMM=float takes matmul_via_float everywhere. All give the same
// float32 sums up to the order of the additions, each rounded once. The rule is what was measured
// (benchmarks/results/README.md), and it follows how fast VDPBF16PS is beside the FMA:
//   - On a Xeon of the Sapphire Rapids family (2026-11-29) the AVX512-BF16 kernel ran at
//     0.54-0.66x matmul_via_float's FLOP/s on one thread and 0.74-0.87x on two: VDPBF16PS there
//     does about half the multiply-adds a cycle that sgemm.cpp's FMAs do. The AMX kernel ran at
//     3.4-7.0x the path through float32 on one thread (1.7-3.0x on two), and took a bfloat16-autocast
//     gpt_char step from 151 to 85 ms (float32: 101 ms).
//   - On an AMD Zen 5 (EPYC, 2026-12-02), whose VDPBF16PS keeps the FMA's rate and so does twice its
//     multiply-adds, the AVX512-BF16 kernel ran at 1.6-2.1x matmul_via_float's FLOP/s (n = 256 to
//     2048, one and two threads, medians of 3 rounds), and took a bfloat16-autocast gpt_char step
//     from 65.0 ms to 49.7 (float32: 60.6).
//   - On an AMD Zen 4 (EPYC, family 25 model 17, 2026-12-02), the first AMD with AVX512-BF16, whose
//     512-bit VDPBF16PS also keeps the FMA's rate, it ran at 1.7-2.3x matmul_via_float's FLOP/s
//     (per-round medians 1.84-2.24) and took a bfloat16-autocast gpt_char step from 101.6 ms to 64.7
//     (float32: 91.2), so from Zen 4 on AMD's take it by default.
Bf16Gemm bf16gemm_choice() {
  static const Bf16Gemm choice = [] {
    const char* v = std::getenv("KILN_CPU_BF16_GEMM");
    if (v != nullptr && std::string_view(v) != "own" && std::string_view(v) != "float")
      KILN_FAIL("KILN_CPU_BF16_GEMM={}: expected 'own' (Kiln's AMX or AVX512-BF16 GEMM where the CPU has it) or "
                "'float' (convert to float32 and use the float32 GEMM)", v);
    if (v != nullptr && std::string_view(v) == "float") return Bf16Gemm::kFloat;
    if (cpu_has_amx_bf16()) return Bf16Gemm::kAmx;
    if (cpu_has_avx512_bf16() && (v != nullptr || cpu_bf16_dot_at_fma_rate())) return Bf16Gemm::kAvx512;
    return Bf16Gemm::kFloat;
  }();
  return choice;
}

void matmul_kernel(const View& a, const View& b, const View& c) {
  switch (c.dtype) {
    case DType::Float32: return matmul_typed<float>(a, b, c);
    case DType::Float64: return matmul_typed<double>(a, b, c);
    case DType::Int32: return matmul_typed<int32_t>(a, b, c);
    case DType::Int64: return matmul_typed<int64_t>(a, b, c);
    case DType::Float16: return matmul_via_float(a, b, c);
    case DType::BFloat16:
      if (bf16gemm_choice() != Bf16Gemm::kFloat && (c.numel() == 0 || c.strides[c.ndim() - 1] == 1))
        return matmul_typed<BFloat16>(a, b, c);
      return matmul_via_float(a, b, c);
    default: KILN_FAIL("matmul: not implemented for {}", dtype_name(c.dtype));
  }
}

}  // namespace kiln::cpu
