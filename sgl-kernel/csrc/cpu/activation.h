// SiluAndMul / GeluAndMul (tanh) on a merged [gate | up] bf16 row: out = act(gate) * up, rounded like torch (the
// activation to bf16, then the product to bf16).
#pragma once

#include "parallel.h"
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

// gelu with the tanh approximation as torch computes it: 0.5 g (1 + tanh(u)), u = sqrt(2 / pi) (g + 0.044715 g^3),
// tanh(u) = sign(u) (1 - e) / (1 + e), e = exp(-2 |u|): accurate to a few ulp, and exactly +-1 where torch's is (a
// very negative g gives 0, not a denormal), so bf16 results match torch's but for values on a rounding edge.
SGL_AVX512_BF16 inline __m512 gelu_tanh_ps(__m512 g) {
  const __m512 g3 = _mm512_mul_ps(_mm512_mul_ps(g, g), g);
  const __m512 u = _mm512_mul_ps(_mm512_set1_ps(0.7978845608028654f), _mm512_fmadd_ps(_mm512_set1_ps(0.044715f), g3, g));
  const __m512 abs_u = _mm512_abs_ps(u);
  const __m512 e = exp_ps(_mm512_mul_ps(_mm512_set1_ps(-2.0f), abs_u));
  const __m512 one = _mm512_set1_ps(1.0f);
  __m512 t = _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e));
  t = _mm512_mask_sub_ps(t, _mm512_cmp_ps_mask(u, _mm512_setzero_ps(), _CMP_LT_OQ), _mm512_setzero_ps(), t);
  return _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), g), _mm512_add_ps(one, t));
}

// gate_up: [2 * inter] (gate then up) -> out: [inter]
SGL_AVX512_BF16 inline void gelu_tanh_and_mul_row(const uint16_t* gate_up, uint16_t* out, int64_t inter) {
  const uint16_t* up = gate_up + inter;
  int64_t i = 0;
  for (; i + 16 <= inter; i += 16) {
    __m512 s = round_bf16(gelu_tanh_ps(load_bf16x16(gate_up + i)));
    store_bf16x16(out + i, _mm512_mul_ps(s, load_bf16x16(up + i)));
  }
  if (i < inter) {
    int n = (int)(inter - i);
    __m512 s = round_bf16(gelu_tanh_ps(load_bf16x16_tail(gate_up + i, n)));
    store_bf16x16_tail(out + i, _mm512_mul_ps(s, load_bf16x16_tail(up + i, n)), n);
  }
}

// rows x [gate | up] bf16 (2 * inter apart) -> out [rows, inter]: the row function of the activation (gelu_tanh when
// GELU, else silu) over the rows, split over the kernels' threads. The silu_and_mul / gelu_tanh_and_mul bindings'
// bf16 path and quant_linear_gated's outside the dense path.
template <bool GELU>
inline void act_and_mul_rows(const uint16_t* gate_up, uint16_t* out, int64_t rows, int64_t inter) {
  parallel_for(0, rows, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      if constexpr (GELU) gelu_tanh_and_mul_row(gate_up + r * 2 * inter, out + r * inter, inter);
      else silu_and_mul_row(gate_up + r * 2 * inter, out + r * inter, inter);
    }
  });
}

}  // namespace sgl_cpu
