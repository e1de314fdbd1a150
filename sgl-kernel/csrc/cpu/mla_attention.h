// Multi-head latent attention (DeepSeek V2/V3 MLA, absorbed form) over a bf16 latent pool, for one query row of one
// request: every query head attends over the same latent rows, so the kernel is two small GEMMs per row that share
// each key row's load across all heads (the per-KV-head decode kernel would read every latent row H times):
//
//   scores [hg, len] = scale * Q [hg, L] . K [len, L]^T            K: the request's latent rows, read in place
//   out    [hg, kv]  = softmax(scores) . K [len, :kv]              V is the first kv columns of the same rows
//
//   q       [hg, L] bf16         L = kv_lora + rope (576 for V2/V3/Kimi), any L; the heads of one task
//   cache   [slots, L] bf16      one latent row [c_kv | k_pe] per token (mem_cache/mla_pool.py)
//   tokens  [len] int64          the rows this query reads, oldest first
//   scratch fp32                 mla_row_scratch_floats(): the scores (a row per head, so the softmax runs on
//                                contiguous rows), 1 / sums, and the output's fp32 accumulators [hg, kv]
//   out     [hg, kv] bf16        kv a multiple of 16
//
// Scores: a register tile of 4 heads x 4 keys (16 VDPBF16PS accumulators over L in steps of 32 bf16; the 4 keys'
// sums of a head reduced together by one shuffle tree, decode_attention.h's reduce_add_4); the 4 key rows stay in
// L1 while every head block passes over them. Output: blocks of 32 keys (their latent parts stay in L1/L2 while every
// tile passes over them), a tile of 8 heads x 32 columns (16 fp32 accumulators) in which each key's 32 values are
// widened once and multiply-added for all 8 heads, the probabilities kept in fp32. Each latent row is read from
// memory twice (scores, then values), never once per head.
// A head's result depends only on its own q row and the keys (not on hg, the other heads or the thread split), so
// an extend row equals the decode of that token bit for bit.
#pragma once

#include <algorithm>
#include <cstdint>

#include "decode_attention.h"  // reduce_add_4, prefetch_row
#include "kernels_f32.h"       // f32_avx512::f32_softmax_row

namespace sgl_cpu {

constexpr int kMlaKeys = 4;         // keys per score tile
constexpr int kMlaScoreHeads = 4;   // heads per score tile
constexpr int kMlaOutHeads = 8;     // heads per output tile
constexpr int64_t kMlaPrefetch = 8; // key rows requested ahead (a request's rows need not be adjacent in the pool)
constexpr int64_t kMlaValueKeys = 32;  // keys per block of the output pass (32 latent rows of 512: 32 KiB bf16)

// The scores' row stride: len rounded up to 16 floats, plus 16, so the rows of 8 heads read side by side never share
// a 4 KiB alias (a stride of exactly 2^k floats put them all in one L1 set).
inline int64_t mla_scores_ld(int64_t len) { return (len + 15) / 16 * 16 + 16; }

SGL_AVX512 inline void mla_prefetch_bf16(const uint16_t* p, int64_t n) {
  for (int64_t i = 0; i < n * 2; i += 64) _mm_prefetch(reinterpret_cast<const char*>(p) + i, _MM_HINT_T0);
}

// scores[h * ld + j0 + t] = scale * q_h . k_t for HB heads and the first nk (<= 4) of the 4 rows k[t].
template <int HB>
SGL_AVX512_BF16 inline void mla_score_tile_bf16(const uint16_t* q, int64_t L, const uint16_t* const* k, int nk,
                                                float scale, float* scores, int64_t ld, int64_t j0) {
  __m512 acc[HB][kMlaKeys];
#pragma GCC unroll 4
  for (int h = 0; h < HB; ++h)
#pragma GCC unroll 4
    for (int t = 0; t < kMlaKeys; ++t) acc[h][t] = _mm512_setzero_ps();
  const int64_t full = L / 32 * 32;
  for (int64_t i = 0; i < full; i += 32) {
    __m512bh kv[kMlaKeys];
#pragma GCC unroll 4
    for (int t = 0; t < kMlaKeys; ++t) kv[t] = (__m512bh)_mm512_loadu_si512(k[t] + i);
#pragma GCC unroll 4
    for (int h = 0; h < HB; ++h) {
      const __m512bh qv = (__m512bh)_mm512_loadu_si512(q + h * L + i);
#pragma GCC unroll 4
      for (int t = 0; t < kMlaKeys; ++t) acc[h][t] = _mm512_dpbf16_ps(acc[h][t], qv, kv[t]);
    }
  }
  if (full < L) {  // the last L % 32 values; the masked-off lanes are zero in both operands
    const __mmask32 m = (__mmask32)((1ull << (L - full)) - 1ull);
    __m512bh kv[kMlaKeys];
#pragma GCC unroll 4
    for (int t = 0; t < kMlaKeys; ++t) kv[t] = (__m512bh)_mm512_maskz_loadu_epi16(m, k[t] + full);
#pragma GCC unroll 4
    for (int h = 0; h < HB; ++h) {
      const __m512bh qv = (__m512bh)_mm512_maskz_loadu_epi16(m, q + h * L + full);
#pragma GCC unroll 4
      for (int t = 0; t < kMlaKeys; ++t) acc[h][t] = _mm512_dpbf16_ps(acc[h][t], qv, kv[t]);
    }
  }
  const __m128 vscale = _mm_set1_ps(scale);
#pragma GCC unroll 4
  for (int h = 0; h < HB; ++h) {
    alignas(16) float s[kMlaKeys];
    _mm_store_ps(s, _mm_mul_ps(reduce_add_4(acc[h][0], acc[h][1], acc[h][2], acc[h][3]), vscale));
    for (int t = 0; t < nk; ++t) scores[h * ld + j0 + t] = s[t];
  }
}

// acc[h * ld_acc + c0 + 16n ...] += sum_j p[h * ld + j] * K[tokens[j], c0 + 16n ...] for HB heads, NC x 16 columns
// and the len (<= kMlaValueKeys) keys of one block.
template <int HB, int NC>
SGL_AVX512 inline void mla_value_tile_bf16(const uint16_t* cache, int64_t L, const int64_t* tokens, int64_t len,
                                           const float* p, int64_t ld, int64_t c0, float* acc_rows, int64_t ld_acc) {
  __m512 acc[HB][NC];
#pragma GCC unroll 8
  for (int h = 0; h < HB; ++h)
#pragma GCC unroll 2
    for (int n = 0; n < NC; ++n) acc[h][n] = _mm512_loadu_ps(acc_rows + h * ld_acc + c0 + 16 * n);
  for (int64_t j = 0; j < len; ++j) {
    const uint16_t* v = cache + tokens[j] * L + c0;
    __m512 vv[NC];
#pragma GCC unroll 2
    for (int n = 0; n < NC; ++n) vv[n] = load_bf16x16(v + 16 * n);
#pragma GCC unroll 8
    for (int h = 0; h < HB; ++h) {
      const __m512 pj = _mm512_set1_ps(p[h * ld + j]);
#pragma GCC unroll 2
      for (int n = 0; n < NC; ++n) acc[h][n] = _mm512_fmadd_ps(pj, vv[n], acc[h][n]);
    }
  }
#pragma GCC unroll 8
  for (int h = 0; h < HB; ++h)
#pragma GCC unroll 2
    for (int n = 0; n < NC; ++n) _mm512_storeu_ps(acc_rows + h * ld_acc + c0 + 16 * n, acc[h][n]);
}

template <int NC>
SGL_AVX512 inline void mla_value_heads_bf16(const uint16_t* cache, int64_t L, const int64_t* tokens, int64_t len,
                                            const float* p, int64_t ld, int64_t hg, int64_t c0, float* acc_rows,
                                            int64_t kv) {
  for (int64_t h0 = 0; h0 < hg; h0 += kMlaOutHeads) {
    const float* ph = p + h0 * ld;
    float* ah = acc_rows + h0 * kv;
    switch (std::min<int64_t>(kMlaOutHeads, hg - h0)) {
#define SGL_MLA_CASE(HB) \
  case HB: mla_value_tile_bf16<HB, NC>(cache, L, tokens, len, ph, ld, c0, ah, kv); break;
      SGL_MLA_CASE(1) SGL_MLA_CASE(2) SGL_MLA_CASE(3) SGL_MLA_CASE(4)
      SGL_MLA_CASE(5) SGL_MLA_CASE(6) SGL_MLA_CASE(7) SGL_MLA_CASE(8)
#undef SGL_MLA_CASE
    }
  }
}

// Scratch floats mla_attention_row needs for hg heads over len keys and kv value columns.
inline int64_t mla_row_scratch_floats(int64_t hg, int64_t len, int64_t kv) {
  return hg * (mla_scores_ld(len) + 1 + kv);
}

// hg query heads over the latent rows tokens[0, len): hg / per_row consecutive query rows of one request, per_row
// heads each, the block's row i reading the first len - (rows - 1 - i) keys (causal; one row: every head all len).
// Their q rows and outputs are consecutive. scratch: mla_row_scratch_floats(hg, len, kv) floats.
SGL_AVX512_BF16 inline void mla_attention_row(const uint16_t* q, int64_t hg, const uint16_t* cache, int64_t L,
                                              int64_t kv, const int64_t* tokens, int64_t len, int64_t per_row,
                                              float scale, float* scratch, uint16_t* out) {
  const int64_t ld = mla_scores_ld(len);
  float* scores = scratch;
  float* inv = scratch + hg * ld;
  float* acc = inv + hg;
  // 1. scores, 4 keys at a time (a short last block repeats its first row; those sums are not stored)
  for (int64_t j = 0; j < std::min(len, kMlaPrefetch); ++j) mla_prefetch_bf16(cache + tokens[j] * L, L);
  for (int64_t j0 = 0; j0 < len; j0 += kMlaKeys) {
    const int nk = (int)std::min<int64_t>(kMlaKeys, len - j0);
    const uint16_t* k[kMlaKeys];
    for (int t = 0; t < kMlaKeys; ++t) k[t] = cache + tokens[j0 + (t < nk ? t : 0)] * L;
    for (int64_t j = j0 + kMlaPrefetch; j < std::min(len, j0 + kMlaPrefetch + kMlaKeys); ++j)
      mla_prefetch_bf16(cache + tokens[j] * L, L);
    for (int64_t h0 = 0; h0 < hg; h0 += kMlaScoreHeads) {
      const uint16_t* qh = q + h0 * L;
      float* sh = scores + h0 * ld;
      switch (std::min<int64_t>(kMlaScoreHeads, hg - h0)) {
        case 1: mla_score_tile_bf16<1>(qh, L, k, nk, scale, sh, ld, j0); break;
        case 2: mla_score_tile_bf16<2>(qh, L, k, nk, scale, sh, ld, j0); break;
        case 3: mla_score_tile_bf16<3>(qh, L, k, nk, scale, sh, ld, j0); break;
        default: mla_score_tile_bf16<4>(qh, L, k, nk, scale, sh, ld, j0); break;
      }
    }
  }
  // 2. softmax of each head row over its own keys (unnormalised exp(s - max); inv = 1 / sum); the keys past them
  // (later rows' of a causal block) get probability 0, so the output pass adds exact zeros for them
  for (int64_t h = 0; h < hg; ++h) {
    const int64_t n = len - (hg / per_row - 1 - h / per_row);
    inv[h] = f32_avx512::f32_softmax_row(scores + h * ld, n, nullptr);
    std::fill(scores + h * ld + n, scores + h * ld + len, 0.0f);
  }
  // 3. acc = P . K[:, :kv] a block of keys at a time (its rows stay in L1/L2 while every column chunk and head block
  // passes over them), 32 columns per tile (16 for an odd last chunk); then out = acc * inv, rounded to bf16
  std::fill(acc, acc + hg * kv, 0.0f);
  for (int64_t j0 = 0; j0 < len; j0 += kMlaValueKeys) {
    const int64_t nj = std::min(kMlaValueKeys, len - j0);
    for (int64_t j = j0 + kMlaValueKeys; j < std::min(len, j0 + 2 * kMlaValueKeys); ++j)
      mla_prefetch_bf16(cache + tokens[j] * L, kv);
    int64_t c0 = 0;
    for (; c0 + 32 <= kv; c0 += 32)
      mla_value_heads_bf16<2>(cache, L, tokens + j0, nj, scores + j0, ld, hg, c0, acc, kv);
    if (c0 < kv) mla_value_heads_bf16<1>(cache, L, tokens + j0, nj, scores + j0, ld, hg, c0, acc, kv);
  }
  for (int64_t h = 0; h < hg; ++h) {
    const __m512 vinv = _mm512_set1_ps(inv[h]);
    for (int64_t c = 0; c < kv; c += 16)
      store_bf16x16(out + h * kv + c, _mm512_mul_ps(_mm512_loadu_ps(acc + h * kv + c), vinv));
  }
}

}  // namespace sgl_cpu
