// RMSNorm over rows of a bf16 [rows, hidden] tensor, optionally after the residual add that precedes it.
//
// The rounding follows the torch path of RMSNorm._norm exactly: the residual sum is rounded to bf16, the
// normalisation runs in fp32 and is rounded to bf16, then multiplied by the bf16 weight and rounded again.
// With an fp32 scale instead of the bf16 weight (Gemma's 1 + w), the scale is applied in fp32 and rounded once.
#pragma once

#include <cmath>

#include "vec.h"

namespace sgl_cpu {

// The rows' shared first half: the residual sum (rounded to bf16 into residual_out, when residual != null) and
// 1 / rms of the row that is normalised. *src is set to that row (x, or residual_out).
SGL_AVX512_BF16 inline float rmsnorm_inv_rms(const uint16_t* x, const uint16_t* residual, uint16_t* residual_out,
                                             int64_t hidden, float eps, const uint16_t** src) {
  *src = x;
  if (residual != nullptr) {
    int64_t i = 0;
    for (; i + 16 <= hidden; i += 16)
      store_bf16x16(residual_out + i, _mm512_add_ps(load_bf16x16(x + i), load_bf16x16(residual + i)));
    if (i < hidden) {
      int n = (int)(hidden - i);
      store_bf16x16_tail(residual_out + i,
                         _mm512_add_ps(load_bf16x16_tail(x + i, n), load_bf16x16_tail(residual + i, n)), n);
    }
    *src = residual_out;
  }
  __m512 ss = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= hidden; i += 16) {
    __m512 v = load_bf16x16(*src + i);
    ss = _mm512_fmadd_ps(v, v, ss);
  }
  if (i < hidden) {
    __m512 v = load_bf16x16_tail(*src + i, (int)(hidden - i));
    ss = _mm512_fmadd_ps(v, v, ss);
  }
  return 1.0f / std::sqrt(_mm512_reduce_add_ps(ss) / (float)hidden + eps);
}

// x, residual (may be null), out, residual_out (used when residual != null): rows of `hidden` elements.
SGL_AVX512_BF16 inline void rmsnorm_row(const uint16_t* x, const uint16_t* residual, const uint16_t* weight,
                                        uint16_t* out, uint16_t* residual_out, int64_t hidden, float eps) {
  const uint16_t* src;
  const __m512 vinv = _mm512_set1_ps(rmsnorm_inv_rms(x, residual, residual_out, hidden, eps, &src));
  int64_t i = 0;
  for (; i + 16 <= hidden; i += 16) {
    __m512 y = round_bf16(_mm512_mul_ps(load_bf16x16(src + i), vinv));
    store_bf16x16(out + i, _mm512_mul_ps(y, load_bf16x16(weight + i)));
  }
  if (i < hidden) {
    int n = (int)(hidden - i);
    __m512 y = round_bf16(_mm512_mul_ps(load_bf16x16_tail(src + i, n), vinv));
    store_bf16x16_tail(out + i, _mm512_mul_ps(y, load_bf16x16_tail(weight + i, n)), n);
  }
}

// Gemma's norm (HF Gemma3RMSNorm) on bf16 rows: the same residual sum, then x / rms * scale all in fp32 with the fp32
// scale (1 + w), rounded to bf16 once.
SGL_AVX512_BF16 inline void rmsnorm_row_f32_scale(const uint16_t* x, const uint16_t* residual, const float* scale,
                                                  uint16_t* out, uint16_t* residual_out, int64_t hidden, float eps) {
  const uint16_t* src;
  const __m512 vinv = _mm512_set1_ps(rmsnorm_inv_rms(x, residual, residual_out, hidden, eps, &src));
  int64_t i = 0;
  for (; i + 16 <= hidden; i += 16)
    store_bf16x16(out + i, _mm512_mul_ps(_mm512_mul_ps(load_bf16x16(src + i), vinv), _mm512_loadu_ps(scale + i)));
  if (i < hidden) {
    int n = (int)(hidden - i);
    const __m512 s = _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), scale + i);
    store_bf16x16_tail(out + i, _mm512_mul_ps(_mm512_mul_ps(load_bf16x16_tail(src + i, n), vinv), s), n);
  }
}

}  // namespace sgl_cpu
