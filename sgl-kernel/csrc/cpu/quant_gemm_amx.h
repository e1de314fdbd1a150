// The quantized GEMM on AMX-INT8 tiles (level amx, from kQAmxMinRows input rows): the same packed records, the same
// int8 activations and the same fp32 accumulation as quant_gemm.h, so the result is bit-identical to the VNNI path;
// only the integer dot products move to TDPBSUD, which is where the VNNI path spends its time once several input rows
// share each weight record (16 VPDPBUSD per row per 32-value record of an 8-bit format, 8 of a 4-bit one).
//
// Tiles: one record's 8 groups of 4 k values are, as stored, the rows of an AMX "B" tile (row g: 16 output rows x 4
// bytes), so an 8-bit record is loaded in place (stride 64) and a 4-bit one after unpacking its nibbles to 512 bytes.
// The activations of 16 input rows are the "A" tile (16 rows x 32 bytes, row stride = the activation row's bytes),
// signed, against the unsigned weight bytes: TDPBSUD. Each block's int32 sums are stored (one 1 KiB tile store) and
// scaled in fp32 exactly as quant_tile does: d * da * quant_block_sum (for 8-bit weights dot + residual dot / 254) +
// c * sa. Each record's lines are prefetched kQPrefetchRecords ahead, as quant_tile does (quant_prefetch_record).
// The halves formats (kQHeadHalves, kQHeadQ6) take k 0-15 and 16-31 as two 4-row B tiles against two 16-byte A tiles.
//   tmm0, tmm1: C of set 0 (main / residual, or half 0 / half 1)   tmm2, tmm3: C of set 1 (the next block's), or
//   for the 8-bit halves formats the residual pass's halves (one set)
//   tmm4, tmm5: A (main / residual, or half 0 / half 1)   tmm6, tmm7: B (whole block of set 0 / 1, or half 0 / half 1)
// From 17 rows the 4-bit formats take the input groups in pairs (quant_tile_amx_pair): one B tile per block for both,
// tmm0-1 group 0's C, tmm2-3 group 1's; each record is unpacked once per pair instead of once per group.
// The caller pads the activations (qa, da, sa, sh) to a multiple of 16 rows with zeros.
#pragma once

#include <cstring>

#include "amx_gemm.h"  // TileConfig
#include "quant_gemm.h"

#define SGL_AMX_INT8 \
  __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16,f16c,fma")))

namespace sgl_cpu {

constexpr int kQAmxMinRows = 8;  // fewer input rows: the VNNI path (a weight record feeds too few rows to pay)
constexpr int kQAmxRows = 16;    // input rows per A tile

template <bool HALVES>
SGL_AMX_INT8 inline void quant_amx_configure() {
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.palette_id = 1;
  for (int t = 0; t < 4; ++t) {  // C: 16 input rows x 16 int32
    cfg.rows[t] = kQAmxRows;
    cfg.colsb[t] = 64;
  }
  for (int t = 4; t < 6; ++t) {  // A: 16 input rows x 32 (halves: 16) int8
    cfg.rows[t] = kQAmxRows;
    cfg.colsb[t] = HALVES ? 16 : 32;
  }
  for (int t = 6; t < 8; ++t) {  // B: 8 (halves: 4) groups x 16 output rows x 4 bytes
    cfg.rows[t] = HALVES ? 4 : 8;
    cfg.colsb[t] = 64;
  }
  __asm__ __volatile__("" : : "r"(&cfg) : "memory");  // the stores above are read by ldtilecfg (see amx_gemm.h)
  _tile_loadconfig(&cfg);
}

// Whether a block's tile work for block b + 1 is issued before block b's fp32 epilogue (two sets of C tiles, so the
// AMX unit computes the next block's sums while the vector units scale this one's): every format but the 8-bit halves
// ones, whose four C tiles per block leave no second set. The fp32 operations keep their order either way.
template <int FMT>
constexpr bool quant_amx_pipelined() {
  return !(quant_format_halves(FMT) && quant_format_bits(FMT) == 8);
}

// Whether two 16-row groups of inputs share each block's B tile (quant_tile_amx_pair): the 4-bit formats, whose record
// is unpacked into the B tile's bytes once per pair instead of once per group (8-15% less time at 32 rows, hot or
// streamed); an 8-bit record is loaded in place, and there the single groups' overlap of one block's tile products
// with the previous block's scaling (two C sets) is worth more (the pair, which needs all four C tiles for one block,
// measured 0-10% slower). Both give the same bits.
template <int FMT>
constexpr bool quant_amx_pairs() {
  return quant_format_bits(FMT) == 4;
}

// Block `rec`'s int32 sums into c[2S], c[2S + 1] (and c[2], c[3] for the 8-bit halves formats, S = 0 only), on
// C tiles 2S, 2S + 1 (2, 3); `unpacked`: this set's 512-byte buffer for a 4-bit record's B tile.
template <int FMT, int S>
SGL_AMX_INT8 __attribute__((always_inline)) inline void quant_block_dots_amx(const uint8_t* rec, const int8_t* a,
                                                                            const int8_t* a2, int64_t lda,
                                                                            uint8_t* unpacked, int32_t (*c)[kQAmxRows][16]) {
  constexpr int BITS = quant_format_bits(FMT), HEAD = quant_format_head(FMT);
  constexpr bool HALVES = quant_format_halves(FMT);
  constexpr int64_t rec_bytes = quant_record_bytes(FMT), header = quant_header_bytes(HEAD);
  quant_prefetch_record<rec_bytes>(rec);
  const uint8_t* w = rec + header;
  if constexpr (BITS == 4) {
    __m512i wv[8];
    load_record_u8<4, header>(rec, wv);
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) _mm512_store_si512(unpacked + 64 * g, wv[g]);
    w = unpacked;
  }
  // GCC's tile intrinsics paste the tile number into the assembly, so each set spells its tiles as literals
#define SGL_QAMX_DOTS(C0, C1, B0)                  \
  if constexpr (!HALVES) {                         \
    _tile_loadd(B0, w, 64);                        \
    _tile_loadd(4, a, lda);                        \
    _tile_zero(C0);                                \
    _tile_dpbsud(C0, 4, B0);                       \
    _tile_stored(C0, c[C0], 64);                   \
    if constexpr (BITS == 8) {                     \
      _tile_loadd(5, a2, lda);                     \
      _tile_zero(C1);                              \
      _tile_dpbsud(C1, 5, B0);                     \
      _tile_stored(C1, c[C1], 64);                 \
    }                                              \
  } else {                                         \
    _tile_loadd(6, w, 64);                         \
    _tile_loadd(7, w + 4 * 64, 64);                \
    _tile_loadd(4, a, lda);                        \
    _tile_loadd(5, a + kQHalf, lda);               \
    _tile_zero(C0);                                \
    _tile_zero(C1);                                \
    _tile_dpbsud(C0, 4, 6);                        \
    _tile_dpbsud(C1, 5, 7);                        \
    _tile_stored(C0, c[C0], 64);                   \
    _tile_stored(C1, c[C1], 64);                   \
  }
  if constexpr (S == 0) {
    SGL_QAMX_DOTS(0, 1, 6)
  } else {
    SGL_QAMX_DOTS(2, 3, 7)
  }
#undef SGL_QAMX_DOTS
  if constexpr (HALVES && BITS == 8) {
    static_assert(S == 0, "the 8-bit halves formats use all four C tiles");
    _tile_loadd(4, a2, lda);
    _tile_loadd(5, a2 + kQHalf, lda);
    _tile_zero(2);
    _tile_zero(3);
    _tile_dpbsud(2, 4, 6);
    _tile_dpbsud(3, 5, 7);
    _tile_stored(2, c[2], 64);
    _tile_stored(3, c[3], 64);
  }
}

// Block b's sums (c: its set, c[0] / c[1] main / residual or half 0 / half 1, c[2] / c[3] the 8-bit halves' residual)
// scaled into acc by the same fp32 operations in the same order as quant_tile, so the two paths agree bit for bit.
template <int FMT>
SGL_AMX_INT8 __attribute__((always_inline)) inline void quant_block_epilogue_amx(const uint8_t* rec, int64_t b, int64_t nb,
                                                                                const float* da, const float* sa,
                                                                                const float* sh,
                                                                                int32_t (*c)[kQAmxRows][16],
                                                                                __m512* acc) {
  constexpr int BITS = quant_format_bits(FMT), HEAD = quant_format_head(FMT);
  constexpr bool HALVES = quant_format_halves(FMT);
  const __m512 residual = _mm512_set1_ps(1.0f / kResidualScale);
  __m512 dw, cw, dw1, cw1;
  load_record_scales<HEAD>(rec, dw, cw, dw1, cw1);
#pragma GCC unroll 16
  for (int i = 0; i < kQAmxRows; ++i) {
    const __m512 dai = _mm512_set1_ps(da[i * nb + b]);
    const __m512i dot0 = _mm512_load_si512(c[0][i]);
    if constexpr (!HALVES) {
      const __m512 dwa = _mm512_mul_ps(dw, dai);
      acc[i] = _mm512_fmadd_ps(quant_block_sum<BITS>(dot0, _mm512_load_si512(c[1][i]), residual), dwa, acc[i]);
      acc[i] = _mm512_fmadd_ps(cw, _mm512_set1_ps(sa[i * nb + b]), acc[i]);
    } else {
      const __m512 dwa0 = _mm512_mul_ps(dw, dai), dwa1 = _mm512_mul_ps(dw1, dai);
      // the 8-bit halves formats: c[2] / c[3] are the halves' residual sums
      const __m512i dot1 = _mm512_load_si512(c[1][i]);
      const __m512i res0 = BITS == 8 ? _mm512_load_si512(c[2][i]) : dot0, res1 = BITS == 8 ? _mm512_load_si512(c[3][i]) : dot1;
      acc[i] = _mm512_fmadd_ps(quant_block_sum<BITS>(dot0, res0, residual), dwa0, acc[i]);
      acc[i] = _mm512_fmadd_ps(quant_block_sum<BITS>(dot1, res1, residual), dwa1, acc[i]);
      acc[i] = _mm512_fmadd_ps(cw, _mm512_set1_ps(sh[2 * (i * nb + b)]), acc[i]);
      acc[i] = _mm512_fmadd_ps(cw1, _mm512_set1_ps(sh[2 * (i * nb + b) + 1]), acc[i]);
    }
  }
}

// 16 input rows (qa rows lda apart, already offset to the first) x one tile of 16 output rows, all nb blocks.
template <int FMT, typename T, bool HW_BF16>
SGL_AMX_INT8 inline void quant_tile_amx(const uint8_t* tile, int64_t nb, const int8_t* qa, int64_t lda, const float* da,
                                        const float* sa, const float* sh, T* y, int64_t ldy, int rows, int n) {
  constexpr int64_t rec_bytes = quant_record_bytes(FMT);
  alignas(64) int32_t c[4][kQAmxRows][16];
  alignas(64) uint8_t unpacked[2][8 * 64];
  __m512 acc[kQAmxRows];
#pragma GCC unroll 16
  for (int i = 0; i < kQAmxRows; ++i) acc[i] = _mm512_setzero_ps();
  // 8-bit weights: the residual pass's activations follow the main pass's (quantize_row_q8's q2 after q)
  const int8_t* a2 = qa + nb * kQBlock;
  if constexpr (quant_amx_pipelined<FMT>()) {
    // blocks in pairs: block b + 1's tiles (set 1) run while block b (set 0) is scaled, then b + 2's (set 0) during b + 1
    quant_block_dots_amx<FMT, 0>(tile, qa, a2, lda, unpacked[0], c);
    for (int64_t b = 0; b < nb; b += 2) {
      const uint8_t* rec = tile + b * rec_bytes;
      const bool odd = b + 1 < nb;
      if (odd)
        quant_block_dots_amx<FMT, 1>(rec + rec_bytes, qa + (b + 1) * kQBlock, a2 + (b + 1) * kQBlock, lda, unpacked[1], c);
      quant_block_epilogue_amx<FMT>(rec, b, nb, da, sa, sh, c, acc);
      if (odd) {
        if (b + 2 < nb)
          quant_block_dots_amx<FMT, 0>(rec + 2 * rec_bytes, qa + (b + 2) * kQBlock, a2 + (b + 2) * kQBlock, lda,
                                       unpacked[0], c);
        quant_block_epilogue_amx<FMT>(rec + rec_bytes, b + 1, nb, da, sa, sh, c + 2, acc);
      }
    }
  } else {
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* rec = tile + b * rec_bytes;
      quant_block_dots_amx<FMT, 0>(rec, qa + b * kQBlock, a2 + b * kQBlock, lda, unpacked[0], c);
      quant_block_epilogue_amx<FMT>(rec, b, nb, da, sa, sh, c, acc);
    }
  }
  q_store_rows<kQAmxRows, T, HW_BF16>(acc, y, ldy, rows, n);
}

// Two 16-row groups of inputs against one block's B tile of a 4-bit record, unpacked once for both: group 0's sums
// into c[0] (and c[1]: half 1 of the halves formats), group 1's (activation rows 16 to 31, 16 * lda bytes on) into
// c[2] (c[3]); the roles as in quant_block_dots_amx.
template <int FMT>
SGL_AMX_INT8 __attribute__((always_inline)) inline void quant_block_dots_amx_pair(const uint8_t* rec, const int8_t* a,
                                                                                 int64_t lda, uint8_t* unpacked,
                                                                                 int32_t (*c)[kQAmxRows][16]) {
  constexpr int HEAD = quant_format_head(FMT);
  constexpr int64_t rec_bytes = quant_record_bytes(FMT), header = quant_header_bytes(HEAD);
  static_assert(quant_amx_pairs<FMT>(), "pairs are for the 4-bit records");
  quant_prefetch_record<rec_bytes>(rec);
  __m512i wv[8];
  load_record_u8<4, header>(rec, wv);
#pragma GCC unroll 8
  for (int g = 0; g < 8; ++g) _mm512_store_si512(unpacked + 64 * g, wv[g]);
  const int8_t* a1 = a + kQAmxRows * lda;  // group 1's first activation row
  if constexpr (!quant_format_halves(FMT)) {
    _tile_loadd(6, unpacked, 64);
    _tile_loadd(4, a, lda);
    _tile_loadd(5, a1, lda);
    _tile_zero(0);
    _tile_zero(2);
    _tile_dpbsud(0, 4, 6);
    _tile_dpbsud(2, 5, 6);
    _tile_stored(0, c[0], 64);
    _tile_stored(2, c[2], 64);
  } else {
    _tile_loadd(6, unpacked, 64);
    _tile_loadd(7, unpacked + 4 * 64, 64);
    _tile_loadd(4, a, lda);
    _tile_loadd(5, a + kQHalf, lda);
    _tile_zero(0);
    _tile_zero(1);
    _tile_dpbsud(0, 4, 6);
    _tile_dpbsud(1, 5, 7);
    _tile_loadd(4, a1, lda);
    _tile_loadd(5, a1 + kQHalf, lda);
    _tile_zero(2);
    _tile_zero(3);
    _tile_dpbsud(2, 4, 6);
    _tile_dpbsud(3, 5, 7);
    _tile_stored(0, c[0], 64);
    _tile_stored(1, c[1], 64);
    _tile_stored(2, c[2], 64);
    _tile_stored(3, c[3], 64);
  }
}

// quant_tile_amx for 17-32 input rows of a 4-bit format (two groups, the second padded with zero rows as the caller
// pads): each block's B tile serves both groups, each group scaled by quant_block_epilogue_amx as quant_tile_amx scales
// it, so every row's result is the same bits as from quant_tile_amx. ldh: the halves' activation sums per row (2 * nb;
// 0 otherwise).
template <int FMT, typename T, bool HW_BF16>
SGL_AMX_INT8 inline void quant_tile_amx_pair(const uint8_t* tile, int64_t nb, const int8_t* qa, int64_t lda,
                                             const float* da, const float* sa, const float* sh, int64_t ldh, T* y,
                                             int64_t ldy, int rows, int n) {
  constexpr int64_t rec_bytes = quant_record_bytes(FMT);
  alignas(64) int32_t c[4][kQAmxRows][16];
  alignas(64) uint8_t unpacked[8 * 64];
  __m512 acc0[kQAmxRows], acc1[kQAmxRows];
#pragma GCC unroll 16
  for (int i = 0; i < kQAmxRows; ++i) acc0[i] = acc1[i] = _mm512_setzero_ps();
  const float *da1 = da + kQAmxRows * nb, *sa1 = sa + kQAmxRows * nb;
  const float* sh1 = sh ? sh + kQAmxRows * ldh : nullptr;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* rec = tile + b * rec_bytes;
    quant_block_dots_amx_pair<FMT>(rec, qa + b * kQBlock, lda, unpacked, c);
    quant_block_epilogue_amx<FMT>(rec, b, nb, da, sa, sh, c, acc0);
    quant_block_epilogue_amx<FMT>(rec, b, nb, da1, sa1, sh1, c + 2, acc1);
  }
  q_store_rows<kQAmxRows, T, HW_BF16>(acc0, y, ldy, std::min(rows, kQAmxRows), n);
  q_store_rows<kQAmxRows, T, HW_BF16>(acc1, y + kQAmxRows * ldy, ldy, rows - kQAmxRows, n);
}

// Output columns of tiles [t0, t1) of y [M, N]; qa / da / sa / sh hold ceil(M / 16) * 16 rows (the padding zero).
// ldy, ty: as quant_gemm's.
template <int FMT, typename T>
SGL_AMX_INT8 inline void quant_gemm_amx(const uint8_t* packed, int64_t nb, const int8_t* qa, const float* da,
                                        const float* sa, const float* sh, int64_t M, T* y, int64_t N, int64_t t0,
                                        int64_t t1, int64_t ldy = 0,
                                        int64_t ty = 0) {
  if (ldy == 0) ldy = N;
  constexpr bool HALVES = quant_format_halves(FMT);
  const int64_t tile_bytes = nb * quant_record_bytes(FMT);
  const int64_t lda = quant_act_row_bytes(quant_format_bits(FMT), nb);
  const int64_t ldh = HALVES ? 2 * nb : 0;
  quant_amx_configure<HALVES>();
  for (int64_t t = t0; t < t1; ++t) {
    const int n = (int)std::min<int64_t>(kQTileRows, N - t * kQTileRows);
    // the inputs in pairs of 16-row groups sharing each block's B tile, then a last single group (a tile's records
    // stay in L1/L2 between the passes)
    int64_t m0 = 0;
    if constexpr (quant_amx_pairs<FMT>()) {
      for (; M - m0 > kQAmxRows; m0 += 2 * kQAmxRows) {
        const int rows = (int)std::min<int64_t>(2 * kQAmxRows, M - m0);
        quant_tile_amx_pair<FMT, T, true>(packed + t * tile_bytes, nb, qa + m0 * lda, lda, da + m0 * nb, sa + m0 * nb,
                                          HALVES ? sh + m0 * ldh : nullptr, ldh, y + m0 * ldy + (t - ty) * kQTileRows,
                                          ldy, rows, n);
      }
    }
    for (; m0 < M; m0 += kQAmxRows) {
      const int rows = (int)std::min<int64_t>(kQAmxRows, M - m0);
      quant_tile_amx<FMT, T, true>(packed + t * tile_bytes, nb, qa + m0 * lda, lda, da + m0 * nb, sa + m0 * nb,
                                   HALVES ? sh + m0 * ldh : nullptr, y + m0 * ldy + (t - ty) * kQTileRows, ldy, rows, n);
    }
  }
  _tile_release();
}

}  // namespace sgl_cpu
