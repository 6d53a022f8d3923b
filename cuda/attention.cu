// cuda/attention.cu: fused scaled dot-product attention on the GPU, forward and backward: for float16
// and bfloat16 on tensor cores (register-tiled kernels on mma.sync, Note [register-tiled attention];
// or, with KILN_CUDA_ATTENTION=wmma, WMMA's 16 x 16 x 16 tiles; float32 accumulation in both), and
// for float32 on the CUDA cores (Note [float32 attention], at the end of the kernels). The contract is
// core/backend.h's Backend::attention; the CPU sibling is cpu/attention.cpp, which follows the same
// plan in float32 or float64 arithmetic. Nothing of size L x S ever reaches global memory.
//
// Shapes: q (B, H, L, D), k and v (B, H, S, D), out (B, H, L, D), lse (B, H, L) in float32; D = 32, 64,
// 96 or 128. Each of q, k, v, out and the gradients may have any strides on its first three dims
// (core/backend.h, Note [attention layout] in ops/attention.cpp): a kernel sees one as a Heads (core/backend.h's AttentionHeads), slice
// z of the B * H (batch, head) pairs at data + (z / H) * sb + (z % H) * sh, rows ld apart. The 16-bit
// kernels load rows 16 bytes at a time, so there the pointer and strides are multiples of 16 bytes.
// Scores s = scale * q k^T; causal: query i sees keys j <= i.
//
// Forward (one block of 4 warps per 64 query rows of one (batch, head) pair; each warp owns 16 rows):
//   for each tile of 64 keys (up to the diagonal when causal):
//     S  = Q K^T               tensor cores, 16 x 64 per warp, into shared memory (float32)
//     m' = max(m, rowmax(S))   the online softmax: the running max and sum of each row,
//     P  = exp(S - m')         P rounded to 16 bits for the next product,
//     l  = l exp(m - m') + rowsum(P)
//     O  = O exp(m - m') + P V the output accumulated in float32 in shared memory
//   out = O / l, lse = m + log(l)
//
// Backward, from lse (so P = exp(S - lse) again, exactly normalised) and Delta = rowsum(dO * out):
//   dP = dO V^T, dS = P (dP - Delta) scale, dQ = dS K, dK = dS^T Q, dV = P^T dO.
// Two kernels, so that no thread ever adds into another's result (no atomics, so results do not
// depend on scheduling): one per 64 query rows walks the keys and accumulates dQ; one per 64 keys
// walks the queries and accumulates dK and dV. S and dP are computed twice, which tensor cores make
// cheap.
//
// In the WMMA kernels, the softmax steps run with two lanes per row (lane = 2 r + h: row r, columns
// h*32 .. h*32+31 of the 64-column tile); the products run as WMMA fragments, whose layout we never
// depend on: they go through shared memory (store_matrix_sync / load_matrix_sync). The register-tiled
// kernels depend on PTX's documented mma.sync layout instead, and keep everything in registers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <type_traits>

#include "core/scalar_math.h"
#include "cuda/context.h"
#include "cuda/kernels.h"
#include "cuda/loops.cuh"

namespace kiln::cuda {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kRows = 64;     // query rows (forward, dQ) or keys (dK, dV) per block
constexpr int kTile = 64;     // keys (forward, dQ) or queries (dK, dV) per step of the walk
constexpr int kWarps = 4;     // each warp owns 16 of the block's 64 rows
constexpr int kPad16 = 8;     // padding of 16-bit rows in shared memory (elements; keeps WMMA's alignment)
constexpr int kPad32 = 4;     // padding of float32 rows
constexpr int kLdS = kTile + kPad32;  // a warp's 16 x 64 float32 tile
constexpr int kLdP = kTile + kPad16;  // a warp's 16 x 64 16-bit tile

using Frag = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
template <typename T>
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
template <typename T>
using FragAcol = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::col_major>;
template <typename T>
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major>;
template <typename T>
using FragBcol = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major>;

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ __half from_f<__half>(float x) { return __float2half(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16(x); }

// An operand: B * H matrices of D contiguous columns (core/backend.h; see the top of the file).
template <typename T>
using Heads = AttentionHeads<T>;

// Rows [row0, row0 + 64) of a (rows, D) matrix, rows ld_src apart, into shared memory (leading
// dimension D + kPad16), 16 bytes at a time; rows past `rows` are zeros.
template <typename T, int D>
__device__ void load_tile(T* dst, const T* src, int64_t ld_src, int64_t row0, int64_t rows) {
  constexpr int kVec = 8;  // 16-bit elements per 16 bytes
  constexpr int kPerRow = D / kVec;
  for (int i = threadIdx.x; i < kRows * kPerRow; i += blockDim.x) {
    const int r = i / kPerRow, c = (i % kPerRow) * kVec;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (row0 + r < rows) v = *reinterpret_cast<const uint4*>(src + (row0 + r) * ld_src + c);
    *reinterpret_cast<uint4*>(dst + r * (D + kPad16) + c) = v;
  }
}

// out (16 x 64, float32, ld kLdS) = A (16 x D) B^T, where A's rows start at a (ld D + kPad16) and B is
// 64 rows of D (ld D + kPad16): a warp's scores against a tile.
template <typename T, int D>
__device__ void rows_times_tile_t(const T* a, const T* b, float* out) {
  constexpr int ld = D + kPad16;
  FragA<T> fa;
  FragBcol<T> fb;
  for (int j = 0; j < kTile / 16; ++j) {
    Frag acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int d = 0; d < D; d += 16) {
      wmma::load_matrix_sync(fa, a + d, ld);
      wmma::load_matrix_sync(fb, b + j * 16 * ld + d, ld);  // B^T: column-major view of B's rows
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + j * 16, acc, kLdS, wmma::mem_row_major);
  }
}

// acc[dj] (16 x D in fragments of 16 columns) += P (16 x 64, ld kLdP) M (64 rows of D, ld D + kPad16).
template <typename T, int D>
__device__ void accumulate_p_times(Frag (&acc)[D / 16], const T* p, const T* m) {
  constexpr int ld = D + kPad16;
  FragA<T> fa;
  FragB<T> fb;
  for (int kk = 0; kk < kTile / 16; ++kk) {
    wmma::load_matrix_sync(fa, p + kk * 16, kLdP);
    for (int dj = 0; dj < D / 16; ++dj) {
      wmma::load_matrix_sync(fb, m + kk * 16 * ld + dj * 16, ld);
      wmma::mma_sync(acc[dj], fa, fb, acc[dj]);
    }
  }
}

// Writes a warp's 16 x D fragments, times `mul`, as rows [row0, row0 + 16) of a (rows, D) matrix
// whose rows are ld_dst apart, through the warp's float32 scratch (16 x kLdS).
template <typename T, int D>
__device__ void store_rows(Frag (&acc)[D / 16], float* scratch, T* dst, int64_t ld_dst, int64_t row0, int64_t rows,
                           float mul) {
  const int lane = threadIdx.x & 31;
  for (int dj = 0; dj < D / 16; ++dj) {
    wmma::store_matrix_sync(scratch, acc[dj], kLdS, wmma::mem_row_major);
    __syncwarp();
    for (int i = lane; i < 256; i += 32) {
      const int r = i / 16, c = i % 16;
      if (row0 + r < rows) dst[(row0 + r) * ld_dst + dj * 16 + c] = from_f<T>(scratch[r * kLdS + c] * mul);
    }
    __syncwarp();
  }
}

// Is key j hidden from query i?
__device__ __forceinline__ bool masked(int64_t i, int64_t j, int64_t L, int64_t S, bool causal) {
  return j >= S || i >= L || (causal && j > i);
}

// ---- forward ----

template <typename T, int D>
__global__ void __launch_bounds__(kWarps * 32)
attention_forward_kernel(Heads<const T> qh, Heads<const T> kh, Heads<const T> vh, Heads<T> oh, float* lse,
                         int64_t L, int64_t S, float scale, bool causal) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int ld = D + kPad16, ldo = D + kPad32;
  T* qs = reinterpret_cast<T*>(smem);
  T* ks = qs + kRows * ld;
  T* vs = ks + kRows * ld;
  float* ss = reinterpret_cast<float*>(vs + kRows * ld);  // kWarps x 16 x kLdS
  float* os = ss + kWarps * 16 * kLdS;                    // kWarps x 16 x ldo
  T* ps = reinterpret_cast<T*>(os + kWarps * 16 * ldo);   // kWarps x 16 x kLdP
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, r = lane >> 1, h = lane & 1;
  const int64_t b = blockIdx.y, q0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const T *q = qh.slice(b), *k = kh.slice(b), *v = vh.slice(b);
  float* s_w = ss + warp * 16 * kLdS;
  float* o_w = os + warp * 16 * ldo;
  T* p_w = ps + warp * 16 * kLdP;
  const int64_t qi = q0 + warp * 16 + r;  // this lane's row

  load_tile<T, D>(qs, q, qh.ld, q0, L);
  for (int i = lane; i < 16 * D; i += 32) o_w[(i / D) * ldo + i % D] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  const int64_t kend = causal && q0 + kRows < S ? q0 + kRows : S;
  for (int64_t k0 = 0; k0 < kend; k0 += kTile) {
    __syncthreads();  // everyone is done with the previous K and V tiles
    load_tile<T, D>(ks, k, kh.ld, k0, S);
    load_tile<T, D>(vs, v, vh.ld, k0, S);
    __syncthreads();
    rows_times_tile_t<T, D>(qs + warp * 16 * ld, ks, s_w);
    __syncwarp();
    float sv[32];
    float mx = -INFINITY;
    for (int c = 0; c < 32; ++c) {
      const int64_t j = k0 + h * 32 + c;
      sv[c] = masked(qi, j, L, S, causal) ? -INFINITY : s_w[r * kLdS + h * 32 + c] * scale;
      mx = fmaxf(mx, sv[c]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float m_new = fmaxf(m, mx);
    // A row with nothing visible yet (only padding rows past L) keeps m = -inf: no NaN from inf - inf.
    const float alpha = m_new == -INFINITY ? 1.0f : __expf(m - m_new);
    float sum = 0.0f;
    for (int c = 0; c < 32; ++c) {
      const float p = sv[c] == -INFINITY ? 0.0f : __expf(sv[c] - m_new);
      const T pt = from_f<T>(p);
      sum += to_f(pt);  // l sums the probabilities as rounded for P V
      p_w[r * kLdP + h * 32 + c] = pt;
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * alpha + sum;
    m = m_new;
    for (int c = h * (D / 2); c < (h + 1) * (D / 2); ++c) o_w[r * ldo + c] *= alpha;
    __syncwarp();
    Frag acc[D / 16];
    for (int dj = 0; dj < D / 16; ++dj) wmma::load_matrix_sync(acc[dj], o_w + dj * 16, ldo, wmma::mem_row_major);
    accumulate_p_times<T, D>(acc, p_w, vs);
    for (int dj = 0; dj < D / 16; ++dj) wmma::store_matrix_sync(o_w + dj * 16, acc[dj], ldo, wmma::mem_row_major);
    __syncwarp();
  }
  if (qi < L) {
    const float inv = l > 0 ? 1.0f / l : 0.0f;
    T* o = oh.slice(b) + qi * oh.ld;
    for (int c = h * (D / 2); c < (h + 1) * (D / 2); ++c) o[c] = from_f<T>(o_w[r * ldo + c] * inv);
    if (h == 0) lse[b * L + qi] = m + logf(l);
  }
}

// ---- backward ----

// delta[row] = sum over d of grad_out[row][d] * out[row][d], in float32, for the B * H * L rows (row
// i of slice z is row z * L + i): one warp per row.
template <typename T>
__global__ void attention_delta_kernel(Heads<const T> go, Heads<const T> o, float* delta, int64_t rows, int64_t L,
                                       int64_t D) {
  const int lane = threadIdx.x & 31;
  for (int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; row < rows;
       row += static_cast<int64_t>(gridDim.x) * blockDim.x / 32) {
    const T* gr = go.slice(row / L) + (row % L) * go.ld;
    const T* orow = o.slice(row / L) + (row % L) * o.ld;
    float acc = 0.0f;
    for (int64_t d = lane; d < D; d += 32) acc += to_f(gr[d]) * to_f(orow[d]);
    for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) delta[row] = acc;
  }
}

// dQ for 64 query rows: walks the keys.
template <typename T, int D>
__global__ void __launch_bounds__(kWarps * 32)
attention_grad_q_kernel(Heads<const T> qh, Heads<const T> kh, Heads<const T> vh, Heads<const T> goh, const float* lse,
                        const float* delta, Heads<T> gqh, int64_t L, int64_t S, float scale, bool causal) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int ld = D + kPad16;
  T* qs = reinterpret_cast<T*>(smem);
  T* gos = qs + kRows * ld;
  T* ks = gos + kRows * ld;
  T* vs = ks + kRows * ld;
  float* ss = reinterpret_cast<float*>(vs + kRows * ld);  // kWarps x 16 x kLdS: S
  float* dps = ss + kWarps * 16 * kLdS;                   // kWarps x 16 x kLdS: dP
  T* dss = reinterpret_cast<T*>(dps + kWarps * 16 * kLdS);  // kWarps x 16 x kLdP: dS
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, r = lane >> 1, h = lane & 1;
  const int64_t b = blockIdx.y, q0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const T *q = qh.slice(b), *go = goh.slice(b), *k = kh.slice(b), *v = vh.slice(b);
  float* s_w = ss + warp * 16 * kLdS;
  float* dp_w = dps + warp * 16 * kLdS;
  T* ds_w = dss + warp * 16 * kLdP;
  const int64_t qi = q0 + warp * 16 + r;
  const float lse_i = qi < L ? lse[b * L + qi] : 0.0f, delta_i = qi < L ? delta[b * L + qi] : 0.0f;

  load_tile<T, D>(qs, q, qh.ld, q0, L);
  load_tile<T, D>(gos, go, goh.ld, q0, L);
  Frag acc[D / 16];
  for (int dj = 0; dj < D / 16; ++dj) wmma::fill_fragment(acc[dj], 0.0f);
  const int64_t kend = causal && q0 + kRows < S ? q0 + kRows : S;
  for (int64_t k0 = 0; k0 < kend; k0 += kTile) {
    __syncthreads();
    load_tile<T, D>(ks, k, kh.ld, k0, S);
    load_tile<T, D>(vs, v, vh.ld, k0, S);
    __syncthreads();
    rows_times_tile_t<T, D>(qs + warp * 16 * ld, ks, s_w);    // S = Q K^T
    rows_times_tile_t<T, D>(gos + warp * 16 * ld, vs, dp_w);  // dP = dO V^T
    __syncwarp();
    for (int c = h * 32; c < h * 32 + 32; ++c) {
      const int64_t j = k0 + c;
      float ds = 0.0f;
      if (!masked(qi, j, L, S, causal)) {
        const float p = __expf(s_w[r * kLdS + c] * scale - lse_i);
        ds = p * (dp_w[r * kLdS + c] - delta_i) * scale;
      }
      ds_w[r * kLdP + c] = from_f<T>(ds);
    }
    __syncwarp();
    accumulate_p_times<T, D>(acc, ds_w, ks);  // dQ += dS K
  }
  store_rows<T, D>(acc, s_w, gqh.slice(b), gqh.ld, q0 + warp * 16, L, 1.0f);
}

// dK and dV for 64 keys: walks the queries.
template <typename T, int D>
__global__ void __launch_bounds__(kWarps * 32)
attention_grad_kv_kernel(Heads<const T> qh, Heads<const T> kh, Heads<const T> vh, Heads<const T> goh, const float* lse,
                         const float* delta, Heads<T> gkh, Heads<T> gvh, int64_t L, int64_t S, float scale,
                         bool causal) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int ld = D + kPad16;
  T* ks = reinterpret_cast<T*>(smem);
  T* vs = ks + kRows * ld;
  T* qs = vs + kRows * ld;
  T* gos = qs + kRows * ld;
  float* sts = reinterpret_cast<float*>(gos + kRows * ld);  // kWarps x 16 x kLdS: S^T (keys x queries)
  float* dpts = sts + kWarps * 16 * kLdS;                   // kWarps x 16 x kLdS: dP^T
  T* pts = reinterpret_cast<T*>(dpts + kWarps * 16 * kLdS);  // kWarps x 16 x kLdP: P^T
  T* dsts = pts + kWarps * 16 * kLdP;                        // kWarps x 16 x kLdP: dS^T
  float* lse_s = reinterpret_cast<float*>(dsts + kWarps * 16 * kLdP);  // kTile
  float* delta_s = lse_s + kTile;                                      // kTile
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, r = lane >> 1, h = lane & 1;
  const int64_t b = blockIdx.y, k0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const T *q = qh.slice(b), *go = goh.slice(b), *k = kh.slice(b), *v = vh.slice(b);
  float* st_w = sts + warp * 16 * kLdS;
  float* dpt_w = dpts + warp * 16 * kLdS;
  T* pt_w = pts + warp * 16 * kLdP;
  T* dst_w = dsts + warp * 16 * kLdP;
  const int64_t kj = k0 + warp * 16 + r;  // this lane's key

  load_tile<T, D>(ks, k, kh.ld, k0, S);
  load_tile<T, D>(vs, v, vh.ld, k0, S);
  Frag dk[D / 16], dv[D / 16];
  for (int dj = 0; dj < D / 16; ++dj) {
    wmma::fill_fragment(dk[dj], 0.0f);
    wmma::fill_fragment(dv[dj], 0.0f);
  }
  // Causal: queries before k0 see none of these keys.
  for (int64_t q0 = causal ? k0 : 0; q0 < L; q0 += kTile) {
    __syncthreads();
    load_tile<T, D>(qs, q, qh.ld, q0, L);
    load_tile<T, D>(gos, go, goh.ld, q0, L);
    for (int i = threadIdx.x; i < kTile; i += blockDim.x) {
      lse_s[i] = q0 + i < L ? lse[b * L + q0 + i] : 0.0f;
      delta_s[i] = q0 + i < L ? delta[b * L + q0 + i] : 0.0f;
    }
    __syncthreads();
    rows_times_tile_t<T, D>(ks + warp * 16 * ld, qs, st_w);    // S^T = K Q^T
    rows_times_tile_t<T, D>(vs + warp * 16 * ld, gos, dpt_w);  // dP^T = V dO^T
    __syncwarp();
    for (int c = h * 32; c < h * 32 + 32; ++c) {
      const int64_t i = q0 + c;
      float p = 0.0f, ds = 0.0f;
      if (!masked(i, kj, L, S, causal)) {
        p = __expf(st_w[r * kLdS + c] * scale - lse_s[c]);
        ds = p * (dpt_w[r * kLdS + c] - delta_s[c]) * scale;
      }
      pt_w[r * kLdP + c] = from_f<T>(p);
      dst_w[r * kLdP + c] = from_f<T>(ds);
    }
    __syncwarp();
    accumulate_p_times<T, D>(dv, pt_w, gos);  // dV += P^T dO
    accumulate_p_times<T, D>(dk, dst_w, qs);  // dK += dS^T Q
  }
  store_rows<T, D>(dk, st_w, gkh.slice(b), gkh.ld, k0 + warp * 16, S, 1.0f);
  store_rows<T, D>(dv, st_w, gvh.slice(b), gvh.ld, k0 + warp * 16, S, 1.0f);
}

// ---- 16-bit, register-tiled (mma.sync) ----
//
// Note [register-tiled attention]
// The WMMA kernels above pass every product through shared memory, because WMMA's fragment layout
// is opaque: S is stored and read back by two lanes per row, P stored and reloaded as a fragment, O
// kept in shared memory. These kernels follow the same plan (the same blocks, walks, masks and
// rounding; results equal up to the order of float32 sums) but keep S, P and O (dP, dS, dQ, dK, dV in
// the backward) in registers, as the fragments
// of PTX's mma.sync.m16n8k16 (16 x 8 x 16, float32 accumulation), whose layout PTX documents. With
// lane = 4 g + t (g = lane / 4, t = lane % 4):
//   A, 16 x 16 (m x k), four 32-bit registers of two 16-bit values each, the lower column in the low
//     half: (row g, columns 2t, 2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..);
//   B, 16 x 8 (k x n), two registers: (rows 2t, 2t+1, column g), (rows 2t+8, 2t+9, column g);
//   C, 16 x 8 float32, four floats: (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1).
// So a lane holds pieces of rows g and g + 8 only, and a row's max or sum is its lane's values joined
// with the other three lanes of its quad (two shuffles). And the C fragments of two neighbouring
// 8-column tiles, rounded to 16 bits and packed in pairs, are exactly an A fragment: P = softmax(S)
// multiplies V without leaving registers (likewise dS times K, P^T times dO, dS^T times Q).
// Operands come from shared memory by ldmatrix (four 8 x 8 matrices per instruction, each lane giving
// one row's address); an operand stored k-major (V in P V, K in dS K, dO and Q in the dK/dV kernel)
// is read with ldmatrix's .trans. Tiles reach shared memory by cp.async, double-buffered: the next
// tile of the walk is in flight while this one is computed. Rows padded by kPad16 elements keep the
// eight row addresses of an ldmatrix on distinct banks.
// The default since they passed the GPU tests on an H200 (2026-12-04), 3.4x faster than the WMMA
// kernels at GPT-2's shapes; KILN_CUDA_ATTENTION=wmma selects those (use_mma_kernels, below).
// scripts/emulate_attention_fragments.py runs their index arithmetic on the CPU (docs/cuda.md 3.3).

// D(16 x 8, float32) += A(16 x 16) B(16 x 8): one tensor-core instruction for the warp.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Four 8 x 8 matrices of 16-bit values from shared memory: lanes 8i .. 8i+7 give the addresses of
// matrix i's rows (16 bytes each); afterwards r[i] holds, in lane 4g + t, row g's columns 2t, 2t+1
// of matrix i (with .trans, Trans = true: column g's rows 2t, 2t+1). The "memory" clobbers here and
// in cp_async_16 tell the compiler that these read and write shared memory, so that it keeps plain
// shared-memory accesses on their side of them.
template <bool Trans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  if constexpr (Trans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(row))
                 : "memory");
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(row))
                 : "memory");
  }
}

// 16 bytes from global to shared memory without passing through registers; zeros when !valid (src
// must still be a readable address).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Note [exp2 in the register-tiled kernels]: between the products, these kernels issue the softmax's
// arithmetic and the next tiles' loads, and that is most of what they issue: in the forward's walk
// (SASS, sm_90, bfloat16, D = 64) a 64-key tile without masked keys took 865 instructions a warp,
// 64 of them HMMA, which a multiprocessor's four schedulers issue at one a cycle each. So the
// exponentials are taken as FlashAttention takes them: scores are scaled by scale * log2(e) once,
// the running max kept in those units, and p = 2^(s' - m') is one hardware ex2 that flushes results
// below 2^-126 (where __expf(x) was x * log2(e) and an ex2 with a guard for subnormal results: four
// instructions more an element). In the backward, P = 2^(fma(s, scale log2 e, -lse log2 e)), one fma and one ex2 where
// there were seven instructions, and dS is kept without the scale, which multiplies dQ and dK once
// at the end, as FlashAttention-2 does (exactly, for D = 64's power-of-two scale; within a rounding
// of dS otherwise). lse is stored in natural units, as before. With the cheaper tile loads of
// load_tile_async and the masks of visible_keys, the forward's tile now takes 647 instructions; the
// loops of the dQ and dK/dV kernels (both paths, masked and not, each load loop once) have 561 and
// 687 where they had 1209 and 1404.
using math::fast_exp2, math::kLn2, math::kLog2e;  // Note [exp2 on the GPU]

// Blocks a multiprocessor holds of each register-tiled kernel: __launch_bounds__'s second argument,
// so ptxas fits its registers to them (65536 / (128 threads * blocks) a thread) instead of its own
// guess, which moved with every change to the code (a spill at D = 96, or 134 registers at D = 64,
// one block fewer). They are what the shared memory allows (the forward holds five tiles of
// 64 * (D + 8) 16-bit values: four blocks at D = 64, two at D = 128), less where the registers
// would spill: five forward blocks at D = 32, three of the dK/dV kernel (two accumulators) at D = 64.
// At D <= 64 the backward kernels still spill one 8-byte value, loaded once a tile.
constexpr int forward_blocks(int D) { return D == 32 ? 5 : D == 64 ? 4 : D == 96 ? 3 : 2; }
constexpr int grad_q_blocks(int D) { return D <= 64 ? 4 : 2; }
constexpr int grad_kv_blocks(int D) { return D == 32 ? 4 : D == 64 ? 3 : 2; }

// The masks of an edge tile as one 32-bit comparison an element: column c (0 .. kTile - 1) of a
// tile starting at key k0 is visible to query i when k0 + c < S and, if causal, k0 + c <= i, that is
// when c < visible_keys(i, k0, S, causal); the count is clamped to [0, kTile], so int holds it. The
// per-element 64-bit comparisons it replaces were four instructions an element on the edge tiles
// (the diagonal's, under a causal mask); the kernels apply the masks in a branch of their own after
// the scores are scaled, so the other tiles skip them.
__device__ __forceinline__ int visible_keys(int64_t i, int64_t k0, int64_t S, bool causal) {
  const int64_t end = causal && i + 1 < S ? i + 1 : S;  // one past the last visible key
  return static_cast<int>(end - k0 < 0 ? 0 : end - k0 > kTile ? kTile : end - k0);
}

// Two values rounded to 16 bits and packed as an mma operand register (lo in the low half), and back.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t r;
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 v = __floats2half2_rn(lo, hi);
    memcpy(&r, &v, 4);
  } else {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    memcpy(&r, &v, 4);
  }
  return r;
}
template <typename T>
__device__ __forceinline__ float2 unpack2(uint32_t r) {
  if constexpr (std::is_same_v<T, __half>) {
    __half2 v;
    memcpy(&v, &r, 4);
    return __half22float2(v);
  } else {
    __nv_bfloat162 v;
    memcpy(&v, &r, 4);
    return __bfloat1622float2(v);
  }
}

// Rows [row0, row0 + kRows) of a (rows, D) matrix (rows ld_src apart) into shared memory (leading
// dimension D + kPad16) by cp.async, zeros past `rows`; the caller commits and waits. The block's
// kWarps * 32 threads take the tile's 16-byte pieces in turn. Where a row's pieces divide the block
// (D = 32, 64, 128), a thread keeps one column and steps down the rows: 22 instructions a piece
// where the loop over pieces by blockDim.x took 30 (SASS, D = 64), in a walk whose key tile takes
// about 650. (Unrolled, the loop took 12 a piece, but ptxas then kept every piece's address in
// registers across the walk: up to 70 more a thread, fewer blocks per multiprocessor.) A row past
// `rows` reads nothing (src-size 0), from the matrix's first row.
template <typename T, int D>
__device__ __forceinline__ void load_tile_async(T* dst, const T* src, int64_t ld_src, int64_t row0, int64_t rows) {
  constexpr int kVec = 8;  // 16-bit elements per 16 bytes
  constexpr int kPerRow = D / kVec, kThreads = kWarps * 32;
  if constexpr (kThreads % kPerRow == 0) {
    constexpr int kRowsPerPass = kThreads / kPerRow;
    const int c = static_cast<int>(threadIdx.x) % kPerRow * kVec;
    const int64_t present = rows - row0;  // rows of the tile that exist
#pragma unroll 1
    for (int r = static_cast<int>(threadIdx.x) / kPerRow; r < kRows; r += kRowsPerPass) {
      const bool valid = r < present;
      cp_async_16(dst + r * (D + kPad16) + c, src + (valid ? row0 + r : 0) * ld_src + c, valid);
    }
  } else {
    for (int i = threadIdx.x; i < kRows * kPerRow; i += kThreads) {
      const int r = i / kPerRow, c = (i % kPerRow) * kVec;
      const bool valid = row0 + r < rows;
      cp_async_16(dst + r * (D + kPad16) + c, src + (valid ? row0 + r : rows - 1) * ld_src + c, valid);
    }
  }
}

// The walks' double buffer has two stages, each a pair of tiles (K then V, or Q then dO). Loads rows
// [row0, row0 + kRows) of a and of b into a stage, committed as one group (with any loads issued
// before it and not yet committed).
template <typename T, int D>
__device__ __forceinline__ void load_pair_async(T* stage, const T* a, int64_t lda, const T* b, int64_t ldb,
                                                int64_t row0, int64_t rows) {
  load_tile_async<T, D>(stage, a, lda, row0, rows);
  load_tile_async<T, D>(stage + kRows * (D + kPad16), b, ldb, row0, rows);
  cp_async_commit();
}

// Waits for the current stage's group: all but the newest when the next stage is already in flight.
__device__ __forceinline__ void cp_async_wait_current(bool next_in_flight) {
  if (next_in_flight) {
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
}

// The walk of the forward and dQ kernels over the key tiles that query rows [q0, q0 + kRows) see (all
// S keys, or up to the diagonal when causal), double-buffered in kvs (two stages of a K and a V
// tile): the first pair is loaded here (committed with whatever the caller has issued before), each
// next pair while the current one is computed; visit(k0, ks, vs) computes one tile.
template <typename T, int D, typename Visit>
__device__ __forceinline__ void walk_kv_tiles(T* kvs, const T* k, int64_t k_ld, const T* v, int64_t v_ld, int64_t q0,
                                              int64_t S, bool causal, Visit&& visit) {
  constexpr int tile = kRows * (D + kPad16);
  const int64_t kend = causal && q0 + kRows < S ? q0 + kRows : S;
  const int tiles = static_cast<int>((kend + kTile - 1) / kTile);
  load_pair_async<T, D>(kvs, k, k_ld, v, v_ld, 0, S);
  for (int it = 0; it < tiles; ++it) {
    const int64_t k0 = static_cast<int64_t>(it) * kTile;
    if (it + 1 < tiles) load_pair_async<T, D>(kvs + ((it + 1) & 1) * 2 * tile, k, k_ld, v, v_ld, k0 + kTile, S);
    cp_async_wait_current(it + 1 < tiles);
    __syncthreads();
    const T* ks = kvs + (it & 1) * 2 * tile;
    visit(k0, ks, ks + tile);
    __syncthreads();  // everyone is done with this stage before it is loaded again
  }
}

// Calls f(j, r, n, h) for every A register of a warp's 16 x 64 tile (Note [register-tiled
// attention]): register r = 2 half + h of fragment j packs columns 2t, 2t + 1 of C tile n = 2j + half
// (its floats 2h, 2h + 1), row g + 8h. So p[j][r] = pack2(c[n][2h], c[n][2h + 1]) turns C fragments
// (S, or dS) into the A operand of the next product.
template <typename F>
__device__ __forceinline__ void for_each_a_register(F&& f) {
#pragma unroll
  for (int j = 0; j < kTile / 16; ++j)
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int h = 0; h < 2; ++h) f(j, 2 * half + h, 2 * j + half, h);
}

// acc[j] (16 x 8, j < 8) += A B^T for 16 rows of A (a warp's, at a) and 64 rows of B (at b), both
// D columns wide in shared memory (leading dimension D + kPad16): a warp's 16 x 64 scores (S = Q K^T,
// dP = dO V^T, and their transposes in the dK/dV kernel).
template <typename T, int D>
__device__ __forceinline__ void rows_times_tile_t_mma(float (&acc)[kTile / 8][4], const T* a, const T* b) {
  constexpr int ld = D + kPad16;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t fa[4];  // rows 0-7 / 8-15 (lane bit 3) x columns +0 / +8 (lane bit 4): a0..a3
    ldmatrix_x4<false>(fa, a + (lane & 15) * ld + kk * 16 + (lane >> 4) * 8);
#pragma unroll
    for (int j = 0; j < kTile / 16; ++j) {
      // B^T's rows 16j .. 16j+15 (columns of the product): matrices (rows +0, cols +0), (+0, +8),
      // (+8, +0), (+8, +8) are b0 and b1 of tile 2j, then of tile 2j + 1.
      uint32_t fb[4];
      ldmatrix_x4<false>(fb, b + (16 * j + (lane & 7) + (lane >> 4) * 8) * ld + kk * 16 + ((lane >> 3) & 1) * 8);
      mma_16816<T>(acc[2 * j], fa, fb[0], fb[1]);
      mma_16816<T>(acc[2 * j + 1], fa, fb[2], fb[3]);
    }
  }
}

// acc[n] (16 x 8, n < D / 8) += P M, P (16 x 64) given as A fragments p[j] (columns 16j .. 16j+15) and M
// 64 rows of D columns in shared memory (leading dimension D + kPad16), read k-major by ldmatrix.trans.
template <typename T, int D>
__device__ __forceinline__ void accumulate_p_times_mma(float (&acc)[D / 8][4], const uint32_t (&p)[kTile / 16][4],
                                                       const T* m) {
  constexpr int ld = D + kPad16;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < kTile / 16; ++j) {
#pragma unroll
    for (int u = 0; u < D / 16; ++u) {
      // M's rows 16j .. 16j+15, columns 16u .. 16u+15: matrices (rows +0, cols +0), (+8, +0), (+0, +8),
      // (+8, +8), transposed, are b0 and b1 of column tile 2u, then of tile 2u + 1.
      uint32_t fb[4];
      ldmatrix_x4<true>(fb, m + (16 * j + (lane & 15)) * ld + 16 * u + (lane >> 4) * 8);
      mma_16816<T>(acc[2 * u], p[j], fb[0], fb[1]);
      mma_16816<T>(acc[2 * u + 1], p[j], fb[2], fb[3]);
    }
  }
}

// Writes a warp's 16 x D C fragments, times mul[h] for row g + 8h, as rows row0 + g and row0 + g + 8
// of a (rows, D) matrix whose rows are ld_dst apart (rows past `rows` are not written).
template <typename T, int D>
__device__ __forceinline__ void store_rows_mma(const float (&acc)[D / 8][4], T* dst, int64_t ld_dst, int64_t row0,
                                               int64_t rows, const float (&mul)[2]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = row0 + g + 8 * h;
    if (row >= rows) continue;
    T* out = dst + row * ld_dst + 2 * t;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      *reinterpret_cast<uint32_t*>(out + 8 * n) = pack2<T>(acc[n][2 * h] * mul[h], acc[n][2 * h + 1] * mul[h]);
    }
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(kWarps * 32, forward_blocks(D))
attention_forward_mma_kernel(Heads<const T> qh, Heads<const T> kh, Heads<const T> vh, Heads<T> oh, float* lse,
                             int64_t L, int64_t S, float scale, bool causal) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int ld = D + kPad16, tile = kRows * ld;
  T* qs = reinterpret_cast<T*>(smem);
  T* kvs = qs + tile;  // two stages, each a K tile then a V tile
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t b = blockIdx.y, q0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const T *q = qh.slice(b), *k = kh.slice(b), *v = vh.slice(b);
  const int64_t row = q0 + warp * 16 + g;  // this lane's rows: row and row + 8

  load_tile_async<T, D>(qs, q, qh.ld, q0, L);
  const float scale_log2 = scale * kLog2e;  // Note [exp2 in the register-tiled kernels]
  float o[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY};  // in units of log2: the max of s * scale_log2
  float l[2] = {0.0f, 0.0f};  // this lane's share of each row's sum; the quad's shares are joined at the end
  walk_kv_tiles<T, D>(kvs, k, kh.ld, v, vh.ld, q0, S, causal, [&](int64_t k0, const T* ks, const T* vs) {
    float s[kTile / 8][4] = {};
    rows_times_tile_t_mma<T, D>(s, qs + warp * 16 * ld, ks);  // S = Q K^T
    const bool edge = (causal && k0 + kTile > q0) || k0 + kTile > S;  // a tile that holds masked keys
#pragma unroll
    for (int n = 0; n < kTile / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] *= scale_log2;
    if (edge) {  // the masks only where a tile holds masked keys: the other tiles skip the comparisons
      const int visible[2] = {visible_keys(row, k0, S, causal), visible_keys(row + 8, k0, S, causal)};
#pragma unroll
      for (int n = 0; n < kTile / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (8 * n + 2 * t + (e & 1) >= visible[e >> 1]) s[n][e] = -INFINITY;
        }
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kTile / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
      const float m_new = fmaxf(m[h], mx[h]);
      alpha[h] = m_new == -INFINITY ? 1.0f : fast_exp2(m[h] - m_new);  // no inf - inf
      m[h] = m_new;
      l[h] *= alpha[h];
    }
    // P = 2^(S' - m), rounded to 16 bits as the A fragments of P V; l sums the rounded values.
    uint32_t p[kTile / 16][4];
    for_each_a_register([&](int j, int r, int n, int h) {
      const float mh = m[h] == -INFINITY ? 0.0f : m[h];
      p[j][r] = pack2<T>(fast_exp2(s[n][2 * h] - mh), fast_exp2(s[n][2 * h + 1] - mh));
      const float2 rounded = unpack2<T>(p[j][r]);
      l[h] += rounded.x + rounded.y;
    });
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }
    accumulate_p_times_mma<T, D>(o, p, vs);  // O += P V
  });
  float inv[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    inv[h] = l[h] > 0 ? 1.0f / l[h] : 0.0f;
    if (t == 0 && row + 8 * h < L) lse[b * L + row + 8 * h] = m[h] * kLn2 + logf(l[h]);  // natural units
  }
  store_rows_mma<T, D>(o, oh.slice(b), oh.ld, q0 + warp * 16, L, inv);
}

// dQ for 64 query rows (16 per warp): walks the keys, as attention_grad_q_kernel does.
template <typename T, int D>
__global__ void __launch_bounds__(kWarps * 32, grad_q_blocks(D))
attention_grad_q_mma_kernel(Heads<const T> qh, Heads<const T> kh, Heads<const T> vh, Heads<const T> goh,
                            const float* lse, const float* delta, Heads<T> gqh, int64_t L, int64_t S, float scale,
                            bool causal) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int ld = D + kPad16, tile = kRows * ld;
  T* qs = reinterpret_cast<T*>(smem);
  T* gos = qs + tile;
  T* kvs = gos + tile;  // two stages, each a K tile then a V tile
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t b = blockIdx.y, q0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const T *k = kh.slice(b), *v = vh.slice(b);
  const int64_t row = q0 + warp * 16 + g;  // this lane's rows: row and row + 8
  const float scale_log2 = scale * kLog2e;  // Note [exp2 in the register-tiled kernels]
  float lse_r[2], delta_r[2];               // lse_r in units of log2
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const bool valid = row + 8 * h < L;
    lse_r[h] = valid ? lse[b * L + row + 8 * h] * kLog2e : 0.0f;
    delta_r[h] = valid ? delta[b * L + row + 8 * h] : 0.0f;
  }

  load_tile_async<T, D>(qs, qh.slice(b), qh.ld, q0, L);
  load_tile_async<T, D>(gos, goh.slice(b), goh.ld, q0, L);
  float dq[D / 8][4] = {};
  walk_kv_tiles<T, D>(kvs, k, kh.ld, v, vh.ld, q0, S, causal, [&](int64_t k0, const T* ks, const T* vs) {
    float s[kTile / 8][4] = {}, dp[kTile / 8][4] = {};
    rows_times_tile_t_mma<T, D>(s, qs + warp * 16 * ld, ks);    // S = Q K^T
    rows_times_tile_t_mma<T, D>(dp, gos + warp * 16 * ld, vs);  // dP = dO V^T
    const bool edge = (causal && k0 + kTile > q0) || k0 + kTile > S;
#pragma unroll
    for (int n = 0; n < kTile / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = fast_exp2(fmaf(s[n][e], scale_log2, -lse_r[e >> 1]));  // P
    if (edge) {  // See visible_keys
      const int visible[2] = {visible_keys(row, k0, S, causal), visible_keys(row + 8, k0, S, causal)};
#pragma unroll
      for (int n = 0; n < kTile / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (8 * n + 2 * t + (e & 1) >= visible[e >> 1]) s[n][e] = 0.0f;
        }
    }
    uint32_t ds[kTile / 16][4];  // dS / scale = P (dP - Delta), as the A fragments of dS K
    for_each_a_register([&](int j, int r, int n, int h) {
      ds[j][r] = pack2<T>(s[n][2 * h] * (dp[n][2 * h] - delta_r[h]), s[n][2 * h + 1] * (dp[n][2 * h + 1] - delta_r[h]));
    });
    accumulate_p_times_mma<T, D>(dq, ds, ks);  // dQ += dS K, but for the scale
  });
  const float by_scale[2] = {scale, scale};
  store_rows_mma<T, D>(dq, gqh.slice(b), gqh.ld, q0 + warp * 16, L, by_scale);
}

// dK and dV for 64 keys (16 per warp): walks the queries, as attention_grad_kv_kernel does. Here the
// warp's rows are keys and a tile's columns queries: S^T = K Q^T, dP^T = V dO^T.
template <typename T, int D>
__global__ void __launch_bounds__(kWarps * 32, grad_kv_blocks(D))
attention_grad_kv_mma_kernel(Heads<const T> qh, Heads<const T> kh, Heads<const T> vh, Heads<const T> goh,
                             const float* lse, const float* delta, Heads<T> gkh, Heads<T> gvh, int64_t L, int64_t S,
                             float scale, bool causal) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int ld = D + kPad16, tile = kRows * ld;
  T* ks = reinterpret_cast<T*>(smem);
  T* vs = ks + tile;
  T* qgos = vs + tile;  // two stages, each a Q tile then a dO tile
  float* lse_s = reinterpret_cast<float*>(qgos + 4 * tile);  // kTile: this tile's queries
  float* delta_s = lse_s + kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t b = blockIdx.y, k0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const T *q = qh.slice(b), *go = goh.slice(b);
  const int64_t key = k0 + warp * 16 + g;  // this lane's keys: key and key + 8
  const float scale_log2 = scale * kLog2e;  // Note [exp2 in the register-tiled kernels]
  const int64_t qstart = causal ? k0 : 0;   // causal: queries before k0 see none of these keys
  const int tiles = static_cast<int>(qstart < L ? (L - qstart + kTile - 1) / kTile : 0);

  load_tile_async<T, D>(ks, kh.slice(b), kh.ld, k0, S);
  load_tile_async<T, D>(vs, vh.slice(b), vh.ld, k0, S);
  if (tiles > 0) {
    load_pair_async<T, D>(qgos, q, qh.ld, go, goh.ld, qstart, L);
  } else {
    cp_async_commit();
  }
  float dk[D / 8][4] = {}, dv[D / 8][4] = {};
  for (int it = 0; it < tiles; ++it) {
    const int64_t q0 = qstart + static_cast<int64_t>(it) * kTile;
    if (it + 1 < tiles) load_pair_async<T, D>(qgos + ((it + 1) & 1) * 2 * tile, q, qh.ld, go, goh.ld, q0 + kTile, L);
    for (int i = threadIdx.x; i < kTile; i += blockDim.x) {  // the previous tile's readers are past the barrier
      lse_s[i] = q0 + i < L ? lse[b * L + q0 + i] * kLog2e : 0.0f;  // in units of log2
      delta_s[i] = q0 + i < L ? delta[b * L + q0 + i] : 0.0f;
    }
    cp_async_wait_current(it + 1 < tiles);
    __syncthreads();
    const T* qs = qgos + (it & 1) * 2 * tile;
    const T* gos = qs + tile;
    float st[kTile / 8][4] = {}, dpt[kTile / 8][4] = {};
    rows_times_tile_t_mma<T, D>(st, ks + warp * 16 * ld, qs);    // S^T = K Q^T
    rows_times_tile_t_mma<T, D>(dpt, vs + warp * 16 * ld, gos);  // dP^T = V dO^T
    const bool edge = (causal && q0 < k0 + kRows) || q0 + kTile > L;
#pragma unroll
    for (int n = 0; n < kTile / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        st[n][e] = fast_exp2(fmaf(st[n][e], scale_log2, -lse_s[8 * n + 2 * t + (e & 1)]));  // P^T
      }
    if (edge) {
      // Query column c sees key jj when q0 + c < L and, if causal, jj <= q0 + c: c in [first[h], last).
      const int last = static_cast<int>(L - q0 < kTile ? L - q0 : kTile);
      int first[2] = {0, 0};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t f = key + 8 * h - q0;
        if (causal) first[h] = static_cast<int>(f < 0 ? 0 : f > kTile ? kTile : f);
      }
#pragma unroll
      for (int n = 0; n < kTile / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = 8 * n + 2 * t + (e & 1);
          if (c >= last || c < first[e >> 1]) st[n][e] = 0.0f;
        }
    }
    uint32_t pt[kTile / 16][4], dst[kTile / 16][4];  // P^T and dS^T / scale as A fragments
    for_each_a_register([&](int j, int r, int n, int h) {
      const int c = 8 * n + 2 * t;  // the query's column in the tile (and c + 1)
      const float p0 = st[n][2 * h], p1 = st[n][2 * h + 1];
      pt[j][r] = pack2<T>(p0, p1);
      dst[j][r] = pack2<T>(p0 * (dpt[n][2 * h] - delta_s[c]), p1 * (dpt[n][2 * h + 1] - delta_s[c + 1]));
    });
    accumulate_p_times_mma<T, D>(dv, pt, gos);  // dV += P^T dO
    accumulate_p_times_mma<T, D>(dk, dst, qs);  // dK += dS^T Q, but for the scale
    __syncthreads();
  }
  if (tiles == 0) cp_async_wait<0>();  // nothing to walk: drain the K and V loads before exiting
  const float one[2] = {1.0f, 1.0f}, by_scale[2] = {scale, scale};
  store_rows_mma<T, D>(dk, gkh.slice(b), gkh.ld, k0 + warp * 16, S, by_scale);
  store_rows_mma<T, D>(dv, gvh.slice(b), gvh.ld, k0 + warp * 16, S, one);
}

// ---- float32 ----
//
// Note [float32 attention]
// Tensor cores would round float32 inputs to TF32 (10-bit mantissas), which float32 results within
// float32 tolerance cannot afford, so float32 runs the same plan on the CUDA cores in float32
// throughout (expf, logf: no fast-math intrinsics). A block of 128 threads owns 32 rows (queries in
// the forward and dQ kernels, keys in the dK/dV kernel); the 4 threads of a row are neighbouring
// lanes, each holding a quarter of the row's D columns in registers: lane `part` holds columns
// part, part + 4, part + 8, ..., so that the 4 lanes read 4 neighbouring words of a shared row at
// once (no bank conflicts; lanes of other rows reading the same word get it broadcast). A dot product of two rows is 4
// partial sums joined by two shuffles; every lane runs every shuffle (a masked or padding row still
// computes, then discards), so no shuffle is divergent. The other side's rows go through shared
// memory in tiles of 32. As in the 16-bit kernels: the online softmax in the forward, P rebuilt from
// lse in the backward, dQ in one kernel and dK, dV in another, no atomics and nothing of size L x S
// in global memory.

constexpr int kRowsF = 32;           // rows per block
constexpr int kThreadsF = 4 * kRowsF;  // 4 threads per row

// The sum of a row's 4 partial sums, in all 4 of its lanes.
__device__ __forceinline__ float row_sum4(float partial) {
  partial += __shfl_xor_sync(0xffffffffu, partial, 1);
  return partial + __shfl_xor_sync(0xffffffffu, partial, 2);
}

// Two dot products at once, each of a row held in registers (this lane's quarter: a, c) with a row in
// shared memory (b, d: the row's start plus `part`; the quarter's columns are 4 apart):
// {a . b, c . d}, in all 4 lanes of the row.
template <int DC>
__device__ __forceinline__ float2 row_dots(const float (&a)[DC], const float* b, const float (&c)[DC], const float* d) {
  float ab = 0.0f, cd = 0.0f;
  for (int i = 0; i < DC; ++i) {
    ab += a[i] * b[4 * i];
    cd += c[i] * d[4 * i];
  }
  return make_float2(row_sum4(ab), row_sum4(cd));
}

// This lane's quarter (columns part + 4 c) of row `row` of a (rows, 4 DC) matrix whose rows are ld
// apart, or zeros past `rows`.
template <int DC>
__device__ __forceinline__ void load_quarter(float (&dst)[DC], const float* src, int64_t ld, int64_t row, int64_t rows,
                                             int part) {
  for (int c = 0; c < DC; ++c) dst[c] = row < rows ? src[row * ld + part + 4 * c] : 0.0f;
}

// Rows [row0, row0 + kRowsF) of a (rows, D) float32 matrix (rows ld apart) into shared memory (zeros
// past `rows`).
template <int D>
__device__ void load_tile_f32(float (*dst)[D], const float* src, int64_t ld, int64_t row0, int64_t rows) {
  for (int i = threadIdx.x; i < kRowsF * D; i += blockDim.x) {
    const int r = i / D, c = i % D;
    dst[r][c] = row0 + r < rows ? src[(row0 + r) * ld + c] : 0.0f;
  }
}

// The key/value tiles that query rows [q0, q0 + kRowsF) can see (all S keys, or up to the diagonal
// when causal), each loaded into ks and vs by the whole block; then visit(k0), its first key.
template <int D, typename Visit>
__device__ __forceinline__ void for_each_kv_tile(float (*ks)[D], float (*vs)[D], const float* k, int64_t k_ld,
                                                 const float* v, int64_t v_ld, int64_t q0, int64_t S, bool causal,
                                                 Visit&& visit) {
  const int64_t kend = causal && q0 + kRowsF < S ? q0 + kRowsF : S;
  for (int64_t k0 = 0; k0 < kend; k0 += kRowsF) {
    __syncthreads();
    load_tile_f32<D>(ks, k, k_ld, k0, S);
    load_tile_f32<D>(vs, v, v_ld, k0, S);
    __syncthreads();
    visit(k0);
  }
}

template <int D>
__global__ void __launch_bounds__(kThreadsF)
attention_forward_f32_kernel(Heads<const float> qh, Heads<const float> kh, Heads<const float> vh, Heads<float> oh,
                             float* lse, int64_t L, int64_t S, float scale, bool causal) {
  constexpr int DC = D / 4;
  __shared__ float ks[kRowsF][D], vs[kRowsF][D];
  const int row = threadIdx.x / 4, part = threadIdx.x % 4;
  const int64_t b = blockIdx.y, q0 = static_cast<int64_t>(blockIdx.x) * kRowsF, qi = q0 + row;
  float qr[DC], o[DC] = {};
  load_quarter<DC>(qr, qh.slice(b), qh.ld, qi, L, part);
  float m = -INFINITY, l = 0.0f;
  for_each_kv_tile<D>(ks, vs, kh.slice(b), kh.ld, vh.slice(b), vh.ld, q0, S, causal, [&](int64_t k0) {
    // Both loops over j are unrolled so that sv stays in registers: rolled, it took a 128-byte stack
    // frame (local memory) for D >= 64.
    float sv[kRowsF];
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < kRowsF; ++j) {
      float partial = 0.0f;
      for (int c = 0; c < DC; ++c) partial += qr[c] * ks[j][part + 4 * c];
      const float dot = row_sum4(partial);  // every lane, masked or not: no divergent shuffle
      sv[j] = masked(qi, k0 + j, L, S, causal) ? -INFINITY : dot * scale;
      mx = fmaxf(mx, sv[j]);
    }
    const float m_new = fmaxf(m, mx);
    if (m_new == -INFINITY) return;  // nothing visible to this row yet (a padding row)
    const float alpha = expf(m - m_new);  // 0 on the first visible tile (m = -inf)
    l *= alpha;
    for (int c = 0; c < DC; ++c) o[c] *= alpha;
#pragma unroll
    for (int j = 0; j < kRowsF; ++j) {
      if (sv[j] == -INFINITY) continue;
      const float p = expf(sv[j] - m_new);
      l += p;
      for (int c = 0; c < DC; ++c) o[c] += p * vs[j][part + 4 * c];
    }
    m = m_new;
  });
  if (qi < L) {
    const float inv = l > 0 ? 1.0f / l : 0.0f;
    float* orow = oh.slice(b) + qi * oh.ld;
    for (int c = 0; c < DC; ++c) orow[part + 4 * c] = o[c] * inv;
    if (part == 0) lse[b * L + qi] = m + logf(l);
  }
}

template <int D>
__global__ void __launch_bounds__(kThreadsF)
attention_grad_q_f32_kernel(Heads<const float> qh, Heads<const float> kh, Heads<const float> vh,
                            Heads<const float> goh, const float* lse, const float* delta, Heads<float> gqh, int64_t L,
                            int64_t S, float scale, bool causal) {
  constexpr int DC = D / 4;
  __shared__ float ks[kRowsF][D], vs[kRowsF][D];
  const int row = threadIdx.x / 4, part = threadIdx.x % 4;
  const int64_t b = blockIdx.y, q0 = static_cast<int64_t>(blockIdx.x) * kRowsF, qi = q0 + row;
  float qr[DC], gor[DC], dq[DC] = {};
  load_quarter<DC>(qr, qh.slice(b), qh.ld, qi, L, part);
  load_quarter<DC>(gor, goh.slice(b), goh.ld, qi, L, part);
  const float lse_i = qi < L ? lse[b * L + qi] : 0.0f, delta_i = qi < L ? delta[b * L + qi] : 0.0f;
  for_each_kv_tile<D>(ks, vs, kh.slice(b), kh.ld, vh.slice(b), vh.ld, q0, S, causal, [&](int64_t k0) {
    for (int j = 0; j < kRowsF; ++j) {
      const float2 sdp = row_dots<DC>(qr, ks[j] + part, gor, vs[j] + part);  // S and dP
      if (masked(qi, k0 + j, L, S, causal)) continue;
      const float p = expf(sdp.x * scale - lse_i);
      const float ds = p * (sdp.y - delta_i) * scale;
      for (int c = 0; c < DC; ++c) dq[c] += ds * ks[j][part + 4 * c];
    }
  });
  if (qi < L) {
    float* grow = gqh.slice(b) + qi * gqh.ld;
    for (int c = 0; c < DC; ++c) grow[part + 4 * c] = dq[c];
  }
}

template <int D>
__global__ void __launch_bounds__(kThreadsF)
attention_grad_kv_f32_kernel(Heads<const float> qh, Heads<const float> kh, Heads<const float> vh,
                             Heads<const float> goh, const float* lse, const float* delta, Heads<float> gkh,
                             Heads<float> gvh, int64_t L, int64_t S, float scale, bool causal) {
  constexpr int DC = D / 4;
  __shared__ float qs[kRowsF][D], gos[kRowsF][D];
  __shared__ float lse_s[kRowsF], delta_s[kRowsF];
  const int row = threadIdx.x / 4, part = threadIdx.x % 4;
  const int64_t b = blockIdx.y, k0 = static_cast<int64_t>(blockIdx.x) * kRowsF, kj = k0 + row;
  const float *q = qh.slice(b), *go = goh.slice(b);
  float kr[DC], vr[DC], dk[DC] = {}, dv[DC] = {};
  load_quarter<DC>(kr, kh.slice(b), kh.ld, kj, S, part);
  load_quarter<DC>(vr, vh.slice(b), vh.ld, kj, S, part);
  for (int64_t q0 = causal ? k0 : 0; q0 < L; q0 += kRowsF) {  // causal: queries before k0 see none of these keys
    __syncthreads();
    load_tile_f32<D>(qs, q, qh.ld, q0, L);
    load_tile_f32<D>(gos, go, goh.ld, q0, L);
    for (int i = threadIdx.x; i < kRowsF; i += blockDim.x) {
      lse_s[i] = q0 + i < L ? lse[b * L + q0 + i] : 0.0f;
      delta_s[i] = q0 + i < L ? delta[b * L + q0 + i] : 0.0f;
    }
    __syncthreads();
    for (int i = 0; i < kRowsF; ++i) {
      const float2 sdp = row_dots<DC>(kr, qs[i] + part, vr, gos[i] + part);  // S^T and dP^T
      if (masked(q0 + i, kj, L, S, causal)) continue;
      const float p = expf(sdp.x * scale - lse_s[i]);
      const float ds = p * (sdp.y - delta_s[i]) * scale;
      for (int c = 0; c < DC; ++c) {
        dv[c] += p * gos[i][part + 4 * c];
        dk[c] += ds * qs[i][part + 4 * c];
      }
    }
  }
  if (kj < S) {
    float *gkrow = gkh.slice(b) + kj * gkh.ld, *gvrow = gvh.slice(b) + kj * gvh.ld;
    for (int c = 0; c < DC; ++c) {
      gkrow[part + 4 * c] = dk[c];
      gvrow[part + 4 * c] = dv[c];
    }
  }
}

// Shared memory of each kernel, in bytes.
template <typename T, int D>
constexpr size_t forward_smem() {
  return 3 * kRows * (D + kPad16) * sizeof(T) + kWarps * 16 * kLdS * 4 + kWarps * 16 * (D + kPad32) * 4 +
         kWarps * 16 * kLdP * sizeof(T);
}
template <typename T, int D>
constexpr size_t grad_q_smem() {
  return 4 * kRows * (D + kPad16) * sizeof(T) + 2 * kWarps * 16 * kLdS * 4 + kWarps * 16 * kLdP * sizeof(T);
}
template <typename T, int D>
constexpr size_t grad_kv_smem() {
  return 4 * kRows * (D + kPad16) * sizeof(T) + 2 * kWarps * 16 * kLdS * 4 + 2 * kWarps * 16 * kLdP * sizeof(T) +
         2 * kTile * 4;
}

// The register-tiled kernels: the block's own tiles, and two stages of the walked pair.
template <typename T, int D>
constexpr size_t forward_mma_smem() {
  return 5 * kRows * (D + kPad16) * sizeof(T);
}
template <typename T, int D>
constexpr size_t grad_q_mma_smem() {
  return 6 * kRows * (D + kPad16) * sizeof(T);
}
template <typename T, int D>
constexpr size_t grad_kv_mma_smem() {
  return 6 * kRows * (D + kPad16) * sizeof(T) + 2 * kTile * 4;
}

// Raises a kernel's dynamic shared memory limit above the default 48 KiB, on the current device
// (the attribute belongs to a device's context). launch_16bit calls it once per kernel and device.
template <typename Kernel>
bool allow_smem(Kernel kernel, size_t bytes) {
  KILN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  return true;
}

struct Dims {
  int64_t B, L, S, D;  // B: the (batch, head) pairs
};

Dims dims_of(const View& q, const View& k, const View& v, const char* op) {
  KILN_CHECK(q.ndim() == 4 && k.ndim() == 4 && v.ndim() == 4,
             "{}: the CUDA kernel takes (B, H, L, D) views, got {}, {} and {}", op, q.sizes.str(), k.sizes.str(),
             v.sizes.str());
  const Dims d{q.sizes[0] * q.sizes[1], q.sizes[2], k.sizes[2], q.sizes[3]};
  KILN_CHECK(k.sizes[0] == q.sizes[0] && v.sizes[0] == q.sizes[0] && k.sizes[1] == q.sizes[1] &&
                 v.sizes[1] == q.sizes[1] && v.sizes[2] == d.S,
             "{}: the CUDA kernel takes query (B, H, L, D), key and value (B, H, S, D), got {}, {} and {}", op,
             q.sizes.str(), k.sizes.str(), v.sizes.str());
  KILN_CHECK(v.sizes[3] == d.D && k.sizes[3] == d.D && (d.D == 32 || d.D == 64 || d.D == 96 || d.D == 128),
             "{}: the CUDA kernel takes one head dim D of 32, 64, 96 or 128 for query, key and value, got shapes "
             "{}, {} and {}",
             op, q.sizes.str(), k.sizes.str(), v.sizes.str());
  KILN_CHECK(q.dtype == kFloat16 || q.dtype == kBFloat16 || q.dtype == kFloat32,
             "{}: the CUDA kernel takes float16, bfloat16 or float32, got {}", op, dtype_name(q.dtype));
  KILN_CHECK(d.L > 0 && d.S > 0, "{}: the CUDA kernel needs at least one query and one key, got L = {}, S = {}", op,
             d.L, d.S);
  return d;
}

// A view as the kernels see it, checked: D contiguous columns, rows that do not overlap, and for the
// 16-bit kernels' 16-byte loads a pointer and strides on 16-byte boundaries (ops/attention.cpp
// copies a view that has not; this check is the backend's own guard).
template <typename T>
Heads<T> heads_of(const View& v, const char* op) {
  const Heads<T> h = attention_heads<T>(v);
  const int64_t cols = v.sizes[3];
  KILN_CHECK((cols <= 1 || v.strides[3] == 1) && h.ld >= cols,
             "{}: the CUDA kernel needs views with contiguous, non-overlapping rows, got sizes {} and strides {}", op,
             v.sizes.str(), v.strides.str());
  if (v.dtype != kFloat32) {
    const int64_t align = 16 / static_cast<int64_t>(itemsize(v.dtype));
    bool aligned = reinterpret_cast<uintptr_t>(v.data) % 16 == 0;
    for (int d = 0; d < 3; ++d) aligned = aligned && (v.sizes[d] <= 1 || v.strides[d] % align == 0);
    KILN_CHECK(aligned,
               "{}: the 16-bit CUDA kernel needs rows on 16-byte boundaries, got strides {} (call .contiguous())", op,
               v.strides.str());
  }
  return h;
}

// KILN_CUDA_ATTENTION picks the 16-bit kernels: "mma" (the default: Note [register-tiled attention])
// or "wmma" (the first kernels, kept for comparison and study). Read at every call, so a program or a
// test can switch between calls.
bool use_mma_kernels() {
  const char* v = std::getenv("KILN_CUDA_ATTENTION");
  if (v == nullptr || *v == '\0') return true;
  const std::string_view name(v);
  KILN_CHECK(name == "mma" || name == "wmma",
             "KILN_CUDA_ATTENTION={}: expected 'mma' (the default 16-bit attention kernels, register-tiled) or "
             "'wmma' (the WMMA ones); unset it for the default",
             v);
  return name == "mma";
}

// Launches a 16-bit kernel with `smem` bytes of shared memory on the current device; the first launch
// of each kernel on each device raises its limit there (a bit per device in a static per
// instantiation; devices past 63 raise it at every launch).
template <auto kernel, typename... Args>
void launch_16bit(size_t smem, const dim3& grid, cudaStream_t stream, Args... args) {
  static std::atomic<uint64_t> ready{0};
  int device = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
  if (bit == 0 || (ready.load(std::memory_order_acquire) & bit) == 0) {
    allow_smem(kernel, smem);
    ready.fetch_or(bit, std::memory_order_acq_rel);
  }
  kernel<<<grid, kWarps * 32, smem, stream>>>(args...);
  KILN_CUDA_CHECK(cudaGetLastError());
}

template <typename T, int D>
void forward_typed(const View& q, const View& k, const View& v, const View& out, const View& lse, const Dims& d,
                   const AttentionArgs& args, cudaStream_t stream) {
  const char* op = "scaled_dot_product_attention";
  const dim3 grid(static_cast<unsigned>((d.L + kRows - 1) / kRows), static_cast<unsigned>(d.B));
  const Heads<const T> hq = heads_of<const T>(q, op), hk = heads_of<const T>(k, op), hv = heads_of<const T>(v, op);
  const Heads<T> ho = heads_of<T>(out, op);
  float* l = static_cast<float*>(lse.data);
  const float scale = static_cast<float>(args.scale);
  if (use_mma_kernels())  // checked before the launch: a bad value is an Error with nothing queued
    launch_16bit<attention_forward_mma_kernel<T, D>>(forward_mma_smem<T, D>(), grid, stream, hq, hk, hv, ho, l, d.L,
                                                     d.S, scale, args.causal);
  else
    launch_16bit<attention_forward_kernel<T, D>>(forward_smem<T, D>(), grid, stream, hq, hk, hv, ho, l, d.L, d.S,
                                                 scale, args.causal);
}

// What both backward paths start from: Delta = rowsum(dO * out) in a device buffer (queued on s),
// and the operands as the kernels see them (Heads). The caller sends L > 0 and S > 0 (ops/attention.cpp composes the
// empty cases).
template <typename T>
struct BackwardOperands {
  BackwardOperands(const View& q_, const View& k_, const View& v_, const View& out, const View& lse_, const View& go_,
                   const Dims& d, const Stream& s)
      : delta_buffer(s.device.index, static_cast<size_t>(d.B * d.L) * sizeof(float)),
        q(heads_of<const T>(q_, kOp)), k(heads_of<const T>(k_, kOp)), v(heads_of<const T>(v_, kOp)),
        go(heads_of<const T>(go_, kOp)), lse(static_cast<const float*>(lse_.data)),
        delta(static_cast<const float*>(delta_buffer.data())) {
    const int64_t rows = d.B * d.L;
    attention_delta_kernel<T><<<static_cast<unsigned>(std::min<int64_t>((rows + 7) / 8, kMaxBlocks)), 256, 0,
                                stream_of(s)>>>(go, heads_of<const T>(out, kOp),
                                                static_cast<float*>(delta_buffer.data()), rows, d.L, d.D);
    KILN_CUDA_CHECK(cudaGetLastError());
  }
  static constexpr const char* kOp = "scaled_dot_product_attention backward";
  DeviceBuffer delta_buffer;
  Heads<const T> q, k, v, go;
  const float *lse, *delta;
};

template <typename T, int D>
void backward_typed(const View& q, const View& k, const View& v, const View& out, const View& lse, const View& go,
                    const View& gq, const View& gk, const View& gv, const Dims& d, const AttentionArgs& args,
                    const Stream& s) {
  const bool mma = use_mma_kernels();  // before anything is queued: a bad value is an Error
  cudaStream_t stream = stream_of(s);
  const BackwardOperands<T> o(q, k, v, out, lse, go, d, s);
  const float scale = static_cast<float>(args.scale);
  const dim3 grid_q(static_cast<unsigned>((d.L + kRows - 1) / kRows), static_cast<unsigned>(d.B));
  const Heads<T> hq = heads_of<T>(gq, o.kOp), hk = heads_of<T>(gk, o.kOp), hv = heads_of<T>(gv, o.kOp);
  if (mma)
    launch_16bit<attention_grad_q_mma_kernel<T, D>>(grad_q_mma_smem<T, D>(), grid_q, stream, o.q, o.k, o.v, o.go,
                 o.lse, o.delta, hq, d.L, d.S, scale, args.causal);
  else
    launch_16bit<attention_grad_q_kernel<T, D>>(grad_q_smem<T, D>(), grid_q, stream, o.q, o.k, o.v, o.go, o.lse,
                 o.delta, hq, d.L, d.S, scale, args.causal);
  const dim3 grid_kv(static_cast<unsigned>((d.S + kRows - 1) / kRows), static_cast<unsigned>(d.B));
  if (mma)
    launch_16bit<attention_grad_kv_mma_kernel<T, D>>(grad_kv_mma_smem<T, D>(), grid_kv, stream, o.q, o.k, o.v, o.go,
                 o.lse, o.delta, hk, hv, d.L, d.S, scale, args.causal);
  else
    launch_16bit<attention_grad_kv_kernel<T, D>>(grad_kv_smem<T, D>(), grid_kv, stream, o.q, o.k, o.v, o.go, o.lse,
                 o.delta, hk, hv, d.L, d.S, scale, args.causal);
}

template <int D>
void forward_f32(const View& q, const View& k, const View& v, const View& out, const View& lse, const Dims& d,
                 const AttentionArgs& args, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((d.L + kRowsF - 1) / kRowsF), static_cast<unsigned>(d.B));
  const char* op = "scaled_dot_product_attention";
  attention_forward_f32_kernel<D><<<grid, kThreadsF, 0, stream>>>(
      heads_of<const float>(q, op), heads_of<const float>(k, op), heads_of<const float>(v, op),
      heads_of<float>(out, op), static_cast<float*>(lse.data), d.L, d.S, static_cast<float>(args.scale), args.causal);
  KILN_CUDA_CHECK(cudaGetLastError());
}

template <int D>
void backward_f32(const View& q, const View& k, const View& v, const View& out, const View& lse, const View& go,
                  const View& gq, const View& gk, const View& gv, const Dims& d, const AttentionArgs& args,
                  const Stream& s) {
  cudaStream_t stream = stream_of(s);
  const BackwardOperands<float> o(q, k, v, out, lse, go, d, s);
  const float scale = static_cast<float>(args.scale);
  const dim3 grid_q(static_cast<unsigned>((d.L + kRowsF - 1) / kRowsF), static_cast<unsigned>(d.B));
  attention_grad_q_f32_kernel<D><<<grid_q, kThreadsF, 0, stream>>>(o.q, o.k, o.v, o.go, o.lse, o.delta,
                                                                   heads_of<float>(gq, o.kOp), d.L, d.S, scale,
                                                                   args.causal);
  KILN_CUDA_CHECK(cudaGetLastError());
  const dim3 grid_kv(static_cast<unsigned>((d.S + kRowsF - 1) / kRowsF), static_cast<unsigned>(d.B));
  attention_grad_kv_f32_kernel<D><<<grid_kv, kThreadsF, 0, stream>>>(o.q, o.k, o.v, o.go, o.lse, o.delta,
                                                                     heads_of<float>(gk, o.kOp),
                                                                     heads_of<float>(gv, o.kOp), d.L, d.S, scale,
                                                                     args.causal);
  KILN_CUDA_CHECK(cudaGetLastError());
}

// Calls f.template operator()<D>() for the head dim.
template <typename F>
void dispatch_dim(int64_t D, F&& f) {
  switch (D) {
    case 32: return f.template operator()<32>();
    case 64: return f.template operator()<64>();
    case 96: return f.template operator()<96>();
    default: return f.template operator()<128>();
  }
}

// Calls f.template operator()<T, D>() for the view's 16-bit dtype and head dim.
template <typename F>
void dispatch_attention(DType dtype, int64_t D, F&& f) {
  auto by_dim = [&]<typename T>() { dispatch_dim(D, [&]<int Dim>() { f.template operator()<T, Dim>(); }); };
  if (dtype == kFloat16) by_dim.template operator()<__half>();
  else by_dim.template operator()<__nv_bfloat16>();
}

// The kernels put the row tiles on gridDim.x and the (batch, head) pairs on gridDim.y, which holds
// at most 65535. More pairs than that are launched in slices, each on its own: whole batch elements
// while one holds at most 65535 heads, else runs of heads of one batch element. Dims 0 and 1 of every
// view (lse's too) are the batch and the heads. in_slices returns whether it sliced.
constexpr int64_t kMaxGridY = 65535;

View pairs(const View& v, int64_t b0, int64_t nb, int64_t h0, int64_t nh) {
  View slice = v;
  slice.data = static_cast<char*>(v.data) + (b0 * v.strides[0] + h0 * v.strides[1]) * itemsize(v.dtype);
  slice.sizes[0] = nb;
  slice.sizes[1] = nh;
  return slice;
}

template <typename F>  // launch(b0, nb, h0, nh)
bool in_slices(const View& q, F&& launch) {
  const int64_t B = q.sizes[0], H = q.sizes[1];
  if (B * H <= kMaxGridY) return false;
  if (H <= kMaxGridY) {
    const int64_t per = kMaxGridY / H;
    for (int64_t b0 = 0; b0 < B; b0 += per) launch(b0, std::min(per, B - b0), int64_t{0}, H);
  } else {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h0 = 0; h0 < H; h0 += kMaxGridY) launch(b, int64_t{1}, h0, std::min(kMaxGridY, H - h0));
  }
  return true;
}

}  // namespace

void attention_launch(const View& q, const View& k, const View& v, const View& out, const View& lse,
                      const AttentionArgs& args, const Stream& s) {
  const Dims d = dims_of(q, k, v, "scaled_dot_product_attention");
  if (d.B == 0) return;
  if (in_slices(q, [&](int64_t b0, int64_t nb, int64_t h0, int64_t nh) {
        auto part = [&](const View& x) { return pairs(x, b0, nb, h0, nh); };
        attention_launch(part(q), part(k), part(v), part(out), part(lse), args, s);
      }))
    return;
  if (q.dtype == kFloat32) {
    return dispatch_dim(d.D, [&]<int D>() { forward_f32<D>(q, k, v, out, lse, d, args, stream_of(s)); });
  }
  dispatch_attention(q.dtype, d.D, [&]<typename T, int D>() { forward_typed<T, D>(q, k, v, out, lse, d, args, stream_of(s)); });
}

void attention_backward_launch(const View& q, const View& k, const View& v, const View& out, const View& lse,
                               const View& grad_out, const View& grad_q, const View& grad_k, const View& grad_v,
                               const AttentionArgs& args, const Stream& s) {
  const Dims d = dims_of(q, k, v, "scaled_dot_product_attention backward");
  if (d.B == 0) return;
  if (in_slices(q, [&](int64_t b0, int64_t nb, int64_t h0, int64_t nh) {
        auto part = [&](const View& x) { return pairs(x, b0, nb, h0, nh); };
        attention_backward_launch(part(q), part(k), part(v), part(out), part(lse), part(grad_out), part(grad_q),
                                  part(grad_k), part(grad_v), args, s);
      }))
    return;
  if (q.dtype == kFloat32) {
    return dispatch_dim(d.D, [&]<int D>() {
      backward_f32<D>(q, k, v, out, lse, grad_out, grad_q, grad_k, grad_v, d, args, s);
    });
  }
  dispatch_attention(q.dtype, d.D, [&]<typename T, int D>() {
    backward_typed<T, D>(q, k, v, out, lse, grad_out, grad_q, grad_k, grad_v, d, args, s);
  });
}

}  // namespace kiln::cuda
