// fp32 vector operations of the two levels below avx512_bf16, under one interface so that the fp32 kernels
// (kernels_f32.h) are written once:
//   F32x16  AVX-512 F/BW/VL/DQ (the avx512_vnni level): 16 lanes, masked tails
//   F32x8   AVX2 + FMA (the avx2 level): 8 lanes, VMASKMOV tails
// Every member carries its level's target attribute only (gcc will not inline a function into a caller whose target
// lacks one of its features, and code built for a higher target must never run at the lower level).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "vec_math.h"

#ifndef SGL_AVX2
#define SGL_AVX2 __attribute__((target("avx2,fma,f16c")))
#endif

namespace sgl_cpu {

struct F32x16 {
  using reg = __m512;
  static constexpr int W = 16;
  static constexpr int kVChunk = 4;  // value registers per head held across a pass over the keys (attention)
  SGL_AVX512 static inline __mmask16 mask(int n) { return (__mmask16)((1u << n) - 1u); }
  SGL_AVX512 static inline reg zero() { return _mm512_setzero_ps(); }
  SGL_AVX512 static inline reg set1(float f) { return _mm512_set1_ps(f); }
  SGL_AVX512 static inline reg load(const float* p) { return _mm512_loadu_ps(p); }
  SGL_AVX512 static inline reg load_tail(const float* p, int n) { return _mm512_maskz_loadu_ps(mask(n), p); }
  SGL_AVX512 static inline void store(float* p, reg v) { _mm512_storeu_ps(p, v); }
  SGL_AVX512 static inline void store_tail(float* p, reg v, int n) { _mm512_mask_storeu_ps(p, mask(n), v); }
  SGL_AVX512 static inline reg add(reg a, reg b) { return _mm512_add_ps(a, b); }
  SGL_AVX512 static inline reg sub(reg a, reg b) { return _mm512_sub_ps(a, b); }
  SGL_AVX512 static inline reg mul(reg a, reg b) { return _mm512_mul_ps(a, b); }
  SGL_AVX512 static inline reg div(reg a, reg b) { return _mm512_div_ps(a, b); }
  SGL_AVX512 static inline reg fmadd(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
  SGL_AVX512 static inline reg max(reg a, reg b) { return _mm512_max_ps(a, b); }
  // a tail lane that must not win a max: -inf there
  SGL_AVX512 static inline reg load_tail_or(const float* p, int n, float fill) {
    return _mm512_mask_loadu_ps(_mm512_set1_ps(fill), mask(n), p);
  }
  SGL_AVX512 static inline float hsum(reg v) { return _mm512_reduce_add_ps(v); }
  SGL_AVX512 static inline float hmax(reg v) { return _mm512_reduce_max_ps(v); }
  SGL_AVX512 static inline reg exp(reg v) { return exp_ps(v); }
};

struct F32x8 {
  using reg = __m256;
  static constexpr int W = 8;
  static constexpr int kVChunk = 2;  // 16 ymm registers: 4 heads x 2 accumulators + 2 value registers + spare
  SGL_AVX2 static inline __m256i mask(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  SGL_AVX2 static inline reg zero() { return _mm256_setzero_ps(); }
  SGL_AVX2 static inline reg set1(float f) { return _mm256_set1_ps(f); }
  SGL_AVX2 static inline reg load(const float* p) { return _mm256_loadu_ps(p); }
  SGL_AVX2 static inline reg load_tail(const float* p, int n) { return _mm256_maskload_ps(p, mask(n)); }
  SGL_AVX2 static inline void store(float* p, reg v) { _mm256_storeu_ps(p, v); }
  SGL_AVX2 static inline void store_tail(float* p, reg v, int n) { _mm256_maskstore_ps(p, mask(n), v); }
  SGL_AVX2 static inline reg add(reg a, reg b) { return _mm256_add_ps(a, b); }
  SGL_AVX2 static inline reg sub(reg a, reg b) { return _mm256_sub_ps(a, b); }
  SGL_AVX2 static inline reg mul(reg a, reg b) { return _mm256_mul_ps(a, b); }
  SGL_AVX2 static inline reg div(reg a, reg b) { return _mm256_div_ps(a, b); }
  SGL_AVX2 static inline reg fmadd(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  SGL_AVX2 static inline reg max(reg a, reg b) { return _mm256_max_ps(a, b); }
  SGL_AVX2 static inline reg load_tail_or(const float* p, int n, float fill) {
    const __m256i m = mask(n);
    return _mm256_blendv_ps(_mm256_set1_ps(fill), _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
  }
  SGL_AVX2 static inline float hsum(reg v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
  }
  SGL_AVX2 static inline float hmax(reg v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
  }
  // exp_ps's method: 2^n built in the exponent bits (no VSCALEF); x is clamped to [-87.3, 88.3] so n stays in
  // [-126, 127], a normal power of two.
  SGL_AVX2 static inline reg exp(reg x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  }
};

}  // namespace sgl_cpu
