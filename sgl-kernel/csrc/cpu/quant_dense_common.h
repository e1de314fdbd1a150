// The dense paths' shared pieces: a quantized weight record dequantized to the bf16 "B tile" both dense GEMMs read
// (quant_gemm_amx_dense.h with AMX-BF16 tiles, quant_gemm_vec_dense.h with VDPBF16PS), the row minimums that choose
// them, and the epilogue that writes their fp32 sums (plain or a gated MLP's act(gate) * up).
//
// Layout of a dequantized record (16 output rows x 32 k values): 16 k-pair rows x 16 output rows x 2 bf16, 1 KiB
// (row p: for each output row n, (w[n][2p], w[n][2p + 1])), the B tile TDPBF16PS reads and, row by row, the 64-byte
// line VDPBF16PS multiplies with a broadcast k-pair. A tile's nb records written one after another are its [K/2][16][2]
// lines in k order.
// Sums: c[2i + j] is the fp32 16 x 16 tile of input rows 16i .. 16i + 15 x output columns 16j .. 16j + 15 of a unit.
// Nothing here needs AMX (AVX-512 BF16 and VNNI only), so both paths inline it.
#pragma once

#include <type_traits>

#include "activation.h"  // silu_ps, gelu_tanh_ps: the gated epilogue
#include "quant_gemm.h"

namespace sgl_cpu {

// Fewer input rows: the int8 paths (at level amx from 8 rows AMX-INT8 tiles). kQDenseMinRows is the default (a
// decode batch: below 32 rows the dense path gains little on the layers and loses on a large vocabulary's lm_head);
// kQDenseMinRowsPrefill is the model runner's for every other forward (set_quant_dense_prefill): a prompt's
// prefill keeps the int8 paths' bits below it whether its prefix was cached or not, as it did before decode batches
// took this path (the int8 paths' rows do not depend on how many rows their call has).
constexpr int kQDenseMinRows = 32;
constexpr int kQDenseMinRowsPrefill = 256;
constexpr int64_t kQDenseBlockElems = 512;  // bf16 per dequantized block (16 k-pairs x 16 rows x 2)

// One record (16 output rows x 32 k) -> its bf16 B tile at out.
template <int FMT>
SGL_AVX512_VNNI_BF16 inline void quant_record_to_bf16(const uint8_t* rec, uint16_t* out) {
  constexpr int BITS = quant_format_bits(FMT), HEAD = quant_format_head(FMT);
  constexpr bool HALVES = quant_format_halves(FMT);
  __m512i wv[8];
  load_record_u8<BITS, quant_header_bytes(HEAD)>(rec, wv);
  __m512 dw, cw, dw1, cw1;
  load_record_scales<HEAD>(rec, dw, cw, dw1, cw1);
  const __m512i ff = _mm512_set1_epi32(0xFF);
  // byte j of each 32-bit lane, zero-extended: j = 0 a mask, j = 3 a shift, j = 1, 2 one byte shuffle each (index
  // 0x80: zero), one instruction a vector where a shift and a mask took two
  const __m512i byte1 = _mm512_set1_epi32((int)0x80808001u), byte2 = _mm512_set1_epi32((int)0x80808002u);
  const __m512i lane4 = _mm512_set_epi32(12, 8, 4, 0, 12, 8, 4, 0, 12, 8, 4, 0, 12, 8, 4, 0);
  const __m512i sh1 = _mm512_add_epi32(byte1, lane4), sh2 = _mm512_add_epi32(byte2, lane4);
  // 16-bit lanes 2n, 2n + 1 <- lanes n, 16 + n: output row n's pair (k, k + 1) from the two converted vectors
  const __m512i pair = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                        21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
#pragma GCC unroll 8
  for (int g = 0; g < 8; ++g) {  // group g: k 4g .. 4g + 3, byte j of lane n = u[n][4g + j]
    const __m512 d = HALVES && g >= 4 ? dw1 : dw, c = HALVES && g >= 4 ? cw1 : cw;
    __m512 w[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const __m512i u = j == 0   ? _mm512_and_si512(wv[g], ff)
                        : j == 1 ? _mm512_shuffle_epi8(wv[g], sh1)
                        : j == 2 ? _mm512_shuffle_epi8(wv[g], sh2)
                                 : _mm512_srli_epi32(wv[g], 24);
      w[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(u), d, c);
    }
#pragma GCC unroll 2
    for (int p = 0; p < 2; ++p) {  // k-pair row 2g + p: (w[2p], w[2p + 1]); low half bf16(w[2p]), high half the other
      const __m512i ab = (__m512i)_mm512_cvtne2ps_pbh(w[2 * p + 1], w[2 * p]);
      _mm512_store_si512(out + (2 * g + p) * 32, _mm512_permutexvar_epi16(pair, ab));
    }
  }
}

// One record of a packed tile -> its bf16 B tile at out, after prefetching the record `ahead` bytes on: the same
// record of the tile the walk dequantizes next in this stream (quant_gemm_amx_dense's next unit). The units' tiles
// are 2 (a pair) or 1 (gated) tiles apart, a stream the hardware prefetcher does not follow across its page strides;
// prefetching the next unit's records (one unit ahead, ~10-20 KiB) took the Gemma 3 270M Q8_0 lm_head's fused argmax
// at 32 rows from ~13.7 to ~12.6 ms at 2 threads, where kQPrefetchRecords (6 records ahead within the tile, as the
// int8 paths read theirs) half-covered it.
template <int FMT>
SGL_AVX512_VNNI_BF16 inline void quant_dequant_record(const uint8_t* rec, uint16_t* out, int64_t ahead) {
  quant_prefetch_record<quant_record_bytes(FMT)>(rec, ahead);
  quant_record_to_bf16<FMT>(rec, out);
}

using QDenseDequant = void (*)(const uint8_t* rec, uint16_t* out, int64_t ahead);

// c (MT x NT tiles) -> y rows [0, min(rows, 16 MT)) (ldy apart), columns [0, n) (n <= 16 NT): fp32 as summed, or
// bf16 (T = uint16_t) rounded to nearest even.
template <int MT, int NT, typename T>
SGL_AVX512_VNNI_BF16 inline void quant_dense_store(float (*c)[16][16], T* y, int64_t ldy, int64_t rows, int64_t n) {
  for (int i = 0; i < MT; ++i)
    for (int64_t r = 0; r < std::min<int64_t>(16, rows - 16 * i); ++r)
      for (int j = 0; j < NT; ++j) {
        const int64_t cols = std::min<int64_t>(16, n - 16 * j);
        if (cols <= 0) continue;
        const __mmask16 mask = (__mmask16)((1u << cols) - 1u);
        const __m512 v = _mm512_load_ps(c[2 * i + j][r]);
        T* out = y + (16 * i + r) * ldy + 16 * j;
        // whole rows unmasked: a masked store costs several times a plain one on AMD's cores
        if constexpr (std::is_same_v<T, float>) {
          if (cols == 16) _mm512_storeu_ps(out, v);
          else _mm512_mask_storeu_ps(out, mask, v);
        } else {
          if (cols == 16) _mm256_storeu_si256((__m256i*)out, (__m256i)_mm512_cvtneps_pbh(v));
          else _mm256_mask_storeu_epi16(out, mask, (__m256i)_mm512_cvtneps_pbh(v));
        }
      }
}

// The gated epilogue (a merged [gate | up] projection's act(gate) * up, QDenseAct): c's tiles j = 0 the gate's 16
// columns, j = 1 the up's, rows [0, min(rows, 16 MT)) -> 16 bf16 columns of y. Each sum is rounded to bf16 as the plain
// store writes it, then the activation runs as activation.h's *_and_mul_row on those bf16 values: the same bits as
// the two calls.
enum class QDenseAct { kNone, kSilu, kGeluTanh };

template <int MT, QDenseAct ACT>
SGL_AVX512_VNNI_BF16 inline void quant_dense_store_gated(float (*c)[16][16], uint16_t* y, int64_t ldy, int64_t rows) {
  for (int i = 0; i < MT; ++i)
    for (int64_t r = 0; r < std::min<int64_t>(16, rows - 16 * i); ++r) {
      const __m512 g = round_bf16(_mm512_load_ps(c[2 * i][r])), u = round_bf16(_mm512_load_ps(c[2 * i + 1][r]));
      const __m512 a = round_bf16(ACT == QDenseAct::kSilu ? silu_ps(g) : gelu_tanh_ps(g));
      store_bf16x16(y + (16 * i + r) * ldy, _mm512_mul_ps(a, u));
    }
}

}  // namespace sgl_cpu
