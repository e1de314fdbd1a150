// Few-row bf16 GEMM for decode: y[m, n] = sum_k x[m, k] * W[n, k], W [N, K] row-major (nn.Linear layout).
//
// Decode at small batch is a stream over the weights. Each tile holds NB (<= 4) weight rows and MB (<= 4) input
// rows; the weight rows are loaded once per 32-wide k step and used for every input row, and the next weight rows
// are prefetched one tile ahead, which is what lifts the stream from ~18 to ~25 GB/s on two cores. Products are
// accumulated in fp32 with VDPBF16PS in a fixed order that does not depend on M or on how rows are split between
// threads, so a request's output is the same alone and in a batch.
#pragma once

#include "vec.h"

namespace sgl_cpu {

constexpr int kGemvK = 32;  // K must be a multiple of this (bf16 elements per 512-bit register)

template <int MB, int NB>
SGL_AVX512_BF16 inline void gemv_tile(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t K, uint16_t* y,
                                      int64_t ldy, bool prefetch) {
  __m512 acc[MB][NB];
#pragma GCC unroll 4
  for (int i = 0; i < MB; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_ps();
  // the next tile's NB rows start right after this tile's, so they are one contiguous range of NB * K elements
  const char* next = reinterpret_cast<const char*>(w + NB * K);
  for (int64_t k = 0; k < K; k += kGemvK) {
    if (prefetch) {
      const char* p = next + 2 * NB * k;  // NB * 64 bytes of the next tile per step
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) _mm_prefetch(p + 64 * j, _MM_HINT_T0);
    }
    __m512bh wv[NB];
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) wv[j] = (__m512bh)_mm512_loadu_si512(w + j * K + k);
#pragma GCC unroll 4
    for (int i = 0; i < MB; ++i) {
      __m512bh xv = (__m512bh)_mm512_loadu_si512(x + i * ldx + k);
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], wv[j], xv);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < MB; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) y[i * ldy + j] = float_to_bf16(_mm512_reduce_add_ps(acc[i][j]));
}

template <int NB>
SGL_AVX512_BF16 inline void gemv_rows_nb(const uint16_t* x, int64_t M, const uint16_t* w, int64_t K, uint16_t* y,
                                         int64_t ldy, bool prefetch) {
  int64_t m = 0;
  // the first group of input rows streams the weights from memory; later groups find them in L1
  for (; m + 4 <= M; m += 4) gemv_tile<4, NB>(x + m * K, K, w, K, y + m * ldy, ldy, prefetch && m == 0);
  switch (M - m) {
    case 3: gemv_tile<3, NB>(x + m * K, K, w, K, y + m * ldy, ldy, prefetch && m == 0); break;
    case 2: gemv_tile<2, NB>(x + m * K, K, w, K, y + m * ldy, ldy, prefetch && m == 0); break;
    case 1: gemv_tile<1, NB>(x + m * K, K, w, K, y + m * ldy, ldy, prefetch && m == 0); break;
    default: break;
  }
}

// Output columns [n0, n1) of y [M, N] (ldy = N) for input x [M, K] and weight W [N, K].
SGL_AVX512_BF16 inline void gemv_bf16(const uint16_t* x, int64_t M, const uint16_t* W, int64_t N, int64_t K,
                                      uint16_t* y, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) gemv_rows_nb<4>(x, M, W + n * K, K, y + n, N, n + 8 <= N);
  for (; n < n1; ++n) gemv_rows_nb<1>(x, M, W + n * K, K, y + n, N, false);
}

}  // namespace sgl_cpu
