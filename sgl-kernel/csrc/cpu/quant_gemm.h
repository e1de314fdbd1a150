// The quantized GEMM on AVX-512 VNNI (the avx512_vnni level and above): weights in quant_layout.h's packed records (each
// format code a template instance),
// dequantized in registers, int8 activations, VPDPBUSD (unsigned weight bytes x signed activation bytes) into one
// int32 lane per output row.
//
// Nothing here needs AVX-512 BF16: bf16 inputs are widened with integer shifts, and bf16 outputs are rounded either
// in software (AVX-512 F/BW integer ops, the same bits as torch's fp32 -> bf16) or, where the level has BF16, by
// VCVTNEPS2BF16 in a separate out-of-line function (HW_BF16), so no BF16 code is inlined into the VNNI path.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "quant_layout.h"
#include "vec.h"  // bf16_round_soft

#define SGL_AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")))
#define SGL_AVX512_VNNI_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16,fma,f16c")))

namespace sgl_cpu {

constexpr int kQMaxRowGroup = 8;   // input rows whose accumulators stay in registers
// ONE_PASS (quant_tile): 16 rows a group, each block's weights read once per 16 rows (no residual dot products to
// hold): the Gemma 3 270M lm_head's fused argmax at 32 rows 20.6 -> 19.0 ms on one AMD EPYC core
constexpr int kQOnePassRowGroup = 16;

// How far ahead of the record being read the weight stream is prefetched, in records: every 64-byte line of that
// record (576 bytes for an 8-bit one), not only its first two, so the records are in L1 when the dot products reach
// them. A decode-sized call streams a large table once (the Gemma 3 270M lm_head: 189 MB of Q8_0) with little work
// per record, and waited on those loads (bench_lm_head_decode.py).
constexpr int kQPrefetchRecords = 6;

// Every line of the record `ahead` bytes on (by default kQPrefetchRecords records on in the same stream).
template <int64_t REC_BYTES>
inline void quant_prefetch_record(const uint8_t* rec, int64_t ahead = kQPrefetchRecords * REC_BYTES) {
#pragma GCC unroll 16
  for (int64_t l = 0; l < REC_BYTES; l += 64) _mm_prefetch((const char*)(rec + ahead + l), _MM_HINT_T0);
}

// n (<= 16) bf16 -> fp32 (exact: bf16 is the top half of an fp32); lanes from n on read as 0.
SGL_AVX512_VNNI inline __m512 q_load_bf16(const uint16_t* p, int n) {
  const __m256i h = n == 16 ? _mm256_loadu_si256((const __m256i*)p) : _mm256_maskz_loadu_epi16((__mmask16)((1u << n) - 1u), p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// rows x n fp32 values (16 apart in buf) -> bf16 rows of y (ldy apart) with VCVTNEPS2BF16. Out of line on purpose:
// the VNNI-only code calls it and never inlines BF16 instructions.
SGL_AVX512_VNNI_BF16 __attribute__((noinline)) inline void q_store_bf16_hw(uint16_t* y, int64_t ldy, const float* buf,
                                                                           int rows, int n) {
  const __mmask16 m = (__mmask16)((1u << n) - 1u);
  for (int i = 0; i < rows; ++i)
    _mm256_mask_storeu_epi16(y + i * ldy, m, (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(buf + 16 * i)));
}

// The first `rows` of R accumulators (R: the bf16 staging buffer's rows), columns [0, n), into y (rows ldy apart):
// fp32 as they are, bf16 by q_store_bf16_hw (HW_BF16) or rounded in software. Every quantized tile (VNNI, AMX) ends so.
template <int R, typename T, bool HW_BF16>
SGL_AVX512_VNNI __attribute__((always_inline)) inline void q_store_rows(const __m512* acc, T* y, int64_t ldy, int rows,
                                                                       int n) {
  const __mmask16 m = (__mmask16)((1u << n) - 1u);
  if constexpr (sizeof(T) == 4) {
    for (int i = 0; i < rows; ++i) _mm512_mask_storeu_ps((float*)(y + i * ldy), m, acc[i]);
  } else if constexpr (HW_BF16) {
    alignas(64) float buf[R * 16];
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i) _mm512_store_ps(buf + 16 * i, acc[i]);
    q_store_bf16_hw((uint16_t*)y, ldy, buf, rows, n);
  } else {
    for (int i = 0; i < rows; ++i) _mm256_mask_storeu_epi16((uint16_t*)(y + i * ldy), m, bf16_round_soft(acc[i]));
  }
}

// One activation row -> int8 blocks (quant_layout.h); the AVX2 level's quantize_row_q8_avx2 gives the same bytes.
template <typename T>
SGL_AVX512_VNNI inline void quantize_row_q8(const T* x, int64_t K, int64_t nb, int8_t* q, float* da, float* sa,
                                            int8_t* q2 = nullptr, float* sh = nullptr) {
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t k0 = b * kQBlock;
    const int n0 = (int)std::min<int64_t>(16, std::max<int64_t>(0, K - k0));
    const int n1 = (int)std::min<int64_t>(16, std::max<int64_t>(0, K - k0 - 16));
    __m512 v0, v1;
    if constexpr (sizeof(T) == 2) {
      v0 = q_load_bf16((const uint16_t*)x + k0, n0);
      v1 = q_load_bf16((const uint16_t*)x + k0 + 16, n1);
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
    if (sh != nullptr) {
      sh[2 * b] = d * (float)_mm512_reduce_add_epi32(q0);
      sh[2 * b + 1] = d * (float)_mm512_reduce_add_epi32(q1);
    }
    if (q2 != nullptr) {
      const __m512 vd = _mm512_set1_ps(d);
      const __m512 inv2 = _mm512_set1_ps(d > 0.0f ? kResidualScale / d : 0.0f);
      const __m512i r0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_fnmadd_ps(_mm512_cvtepi32_ps(q0), vd, v0), inv2));
      const __m512i r1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_fnmadd_ps(_mm512_cvtepi32_ps(q1), vd, v1), inv2));
      _mm_storeu_si128((__m128i*)(q2 + k0), _mm512_cvtsepi32_epi8(r0));
      _mm_storeu_si128((__m128i*)(q2 + k0 + 16), _mm512_cvtsepi32_epi8(r1));
      sa[b] += d / kResidualScale * (float)_mm512_reduce_add_epi32(_mm512_add_epi32(r0, r1));
      if (sh != nullptr) {
        sh[2 * b] += d / kResidualScale * (float)_mm512_reduce_add_epi32(r0);
        sh[2 * b + 1] += d / kResidualScale * (float)_mm512_reduce_add_epi32(r1);
      }
    }
  }
}

// The 8 groups of one record's weights as unsigned bytes (after a header of HEADER bytes).
template <int BITS, int64_t HEADER = 64>
SGL_AVX512_VNNI inline void load_record_u8(const uint8_t* rec, __m512i* wv) {
  const uint8_t* u = rec + HEADER;
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

// sum over groups [G0, G1) of u * qa per row (a: the block's activations as int32 words, 4 k values each)
template <int G0, int G1>
SGL_AVX512_VNNI inline __m512i q_dot_groups(const __m512i* wv, const int32_t* a) {
  __m512i s = _mm512_setzero_si512();
#pragma GCC unroll 8
  for (int g = G0; g < G1; ++g) s = _mm512_dpbusd_epi32(s, wv[g], _mm512_set1_epi32(a[g]));
  return s;
}

// A record's per-row scales d, c (kQHeadHalves / kQHeadQ6: of k 0-15; dw1, cw1 of k 16-31), from its header.
template <int HEAD>
SGL_AVX512_VNNI inline void load_record_scales(const uint8_t* rec, __m512& dw, __m512& cw, __m512& dw1, __m512& cw1) {
  if constexpr (HEAD == kQHeadF16) {
    dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)rec));
    cw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(rec + 32)));
  } else if constexpr (HEAD == kQHeadF32) {
    dw = _mm512_loadu_ps(rec);
    cw = _mm512_loadu_ps(rec + 64);
  } else if constexpr (HEAD == kQHeadHalves) {
    dw = _mm512_loadu_ps(rec);
    dw1 = _mm512_loadu_ps(rec + 64);
    cw = _mm512_loadu_ps(rec + 128);
    cw1 = _mm512_loadu_ps(rec + 192);
  } else {  // kQHeadQ6: d * sc per half (exact in fp32), c = -32 d
    const __m512 d16 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)rec));
    dw = _mm512_mul_ps(d16, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(rec + 32)))));
    dw1 = _mm512_mul_ps(d16, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(rec + 48)))));
    cw = _mm512_mul_ps(dw, _mm512_set1_ps(-kQ6Offset));
    cw1 = _mm512_mul_ps(dw1, _mm512_set1_ps(-kQ6Offset));
  }
}

// A block's (or half block's) integer sums as the one fp32 factor of d * da: for 8-bit weights the main pass's sum plus
// the residual pass's over kResidualScale (one FMA, so the block costs one scaling FMA, not two, in every row's
// epilogue); for 4-bit weights the main sum alone (res unused). Exact but for the FMA's one rounding (2^-24 of it).
template <int BITS>
SGL_AVX512_VNNI __attribute__((always_inline)) inline __m512 quant_block_sum(__m512i main, __m512i res, __m512 inv_scale) {
  if constexpr (BITS == 8) return _mm512_fmadd_ps(_mm512_cvtepi32_ps(res), inv_scale, _mm512_cvtepi32_ps(main));
  else return _mm512_cvtepi32_ps(main);
}

// MB input rows x one tile of 16 output rows, all nb blocks; y rows are ldy apart, n valid columns. FMT: a format
// code (quant_layout.h). T = float, or uint16_t for bf16 (rounded by VCVTNEPS2BF16 with HW_BF16, else in software: the
// same bits but for denormals). sh: the activations' half-block sums (kQHeadHalves only). ONE_PASS: 8-bit weights
// times the activations' first int8 pass only (no residual rows in qa): half the byte dot products of a block.
template <int FMT, int MB, typename T, bool HW_BF16, bool ONE_PASS = false>
SGL_AVX512_VNNI inline void quant_tile(const uint8_t* tile, int64_t nb, const int8_t* qa, const float* da,
                                       const float* sa, const float* sh, T* y, int64_t ldy, int n) {
  constexpr int BITS = quant_format_bits(FMT), HEAD = quant_format_head(FMT);
  constexpr int SUM_BITS = ONE_PASS ? 4 : BITS;  // quant_block_sum's: the residual's sum only with two passes
  constexpr int64_t rec_bytes = quant_record_bytes(FMT), header = quant_header_bytes(HEAD);
  const int64_t lda = quant_act_row_bytes(BITS, nb, ONE_PASS);
  const __m512 residual = _mm512_set1_ps(1.0f / kResidualScale);
  __m512 acc[MB];
#pragma GCC unroll 16
  for (int i = 0; i < MB; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* rec = tile + b * rec_bytes;
    quant_prefetch_record<rec_bytes>(rec);
    __m512i wv[8];
    load_record_u8<BITS, header>(rec, wv);
    __m512 dw, cw, dw1, cw1;  // d, c (kQHeadHalves: of k 0-15; dw1, cw1 of k 16-31)
    load_record_scales<HEAD>(rec, dw, cw, dw1, cw1);
#pragma GCC unroll 8
    for (int i = 0; i < MB; ++i) {
      const int32_t* a = (const int32_t*)(qa + i * lda + b * kQBlock);
      const int32_t* a2 = a + nb * kQBlock / 4;  // 8-bit weights: the residual pass (quantize_row_q8's q2, after q)
      const __m512 dai = _mm512_set1_ps(da[i * nb + b]);
      if constexpr (!quant_format_halves(FMT)) {
        const __m512 dwa = _mm512_mul_ps(dw, dai);
        const __m512i dot = q_dot_groups<0, 8>(wv, a), res = SUM_BITS == 8 ? q_dot_groups<0, 8>(wv, a2) : dot;
        acc[i] = _mm512_fmadd_ps(quant_block_sum<SUM_BITS>(dot, res, residual), dwa, acc[i]);
        acc[i] = _mm512_fmadd_ps(cw, _mm512_set1_ps(sa[i * nb + b]), acc[i]);
      } else {  // groups 0-3 are k 0-15, groups 4-7 k 16-31: each half its own d and c
        const __m512 dwa0 = _mm512_mul_ps(dw, dai), dwa1 = _mm512_mul_ps(dw1, dai);
        const __m512i dot0 = q_dot_groups<0, 4>(wv, a), dot1 = q_dot_groups<4, 8>(wv, a);
        const __m512i res0 = SUM_BITS == 8 ? q_dot_groups<0, 4>(wv, a2) : dot0;
        const __m512i res1 = SUM_BITS == 8 ? q_dot_groups<4, 8>(wv, a2) : dot1;
        acc[i] = _mm512_fmadd_ps(quant_block_sum<SUM_BITS>(dot0, res0, residual), dwa0, acc[i]);
        acc[i] = _mm512_fmadd_ps(quant_block_sum<SUM_BITS>(dot1, res1, residual), dwa1, acc[i]);
        acc[i] = _mm512_fmadd_ps(cw, _mm512_set1_ps(sh[2 * (i * nb + b)]), acc[i]);
        acc[i] = _mm512_fmadd_ps(cw1, _mm512_set1_ps(sh[2 * (i * nb + b) + 1]), acc[i]);
      }
    }
  }
  q_store_rows<MB, T, HW_BF16>(acc, y, ldy, MB, n);
}

template <int FMT, typename T, bool HW_BF16, bool ONE_PASS>
SGL_AVX512_VNNI inline void quant_tile_rows(const uint8_t* tile, int64_t nb, const int8_t* qa, const float* da,
                                            const float* sa, const float* sh, int64_t M, T* y, int64_t ldy, int n) {
  const int64_t lda = quant_act_row_bytes(quant_format_bits(FMT), nb, ONE_PASS);
  const int64_t ldh = sh != nullptr ? 2 * nb : 0;
  int64_t m = 0;
  if constexpr (ONE_PASS)
    for (; m + kQOnePassRowGroup <= M; m += kQOnePassRowGroup)
      quant_tile<FMT, kQOnePassRowGroup, T, HW_BF16, ONE_PASS>(tile, nb, qa + m * lda, da + m * nb, sa + m * nb,
                                                               sh + m * ldh, y + m * ldy, ldy, n);
  for (; m + kQMaxRowGroup <= M; m += kQMaxRowGroup)
    quant_tile<FMT, kQMaxRowGroup, T, HW_BF16, ONE_PASS>(tile, nb, qa + m * lda, da + m * nb, sa + m * nb,
                                                         sh + m * ldh, y + m * ldy, ldy, n);
  const int64_t r = M - m;
  const int8_t* q = qa + m * lda;
  const float* d = da + m * nb;
  const float* s = sa + m * nb;
  const float* h = sh + m * ldh;
  T* yy = y + m * ldy;
  switch (r) {
    case 7: quant_tile<FMT, 7, T, HW_BF16, ONE_PASS>(tile, nb, q, d, s, h, yy, ldy, n); break;
    case 6: quant_tile<FMT, 6, T, HW_BF16, ONE_PASS>(tile, nb, q, d, s, h, yy, ldy, n); break;
    case 5: quant_tile<FMT, 5, T, HW_BF16, ONE_PASS>(tile, nb, q, d, s, h, yy, ldy, n); break;
    case 4: quant_tile<FMT, 4, T, HW_BF16, ONE_PASS>(tile, nb, q, d, s, h, yy, ldy, n); break;
    case 3: quant_tile<FMT, 3, T, HW_BF16, ONE_PASS>(tile, nb, q, d, s, h, yy, ldy, n); break;
    case 2: quant_tile<FMT, 2, T, HW_BF16, ONE_PASS>(tile, nb, q, d, s, h, yy, ldy, n); break;
    case 1: quant_tile<FMT, 1, T, HW_BF16, ONE_PASS>(tile, nb, q, d, s, h, yy, ldy, n); break;
    default: break;
  }
}

// Output columns of tiles [t0, t1) of y [M, N] for activations already quantized (qa [M, quant_act_row_bytes], da/sa
// [M, nb], sh [M, 2 * nb] for kQHeadHalves, else null). ldy: y's row stride (0: N); tile t's columns start at
// (t - ty) * 16 of y, so a caller may hand a buffer of a few tiles' columns (ty = its first tile). ONE_PASS: as
// quant_tile's (qa without the residual rows).
template <int FMT, typename T, bool HW_BF16, bool ONE_PASS = false>
SGL_AVX512_VNNI inline void quant_gemm(const uint8_t* packed, int64_t nb, const int8_t* qa, const float* da,
                                       const float* sa, const float* sh, int64_t M, T* y, int64_t N, int64_t t0,
                                       int64_t t1, int64_t ldy = 0,
                                        int64_t ty = 0) {
  if (ldy == 0) ldy = N;
  const int64_t tile_bytes = nb * quant_record_bytes(FMT);
  for (int64_t t = t0; t < t1; ++t) {
    const int n = (int)std::min<int64_t>(kQTileRows, N - t * kQTileRows);
    quant_tile_rows<FMT, T, HW_BF16, ONE_PASS>(packed + t * tile_bytes, nb, qa, da, sa, sh, M,
                                               y + (t - ty) * kQTileRows, ldy, n);
  }
}

}  // namespace sgl_cpu
