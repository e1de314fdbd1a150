// SiluAndMul on a merged [gate | up] bf16 row: out = silu(gate) * up, rounded like torch (silu to bf16, then the
// product to bf16).
#pragma once

#include "vec_math.h"

namespace sgl_cpu {

SGL_AVX512_BF16 inline __m512 silu_ps(__m512 g) {
  __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g));
  return _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

// gate_up: [2 * inter] (gate then up) -> out: [inter]
SGL_AVX512_BF16 inline void silu_and_mul_row(const uint16_t* gate_up, uint16_t* out, int64_t inter) {
  const uint16_t* up = gate_up + inter;
  int64_t i = 0;
  for (; i + 16 <= inter; i += 16) {
    __m512 s = round_bf16(silu_ps(load_bf16x16(gate_up + i)));
    store_bf16x16(out + i, _mm512_mul_ps(s, load_bf16x16(up + i)));
  }
  if (i < inter) {
    int n = (int)(inter - i);
    __m512 s = round_bf16(silu_ps(load_bf16x16_tail(gate_up + i, n)));
    store_bf16x16_tail(out + i, _mm512_mul_ps(s, load_bf16x16_tail(up + i, n)), n);
  }
}

}  // namespace sgl_cpu
