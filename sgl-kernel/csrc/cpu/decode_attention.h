// Decode attention over the paged KV pool for one (request, KV head): the query heads of that KV head's group are
// served together, so each key and value row is read and converted once for all of them. Keys and values are read in
// place through the request's req_to_token row (no gathered copy); softmax in fp32; output rounded to bf16.
//
//   q        [group, head_dim] bf16       the query heads of one KV head (consecutive heads of q [B, H, D])
//   k_cache  [slots, kv_heads, head_dim] bf16, v_cache likewise
//   tokens   [seq_len] int64              KV slots of the request's tokens, oldest first
//   scores   [seq_len, 4] fp32 scratch    head-interleaved: the 4 scores of one key are one 128-bit lane
//   sinks    [group] fp32 or null         gpt-oss's learned per-head logit: joins each head's softmax denominator
//   logit_cap                             > 0: each score s -> cap * tanh(s / cap) (Gemma 2's soft-capping)
// A sliding window is the caller's choice of tokens (window_keys.h): the kernel attends every key it is given.
//
// Per key, up to 4 heads' q.k products (VDPBF16PS) are reduced together by one shuffle tree (13 instructions for 4
// dot products instead of ~9 each), and the value row is widened to fp32 once and multiply-added for every head.
// A (request, head)'s result does not depend on the other requests, heads or the thread split.
#pragma once

#include <algorithm>
#include <vector>

#include "vec_math.h"

namespace sgl_cpu {

constexpr int kHeadsPerPass = 4;  // query heads served per pass over a request's keys

constexpr int64_t kPrefetchKeys = 24;  // keys ahead: the slots of a request need not be adjacent in the pool

template <int D>
SGL_AVX512 inline void prefetch_row(const uint16_t* p) {
#pragma GCC unroll 8
  for (int i = 0; i < D * 2; i += 64) _mm_prefetch(reinterpret_cast<const char*>(p) + i, _MM_HINT_T0);
}

// The sums of a, b, c, d, as elements 0-3 of the result.
SGL_AVX512 inline __m128 reduce_add_4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));  // per 128-bit lane: a b a b
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  __m512 t = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd))),
                           _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd))));
  t = _mm512_add_ps(t, _mm512_shuffle_f32x4(t, t, 0x4E));  // 128-bit lanes: swap halves
  t = _mm512_add_ps(t, _mm512_shuffle_f32x4(t, t, 0xB1));  // and neighbours
  return _mm512_castps512_ps128(t);
}

// Across the four 128-bit lanes (keys) of v, per head position: max or sum, broadcast to every lane.
SGL_AVX512 inline __m512 lanes_max(__m512 v) {
  v = _mm512_max_ps(v, _mm512_shuffle_f32x4(v, v, 0x4E));
  return _mm512_max_ps(v, _mm512_shuffle_f32x4(v, v, 0xB1));
}
SGL_AVX512 inline __m512 lanes_sum(__m512 v) {
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0x4E));
  return _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0xB1));
}

// Softmax of each head's column of scores [seq_len][4] in place (unnormalised exp(s - max)); inv[4] = 1 / sums.
// sinks (4 logits, or null): each joins its head's max and denominator, out = sum_j e^{s_j} v_j / (e^sink + sum_j e^{s_j}).
SGL_AVX512 inline void softmax_columns_4(float* scores, int64_t seq_len, float* inv, const float* sinks = nullptr) {
  const int64_t n = seq_len * 4;
  __m512 vmax = _mm512_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) vmax = _mm512_max_ps(vmax, _mm512_loadu_ps(scores + i));
  const __mmask16 tail = (__mmask16)((1u << (n - i)) - 1u);  // whole keys: n - i is 0, 4, 8 or 12
  if (tail) vmax = _mm512_mask_max_ps(vmax, tail, vmax, _mm512_maskz_loadu_ps(tail, scores + i));
  vmax = lanes_max(vmax);
  const __m512 vsink = sinks ? _mm512_broadcast_f32x4(_mm_loadu_ps(sinks)) : _mm512_setzero_ps();
  if (sinks) vmax = _mm512_max_ps(vmax, vsink);
  __m512 vsum = _mm512_setzero_ps();
  for (i = 0; i + 16 <= n; i += 16) {
    const __m512 p = exp_ps(_mm512_sub_ps(_mm512_loadu_ps(scores + i), vmax));
    _mm512_storeu_ps(scores + i, p);
    vsum = _mm512_add_ps(vsum, p);
  }
  if (tail) {
    const __m512 p = _mm512_maskz_mov_ps(tail, exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, scores + i), vmax)));
    _mm512_mask_storeu_ps(scores + i, tail, p);
    vsum = _mm512_add_ps(vsum, p);
  }
  __m128 sum = _mm512_castps512_ps128(lanes_sum(vsum));
  if (sinks) sum = _mm_add_ps(sum, _mm512_castps512_ps128(exp_ps(_mm512_sub_ps(vsink, vmax))));
  _mm_storeu_ps(inv, _mm_div_ps(_mm_set1_ps(1.0f), sum));
}

// scores[0, n) <- cap * tanh(scores / cap), tanh(x) = 1 - 2 / (e^{2x} + 1) (exp_ps saturates: +-1 at the ends).
SGL_AVX512 inline void soft_cap_scores(float* scores, int64_t n, float cap) {
  const __m512 two_over_cap = _mm512_set1_ps(2.0f / cap), vcap = _mm512_set1_ps(cap), one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1u);
    const __m512 e = exp_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, scores + i), two_over_cap));
    const __m512 t = _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, one)));
    _mm512_mask_storeu_ps(scores + i, m, _mm512_mul_ps(t, vcap));
  }
}

// G (<= 4) heads of head_dim D against one KV head.
template <int D, int G>
SGL_AVX512_BF16 inline void decode_attention_heads(const uint16_t* q, const uint16_t* k_cache, const uint16_t* v_cache,
                                                   int64_t row, const int64_t* tokens, int64_t seq_len, float scale,
                                                   const float* sinks, float logit_cap, float* scores, uint16_t* out) {
  static_assert(D % 32 == 0 && D <= 256 && G >= 1 && G <= kHeadsPerPass, "head_dim: a multiple of 32, at most 256");
  constexpr int kQ = D / 32;  // 512-bit registers of bf16 per head row
  __m512bh qv[G][kQ];
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 8
    for (int i = 0; i < kQ; ++i) qv[g][i] = (__m512bh)_mm512_loadu_si512(q + g * D + 32 * i);
  const __m128 vscale = _mm_set1_ps(scale);
  // 1. scores[j][g] = scale * q_g . k_j (the first kPrefetchKeys rows requested at once, then each row that far ahead)
  for (int64_t j = 0; j < std::min(kPrefetchKeys, seq_len); ++j) prefetch_row<D>(k_cache + tokens[j] * row);
  for (int64_t j = 0; j < seq_len; ++j) {
    const uint16_t* k = k_cache + tokens[j] * row;
    if (j + kPrefetchKeys < seq_len) prefetch_row<D>(k_cache + tokens[j + kPrefetchKeys] * row);
    __m512 acc[kHeadsPerPass];
#pragma GCC unroll 4
    for (int g = 0; g < kHeadsPerPass; ++g) acc[g] = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int i = 0; i < kQ; ++i) {
      const __m512bh kv = (__m512bh)_mm512_loadu_si512(k + 32 * i);
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) acc[g] = _mm512_dpbf16_ps(acc[g], qv[g][i], kv);
    }
    _mm_storeu_ps(scores + 4 * j, _mm_mul_ps(reduce_add_4(acc[0], acc[1], acc[2], acc[3]), vscale));
  }
  if (logit_cap > 0.0f) soft_cap_scores(scores, 4 * seq_len, logit_cap);
  alignas(16) float inv[4];
  float sink4[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // the heads beyond G are computed on zeros and never stored
  if (sinks) std::copy(sinks, sinks + G, sink4);
  softmax_columns_4(scores, seq_len, inv, sinks ? sink4 : nullptr);
  // 2. out_g = sum_j p[j][g] v_j / sum_g, 64 dims at a time (G x 4 accumulators); each value row widened once
  constexpr int kV = D / 16;
  constexpr int kChunk = 4;
#pragma GCC unroll 1
  for (int c = 0; c < kV; c += kChunk) {
    __m512 acc[G][kChunk];
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g)
#pragma GCC unroll 4
      for (int d = 0; d < kChunk; ++d) acc[g][d] = _mm512_setzero_ps();
    for (int64_t j = 0; j < std::min(kPrefetchKeys, seq_len); ++j)
      prefetch_row<kChunk * 16>(v_cache + tokens[j] * row + 16 * c);
    for (int64_t j = 0; j < seq_len; ++j) {
      const uint16_t* v = v_cache + tokens[j] * row + 16 * c;
      if (j + kPrefetchKeys < seq_len) prefetch_row<kChunk * 16>(v_cache + tokens[j + kPrefetchKeys] * row + 16 * c);
      __m512 vv[kChunk];
#pragma GCC unroll 4
      for (int d = 0; d < kChunk; ++d) vv[d] = c + d < kV ? load_bf16x16(v + 16 * d) : _mm512_setzero_ps();
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) {
        const __m512 p = _mm512_set1_ps(scores[4 * j + g]);
#pragma GCC unroll 4
        for (int d = 0; d < kChunk; ++d) acc[g][d] = _mm512_fmadd_ps(p, vv[d], acc[g][d]);
      }
    }
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      const __m512 vinv = _mm512_set1_ps(inv[g]);
#pragma GCC unroll 4
      for (int d = 0; d < kChunk; ++d)
        if (c + d < kV) store_bf16x16(out + g * D + 16 * (c + d), _mm512_mul_ps(acc[g][d], vinv));
    }
  }
}

// The query heads [0, group) of one KV head, kHeadsPerPass per pass over the keys.
template <int D>
SGL_AVX512_BF16 inline void decode_attention_group_d(const uint16_t* q, int64_t group, const uint16_t* k_cache,
                                                     const uint16_t* v_cache, int64_t kv_heads, int64_t kv_head,
                                                     const int64_t* tokens, int64_t seq_len, float scale,
                                                     const float* sinks, float logit_cap, float* scores,
                                                     uint16_t* out) {
  const int64_t row = kv_heads * D;
  const uint16_t* kc = k_cache + kv_head * D;
  const uint16_t* vc = v_cache + kv_head * D;
  for (int64_t g0 = 0; g0 < group; g0 += kHeadsPerPass) {
    const uint16_t* qg = q + g0 * D;
    uint16_t* og = out + g0 * D;
    const float* sg = sinks ? sinks + g0 : nullptr;
    switch (std::min<int64_t>(kHeadsPerPass, group - g0)) {
      case 1: decode_attention_heads<D, 1>(qg, kc, vc, row, tokens, seq_len, scale, sg, logit_cap, scores, og); break;
      case 2: decode_attention_heads<D, 2>(qg, kc, vc, row, tokens, seq_len, scale, sg, logit_cap, scores, og); break;
      case 3: decode_attention_heads<D, 3>(qg, kc, vc, row, tokens, seq_len, scale, sg, logit_cap, scores, og); break;
      default: decode_attention_heads<D, 4>(qg, kc, vc, row, tokens, seq_len, scale, sg, logit_cap, scores, og); break;
    }
  }
}

// Runtime head_dim -> the matching instantiation; false for an unsupported head_dim.
#define SGL_DECODE_HEAD_DIMS(X) X(32) X(64) X(96) X(128) X(160) X(192) X(256)

// The head_dim values above, for the binding's argument check and for Python to ask which are compiled.
inline std::vector<int64_t> decode_attention_head_dims() {
#define SGL_DIM(D) D,
  return {SGL_DECODE_HEAD_DIMS(SGL_DIM)};
#undef SGL_DIM
}

// scores: seq_len * 4 floats of scratch; sinks: the group's heads' (or null).
inline bool decode_attention_group(const uint16_t* q, int64_t group, const uint16_t* k_cache, const uint16_t* v_cache,
                                   int64_t kv_heads, int64_t kv_head, int64_t head_dim, const int64_t* tokens,
                                   int64_t seq_len, float scale, const float* sinks, float logit_cap, float* scores,
                                   uint16_t* out) {
  switch (head_dim) {
#define SGL_CASE(D)                                                                                                \
  case D:                                                                                                          \
    decode_attention_group_d<D>(q, group, k_cache, v_cache, kv_heads, kv_head, tokens, seq_len, scale, sinks,     \
                                logit_cap, scores, out);                                                           \
    return true;
    SGL_DECODE_HEAD_DIMS(SGL_CASE)
#undef SGL_CASE
    default:
      return false;
  }
}

}  // namespace sgl_cpu
