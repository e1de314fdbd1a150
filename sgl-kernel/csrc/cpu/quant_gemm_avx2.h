// The quantized GEMM on AVX2 + FMA + F16C (the avx2 level): quant_layout.h's packed records, the activations quantized
// by quant_layout.h's rule (the same values, scales and sums as the AVX-512 level), byte dot products with VPMADDUBSW
// (Q4) and int16 ones with VPMADDWD (8-bit weights).
//
// Each 64-byte group register of a record (16 rows x 4 bytes) is read as two 32-byte halves: rows 0-7, then rows 8-15
// (a tile is walked twice, once per half; the second pass finds its records in L1/L2).
// - Q4 (u <= 15, |qa| <= 127): VPMADDUBSW (unsigned x signed bytes, adjacent pairs added into int16, saturating at
//   32767) gives pairs of at most 3810, so the int16 pair sums of all 8 groups add up without overflow (<= 30480) and
//   one VPMADDWD per block widens them: sum(u * qa), the AVX-512 level's integer, and the same fp32 FMAs after it, so
//   Q4 results are bit-identical to that level's.
// - 8-bit (u up to 255): u * qa pairs would saturate VPMADDUBSW. Instead both int8 passes of an activation are stored
//   as one int16, a16 = 254 qa + r (|a16| <= 32385: the same value, da / 254 * a16), the weights are widened to int16
//   (VPMOVZXBW) and VPMADDWD gives int32 sums of u * a16 (<= 32 * 255 * 32385 < 2^31): one product pass where the
//   byte path needs two, and no saturation. A 16-byte half of a group (4 rows x 4 k) widens to one register, so the
//   int32 lanes hold (row, k pair) sums that one VPHADDD + VPERMQ per row and block turns into 8 row sums.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "quant_layout.h"

#define SGL_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace sgl_cpu {

constexpr int kQ2MaxRowGroup = 4;  // input rows per pass over a tile half (their sums and accumulators in registers)
constexpr int kQ2HalfRows = 8;     // output rows in one 32-byte half of a group register

SGL_AVX2 inline float q2_hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

SGL_AVX2 inline int32_t q2_hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// 4 x 8 int32 (k order) -> 32 int8 with saturation (VPMOVSDB's result), stored at q.
SGL_AVX2 inline void q2_store_i8x32(int8_t* q, const __m256i (&v)[4]) {
  const __m256i ab = _mm256_packs_epi32(v[0], v[1]);  // 128-bit lanes: [a0-3 b0-3 | a4-7 b4-7]
  const __m256i cd = _mm256_packs_epi32(v[2], v[3]);
  const __m256i abcd = _mm256_packs_epi16(ab, cd);    // dwords: a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 c4-7 d4-7
  _mm256_storeu_si256((__m256i*)q, _mm256_permutevar8x32_epi32(abcd, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

// One activation row -> quant_layout.h's int8 blocks (wide = false: q [nb * 32] int8, the AVX-512 level's bytes), or
// with the residual pass (wide = true, for 8-bit weights) both passes as int16 a16 = 254 qa + r in the same
// quant_act_row_bytes(8, nb) bytes. da, sa and sh (the half-block sums, when not null) are the AVX-512 level's, bit
// for bit (same roundings, the residual with one FMA as there).
template <typename T>
SGL_AVX2 inline void quantize_row_q8_avx2(const T* x, int64_t K, int64_t nb, int8_t* q, float* da, float* sa,
                                          bool wide, float* sh = nullptr) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t k0 = b * kQBlock;
    const int64_t n = std::min<int64_t>(kQBlock, K - k0);
    alignas(32) float tail[kQBlock];
    const float* src = nullptr;
    __m256 v[4];
    if constexpr (sizeof(T) == 2) {
      if (n == kQBlock) {
        for (int j = 0; j < 4; ++j)
          v[j] = _mm256_castsi256_ps(_mm256_slli_epi32(
              _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)((const uint16_t*)x + k0 + 8 * j))), 16));
      } else {
        for (int j = 0; j < kQBlock; ++j) {
          const uint32_t bits = j < n ? (uint32_t)((const uint16_t*)x)[k0 + j] << 16 : 0u;
          __builtin_memcpy(tail + j, &bits, 4);
        }
        src = tail;
      }
    } else {
      if (n == kQBlock) {
        src = (const float*)x + k0;
      } else {
        for (int j = 0; j < kQBlock; ++j) tail[j] = j < n ? ((const float*)x)[k0 + j] : 0.0f;
        src = tail;
      }
    }
    if (src != nullptr)
      for (int j = 0; j < 4; ++j) v[j] = _mm256_loadu_ps(src + 8 * j);
    const __m256 m01 = _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1]));
    const __m256 m23 = _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3]));
    const float d = q2_hmax(_mm256_max_ps(m01, m23)) / 127.0f;
    const __m256 inv = _mm256_set1_ps(d > 0.0f ? 1.0f / d : 0.0f);
    __m256i qi[4];
    for (int j = 0; j < 4; ++j) qi[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], inv));  // round to nearest even
    da[b] = d;
    sa[b] = d * (float)q2_hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3])));
    if (sh != nullptr) {
      sh[2 * b] = d * (float)q2_hsum_epi32(_mm256_add_epi32(qi[0], qi[1]));
      sh[2 * b + 1] = d * (float)q2_hsum_epi32(_mm256_add_epi32(qi[2], qi[3]));
    }
    if (!wide) {
      q2_store_i8x32(q + k0, qi);
      continue;
    }
    const __m256 vd = _mm256_set1_ps(d);
    const __m256 inv2 = _mm256_set1_ps(d > 0.0f ? kResidualScale / d : 0.0f);
    __m256i ri[4];
    for (int j = 0; j < 4; ++j)
      ri[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_fnmadd_ps(_mm256_cvtepi32_ps(qi[j]), vd, v[j]), inv2));
    sa[b] += d / kResidualScale *
             (float)q2_hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(ri[0], ri[1]), _mm256_add_epi32(ri[2], ri[3])));
    if (sh != nullptr) {
      sh[2 * b] += d / kResidualScale * (float)q2_hsum_epi32(_mm256_add_epi32(ri[0], ri[1]));
      sh[2 * b + 1] += d / kResidualScale * (float)q2_hsum_epi32(_mm256_add_epi32(ri[2], ri[3]));
    }
    // both passes saturated to int8 as the AVX-512 level stores them, then 254 qa + r as int16
    alignas(32) int8_t q8[2][kQBlock];
    q2_store_i8x32(q8[0], qi);
    q2_store_i8x32(q8[1], ri);
    int16_t* a16 = reinterpret_cast<int16_t*>(q) + k0;
    for (int j = 0; j < kQBlock; j += 16) {
      const __m256i hi = _mm256_cvtepi8_epi16(_mm_load_si128((const __m128i*)(q8[0] + j)));
      const __m256i lo = _mm256_cvtepi8_epi16(_mm_load_si128((const __m128i*)(q8[1] + j)));
      _mm256_storeu_si256((__m256i*)(a16 + j),
                          _mm256_add_epi16(_mm256_mullo_epi16(hi, _mm256_set1_epi16((int16_t)kResidualScale)), lo));
    }
  }
}

// 8 fp32 -> 8 bf16 bits, round to nearest even, NaN -> 0x7FC0 (torch's conversion).
SGL_AVX2 inline __m128i q2_bf16_round(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  r = _mm256_srli_epi32(_mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc00000), nan), 16);
  const __m256i p = _mm256_packus_epi32(r, r);  // [r0-3 r0-3 | r4-7 r4-7]
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(p, 0x08));
}

template <typename T>
SGL_AVX2 inline void q2_store_row8(T* y, __m256 v, int n) {
  if constexpr (sizeof(T) == 4) {
    if (n == 8) {
      _mm256_storeu_ps((float*)y, v);
    } else {
      const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
      _mm256_maskstore_ps((float*)y, _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane), v);
    }
  } else {
    const __m128i h = q2_bf16_round(v);
    if (n == 8) {
      _mm_storeu_si128((__m128i*)y, h);
    } else {
      alignas(16) uint16_t buf[8];
      _mm_store_si128((__m128i*)buf, h);
      std::copy(buf, buf + n, (uint16_t*)y);
    }
  }
}

// MB input rows x one half (rows 8h .. 8h + 7) of a tile, all nb blocks; nh valid output rows of the half. FMT: a
// format code (quant_layout.h); sh: the activations' half-block sums (kQHeadHalves only). The integer sums are kept
// per half block (KH = 2: k 0-15 in s[0], k 16-31 in s[1]) only where the header scales the halves apart.
template <int FMT, int MB, typename T>
SGL_AVX2 inline void quant_half_tile_avx2(const uint8_t* tile, int64_t nb, int h, const int8_t* qa, const float* da,
                                          const float* sa, const float* sh, T* y, int64_t ldy, int nh) {
  constexpr int BITS = quant_format_bits(FMT), HEAD = quant_format_head(FMT);
  constexpr int KH = quant_format_halves(FMT) ? 2 : 1;
  constexpr int64_t rec_bytes = quant_record_bytes(FMT), header = quant_header_bytes(HEAD);
  const int64_t lda = quant_act_row_bytes(BITS, nb);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[MB];
#pragma GCC unroll 4
  for (int i = 0; i < MB; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* rec = tile + b * rec_bytes;
    if (h == 0) {
      _mm_prefetch((const char*)(rec + 4 * rec_bytes), _MM_HINT_T0);
      _mm_prefetch((const char*)(rec + 4 * rec_bytes + 64), _MM_HINT_T0);
    }
    const uint8_t* u = rec + header + 32 * h;
    __m256 dw[KH], cw[KH];  // per half block with kQHeadHalves
    if constexpr (HEAD == kQHeadF16) {
      dw[0] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(rec + 16 * h)));
      cw[0] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(rec + 32 + 16 * h)));
    } else if constexpr (HEAD == kQHeadQ6) {  // d * sc per half (exact in fp32), c = -32 d
      const __m256 d16 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(rec + 16 * h)));
#pragma GCC unroll 2
      for (int kh = 0; kh < KH; ++kh) {
        const __m128i sc = _mm_loadl_epi64((const __m128i*)(rec + 32 + 16 * kh + 8 * h));
        dw[kh] = _mm256_mul_ps(d16, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)));
        cw[kh] = _mm256_mul_ps(dw[kh], _mm256_set1_ps(-kQ6Offset));
      }
    } else {
#pragma GCC unroll 2
      for (int kh = 0; kh < KH; ++kh) {
        dw[kh] = _mm256_loadu_ps((const float*)(rec + 64 * kh) + 8 * h);
        cw[kh] = _mm256_loadu_ps((const float*)(rec + 64 * KH + 64 * kh) + 8 * h);
      }
    }
    __m256i s[KH][MB];
    float dscale = 1.0f;  // the scale of s beside d: 1 (Q4), 1 / 254 (8-bit: s counts a16 units)
    if constexpr (BITS == 4) {
      const __m256i lo = _mm256_set1_epi8(0x0F);
      __m256i s16[KH][MB];
#pragma GCC unroll 4
      for (int i = 0; i < MB; ++i) s16[0][i] = s16[KH - 1][i] = _mm256_setzero_si256();
#pragma GCC unroll 4
      for (int p = 0; p < 4; ++p) {  // register p: group p (k 4p..) in the low nibbles, group p + 4 in the high ones
        const __m256i v = _mm256_loadu_si256((const __m256i*)(u + 64 * p));
        const __m256i wl = _mm256_and_si256(v, lo);
        const __m256i wh = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo);
#pragma GCC unroll 4
        for (int i = 0; i < MB; ++i) {
          const int32_t* a = (const int32_t*)(qa + i * lda + b * kQBlock);
          s16[0][i] = _mm256_add_epi16(s16[0][i], _mm256_maddubs_epi16(wl, _mm256_set1_epi32(a[p])));
          s16[KH - 1][i] = _mm256_add_epi16(s16[KH - 1][i], _mm256_maddubs_epi16(wh, _mm256_set1_epi32(a[p + 4])));
        }
      }
#pragma GCC unroll 2
      for (int kh = 0; kh < KH; ++kh)
#pragma GCC unroll 4
        for (int i = 0; i < MB; ++i) s[kh][i] = _mm256_madd_epi16(s16[kh][i], ones);
    } else {
#pragma GCC unroll 2
      for (int kh = 0; kh < KH; ++kh) {
        __m256i slo[MB], shi[MB];  // int32 lanes: (row, k pair) of rows 0-3 / rows 4-7 of the half
#pragma GCC unroll 4
        for (int i = 0; i < MB; ++i) slo[i] = shi[i] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int g = 8 / KH * kh; g < 8 / KH * (kh + 1); ++g) {
          const __m256i wl = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(u + 64 * g)));
          const __m256i wh = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(u + 64 * g + 16)));
#pragma GCC unroll 4
          for (int i = 0; i < MB; ++i) {
            const int64_t* a = (const int64_t*)(qa + i * lda + 2 * b * kQBlock);  // a16: 4 k values = 8 bytes
            const __m256i av = _mm256_set1_epi64x(a[g]);
            slo[i] = _mm256_add_epi32(slo[i], _mm256_madd_epi16(wl, av));
            shi[i] = _mm256_add_epi32(shi[i], _mm256_madd_epi16(wh, av));
          }
        }
        // hadd: [r0 r1 r4 r5 | r2 r3 r6 r7] -> rows in order
#pragma GCC unroll 4
        for (int i = 0; i < MB; ++i) s[kh][i] = _mm256_permute4x64_epi64(_mm256_hadd_epi32(slo[i], shi[i]), 0xD8);
      }
      dscale = 1.0f / kResidualScale;
    }
#pragma GCC unroll 2
    for (int kh = 0; kh < KH; ++kh) {
      const __m256 ds = BITS == 4 ? dw[kh] : _mm256_mul_ps(dw[kh], _mm256_set1_ps(dscale));
#pragma GCC unroll 4
      for (int i = 0; i < MB; ++i)
        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[kh][i]), _mm256_mul_ps(ds, _mm256_set1_ps(da[i * nb + b])), acc[i]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < MB; ++i) {
      if constexpr (KH == 1) {
        acc[i] = _mm256_fmadd_ps(cw[0], _mm256_set1_ps(sa[i * nb + b]), acc[i]);
      } else {
        acc[i] = _mm256_fmadd_ps(cw[0], _mm256_set1_ps(sh[2 * (i * nb + b)]), acc[i]);
        acc[i] = _mm256_fmadd_ps(cw[1], _mm256_set1_ps(sh[2 * (i * nb + b) + 1]), acc[i]);
      }
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < MB; ++i) q2_store_row8<T>(y + i * ldy + kQ2HalfRows * h, acc[i], nh);
}

// All M input rows x one tile (n valid output rows), in row groups of kQ2MaxRowGroup, half by half.
template <int FMT, typename T>
SGL_AVX2 inline void quant_tile_rows_avx2(const uint8_t* tile, int64_t nb, const int8_t* qa, const float* da,
                                          const float* sa, const float* sh, int64_t M, T* y, int64_t ldy, int n) {
  const int64_t lda = quant_act_row_bytes(quant_format_bits(FMT), nb);
  const int64_t ldh = sh != nullptr ? 2 * nb : 0;
  for (int h = 0; h < 2; ++h) {
    const int nh = std::min(kQ2HalfRows, n - kQ2HalfRows * h);
    if (nh <= 0) break;
    for (int64_t m = 0; m < M; m += kQ2MaxRowGroup) {
      const int8_t* q = qa + m * lda;
      const float* d = da + m * nb;
      const float* s = sa + m * nb;
      const float* hs = sh + m * ldh;
      T* yy = y + m * ldy;
      switch (std::min<int64_t>(kQ2MaxRowGroup, M - m)) {
        case 4: quant_half_tile_avx2<FMT, 4, T>(tile, nb, h, q, d, s, hs, yy, ldy, nh); break;
        case 3: quant_half_tile_avx2<FMT, 3, T>(tile, nb, h, q, d, s, hs, yy, ldy, nh); break;
        case 2: quant_half_tile_avx2<FMT, 2, T>(tile, nb, h, q, d, s, hs, yy, ldy, nh); break;
        default: quant_half_tile_avx2<FMT, 1, T>(tile, nb, h, q, d, s, hs, yy, ldy, nh); break;
      }
    }
  }
}

// Output columns of tiles [t0, t1) of y [M, N] (quant_gemm.h's quant_gemm at this level, ldy and ty as there).
template <int FMT, typename T>
SGL_AVX2 inline void quant_gemm_avx2(const uint8_t* packed, int64_t nb, const int8_t* qa, const float* da,
                                     const float* sa, const float* sh, int64_t M, T* y, int64_t N, int64_t t0,
                                     int64_t t1, int64_t ldy = 0,
                                        int64_t ty = 0) {
  if (ldy == 0) ldy = N;
  const int64_t tile_bytes = nb * quant_record_bytes(FMT);
  for (int64_t t = t0; t < t1; ++t) {
    const int n = (int)std::min<int64_t>(kQTileRows, N - t * kQTileRows);
    quant_tile_rows_avx2<FMT, T>(packed + t * tile_bytes, nb, qa, da, sa, sh, M, y + (t - ty) * kQTileRows, ldy, n);
  }
}

}  // namespace sgl_cpu
