// Decode attention over the paged KV pool for one (request, query head): reads the request's keys and values in
// place through its req_to_token row (no gathered copy), softmax in fp32, output rounded to bf16.
//
//   q        [head_dim] bf16            the query head
//   k_cache  [slots, kv_heads, head_dim] bf16, v_cache likewise; kv_head selects the head of this query's group
//   tokens   [seq_len] int64            KV slots of the request's tokens, oldest first
//   scores   [seq_len] fp32 scratch
#pragma once

#include "vec_math.h"

namespace sgl_cpu {

// head_dim must be a multiple of 32 (checked by the binding).
SGL_AVX512_BF16 inline void decode_attention_head(const uint16_t* q, const uint16_t* k_cache, const uint16_t* v_cache,
                                                  int64_t kv_heads, int64_t kv_head, int64_t head_dim,
                                                  const int64_t* tokens, int64_t seq_len, float scale, float* scores,
                                                  uint16_t* out) {
  const int64_t row = kv_heads * head_dim;
  const int64_t off = kv_head * head_dim;
  // scores: q . k_j in fp32 (bf16 pair products accumulated by VDPBF16PS)
  float max_score = -INFINITY;
  for (int64_t j = 0; j < seq_len; ++j) {
    const uint16_t* k = k_cache + tokens[j] * row + off;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t d = 0; d < head_dim; d += 32)
      acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(q + d), (__m512bh)_mm512_loadu_si512(k + d));
    float s = _mm512_reduce_add_ps(acc) * scale;
    scores[j] = s;
    max_score = s > max_score ? s : max_score;
  }
  // probabilities (unnormalised), 16 at a time
  const __m512 vmax = _mm512_set1_ps(max_score);
  __m512 vsum = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= seq_len; j += 16) {
    __m512 p = exp_ps(_mm512_sub_ps(_mm512_loadu_ps(scores + j), vmax));
    _mm512_storeu_ps(scores + j, p);
    vsum = _mm512_add_ps(vsum, p);
  }
  if (j < seq_len) {
    __mmask16 m = (__mmask16)((1u << (seq_len - j)) - 1u);
    __m512 p = exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, scores + j), vmax));
    p = _mm512_maskz_mov_ps(m, p);
    _mm512_mask_storeu_ps(scores + j, m, p);
    vsum = _mm512_add_ps(vsum, p);
  }
  const float inv_sum = 1.0f / _mm512_reduce_add_ps(vsum);
  // out = sum_j p_j v_j / sum_j p_j, head_dim / 16 fp32 accumulators (head_dim <= 256)
  __m512 acc[16];
  const int64_t nv = head_dim / 16;
  for (int64_t d = 0; d < nv; ++d) acc[d] = _mm512_setzero_ps();
  for (j = 0; j < seq_len; ++j) {
    const uint16_t* v = v_cache + tokens[j] * row + off;
    const __m512 p = _mm512_set1_ps(scores[j]);
    for (int64_t d = 0; d < nv; ++d) acc[d] = _mm512_fmadd_ps(p, load_bf16x16(v + 16 * d), acc[d]);
  }
  const __m512 vinv = _mm512_set1_ps(inv_sum);
  for (int64_t d = 0; d < nv; ++d) store_bf16x16(out + 16 * d, _mm512_mul_ps(acc[d], vinv));
}

}  // namespace sgl_cpu
