// Decode attention over a quantized KV pool (python/sglang/srt/mem_plan/kv_quant.py), reading the codes in place:
// the algorithm of decode_attention.h (one pass over a request's keys for up to 4 query heads of one KV head, keys and
// values through req_to_token, fp32 softmax), with each code row converted to fp32 in registers. Nothing is written
// back and no dequantized copy of a row exists outside the registers. Level avx512_vnni and up (AVX-512 F/BW/VL/DQ +
// F16C: no BF16 instruction; bf16 rows are read by a shift and written by bf16_round_soft, vec.h).
//
// Formats and how their scales are applied (code -> fp32 in a few instructions per 16 elements):
//   int8      codes int8, one fp16 scale per (token, KV head) for K and for V (s = amax / 127):
//             score_j = scale * s_k[j] * (q . code_k[j])   (the K scale folded into the dot product)
//             out     = sum_j (p_j * s_v[j]) code_v[j]     (the V scale folded into the softmax weight)
//   int4      two codes a byte, fp16 (step, min) per row: as int8 with step for s, plus min x sum(q) per score and
//             sum_j p_j min_v[j] added to every output element
//   int2_hadamard  keys 2-bit (4 levels), values trits (kv_quant_int2.h), one log-scale byte per row for K and for
//             V (a 256-entry table): as int8, the values' -1 (trit - 1) added as int4's min (-s_v[j]); K and V rows
//             are D / 4 and ceil(D / 5) bytes
//   fp8_e5m2  one byte = the high byte of an fp16: byte << 8, then VCVTPH2PS (exact, subnormals included)
//   fp8_e4m3  (FN: 4 exponent bits, bias 7) moved into an fp16's bits: sign to bit 15, the 7 exponent/mantissa bits << 7;
//             that fp16 is the value x 2^-8 for normals and subnormals alike (fp16 bias 15 = 7 + 8), so VCVTPH2PS
//             converts it exactly and the 2^8 goes into the per-head scale
//   fp8 scales: one fp32 per (layer, KV head) for K and for V, constant over a task: the K scale (x the format's
//             power of two) multiplies the softmax scale, the V scale the final 1 / sum.
//
//   q, out   [group, D] fp32 (the op converts the model's bf16 / fp32 rows)
//   k, v     [slots, kv_heads, row bytes] codes (krow, vrow: a slot's bytes);  ks, vs  [slots, kv_heads, 1 or 2]
//            per-row scales (KvScale: fp16 bits, int2_hadamard's one byte; fp8: null)
//   scores   [seq_len, 4] fp32 scratch
#pragma once

#include <algorithm>
#include <type_traits>

#include "decode_attention.h"
#include "kv_quant_int2.h"

// AVX-512 without BF16 plus F16C (every level from avx2 has it: isa.h), for the scalar fp16 scale conversion.
#define SGL_AVX512_F16C __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,f16c")))

namespace sgl_cpu {

// The keys and values a task attends uncompressed, all in the pool's stored basis; the softmax scale k_mul alone
// multiplies their q.k (no code scale applies). Of a task's seq_len keys, [0, n_sink) are read from the request's
// sink entries (its first tokens: bf16 rows ring_k + (sink_base + j) x stride), [n_sink, n_codes) as codes,
// [n_codes, n_codes + n_ring) from its recent-window ring (bf16 rows ring_k + ((ring_base + j % window) x stride),
// mem_cache/recent_window.py), and the rest -- the forward's own new tokens -- as fp32 rows k + i x stride.
// k == null: every key is read as codes.
struct FreshRows {
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t stride = 0, n_codes = 0;
  float k_mul = 0.0f;
  const uint16_t* ring_k = nullptr;
  const uint16_t* ring_v = nullptr;
  int64_t ring_base = 0, window = 1, n_ring = 0;
  int64_t sink_base = 0, n_sink = 0;
};

// Walks the ring rows of keys j = n_codes, n_codes + 1, ... in order: entry j % window without a division per row.
struct RingCursor {
  int64_t entry, window;
  RingCursor(const FreshRows& f) : entry(f.n_ring > 0 ? f.n_codes % f.window : 0), window(f.window) {}
  int64_t next() {
    const int64_t e = entry;
    entry = entry + 1 == window ? 0 : entry + 1;
    return e;
  }
};

enum class KvQuant : int { kInt8 = 0, kFp8E4m3 = 1, kFp8E5m2 = 2, kInt4 = 3, kInt2 = 4 };

constexpr bool kv_quant_per_token(KvQuant f) { return f != KvQuant::kFp8E4m3 && f != KvQuant::kFp8E5m2; }
// Key codes per byte (int4 two, int2_hadamard four, the others one), a row's bytes per part (int2_hadamard's values:
// five trits a byte), and scale values per (token, KV head): int4 keeps (step, min) per row, int8 / int2 one scale.
constexpr int kv_quant_codes_per_byte(KvQuant f) { return f == KvQuant::kInt4 ? 2 : f == KvQuant::kInt2 ? 4 : 1; }
constexpr int64_t kv_quant_row_bytes(KvQuant f, int64_t d, bool value) {
  return value && f == KvQuant::kInt2 ? (d + 4) / 5 : d / kv_quant_codes_per_byte(f);
}
constexpr int kv_quant_scales_per_row(KvQuant f) { return f == KvQuant::kInt4 ? 2 : 1; }

// A per-row scale: fp16 bits, int2_hadamard's log-scale byte.
template <KvQuant F>
using KvScale = std::conditional_t<F == KvQuant::kInt2, uint8_t, uint16_t>;

// The factor between a converted code and the format's value (folded into the per-head scales).
constexpr float kv_quant_code_unit(KvQuant f) { return f == KvQuant::kFp8E4m3 ? 256.0f : 1.0f; }

// 16 codes -> 16 fp32 (times 1 / kv_quant_code_unit); int4 reads 8 bytes, int2_hadamard's keys 4.
template <KvQuant F>
SGL_AVX512 inline __m512 load_codes16(const uint8_t* p) {
  if constexpr (F == KvQuant::kInt2) return load_crumbs16(p);
  const __m128i b = F == KvQuant::kInt4 ? _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))
                                        : _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if constexpr (F == KvQuant::kInt8) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
  } else if constexpr (F == KvQuant::kInt4) {
    // 8 bytes, element 2i in byte i's low nibble and 2i + 1 in its high nibble (kv_quant_codec._pack_nibbles)
    const __m128i lo = _mm_and_si128(b, _mm_set1_epi8(0x0F));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F));
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)));
  } else if constexpr (F == KvQuant::kFp8E5m2) {
    return _mm512_cvtph_ps(_mm256_slli_epi16(_mm256_cvtepu8_epi16(b), 8));
  } else {
    // sign-extended to 16 bits and shifted by 7: bits 13..7 = exponent and mantissa, bits 15 and 14 = the sign;
    // clearing bit 14 leaves the fp16
    const __m256i s = _mm256_slli_epi16(_mm256_cvtepi8_epi16(b), 7);
    return _mm512_cvtph_ps(_mm256_and_si256(s, _mm256_set1_epi16((short)0xbf80)));
  }
}

template <int kBytes>
SGL_AVX512 inline void prefetch_bytes(const uint8_t* p) {
#pragma GCC unroll 4
  for (int i = 0; i < kBytes; i += 64) _mm_prefetch(reinterpret_cast<const char*>(p) + i, _MM_HINT_T0);
}

SGL_AVX512_F16C inline float half_bits_to_float(uint16_t h) { return _cvtsh_ss(h); }

template <KvQuant F>
SGL_AVX512_F16C inline float scale_value(KvScale<F> s) {
  if constexpr (F == KvQuant::kInt2) return kLogScale[s];
  else return half_bits_to_float(s);
}

// Values 16i .. 16i + 15 of a value row (int2_hadamard: the trits 0..2, the -1 applied by the caller).
template <KvQuant F>
SGL_AVX512 inline __m512 load_values16(const uint8_t* row, int i) {
  if constexpr (F == KvQuant::kInt2) return load_trits16(row, i);
  else return load_codes16<F>(row + 16 / kv_quant_codes_per_byte(F) * i);
}

// The value bytes of blocks [c, c + 4) of a row: prefetched from their first and last cache line.
template <KvQuant F, int D>
SGL_AVX512 inline void prefetch_value_chunk(const uint8_t* row, int c) {
  if constexpr (F == KvQuant::kInt2) {
    const int first = 16 * c / 5, last = std::min<int>((D + 4) / 5 - 1, (16 * c + 63) / 5);
    _mm_prefetch(reinterpret_cast<const char*>(row + first), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(row + last), _MM_HINT_T0);
  } else {
    constexpr int kB16 = 16 / kv_quant_codes_per_byte(F);
    prefetch_bytes<4 * kB16>(row + kB16 * c);
  }
}

SGL_AVX512 inline __m512 load_row16(const uint16_t* p) { return load_bf16x16(p); }
SGL_AVX512 inline __m512 load_row16(const float* p) { return _mm512_loadu_ps(p); }

// An uncompressed key row (bf16 ring row or fp32 new row) against G query heads: out4[g] = k_mul * q_g . k.
template <int D, int G, typename T>
SGL_AVX512 inline void score_uncompressed(const __m512 (&qv)[G][D / 16], const T* k, float k_mul, float* out4) {
  __m512 acc[kHeadsPerPass];
#pragma GCC unroll 4
  for (int g = 0; g < kHeadsPerPass; ++g) acc[g] = _mm512_setzero_ps();
#pragma GCC unroll 16
  for (int i = 0; i < D / 16; ++i) {
    const __m512 kv = load_row16(k + 16 * i);
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) acc[g] = _mm512_fmadd_ps(qv[g][i], kv, acc[g]);
  }
  _mm_storeu_ps(out4, _mm_mul_ps(reduce_add_4(acc[0], acc[1], acc[2], acc[3]), _mm_set1_ps(k_mul)));
}

// An uncompressed value row's 16-dim blocks [c, c + kChunk) (v points at block c), weighted by p4[g] / v_mul.
template <int D, int G, int kChunk, typename T>
SGL_AVX512 inline void add_uncompressed(__m512 (&acc)[G][kChunk], const T* v, int c, const float* p4,
                                        float v_mul) {
  __m512 vv[kChunk];
#pragma GCC unroll 4
  for (int d = 0; d < kChunk; ++d) vv[d] = c + d < D / 16 ? load_row16(v + 16 * d) : _mm512_setzero_ps();
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
    const __m512 p = _mm512_set1_ps(p4[g] / v_mul);
#pragma GCC unroll 4
    for (int d = 0; d < kChunk; ++d) acc[g][d] = _mm512_fmadd_ps(p, vv[d], acc[g][d]);
  }
}

// G (<= 4) query heads of head_dim D against one KV head; k, v, ks, vs point at that head's column; krow, vrow, srow:
// a slot's bytes of K and V codes and its scales.
template <KvQuant F, int D, int G>
SGL_AVX512_F16C inline void quant_attention_heads(const float* q, const uint8_t* k, const uint8_t* v,
                                                  const KvScale<F>* ks, const KvScale<F>* vs, int64_t krow,
                                                  int64_t vrow, int64_t srow, const int64_t* tokens, int64_t seq_len,
                                                  float k_mul, float v_mul, float* scores, float* out,
                                                  const FreshRows& fresh) {
  static_assert(D % 16 == 0 && G >= 1 && G <= kHeadsPerPass, "head_dim: a multiple of 16");
  constexpr int kQ = D / 16;
  constexpr bool kPerToken = kv_quant_per_token(F);
  constexpr bool kMin = F == KvQuant::kInt4;  // an asymmetric row: value = code x step + min
  constexpr bool kVMin = kMin || F == KvQuant::kInt2;  // a value row with an offset (int2_hadamard: -s_v)
  constexpr int kB16 = 16 / kv_quant_codes_per_byte(F), kRowBytes = D / kv_quant_codes_per_byte(F);
  __m512 qv[G][kQ];  // in registers (q may alias the scores for the compiler: no reload per key)
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 16
    for (int i = 0; i < kQ; ++i) qv[g][i] = _mm512_loadu_ps(q + g * D + 16 * i);
  alignas(16) float qsum[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // int4: q_g . (min, ..., min) = min x sum(q_g)
  if constexpr (kMin) {
    for (int g = 0; g < G; ++g) {
      __m512 a = qv[g][0];
      for (int i = 1; i < kQ; ++i) a = _mm512_add_ps(a, qv[g][i]);
      qsum[g] = _mm512_reduce_add_ps(a);
    }
  }
  const __m128 qsum4 = _mm_load_ps(qsum);
  // keys [n_sink, n_codes) are read as codes through tokens, the rest uncompressed (sinks, ring, this forward's rows)
  const int64_t n_codes = fresh.k == nullptr ? seq_len : fresh.n_codes;
  const int64_t n_sink = fresh.k == nullptr ? 0 : fresh.n_sink;
  // the ring's rows (read after the codes, entries n_codes % window onwards): fetched while the codes are read
  RingCursor pcur(fresh);
  for (int64_t i = 0; i < std::min(fresh.n_ring, fresh.window); ++i) {
    const int64_t e = pcur.next();
    prefetch_bytes<2 * D>(reinterpret_cast<const uint8_t*>(fresh.ring_k + (fresh.ring_base + e) * fresh.stride));
    prefetch_bytes<2 * D>(reinterpret_cast<const uint8_t*>(fresh.ring_v + (fresh.ring_base + e) * fresh.stride));
  }
  // 1. scores[j][g] = k_mul (x s_k[j]) * q_g . code_k[j] (int4: + k_mul m_k[j] sum(q_g))
  for (int64_t j = n_sink; j < std::min(n_sink + kPrefetchKeys, n_codes); ++j)
    prefetch_bytes<kRowBytes>(k + tokens[j] * krow);
  for (int64_t j = n_sink; j < n_codes; ++j) {
    const uint8_t* kr = k + tokens[j] * krow;
    if (j + kPrefetchKeys < n_codes) {
      prefetch_bytes<kRowBytes>(k + tokens[j + kPrefetchKeys] * krow);
      if constexpr (kPerToken) _mm_prefetch(reinterpret_cast<const char*>(ks + tokens[j + kPrefetchKeys] * srow),
                                            _MM_HINT_T0);
    }
    __m512 acc[kHeadsPerPass];
#pragma GCC unroll 4
    for (int g = 0; g < kHeadsPerPass; ++g) acc[g] = _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int i = 0; i < kQ; ++i) {
      const __m512 kv = load_codes16<F>(kr + kB16 * i);
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) acc[g] = _mm512_fmadd_ps(qv[g][i], kv, acc[g]);
    }
    const float m = kPerToken ? k_mul * scale_value<F>(ks[tokens[j] * srow]) : k_mul;
    __m128 sc = _mm_mul_ps(reduce_add_4(acc[0], acc[1], acc[2], acc[3]), _mm_set1_ps(m));
    if constexpr (kMin) sc = _mm_add_ps(sc, _mm_mul_ps(qsum4, _mm_set1_ps(k_mul * half_bits_to_float(ks[tokens[j] * srow + 1]))));
    _mm_storeu_ps(scores + 4 * j, sc);
  }
  // 1b. the uncompressed keys: scores[j][g] = fresh.k_mul * q_g . k_j (sink and ring rows bf16, then the new rows
  // fp32; a loop each, so none tests which a row is)
  for (int64_t j = 0; j < n_sink; ++j)
    score_uncompressed<D, G>(qv, fresh.ring_k + (fresh.sink_base + j) * fresh.stride, fresh.k_mul, scores + 4 * j);
  const int64_t n_old = n_codes + fresh.n_ring;
  RingCursor kcur(fresh);
  for (int64_t j = n_codes; j < n_old; ++j)
    score_uncompressed<D, G>(qv, fresh.ring_k + (fresh.ring_base + kcur.next()) * fresh.stride, fresh.k_mul,
                             scores + 4 * j);
  for (int64_t j = n_old; j < seq_len; ++j)
    score_uncompressed<D, G>(qv, fresh.k + (j - n_old) * fresh.stride, fresh.k_mul, scores + 4 * j);
  alignas(16) float inv[4];
  softmax_columns_4(scores, seq_len, inv);
  float pmin[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // int4 / int2: sum_j p[j][g] m_v[j], added to every element of out_g
  if constexpr (kVMin) {
    for (int64_t j = n_sink; j < n_codes; ++j) {
      const float mv = kMin ? half_bits_to_float(vs[tokens[j] * srow + 1]) : -scale_value<F>(vs[tokens[j] * srow]);
      for (int g = 0; g < G; ++g) pmin[g] += scores[4 * j + g] * mv;
    }
  }
  // 2. out_g = sum_j p[j][g] (x s_v[j]) code_v[j] x v_mul / sum_g, 64 dims at a time
  constexpr int kChunk = 4;
#pragma GCC unroll 1
  for (int c = 0; c < kQ; c += kChunk) {
    __m512 acc[G][kChunk];
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g)
#pragma GCC unroll 4
      for (int d = 0; d < kChunk; ++d) acc[g][d] = _mm512_setzero_ps();
    for (int64_t j = n_sink; j < std::min(n_sink + kPrefetchKeys, n_codes); ++j)
      prefetch_value_chunk<F, D>(v + tokens[j] * vrow, c);
    for (int64_t j = n_sink; j < n_codes; ++j) {
      const uint8_t* vr = v + tokens[j] * vrow;
      if (j + kPrefetchKeys < n_codes) {
        prefetch_value_chunk<F, D>(v + tokens[j + kPrefetchKeys] * vrow, c);
        if constexpr (kPerToken) _mm_prefetch(reinterpret_cast<const char*>(vs + tokens[j + kPrefetchKeys] * srow),
                                              _MM_HINT_T0);
      }
      __m512 vv[kChunk];
#pragma GCC unroll 4
      for (int d = 0; d < kChunk; ++d) vv[d] = c + d < kQ ? load_values16<F>(vr, c + d) : _mm512_setzero_ps();
      const float sv = kPerToken ? scale_value<F>(vs[tokens[j] * srow]) : 1.0f;
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) {
        const __m512 p = _mm512_set1_ps(scores[4 * j + g] * sv);
#pragma GCC unroll 4
        for (int d = 0; d < kChunk; ++d) acc[g][d] = _mm512_fmadd_ps(p, vv[d], acc[g][d]);
      }
    }
    // the uncompressed values (sink rows, ring rows, then the new rows), weighted by p / v_mul (v_mul scales the sum)
    for (int64_t j = 0; j < n_sink; ++j)
      add_uncompressed<D, G, kChunk>(acc, fresh.ring_v + (fresh.sink_base + j) * fresh.stride + 16 * c, c,
                                     scores + 4 * j, v_mul);
    RingCursor vcur(fresh);
    for (int64_t j = n_codes; j < n_old; ++j)
      add_uncompressed<D, G, kChunk>(acc, fresh.ring_v + (fresh.ring_base + vcur.next()) * fresh.stride + 16 * c, c,
                                     scores + 4 * j, v_mul);
    for (int64_t j = n_old; j < seq_len; ++j)
      add_uncompressed<D, G, kChunk>(acc, fresh.v + (j - n_old) * fresh.stride + 16 * c, c, scores + 4 * j, v_mul);
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      const __m512 vinv = _mm512_set1_ps(inv[g] * v_mul), vmin = _mm512_set1_ps(pmin[g]);
#pragma GCC unroll 4
      for (int d = 0; d < kChunk; ++d)
        if (c + d < kQ) _mm512_storeu_ps(out + g * D + 16 * (c + d), _mm512_mul_ps(_mm512_add_ps(acc[g][d], vmin), vinv));
    }
  }
}

// A task's operands: the codes and scales of one KV head's column, a slot's strides (krow, vrow, srow).
template <KvQuant F>
struct QuantKv {
  const uint8_t* k;
  const uint8_t* v;
  const KvScale<F>* ks;
  const KvScale<F>* vs;
  int64_t krow, vrow, srow;
};

template <KvQuant F, int D>
SGL_AVX512_F16C inline void quant_attention_pass_d(int64_t heads, const float* q, const QuantKv<F>& c,
                                                   const int64_t* tokens, int64_t seq_len, float k_mul, float v_mul,
                                                   float* scores, float* out, const FreshRows& fresh) {
#define SGL_HEADS(G)                                                                                             \
  quant_attention_heads<F, D, G>(q, c.k, c.v, c.ks, c.vs, c.krow, c.vrow, c.srow, tokens, seq_len, k_mul, v_mul, \
                                 scores, out, fresh)
  switch (heads) {
    case 1: SGL_HEADS(1); break;
    case 2: SGL_HEADS(2); break;
    case 3: SGL_HEADS(3); break;
    default: SGL_HEADS(4);
  }
#undef SGL_HEADS
}

// One pass (heads <= 4) of a format over head_dim (one of SGL_DECODE_HEAD_DIMS); false for another head_dim.
template <KvQuant F>
inline bool quant_attention_pass(int64_t head_dim, int64_t heads, const float* q, const QuantKv<F>& c,
                                 const int64_t* tokens, int64_t seq_len, float k_mul, float v_mul, float* scores,
                                 float* out, const FreshRows& fresh) {
  switch (head_dim) {
#define SGL_CASE(D)                                                                                  \
  case D:                                                                                            \
    quant_attention_pass_d<F, D>(heads, q, c, tokens, seq_len, k_mul, v_mul, scores, out, fresh); \
    return true;
    SGL_DECODE_HEAD_DIMS(SGL_CASE)
#undef SGL_CASE
    default:
      return false;
  }
}

}  // namespace sgl_cpu
