// The quantized GEMM for many input rows on AMX-BF16 tiles (level amx, bf16 activations, from kQDenseMinRows rows):
// each tile of 16 output rows is dequantized once per call into bf16 "B" tiles and multiplied with the activations
// as they are (bf16, no int8 quantization) by TDPBF16PS, the sums staying in the C tiles over the whole K.
//
// Why: the int8 paths (quant_gemm.h, quant_gemm_amx.h) scale every 32-value block's integer sums in fp32 per input
// row and output row, 16 vector operations per 16 x 16 x 32 block against one TDPBSUD; past a few dozen rows that
// epilogue, not the dot products, is the GEMM's time. Here the scales are applied once per weight, at dequantization,
// and the per-row cost is the tile products alone.
//
// Values: each weight is the GGUF formula's d * u + c rounded once to fp32 (one FMA), then written as the sum of
// kQDenseTerms = 3 bf16 numbers hi + mid + lo (hi = bf16(w), mid = bf16(w - hi), lo = bf16(w - hi - mid)): the
// residuals are exact in fp32 and 3 x 8 significand bits hold all 24 of w's, so the three terms ARE w (no weight is
// rounded; only residuals below bf16's normal range, < 2^-126, would flush). A bf16 activation times a bf16 term is
// exact in fp32, so an output is sum_k x_k * w_k with fp32 additions only: the int8 paths' activation rounding (up
// to da / 2 per value, da / 508 with the 8-bit formats' residual pass) is gone. The three terms cost three tile
// products per block; the epilogue they replace cost more from kQDenseMinRows rows (bench_quant_prefill.py).
// Not the int8 paths' bits: a row's result depends on whether its batch has kQDenseMinRows rows (each path within
// test_kquant_kernels' bound of the fp64 GGUF formula; this one far inside it).
//
// Layout of the dequantized tile (per term, per 32-value block b): 16 k-pair rows x 16 output rows x 2 bf16, 1 KiB,
// the B tile TDPBF16PS reads (row p: for each output row n, (w[n][2p], w[n][2p + 1])); the term t of block b of
// tile j at buf + ((j * kQDenseTerms + t) * nb + b) * 512 (uint16 units).
// Tiles: tmm0-3 C (input tile i x output tile j at 2i + j), tmm4-5 A (activations, 16 rows x 32 bf16), tmm6-7 B.
#pragma once

#include <cstdlib>
#include <cstring>
#include <vector>

#include "amx_gemm.h"  // TileConfig
#include "quant_gemm.h"

#define SGL_AMX_QDENSE \
  __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16,f16c,fma")))

namespace sgl_cpu {

// Fewer input rows: the int8 paths. The dequantization is paid per call (~2.5 cycles per weight with 3 terms), so on
// the Gemma 3 270M layers the Q5_0 ones (2 terms) broke even between 128 and 512 rows, Q6_K's from ~96.
constexpr int kQDenseMinRows = 256;
constexpr int kQDenseTerms = 3;     // bf16 terms per weight: hi + mid + lo == the fp32 weight
constexpr int64_t kQDenseBlockElems = 512;  // bf16 per term per block (16 k-pairs x 16 rows x 2)

SGL_AMX_QDENSE inline void quant_dense_configure() {
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) {  // C: 16 x 16 fp32; A: 16 rows x 32 bf16; B: 16 k-pairs x 16 x 2 bf16
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  __asm__ __volatile__("" : : "r"(&cfg) : "memory");  // the stores above are read by ldtilecfg (see amx_gemm.h)
  _tile_loadconfig(&cfg);
}

// The fp32 value of the 16 bf16 in the low (HI = false) or high half of v.
template <bool HI>
SGL_AMX_QDENSE inline __m512 qdense_bf16_half(__m512i v) {
  const __m256i h = HI ? _mm512_extracti64x4_epi64(v, 1) : _mm512_castsi512_si256(v);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// One record (16 output rows x 32 k) -> its kQDenseTerms B tiles at out, out + term_stride, ... (uint16 units);
// any1 / any2 collect the bits of the mid / lo terms (zero where the weights need fewer terms).
template <int FMT>
SGL_AMX_QDENSE inline void quant_record_to_bf16(const uint8_t* rec, uint16_t* out, int64_t term_stride, __m512i& any1,
                                                __m512i& any2) {
  constexpr int BITS = quant_format_bits(FMT), HEAD = quant_format_head(FMT);
  constexpr bool HALVES = quant_format_halves(FMT);
  __m512i wv[8];
  load_record_u8<BITS, quant_header_bytes(HEAD)>(rec, wv);
  __m512 dw, cw, dw1, cw1;
  load_record_scales<HEAD>(rec, dw, cw, dw1, cw1);
  const __m512i ff = _mm512_set1_epi32(0xFF);
  // 16-bit lanes 2n, 2n + 1 <- lanes n, 16 + n: output row n's pair (k, k + 1) from the two converted vectors
  const __m512i pair = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                        21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
#pragma GCC unroll 8
  for (int g = 0; g < 8; ++g) {  // group g: k 4g .. 4g + 3, byte j of lane n = u[n][4g + j]
    const __m512 d = HALVES && g >= 4 ? dw1 : dw, c = HALVES && g >= 4 ? cw1 : cw;
    __m512 w[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j)
      w[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(wv[g], 8 * j), ff)), d, c);
#pragma GCC unroll 2
    for (int p = 0; p < 2; ++p) {  // k-pair row 2g + p: (w[2p], w[2p + 1])
      __m512 a = w[2 * p], b = w[2 * p + 1];
#pragma GCC unroll 3
      for (int t = 0; t < kQDenseTerms; ++t) {
        const __m512i ab = (__m512i)_mm512_cvtne2ps_pbh(b, a);  // low half: bf16(a), high half: bf16(b)
        _mm512_store_si512(out + t * term_stride + (2 * g + p) * 32, _mm512_permutexvar_epi16(pair, ab));
        if (t == 1) any1 = _mm512_or_si512(any1, ab);
        if (t == 2) any2 = _mm512_or_si512(any2, ab);
        if (t + 1 < kQDenseTerms) {  // exact: the residual has at most 16 significant bits
          a = _mm512_sub_ps(a, qdense_bf16_half<false>(ab));
          b = _mm512_sub_ps(b, qdense_bf16_half<true>(ab));
        }
      }
    }
  }
}

// One packed tile (16 output rows, nb records) -> its kQDenseTerms x nb B tiles at out (term t of block b at
// out + (t * nb + b) * kQDenseBlockElems); returns how many leading terms are not all zero (1 to 3): the weights of
// 16-bit formats (Q4_0, Q5_0: d (q - o) with an fp16 d) need two, 8-bit ones' bf16 multiples of a power of two one.
template <int FMT>
SGL_AMX_QDENSE inline int quant_dequant_tile(const uint8_t* tile, int64_t nb, uint16_t* out) {
  constexpr int64_t rec_bytes = quant_record_bytes(FMT);
  __m512i any1 = _mm512_setzero_si512(), any2 = _mm512_setzero_si512();
  for (int64_t b = 0; b < nb; ++b)
    quant_record_to_bf16<FMT>(tile + b * rec_bytes, out + b * kQDenseBlockElems, nb * kQDenseBlockElems, any1, any2);
  return _mm512_test_epi32_mask(any2, any2) ? 3 : _mm512_test_epi32_mask(any1, any1) ? 2 : 1;
}

using QDenseDequant = int (*)(const uint8_t* tile, int64_t nb, uint16_t* out);

// MT input tiles (16 rows each, x rows K apart) x NT output tiles (dequantized at w0, w1), the first T terms of all
// nb blocks, into c[2i + j] (fp32 16 x 16).
template <int MT, int NT, int T>
SGL_AMX_QDENSE inline void quant_dense_block(const uint16_t* x, int64_t K, const uint16_t* w0, const uint16_t* w1,
                                             int64_t nb, float (*c)[16][16]) {
  const int64_t lda = K * 2, term = nb * kQDenseBlockElems;
  _tile_zero(0);
  if (NT > 1) _tile_zero(1);
  if (MT > 1) _tile_zero(2);
  if (MT > 1 && NT > 1) _tile_zero(3);
  for (int64_t b = 0; b < nb; ++b) {
    _tile_loadd(4, x + b * 32, lda);
    if (MT > 1) _tile_loadd(5, x + 16 * K + b * 32, lda);
#pragma GCC unroll 3
    for (int t = 0; t < T; ++t) {
      _tile_loadd(6, w0 + t * term + b * kQDenseBlockElems, 64);
      if (NT > 1) _tile_loadd(7, w1 + t * term + b * kQDenseBlockElems, 64);
      _tile_dpbf16ps(0, 4, 6);
      if (NT > 1) _tile_dpbf16ps(1, 4, 7);
      if (MT > 1) _tile_dpbf16ps(2, 5, 6);
      if (MT > 1 && NT > 1) _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c[0], 64);
  if (NT > 1) _tile_stored(1, c[1], 64);
  if (MT > 1) _tile_stored(2, c[2], 64);
  if (MT > 1 && NT > 1) _tile_stored(3, c[3], 64);
}

// c (MT x NT tiles) -> bf16 y rows [0, min(rows, 16 MT)), columns [0, n) (n <= 16 NT), rounded to nearest even.
template <int MT, int NT>
SGL_AMX_QDENSE inline void quant_dense_store(float (*c)[16][16], uint16_t* y, int64_t N, int64_t rows, int64_t n) {
  for (int i = 0; i < MT; ++i)
    for (int64_t r = 0; r < std::min<int64_t>(16, rows - 16 * i); ++r)
      for (int j = 0; j < NT; ++j) {
        const int64_t cols = std::min<int64_t>(16, n - 16 * j);
        if (cols <= 0) continue;
        const __m256i v = (__m256i)_mm512_cvtneps_pbh(_mm512_load_ps(c[2 * i + j][r]));
        _mm256_mask_storeu_epi16(y + (16 * i + r) * N + 16 * j, (__mmask16)((1u << cols) - 1u), v);
      }
}

template <int MT, int NT>
SGL_AMX_QDENSE inline void quant_dense_tiles(int T, const uint16_t* x, int64_t K, const uint16_t* w0,
                                             const uint16_t* w1, int64_t nb, float (*c)[16][16], uint16_t* y,
                                             int64_t N, int64_t rows, int64_t n) {
  if (T == 1) quant_dense_block<MT, NT, 1>(x, K, w0, w1, nb, c);
  else if (T == 2) quant_dense_block<MT, NT, 2>(x, K, w0, w1, nb, c);
  else quant_dense_block<MT, NT, 3>(x, K, w0, w1, nb, c);
  quant_dense_store<MT, NT>(c, y, N, rows, n);
}

// Input rows per pass over a range of output tiles: the pass's activations (rows x K bf16) stay in L2 while every
// tile of the range multiplies them (the range's dequantized tiles are kept for the later passes).
constexpr int64_t kQDensePassBytes = 512 * 1024;

// Output tiles [t0, t1) of y [M, N] (bf16) from x [Mp, K] bf16 (Mp: M rounded up to 16, the padding rows zero;
// K = nb * 32); tile_bytes: one packed tile's bytes.
SGL_AMX_QDENSE inline void quant_gemm_amx_dense(QDenseDequant dequant, const uint8_t* packed, int64_t tile_bytes,
                                                int64_t nb, const uint16_t* x, int64_t M, uint16_t* y, int64_t N,
                                                int64_t t0, int64_t t1) {
  const int64_t K = nb * kQBlock, tile_elems = kQDenseTerms * nb * kQDenseBlockElems;
  const int64_t pass = std::max<int64_t>(32, kQDensePassBytes / (K * 2) / 32 * 32);
  uint16_t* buf = static_cast<uint16_t*>(std::aligned_alloc(64, (size_t)(t1 - t0) * tile_elems * sizeof(uint16_t)));
  std::vector<int> terms(t1 - t0);
  alignas(64) float c[4][16][16];
  quant_dense_configure();
  for (int64_t m0 = 0; m0 < M; m0 += pass) {
    const int64_t m1 = std::min(M, m0 + pass);
    for (int64_t t = t0; t < t1; t += 2) {
      const int nt = (int)std::min<int64_t>(2, t1 - t);
      uint16_t* w0 = buf + (t - t0) * tile_elems;
      if (m0 == 0)
        for (int j = 0; j < nt; ++j) terms[t - t0 + j] = dequant(packed + (t + j) * tile_bytes, nb, w0 + j * tile_elems);
      const int T = nt == 2 ? std::max(terms[t - t0], terms[t - t0 + 1]) : terms[t - t0];
      const int64_t n0 = t * kQTileRows, n = std::min<int64_t>(nt * kQTileRows, N - n0);
      int64_t m = m0;
      for (; m + 16 < m1; m += 32) {  // two input tiles (the second may be partly padding)
        if (nt == 2) quant_dense_tiles<2, 2>(T, x + m * K, K, w0, w0 + tile_elems, nb, c, y + m * N + n0, N, M - m, n);
        else quant_dense_tiles<2, 1>(T, x + m * K, K, w0, w0, nb, c, y + m * N + n0, N, M - m, n);
      }
      if (m < m1) {  // one input tile left
        if (nt == 2) quant_dense_tiles<1, 2>(T, x + m * K, K, w0, w0 + tile_elems, nb, c, y + m * N + n0, N, M - m, n);
        else quant_dense_tiles<1, 1>(T, x + m * K, K, w0, w0, nb, c, y + m * N + n0, N, M - m, n);
      }
    }
  }
  _tile_release();
  std::free(buf);
}

}  // namespace sgl_cpu
