// GEMV/GEMM over block-quantized weights (GGUF Q4_0 / Q4_1 / Q8_0 and int8 weight-only), dequantized in registers.
//
// Every supported type is written as w = d * u + c per block of 32 weights of one row, with u an unsigned integer
// (4-bit for Q4_0/Q4_1, 8-bit for Q8_0/int8 stored with +128) and d, c one fp16 pair per block:
//   Q4_0: u = q, c = -8 d;  Q4_1: u = q, c = m;  Q8_0 / int8: u = q + 128, c = -128 d.
// Activations are quantized to int8 per block of 32 values (a = da * qa, as llama.cpp does for its integer dot
// products), so one block's dot product is  d * da * sum(u * qa) + c * da * sum(qa):  the integer sum comes from
// VPDPBUSD (unsigned x signed bytes), the rest is two fp32 FMAs per block.
//
// Packed layout (quant_pack in layers/quantization/packing.py writes it once at load): output rows in tiles of 16,
// each tile a run of records, one per 32-wide block of K:
//   [16 x fp16 d][16 x fp16 c][u: 8 groups of 4 k values, each group one 64-byte register: lane r = row r's 4 bytes]
// Q4 records hold the 8 groups in 4 registers (group g in the low nibbles, group g + 4 in the high nibbles):
// 320 bytes per 16 x 32 weights (0.625 B/weight); Q8 records 576 bytes (1.125 B/weight). A tile's records are
// contiguous, so each thread streams one range of memory. One int32 lane per output row: no horizontal sums.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "vec.h"

#define SGL_AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vnni,f16c")))

namespace sgl_cpu {

constexpr int kQBlock = 32;        // weights (and activations) per scale
constexpr int kQTileRows = 16;     // output rows per tile (one fp32 / int32 lane each)
constexpr int kQMaxRowGroup = 8;   // input rows whose accumulators stay in registers
constexpr int64_t kQ4RecordBytes = 64 + 4 * 64;
constexpr int64_t kQ8RecordBytes = 64 + 8 * 64;

inline int64_t quant_record_bytes(int bits) { return bits == 4 ? kQ4RecordBytes : kQ8RecordBytes; }
// bytes of one quantized activation row: the int8 values, then for 8-bit weights their residual pass
inline int64_t quant_act_row_bytes(int bits, int64_t nb) { return (bits == 8 ? 2 : 1) * nb * kQBlock; }

// One activation row (K values, float or bf16) -> int8 per block of 32 (K padded with zeros to nb * 32),
// da[b] = scale, sa[b] = scale * sum of the block's int8 values.
// With q2 (not null) the rounding residual is quantized again, to int8 of scale da / kResidualScale, into q2: the
// two int8 passes carry about 15 bits of each activation (used with 8-bit weights, where one pass's error would
// dominate the weights').
constexpr float kResidualScale = 254.0f;

template <typename T>
SGL_AVX512_VNNI inline void quantize_row_q8(const T* x, int64_t K, int64_t nb, int8_t* q, float* da, float* sa,
                                            int8_t* q2 = nullptr) {
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t k0 = b * kQBlock;
    const int n0 = (int)std::min<int64_t>(16, std::max<int64_t>(0, K - k0));
    const int n1 = (int)std::min<int64_t>(16, std::max<int64_t>(0, K - k0 - 16));
    __m512 v0, v1;
    if constexpr (sizeof(T) == 2) {
      v0 = n0 == 16 ? load_bf16x16((const uint16_t*)x + k0) : load_bf16x16_tail((const uint16_t*)x + k0, n0);
      v1 = n1 == 16 ? load_bf16x16((const uint16_t*)x + k0 + 16) : load_bf16x16_tail((const uint16_t*)x + k0 + 16, n1);
    } else {
      v0 = _mm512_maskz_loadu_ps((__mmask16)((1u << n0) - 1u), (const float*)x + k0);
      v1 = _mm512_maskz_loadu_ps((__mmask16)((1u << n1) - 1u), (const float*)x + k0 + 16);
    }
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    const float d = amax / 127.0f;
    const __m512 inv = _mm512_set1_ps(d > 0.0f ? 1.0f / d : 0.0f);
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, inv));  // round to nearest even
    const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, inv));
    _mm_storeu_si128((__m128i*)(q + k0), _mm512_cvtsepi32_epi8(q0));
    _mm_storeu_si128((__m128i*)(q + k0 + 16), _mm512_cvtsepi32_epi8(q1));
    da[b] = d;
    sa[b] = d * (float)_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    if (q2 != nullptr) {
      const __m512 vd = _mm512_set1_ps(d);
      const __m512 inv2 = _mm512_set1_ps(d > 0.0f ? kResidualScale / d : 0.0f);
      const __m512i r0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_fnmadd_ps(_mm512_cvtepi32_ps(q0), vd, v0), inv2));
      const __m512i r1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_fnmadd_ps(_mm512_cvtepi32_ps(q1), vd, v1), inv2));
      _mm_storeu_si128((__m128i*)(q2 + k0), _mm512_cvtsepi32_epi8(r0));
      _mm_storeu_si128((__m128i*)(q2 + k0 + 16), _mm512_cvtsepi32_epi8(r1));
      sa[b] += d / kResidualScale * (float)_mm512_reduce_add_epi32(_mm512_add_epi32(r0, r1));
    }
  }
}

// The 8 groups of one record's weights as unsigned bytes.
template <int BITS>
SGL_AVX512_VNNI inline void load_record_u8(const uint8_t* rec, __m512i* wv) {
  const uint8_t* u = rec + 64;
  if constexpr (BITS == 4) {
    const __m512i lo = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) {
      const __m512i v = _mm512_loadu_si512(u + 64 * p);
      wv[p] = _mm512_and_si512(v, lo);
      wv[p + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), lo);
    }
  } else {
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) wv[g] = _mm512_loadu_si512(u + 64 * g);
  }
}

template <typename T>
SGL_AVX512_VNNI inline void store_row16(T* y, __m512 v, int n) {
  if constexpr (sizeof(T) == 2) {
    if (n == 16) store_bf16x16((uint16_t*)y, v); else store_bf16x16_tail((uint16_t*)y, v, n);
  } else {
    _mm512_mask_storeu_ps((float*)y, (__mmask16)((1u << n) - 1u), v);
  }
}

// MB input rows x one tile of 16 output rows, all nb blocks; y rows are ldy apart, n valid columns.
template <int BITS, int MB, typename T>
SGL_AVX512_VNNI inline void quant_tile(const uint8_t* tile, int64_t nb, const int8_t* qa, const float* da,
                                       const float* sa, T* y, int64_t ldy, int n) {
  constexpr int64_t rec_bytes = BITS == 4 ? kQ4RecordBytes : kQ8RecordBytes;
  const int64_t lda = quant_act_row_bytes(BITS, nb);
  __m512 acc[MB];
#pragma GCC unroll 8
  for (int i = 0; i < MB; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* rec = tile + b * rec_bytes;
    _mm_prefetch((const char*)(rec + 4 * rec_bytes), _MM_HINT_T0);
    _mm_prefetch((const char*)(rec + 4 * rec_bytes + 64), _MM_HINT_T0);
    __m512i wv[8];
    load_record_u8<BITS>(rec, wv);
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)rec));
    const __m512 cw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(rec + 32)));
#pragma GCC unroll 8
    for (int i = 0; i < MB; ++i) {
      const int32_t* a = (const int32_t*)(qa + i * lda + b * kQBlock);
      __m512i s = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int g = 0; g < 8; ++g) s = _mm512_dpbusd_epi32(s, wv[g], _mm512_set1_epi32(a[g]));
      const __m512 dwa = _mm512_mul_ps(dw, _mm512_set1_ps(da[i * nb + b]));
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), dwa, acc[i]);
      if constexpr (BITS == 8) {  // the activations' residual pass (quantize_row_q8's q2, right after q)
        const int32_t* a2 = a + nb * kQBlock / 4;
        __m512i s2 = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int g = 0; g < 8; ++g) s2 = _mm512_dpbusd_epi32(s2, wv[g], _mm512_set1_epi32(a2[g]));
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s2), _mm512_mul_ps(dwa, _mm512_set1_ps(1.0f / kResidualScale)), acc[i]);
      }
      acc[i] = _mm512_fmadd_ps(cw, _mm512_set1_ps(sa[i * nb + b]), acc[i]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MB; ++i) store_row16<T>(y + i * ldy, acc[i], n);
}

template <int BITS, typename T>
SGL_AVX512_VNNI inline void quant_tile_rows(const uint8_t* tile, int64_t nb, const int8_t* qa, const float* da,
                                            const float* sa, int64_t M, T* y, int64_t ldy, int n) {
  const int64_t lda = quant_act_row_bytes(BITS, nb);
  int64_t m = 0;
  for (; m + kQMaxRowGroup <= M; m += kQMaxRowGroup)
    quant_tile<BITS, kQMaxRowGroup, T>(tile, nb, qa + m * lda, da + m * nb, sa + m * nb, y + m * ldy, ldy, n);
  const int64_t r = M - m;
  const int8_t* q = qa + m * lda;
  const float* d = da + m * nb;
  const float* s = sa + m * nb;
  T* yy = y + m * ldy;
  switch (r) {
    case 7: quant_tile<BITS, 7, T>(tile, nb, q, d, s, yy, ldy, n); break;
    case 6: quant_tile<BITS, 6, T>(tile, nb, q, d, s, yy, ldy, n); break;
    case 5: quant_tile<BITS, 5, T>(tile, nb, q, d, s, yy, ldy, n); break;
    case 4: quant_tile<BITS, 4, T>(tile, nb, q, d, s, yy, ldy, n); break;
    case 3: quant_tile<BITS, 3, T>(tile, nb, q, d, s, yy, ldy, n); break;
    case 2: quant_tile<BITS, 2, T>(tile, nb, q, d, s, yy, ldy, n); break;
    case 1: quant_tile<BITS, 1, T>(tile, nb, q, d, s, yy, ldy, n); break;
    default: break;
  }
}

// Output columns of tiles [t0, t1) of y [M, N] for activations already quantized (qa [M, nb * 32], da/sa [M, nb]).
template <int BITS, typename T>
SGL_AVX512_VNNI inline void quant_gemm(const uint8_t* packed, int64_t nb, const int8_t* qa, const float* da,
                                       const float* sa, int64_t M, T* y, int64_t N, int64_t t0, int64_t t1) {
  const int64_t tile_bytes = nb * (BITS == 4 ? kQ4RecordBytes : kQ8RecordBytes);
  for (int64_t t = t0; t < t1; ++t) {
    const int n = (int)std::min<int64_t>(kQTileRows, N - t * kQTileRows);
    quant_tile_rows<BITS, T>(packed + t * tile_bytes, nb, qa, da, sa, M, y + t * kQTileRows, N, n);
  }
}

}  // namespace sgl_cpu
