// The int2_hadamard KV format in registers (python/sglang/srt/mem_cache/kv_quant_codec.py's rule; both parts stored
// turned, x @ R, by the caller):
//   keys    2-bit codes, four a byte (element 4i + s at bits 2s of byte i), levels {-1.510, -0.4528, 0.4528, 1.510}
//   values  trits 0, 1, 2 (= -1, 0, +1), five a byte in base 3, least significant first, padded with 1 to a
//           multiple of 5: a row of D values is ceil(D / 5) bytes
//   scales  one byte per (token, KV head) and part: 2^((code - 176) / 12), code 0 = 0
// Level avx512_vnni's instructions only (AVX-512 F/BW/VL/DQ: no VBMI, no BF16).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "vec.h"

namespace sgl_cpu {

constexpr float kInt2Levels[4] = {-1.510f, -0.4528f, 0.4528f, 1.510f};
constexpr float kInt2Threshold = 0.9816f, kTernaryThreshold = 0.6120f;  // x RMS
constexpr int kLogScaleSteps = 12, kLogScaleOffset = 176;

// code -> the scale, as the codec's fp32 exp2((code - 176) / 12) (its argument rounded to fp32 first; the power
// correctly rounded, so within an ulp of torch's exp2)
inline const std::array<float, 256> kLogScale = [] {
  std::array<float, 256> t{};
  for (int c = 1; c < 256; ++c) t[c] = (float)std::exp2((double)((float)(c - kLogScaleOffset) / (float)kLogScaleSteps));
  return t;
}();

// 16 key codes (4 bytes) -> their 16 levels: lane e shifted right by 2e, whose low 4 bits index a table of the 4
// levels repeated 4 times (VPERMPS reads 4 index bits: no mask needed).
SGL_AVX512 inline __m512 load_crumbs16(const uint8_t* p) {
  uint32_t w;
  std::memcpy(&w, p, 4);
  const __m512i shift = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512 lv = _mm512_setr_ps(kInt2Levels[0], kInt2Levels[1], kInt2Levels[2], kInt2Levels[3], kInt2Levels[0],
                                   kInt2Levels[1], kInt2Levels[2], kInt2Levels[3], kInt2Levels[0], kInt2Levels[1],
                                   kInt2Levels[2], kInt2Levels[3], kInt2Levels[0], kInt2Levels[1], kInt2Levels[2],
                                   kInt2Levels[3]);
  return _mm512_permutexvar_ps(_mm512_srlv_epi32(_mm512_set1_epi32((int)w), shift), lv);
}

// Values, 16 at a time: block i (elements 16i ..) lies in the 4 bytes from byte 16i / 5, element k at byte
// (p + k) / 5 of them, trit (p + k) % 5, p = i % 5. Per element two 16-bit words hold its byte b; VPMULHUW gives
// floor(b / 3^t) and floor(b / 3^(t+1)) as (b x M) >> 16, M = ceil(2^16 / 3^t) (t = 0: b itself, masked off), and
// VPMADDWD trit = floor(b / 3^t) - 3 floor(b / 3^(t+1)). Exact for every byte: M x 3^t - 2^16 <= 74, 74 x 255 < 2^16
// (jit_kernel/test_cpu_quant_attention.py checks all bytes at every position).
struct TritBlock {
  alignas(64) uint8_t shuf[64];  // VPSHUFB control: the byte of each word (high byte zero)
  alignas(64) uint16_t mul[32];
  uint32_t mask;  // the words VPMULHUW replaces
};

constexpr uint16_t kTritMul[6] = {0, 21846, 7282, 2428, 810, 270};

constexpr TritBlock trit_block(int p) {
  TritBlock b{};
  for (int k = 0; k < 16; ++k) {
    const int rel = (p + k) / 5, t = (p + k) % 5;
    b.shuf[4 * k] = b.shuf[4 * k + 2] = (uint8_t)rel;
    b.shuf[4 * k + 1] = b.shuf[4 * k + 3] = 0x80;
    b.mul[2 * k] = kTritMul[t];
    b.mul[2 * k + 1] = kTritMul[t + 1];
    b.mask |= (t != 0 ? 1u : 0u) << (2 * k) | 1u << (2 * k + 1);
  }
  return b;
}

constexpr TritBlock kTritBlocks[5] = {trit_block(0), trit_block(1), trit_block(2), trit_block(3), trit_block(4)};

// The trits (0, 1, 2) of values 16i .. 16i + 15 of a row, as fp32 (the value is trit - 1: the caller subtracts the 1).
SGL_AVX512 inline __m512 load_trits16(const uint8_t* row, int i) {
  const TritBlock& b = kTritBlocks[i % 5];
  uint32_t w;
  std::memcpy(&w, row + 16 * i / 5, 4);
  const __m512i x = _mm512_shuffle_epi8(_mm512_set1_epi32((int)w), _mm512_load_si512(b.shuf));
  const __m512i q = _mm512_mask_mulhi_epu16(x, (__mmask32)b.mask, x, _mm512_load_si512(b.mul));
  return _mm512_cvtepi32_ps(_mm512_madd_epi16(q, _mm512_set1_epi32((int)0xFFFD0001)));  // words (1, -3)
}

// The log-scale byte of a scale s: round_half_even(log2(s) x 12) + 176 clamped to [1, 255]; 0 for s <= 0.
inline uint8_t log_scale_code(float s) {
  if (!(s > 0.0f)) return 0;
  const float c = std::nearbyint(std::log2(s) * (float)kLogScaleSteps) + (float)kLogScaleOffset;
  return (uint8_t)std::min(255.0f, std::max(1.0f, c));
}

// One (turned) row r [D] fp32 -> int2_hadamard codes (keys D / 4 bytes, values ceil(D / 5)) and the scale byte, the
// codec's rule: z = r / RMS(r); keys: code = #{thresholds -0.9816, 0, 0.9816 below z}, values: trit = 1 + (z > 0.612)
// - (z < -0.612); s = sum(r x level) / sum(level^2) (0 for no nonzero level).
SGL_AVX512 inline void quantize_int2_row(const float* r, int64_t D, bool value, uint8_t* code, uint8_t* scale) {
  __m512 ss = _mm512_setzero_ps();
  for (int64_t j = 0; j < D; j += 16) {
    const __m512 x = _mm512_loadu_ps(r + j);
    ss = _mm512_add_ps(ss, _mm512_mul_ps(x, x));
  }
  const float rms = std::max(std::sqrt(_mm512_reduce_add_ps(ss) / (float)D), 1e-30f);
  const __m512 vrms = _mm512_set1_ps(rms), one = _mm512_set1_ps(1.0f);
  const __m512i ione = _mm512_set1_epi32(1);
  __m512 num = _mm512_setzero_ps(), den = _mm512_setzero_ps();
  alignas(64) int32_t trits[256 + 16];
  for (int64_t j = 0; j < D; j += 16) {
    const __m512 x = _mm512_loadu_ps(r + j), z = _mm512_div_ps(x, vrms);
    __m512 lev;
    if (!value) {
      __m512i c = _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask(z, _mm512_set1_ps(-kInt2Threshold), _CMP_GT_OQ), ione);
      c = _mm512_mask_add_epi32(c, _mm512_cmp_ps_mask(z, _mm512_setzero_ps(), _CMP_GT_OQ), c, ione);
      c = _mm512_mask_add_epi32(c, _mm512_cmp_ps_mask(z, _mm512_set1_ps(kInt2Threshold), _CMP_GT_OQ), c, ione);
      lev = _mm512_permutexvar_ps(c, _mm512_setr_ps(kInt2Levels[0], kInt2Levels[1], kInt2Levels[2], kInt2Levels[3], 0,
                                                     0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0));
      const __m512i crumbs = _mm512_sllv_epi32(c, _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24,
                                                                     26, 28, 30));
      const uint32_t w = (uint32_t)_mm512_reduce_or_epi32(crumbs);
      std::memcpy(code + j / 4, &w, 4);
    } else {
      __m512i c = _mm512_mask_add_epi32(ione, _mm512_cmp_ps_mask(z, _mm512_set1_ps(kTernaryThreshold), _CMP_GT_OQ),
                                        ione, ione);
      c = _mm512_mask_sub_epi32(c, _mm512_cmp_ps_mask(z, _mm512_set1_ps(-kTernaryThreshold), _CMP_LT_OQ), c, ione);
      lev = _mm512_sub_ps(_mm512_cvtepi32_ps(c), one);
      _mm512_store_si512(trits + j, c);
    }
    num = _mm512_add_ps(num, _mm512_mul_ps(x, lev));
    den = _mm512_add_ps(den, _mm512_mul_ps(lev, lev));
  }
  if (value) {
    for (int64_t j = D; j < D + 4; ++j) trits[j] = 1;  // the padding: zero trits
    for (int64_t b = 0; b < (D + 4) / 5; ++b) {
      const int32_t* t = trits + 5 * b;
      code[b] = (uint8_t)(t[0] + 3 * t[1] + 9 * t[2] + 27 * t[3] + 81 * t[4]);
    }
  }
  const float d = _mm512_reduce_add_ps(den);
  const float s = d > 0.0f ? _mm512_reduce_add_ps(num) / d : 0.0f;
  *scale = log_scale_code(std::max(s, 0.0f));
}

}  // namespace sgl_cpu
