// bf16 <-> fp32 vector helpers for AVX-512. Each is compiled for its own target: SGL_AVX512_BF16 where it uses a BF16
// instruction (VCVTNEPS2BF16), SGL_AVX512 (the loads, the transpose, bf16_round_soft) where it does not, so that the
// kernels of level avx512_vnni can call those; callers check the level at run time (bindings.cpp) before any kernel.
#pragma once

#include <immintrin.h>

#include <cstdint>

#define SGL_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
// AVX-512 without BF16 (the avx512_vnni level's fp32 code); functions of the BF16 target may inline these.
#define SGL_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

namespace sgl_cpu {

// 16 bf16 -> 16 fp32 (exact: bf16 is the top half of an fp32).
SGL_AVX512 inline __m512 load_bf16x16(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}

// Masked form for a tail of n < 16 elements (the rest read as 0).
SGL_AVX512 inline __m512 load_bf16x16_tail(const uint16_t* p, int n) {
  __mmask16 m = (__mmask16)((1u << n) - 1u);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

// 16 fp32 -> 16 bf16, round to nearest even (torch's rounding for bf16 results).
SGL_AVX512_BF16 inline void store_bf16x16(uint16_t* p, __m512 v) {
  _mm256_storeu_si256((__m256i*)p, (__m256i)_mm512_cvtneps_pbh(v));
}

SGL_AVX512_BF16 inline void store_bf16x16_tail(uint16_t* p, __m512 v, int n) {
  __mmask16 m = (__mmask16)((1u << n) - 1u);
  _mm256_mask_storeu_epi16(p, m, (__m256i)_mm512_cvtneps_pbh(v));
}

// fp32 -> bf16 bits, round to nearest even, NaN -> 0x7FC0: torch's conversion (denormals kept, where VCVTNEPS2BF16
// flushes them to zero), integer ops only -- for the code of levels without BF16 (quant_gemm.h's VNNI path, the
// quantized-KV kernels).
SGL_AVX512 inline __m256i bf16_round_soft(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7fc00000));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}

SGL_AVX512 inline void store_bf16x16_soft(uint16_t* p, __m512 v) {
  _mm256_storeu_si256((__m256i*)p, bf16_round_soft(v));
}

// Scalar fp32 -> bf16, the same rounding as the vector forms.
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

// Round an fp32 vector to bf16 precision and back (what storing and reloading a bf16 tensor does).
SGL_AVX512_BF16 inline __m512 round_bf16(__m512 v) {
  __m256bh h = _mm512_cvtneps_pbh(v);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)h), 16));
}

// In-register transpose of a 16 x 16 block of 32-bit values: r[i][j] -> r[j][i].
SGL_AVX512 inline void transpose_16x16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xDD);
    t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xDD);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xDD);
    r[i + 4] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0x88);
    r[i + 12] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0xDD);
  }
}

}  // namespace sgl_cpu
