// RMSNorm over rows of a bf16 [rows, hidden] tensor, optionally after the residual add that precedes it.
//
// The rounding follows the torch path of RMSNorm._norm exactly: the residual sum is rounded to bf16, the
// normalisation runs in fp32 and is rounded to bf16, then multiplied by the bf16 weight and rounded again.
#pragma once

#include <cmath>

#include "vec.h"

namespace sgl_cpu {

// x, residual (may be null), out, residual_out (used when residual != null): rows of `hidden` elements.
SGL_AVX512_BF16 inline void rmsnorm_row(const uint16_t* x, const uint16_t* residual, const uint16_t* weight,
                                        uint16_t* out, uint16_t* residual_out, int64_t hidden, float eps) {
  const uint16_t* src = x;
  if (residual != nullptr) {
    int64_t i = 0;
    for (; i + 16 <= hidden; i += 16)
      store_bf16x16(residual_out + i, _mm512_add_ps(load_bf16x16(x + i), load_bf16x16(residual + i)));
    if (i < hidden) {
      int n = (int)(hidden - i);
      store_bf16x16_tail(residual_out + i,
                         _mm512_add_ps(load_bf16x16_tail(x + i, n), load_bf16x16_tail(residual + i, n)), n);
    }
    src = residual_out;
  }
  __m512 ss = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= hidden; i += 16) {
    __m512 v = load_bf16x16(src + i);
    ss = _mm512_fmadd_ps(v, v, ss);
  }
  if (i < hidden) {
    __m512 v = load_bf16x16_tail(src + i, (int)(hidden - i));
    ss = _mm512_fmadd_ps(v, v, ss);
  }
  const float inv = 1.0f / std::sqrt(_mm512_reduce_add_ps(ss) / (float)hidden + eps);
  const __m512 vinv = _mm512_set1_ps(inv);
  for (i = 0; i + 16 <= hidden; i += 16) {
    __m512 y = round_bf16(_mm512_mul_ps(load_bf16x16(src + i), vinv));
    store_bf16x16(out + i, _mm512_mul_ps(y, load_bf16x16(weight + i)));
  }
  if (i < hidden) {
    int n = (int)(hidden - i);
    __m512 y = round_bf16(_mm512_mul_ps(load_bf16x16_tail(src + i, n), vinv));
    store_bf16x16_tail(out + i, _mm512_mul_ps(y, load_bf16x16_tail(weight + i, n)), n);
  }
}

}  // namespace sgl_cpu
