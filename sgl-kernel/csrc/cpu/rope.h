// Rotary embedding (neox / half-split layout) applied in place to the heads of one token.
//
// cos_sin: the token's row of the [max_position, rotary_dim] cache (cos halves, then sin halves), in bf16.
// Each product and the sum are rounded to bf16 like the torch path: x1' = r(r(x1 c) - r(x2 s)), x2' = r(r(x2 c) + r(x1 s)).
#pragma once

#include "vec.h"

namespace sgl_cpu {

SGL_AVX512_BF16 inline void rope_heads(uint16_t* x, int64_t num_heads, int64_t head_size, const uint16_t* cos_sin,
                                       int64_t rotary_dim) {
  const int64_t half = rotary_dim / 2;
  const uint16_t* cs = cos_sin;
  const uint16_t* sn = cos_sin + half;
  for (int64_t h = 0; h < num_heads; ++h) {
    uint16_t* x1p = x + h * head_size;
    uint16_t* x2p = x1p + half;
    for (int64_t i = 0; i < half; i += 16) {
      int n = (int)(half - i < 16 ? half - i : 16);
      __m512 x1 = load_bf16x16_tail(x1p + i, n), x2 = load_bf16x16_tail(x2p + i, n);
      __m512 c = load_bf16x16_tail(cs + i, n), s = load_bf16x16_tail(sn + i, n);
      __m512 o1 = _mm512_sub_ps(round_bf16(_mm512_mul_ps(x1, c)), round_bf16(_mm512_mul_ps(x2, s)));
      __m512 o2 = _mm512_add_ps(round_bf16(_mm512_mul_ps(x2, c)), round_bf16(_mm512_mul_ps(x1, s)));
      store_bf16x16_tail(x1p + i, o1, n);
      store_bf16x16_tail(x2p + i, o2, n);
    }
  }
}

}  // namespace sgl_cpu
