// Turned rows and the quantized KV write (python/sglang/srt/mem_cache/kv_quant_codec.py's rules, in registers):
//   turn_rows    rows [n, D] fp32 -> rows @ R in place (R [D, D] fp32 row-major, the codec's rotation): the query
//                turn of a pool that stores its keys turned, done inside extend_attention_quant's scratch;
//   kv_quant_write  new K or V rows [N, KV, D] (bf16 / fp32) -> the pool's codes at the slots loc, optionally turned
//                first (r = x @ R), by the codec's rule op for op: int8 s = fp16(amax(|r|) / 127) (1.0 where that is
//                0) written per row, code = round_half_even(r / s) clamped to [-127, 127]; fp8 code =
//                fp8(clamp(r / scale, +-max)) with the pool's fixed per-head scale, rounded to nearest even as torch's
//                conversion; int4 (step, min) = fp16((max - min) / 15), fp16(min) per row written, code =
//                round((r - min) / step) in [0, 15], keys multiplied by w (smooth) before the turn; int2_hadamard
//                (K and V turned) 2-bit keys / ternary values and a log-scale byte per row (kv_quant_int2.h). The
//                turn's sums are ordered differently from torch's matmul, so a turned row's codes can differ from the
//                codec's by one step where r / s lies within rounding of a half (int2: r / RMS of a threshold).
// Level avx512_vnni and up (the module's quantized-KV kernels). D: a multiple of 16, at most 256.
#pragma once

#include <torch/extension.h>

#include <algorithm>
#include <string>

#include "decode_attention_quant.h"
#include "parallel.h"

namespace sgl_cpu {

constexpr int64_t kMaxTurnDim = 256;

// NB 16-column blocks of row @ R, columns [j, j + 16 NB): NB FMA chains side by side (one a block, each summing
// over i in order, as a block on its own would) instead of one block's chain of D dependent FMAs after another's.
template <int NB>
SGL_AVX512 inline void turn_columns(const float* row, int64_t D, const float* R, int64_t j, float* tmp) {
  __m512 acc[NB];
#pragma GCC unroll 4
  for (int b = 0; b < NB; ++b) acc[b] = _mm512_setzero_ps();
  for (int64_t i = 0; i < D; ++i) {
    const __m512 x = _mm512_set1_ps(row[i]);
    const float* r = R + i * D + j;
#pragma GCC unroll 4
    for (int b = 0; b < NB; ++b) acc[b] = _mm512_fmadd_ps(x, _mm512_loadu_ps(r + 16 * b), acc[b]);
  }
#pragma GCC unroll 4
  for (int b = 0; b < NB; ++b) _mm512_storeu_ps(tmp + j + 16 * b, acc[b]);
}

// row [D] -> row @ R, through tmp [D]: 64 columns at a time, then the 16-column blocks left.
SGL_AVX512 inline void turn_row(float* row, int64_t D, const float* R, float* tmp) {
  int64_t j = 0;
  for (; j + 64 <= D; j += 64) turn_columns<4>(row, D, R, j, tmp);
  for (; j < D; j += 16) turn_columns<1>(row, D, R, j, tmp);
  std::copy(tmp, tmp + D, row);
}

SGL_AVX512 inline void turn_rows(float* rows, int64_t n, int64_t D, const float* R, float* tmp) {
  for (int64_t h = 0; h < n; ++h) turn_row(rows + h * D, D, R, tmp);
}

// rows [n, D] / w [D] (int4's query, whose keys are stored times w), and row [D] * w (int4's keys on write).
SGL_AVX512 inline void divide_rows(float* rows, int64_t n, int64_t D, const float* w) {
  for (int64_t h = 0; h < n; ++h)
    for (int64_t j = 0; j < D; j += 16)
      _mm512_storeu_ps(rows + h * D + j, _mm512_div_ps(_mm512_loadu_ps(rows + h * D + j), _mm512_loadu_ps(w + j)));
}
SGL_AVX512 inline void multiply_row(float* row, int64_t D, const float* w) {
  for (int64_t j = 0; j < D; j += 16)
    _mm512_storeu_ps(row + j, _mm512_mul_ps(_mm512_loadu_ps(row + j), _mm512_loadu_ps(w + j)));
}

// One row r [D] fp32 -> D int8 codes and the fp16 bits of its scale.
SGL_AVX512_F16C inline void quantize_int8_row(const float* r, int64_t D, int8_t* code, uint16_t* scale) {
  __m512 amax = _mm512_setzero_ps();
  for (int64_t j = 0; j < D; j += 16) amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_loadu_ps(r + j)));
  uint16_t h = _cvtss_sh(_mm512_reduce_max_ps(amax) / 127.0f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  float s = _cvtsh_ss(h);
  if (!(s > 0.0f)) {
    h = 0x3C00;  // fp16 1.0
    s = 1.0f;
  }
  *scale = h;
  const __m512 vs = _mm512_set1_ps(s), lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
  for (int64_t j = 0; j < D; j += 16) {
    __m512 q = _mm512_roundscale_ps(_mm512_div_ps(_mm512_loadu_ps(r + j), vs),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q = _mm512_min_ps(_mm512_max_ps(q, lo), hi);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(code + j), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(q)));
  }
}

// n values (a multiple of 16) between the model's dtype and fp32 scratch.
SGL_AVX512 inline void rows_to_f32(const at::BFloat16* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; i += 16) _mm512_storeu_ps(dst + i, load_bf16x16(reinterpret_cast<const uint16_t*>(src) + i));
}
inline void rows_to_f32(const float* src, int64_t n, float* dst) { std::copy(src, src + n, dst); }

// One row r [D] fp32 -> D / 2 bytes of 4-bit codes (element 2i low nibble, 2i + 1 high) and fp16 (step, min):
// step = fp16((max - min) / 15), min = fp16(min r), code = round_half_even((r - min) / step) in [0, 15] (step 1
// where it is 0).
SGL_AVX512_F16C inline void quantize_int4_row(const float* r, int64_t D, uint8_t* code, uint16_t* scale) {
  __m512 lo = _mm512_loadu_ps(r), hi = lo;
  for (int64_t j = 16; j < D; j += 16) {
    const __m512 x = _mm512_loadu_ps(r + j);
    lo = _mm512_min_ps(lo, x);
    hi = _mm512_max_ps(hi, x);
  }
  const float mn = _mm512_reduce_min_ps(lo), mx = _mm512_reduce_max_ps(hi);
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const uint16_t sh = _cvtss_sh((mx - mn) / 15.0f, kRound), mh = _cvtss_sh(mn, kRound);
  scale[0] = sh;
  scale[1] = mh;
  float step = _cvtsh_ss(sh);
  if (!(step > 0.0f)) step = 1.0f;
  const __m512 vm = _mm512_set1_ps(_cvtsh_ss(mh)), vs = _mm512_set1_ps(step);
  const __m512 zero = _mm512_setzero_ps(), top = _mm512_set1_ps(15.0f);
  for (int64_t j = 0; j < D; j += 16) {
    __m512 q = _mm512_roundscale_ps(_mm512_div_ps(_mm512_sub_ps(_mm512_loadu_ps(r + j), vm), vs), kRound);
    q = _mm512_min_ps(_mm512_max_ps(q, zero), top);
    const __m128i c = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(q));  // 16 codes, one a byte
    // pairs (2i, 2i + 1) -> one byte: the odd codes shifted up a nibble, OR-ed in, then every other byte kept
    const __m128i pair = _mm_or_si128(c, _mm_srli_epi16(c, 4));
    const __m128i packed = _mm_shuffle_epi8(pair, _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, -1, -1, -1, -1, -1, -1, -1, -1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(code + j / 2), packed);
  }
}

// 16 fp32 values (already clamped to the format's finite range) -> 16 fp8 bytes, rounded to nearest even as torch's
// float -> float8 conversion rounds: normals by integer rounding of the fp32 bits at the format's mantissa width,
// subnormals (below the format's smallest normal) as round(|x| / the subnormal step), both with the sign bit on top.
template <KvQuant F>
SGL_AVX512 inline __m128i fp32_to_fp8x16(__m512 x) {
  constexpr int kMant = F == KvQuant::kFp8E4m3 ? 3 : 2, kBias = F == KvQuant::kFp8E4m3 ? 7 : 15;
  constexpr int kShift = 23 - kMant;
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(bits, 24), _mm512_set1_epi32(0x80));
  const __m512 ax = _mm512_abs_ps(x);
  const __m512i abits = _mm512_castps_si512(ax);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(abits, kShift), _mm512_set1_epi32(1));
  const __m512i up = _mm512_add_epi32(_mm512_set1_epi32((1 << (kShift - 1)) - 1), lsb);
  const __m512i normal = _mm512_sub_epi32(_mm512_srli_epi32(_mm512_add_epi32(abits, up), kShift),
                                          _mm512_set1_epi32((127 - kBias) << kMant));
  const float sub_unit_inv = (float)(1 << (kBias - 1 + kMant));  // 1 / the subnormal step 2^(1 - bias - mant)
  const __m512i sub = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(ax, _mm512_set1_ps(sub_unit_inv)),
                                                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  const __mmask16 is_sub = _mm512_cmp_ps_mask(ax, _mm512_set1_ps(1.0f / (float)(1 << (kBias - 1))), _CMP_LT_OQ);
  return _mm512_cvtepi32_epi8(_mm512_or_si512(_mm512_mask_blend_epi32(is_sub, normal, sub), sign));
}

// One row r [D] fp32 -> D fp8 bytes of r / scale, saturated to the format's largest finite value.
template <KvQuant F>
SGL_AVX512 inline void quantize_fp8_row(const float* r, int64_t D, float scale, uint8_t* code) {
  const float fmax = F == KvQuant::kFp8E4m3 ? 448.0f : 57344.0f;
  const __m512 vs = _mm512_set1_ps(scale), lo = _mm512_set1_ps(-fmax), hi = _mm512_set1_ps(fmax);
  for (int64_t j = 0; j < D; j += 16) {
    const __m512 q = _mm512_min_ps(_mm512_max_ps(_mm512_div_ps(_mm512_loadu_ps(r + j), vs), lo), hi);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(code + j), fp32_to_fp8x16<F>(q));
  }
}

template <typename T>
void kv_quant_write_t(KvQuant fmt, const at::Tensor& x, at::Tensor& codes, at::Tensor& scales, const int64_t* loc,
                      const float* R, const float* smooth, float* turned_out) {
  const int64_t N = x.size(0), KV = x.size(1), D = x.size(2);
  const T* xp = x.data_ptr<T>();
  uint8_t* cp = reinterpret_cast<uint8_t*>(codes.data_ptr());
  const bool per_token = kv_quant_per_token(fmt);
  const int64_t cb = codes.size(2), sr = kv_quant_scales_per_row(fmt);
  const bool value = fmt == KvQuant::kInt2 && cb == kv_quant_row_bytes(fmt, D, true);  // int2: trits
  uint16_t* sp = per_token && fmt != KvQuant::kInt2 ? reinterpret_cast<uint16_t*>(scales.data_ptr()) : nullptr;
  uint8_t* sp8 = fmt == KvQuant::kInt2 ? reinterpret_cast<uint8_t*>(scales.data_ptr()) : nullptr;
  const float* head_scale = per_token ? nullptr : scales.data_ptr<float>();
  parallel_for(0, N * KV, 32, [&](int64_t lo, int64_t hi) {
    alignas(64) float r[kMaxTurnDim], tmp[kMaxTurnDim];
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t t = i / KV, h = i % KV, slot = loc[t];
      uint8_t* dst = cp + (slot * KV + h) * cb;
      rows_to_f32(xp + i * D, D, r);
      if (smooth != nullptr) multiply_row(r, D, smooth + h * D);
      if (R != nullptr) turn_row(r, D, R, tmp);
      if (turned_out != nullptr) std::copy(r, r + D, turned_out + i * D);  // the row in the stored basis, fp32
      switch (fmt) {
        case KvQuant::kInt8: quantize_int8_row(r, D, reinterpret_cast<int8_t*>(dst), sp + slot * KV + h); break;
        case KvQuant::kInt4: quantize_int4_row(r, D, dst, sp + (slot * KV + h) * sr); break;
        case KvQuant::kFp8E4m3: quantize_fp8_row<KvQuant::kFp8E4m3>(r, D, head_scale[h], dst); break;
        case KvQuant::kFp8E5m2: quantize_fp8_row<KvQuant::kFp8E5m2>(r, D, head_scale[h], dst); break;
        case KvQuant::kInt2: quantize_int2_row(r, D, value, dst, sp8 + slot * KV + h); break;
      }
    }
  });
}

// x [N, KV, D] bf16 or fp32; codes [slots, KV, row bytes] one-byte (int2_hadamard: D / 4 for keys, ceil(D / 5) for
// values, which says the part); loc [N] int64 slots; scales: int8: [slots, KV, 1] fp16, int4 [slots, KV, 2] fp16,
// int2_hadamard [slots, KV, 1] uint8, written (one per row); fp8: [KV] fp32, read (the pool's fixed scales); turn:
// None, or R [D, D] fp32 (the rows are stored turned). turned_out [N, KV, D] fp32, optional, gets each row as stored
// (times smooth, turned): what extend_attention_quant takes as fresh_k / fresh_v.
inline void kv_quant_write(const at::Tensor& x, at::Tensor codes, at::Tensor scales, const at::Tensor& loc,
                           const std::string& kv_format, const c10::optional<at::Tensor>& turn,
                           const c10::optional<at::Tensor>& smooth, const c10::optional<at::Tensor>& turned_out) {
  const char* op = "kv_quant_write";
  KvQuant fmt = KvQuant::kInt8;
  if (kv_format == "int4") {
    fmt = KvQuant::kInt4;
  } else if (kv_format == "int2_hadamard") {
    fmt = KvQuant::kInt2;
  } else if (kv_format == "fp8_e4m3") {
    fmt = KvQuant::kFp8E4m3;
  } else if (kv_format == "fp8_e5m2") {
    fmt = KvQuant::kFp8E5m2;
  } else {
    TORCH_CHECK(kv_format == "int8", op, ": kv format int8, int4, int2_hadamard, fp8_e4m3 or fp8_e5m2, got ", kv_format);
  }
  TORCH_CHECK(isa_at_least(CpuIsa::kAvx512Vnni), op, ": needs CPU level avx512_vnni, this module runs at ",
              cpu_isa_name(current_isa()));
  TORCH_CHECK(x.dim() == 3 && x.is_contiguous() && x.device().is_cpu() &&
                  (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat),
              op, ": rows must be a contiguous CPU [N, KV, D] bfloat16 or float32 tensor");
  const int64_t N = x.size(0), KV = x.size(1), D = x.size(2);
  TORCH_CHECK(D % 16 == 0 && D <= kMaxTurnDim, op, ": head_dim ", D, " must be a multiple of 16, at most ", kMaxTurnDim);
  const int64_t cb = kv_quant_row_bytes(fmt, D, false), sr = kv_quant_scales_per_row(fmt);
  const int64_t vb = kv_quant_row_bytes(fmt, D, true);  // int2_hadamard's values (its keys: cb)
  TORCH_CHECK(fmt != KvQuant::kInt2 || cb != vb, op, ": int2_hadamard head_dim ", D, ": key and value rows alike");
  TORCH_CHECK(codes.dim() == 3 && codes.is_contiguous() && codes.element_size() == 1 && codes.size(1) == KV &&
                  (codes.size(2) == cb || codes.size(2) == vb),
              op, ": codes must be a contiguous one-byte [slots, ", KV, ", ", cb, "] tensor",
              fmt == KvQuant::kInt2 ? " (values: " + std::to_string(vb) + ")" : std::string());
  const int64_t slots = codes.size(0);
  if (fmt == KvQuant::kInt2) {
    TORCH_CHECK(scales.is_contiguous() && scales.scalar_type() == at::kByte && scales.numel() == slots * KV &&
                    scales.size(0) == slots,
                op, ": int2_hadamard scales must be a contiguous uint8 [slots, KV, 1] tensor");
  } else if (kv_quant_per_token(fmt)) {
    TORCH_CHECK(scales.is_contiguous() && scales.scalar_type() == at::kHalf && scales.numel() == slots * KV * sr &&
                    scales.size(0) == slots,
                op, ": scales must be a contiguous float16 [slots, KV, ", sr, "] tensor");
  } else {
    TORCH_CHECK(scales.is_contiguous() && scales.scalar_type() == at::kFloat && scales.numel() == KV, op,
                ": fp8 scales must be a contiguous float32 [KV] tensor");
  }
  TORCH_CHECK(loc.dim() == 1 && loc.numel() == N && loc.scalar_type() == at::kLong && loc.is_contiguous(), op,
              ": loc must be a contiguous int64 [N] tensor");
  const int64_t* lp = loc.data_ptr<int64_t>();
  for (int64_t i = 0; i < N; ++i) TORCH_CHECK(lp[i] >= 0 && lp[i] < slots, op, ": slot ", lp[i], " is outside the pool");
  const float* R = nullptr;
  if (turn.has_value() && turn->defined()) {
    TORCH_CHECK(turn->scalar_type() == at::kFloat && turn->is_contiguous() && turn->dim() == 2 && turn->size(0) == D &&
                    turn->size(1) == D,
                op, ": turn must be a contiguous float32 [D, D] matrix");
    R = turn->data_ptr<float>();
  }
  const float* w = nullptr;
  if (smooth.has_value() && smooth->defined()) {
    TORCH_CHECK(smooth->scalar_type() == at::kFloat && smooth->is_contiguous() && smooth->numel() == KV * D, op,
                ": smooth must be a contiguous float32 [KV, D] tensor");
    w = smooth->data_ptr<float>();
  }
  float* out = nullptr;
  if (turned_out.has_value() && turned_out->defined()) {
    TORCH_CHECK(turned_out->scalar_type() == at::kFloat && turned_out->is_contiguous() &&
                    turned_out->sizes() == x.sizes(),
                op, ": turned_out must be a contiguous float32 tensor shaped like the rows");
    out = turned_out->data_ptr<float>();
  }
  if (x.scalar_type() == at::kBFloat16)
    return kv_quant_write_t<at::BFloat16>(fmt, x, codes, scales, lp, R, w, out);
  kv_quant_write_t<float>(fmt, x, codes, scales, lp, R, w, out);
}

}  // namespace sgl_cpu
