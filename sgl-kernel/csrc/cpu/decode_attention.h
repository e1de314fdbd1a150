// Decode attention over the paged KV pool for one (request, query head): reads the request's keys and values in
// place through its req_to_token row (no gathered copy), softmax in fp32, output rounded to bf16.
//
//   q        [head_dim] bf16            the query head
//   k_cache  [slots, kv_heads, head_dim] bf16, v_cache likewise; kv_head selects the head of this query's group
//   tokens   [seq_len] int64            KV slots of the request's tokens, oldest first
//   scores   [seq_len] fp32 scratch
#pragma once

#include <algorithm>
#include <vector>

#include "vec_math.h"

namespace sgl_cpu {

// Softmax over one head's scores in place (unnormalised exp(s - max)); returns 1 / sum.
SGL_AVX512_BF16 inline float softmax_unnormalised(float* scores, int64_t seq_len) {
  __m512 vmax = _mm512_set1_ps(-INFINITY);
  int64_t j = 0;
  for (; j + 16 <= seq_len; j += 16) vmax = _mm512_max_ps(vmax, _mm512_loadu_ps(scores + j));
  if (j < seq_len) {
    __mmask16 m = (__mmask16)((1u << (seq_len - j)) - 1u);
    vmax = _mm512_mask_max_ps(vmax, m, vmax, _mm512_maskz_loadu_ps(m, scores + j));
  }
  vmax = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
  __m512 vsum = _mm512_setzero_ps();
  for (j = 0; j + 16 <= seq_len; j += 16) {
    __m512 p = exp_ps(_mm512_sub_ps(_mm512_loadu_ps(scores + j), vmax));
    _mm512_storeu_ps(scores + j, p);
    vsum = _mm512_add_ps(vsum, p);
  }
  if (j < seq_len) {
    __mmask16 m = (__mmask16)((1u << (seq_len - j)) - 1u);
    __m512 p = _mm512_maskz_mov_ps(m, exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, scores + j), vmax)));
    _mm512_mask_storeu_ps(scores + j, m, p);
    vsum = _mm512_add_ps(vsum, p);
  }
  return 1.0f / _mm512_reduce_add_ps(vsum);
}

// out = sum_j p_j v_j * inv_sum, D / 16 fp32 accumulators.
template <int D>
SGL_AVX512_BF16 inline void attend_values(const uint16_t* v_base, int64_t row, const int64_t* tokens, int64_t seq_len,
                                          const float* p, float inv_sum, uint16_t* out) {
  constexpr int kV = D / 16;
  __m512 acc[kV];
#pragma GCC unroll 16
  for (int d = 0; d < kV; ++d) acc[d] = _mm512_setzero_ps();
  for (int64_t j = 0; j < seq_len; ++j) {
    const uint16_t* v = v_base + tokens[j] * row;
    const __m512 pj = _mm512_set1_ps(p[j]);
#pragma GCC unroll 16
    for (int d = 0; d < kV; ++d) acc[d] = _mm512_fmadd_ps(pj, load_bf16x16(v + 16 * d), acc[d]);
  }
  const __m512 vinv = _mm512_set1_ps(inv_sum);
#pragma GCC unroll 16
  for (int d = 0; d < kV; ++d) store_bf16x16(out + 16 * d, _mm512_mul_ps(acc[d], vinv));
}

// D = head_dim is a template parameter so the per-key loops unroll and the accumulators stay in registers.
template <int D>
SGL_AVX512_BF16 inline void decode_attention_head_d(const uint16_t* q, const uint16_t* k_cache,
                                                    const uint16_t* v_cache, int64_t kv_heads, int64_t kv_head,
                                                    const int64_t* tokens, int64_t seq_len, float scale, float* scores,
                                                    uint16_t* out) {
  static_assert(D % 32 == 0 && D <= 256, "head_dim must be a multiple of 32, at most 256");
  constexpr int kQ = D / 32;  // 512-bit registers of bf16 per head row
  const int64_t row = kv_heads * D;
  const int64_t off = kv_head * D;
  __m512bh qv[kQ];
#pragma GCC unroll 8
  for (int i = 0; i < kQ; ++i) qv[i] = (__m512bh)_mm512_loadu_si512(q + 32 * i);
  // scores: q . k_j in fp32 (bf16 pair products accumulated by VDPBF16PS)
  for (int64_t j = 0; j < seq_len; ++j) {
    const uint16_t* k = k_cache + tokens[j] * row + off;
    __m512 acc = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int i = 0; i < kQ; ++i) acc = _mm512_dpbf16_ps(acc, qv[i], (__m512bh)_mm512_loadu_si512(k + 32 * i));
    scores[j] = _mm512_reduce_add_ps(acc) * scale;
  }
  attend_values<D>(v_cache + off, row, tokens, seq_len, scores, softmax_unnormalised(scores, seq_len), out);
}

// Runtime head_dim -> the matching instantiation; false for an unsupported head_dim.
#define SGL_DECODE_HEAD_DIMS(X) X(32) X(64) X(96) X(128) X(160) X(192) X(256)

// The head_dim values above, for the binding's argument check and for Python to ask which are compiled.
inline std::vector<int64_t> decode_attention_head_dims() {
#define SGL_DIM(D) D,
  return {SGL_DECODE_HEAD_DIMS(SGL_DIM)};
#undef SGL_DIM
}

inline bool decode_attention_head(const uint16_t* q, const uint16_t* k_cache, const uint16_t* v_cache,
                                  int64_t kv_heads, int64_t kv_head, int64_t head_dim, const int64_t* tokens,
                                  int64_t seq_len, float scale, float* scores, uint16_t* out) {
  switch (head_dim) {
#define SGL_CASE(D)                                                                                         \
  case D:                                                                                                   \
    decode_attention_head_d<D>(q, k_cache, v_cache, kv_heads, kv_head, tokens, seq_len, scale, scores, out); \
    return true;
    SGL_DECODE_HEAD_DIMS(SGL_CASE)
#undef SGL_CASE
    default:
      return false;
  }
}

}  // namespace sgl_cpu
