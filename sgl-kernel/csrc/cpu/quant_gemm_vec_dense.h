// The dense path without AMX (level avx512_bf16: AMD EPYC, Xeons without AMX): the quantized GEMM for batches of
// bf16 rows, each tile of 16 output rows dequantized once per call into the bf16 records quant_dense_common.h lays out
// and multiplied with the activations as they are by VDPBF16PS (a broadcast k-pair of one input row times a record's
// 64-byte line: 16 output columns' fp32 sums, no horizontal reductions).
//
// Why: the int8 path (quant_gemm.h) spends two VPDPBUSD per 16 x 32 record and input row on the 8-bit formats (the
// residual pass) and ~5 vector operations on every block's scales; VDPBF16PS needs 16 per record and row and nothing
// after. On a 2-core AMD EPYC (Zen 5) with the Gemma 3 270M's layer 0 at 2 threads, the int8 path ran 256-565 GFLOP/s
// at 32 rows and 299-689 at 512-2,048, torch's bf16 F.linear on the dequantized weights (oneDNN) 476-575 and
// 830-920: the int8 path lost most where the prefill of a 100-word chat prompt spends its time.
//
// Values: as the AMX dense path (quant_gemm_amx_dense.h): each weight d * u + c rounded once to fp32, then to bf16,
// times the bf16 activations, summed in fp32; each output one chain of VDPBF16PS over its k-pairs in ascending order
// (the AMX tiles sum in another order: not their bits). Taken where the AMX dense path would be (kQDenseMinRows rows,
// kQDenseMinRowsPrefill under set_quant_dense_prefill), so a row's bits depend on its batch size exactly there.
//
// Walk: a unit is two output tiles (a gated unit: a gate tile and its up tile), dequantized once into a buffer, then
// multiplied by the input rows 32 at a time into c (quant_dense_common.h's tiles) and stored by the dense paths'
// epilogue. A call whose activations exceed kQVecPassBytes dequantizes blocks of units (at most kQVecBlockBytes of
// records, in L2) and runs each 32 input rows over the whole block, so the rows stay in L1 while the block's weights
// multiply them.
#pragma once

#include <algorithm>
#include <cstdlib>

#include "quant_dense_common.h"

namespace sgl_cpu {

constexpr int64_t kQVecPassBytes = 256 * 1024;
constexpr int64_t kQVecBlockBytes = 512 * 1024;
constexpr int kQVecRowGroup = 8;  // input rows x 2 output tiles: 16 accumulators

// MB input rows of x (rows K apart) x a unit's NT dequantized tiles (w0, w1: [K/2][16][2] bf16 each) -> c0, c1
// (16 floats a row, rows 16 floats apart: a c tile's rows).
template <int MB, int NT>
SGL_AVX512_VNNI_BF16 inline void qvec_rows(const uint16_t* x, int64_t K, const uint16_t* w0, const uint16_t* w1,
                                           float* c0, float* c1) {
  __m512 acc[MB][NT];
#pragma GCC unroll 8
  for (int i = 0; i < MB; ++i)
#pragma GCC unroll 2
    for (int j = 0; j < NT; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t kp = 0; kp < K / 2; ++kp) {
    const __m512bh wa = (__m512bh)_mm512_load_si512(w0 + kp * 32);
    const __m512bh wb = NT > 1 ? (__m512bh)_mm512_load_si512(w1 + kp * 32) : wa;
#pragma GCC unroll 8
    for (int i = 0; i < MB; ++i) {
      const __m512bh xb = (__m512bh)_mm512_set1_epi32(*reinterpret_cast<const int32_t*>(x + i * K + 2 * kp));
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], xb, wa);
      if (NT > 1) acc[i][NT - 1] = _mm512_dpbf16_ps(acc[i][NT - 1], xb, wb);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MB; ++i) {
    _mm512_store_ps(c0 + 16 * i, acc[i][0]);
    if (NT > 1) _mm512_store_ps(c1 + 16 * i, acc[i][NT - 1]);
  }
}

template <int NT>
SGL_AVX512_VNNI_BF16 inline void qvec_rows_n(const uint16_t* x, int64_t K, const uint16_t* w0, const uint16_t* w1,
                                             float* c0, float* c1, int64_t rows) {
  switch (rows) {
    case 8: qvec_rows<8, NT>(x, K, w0, w1, c0, c1); break;
    case 7: qvec_rows<7, NT>(x, K, w0, w1, c0, c1); break;
    case 6: qvec_rows<6, NT>(x, K, w0, w1, c0, c1); break;
    case 5: qvec_rows<5, NT>(x, K, w0, w1, c0, c1); break;
    case 4: qvec_rows<4, NT>(x, K, w0, w1, c0, c1); break;
    case 3: qvec_rows<3, NT>(x, K, w0, w1, c0, c1); break;
    case 2: qvec_rows<2, NT>(x, K, w0, w1, c0, c1); break;
    default: qvec_rows<1, NT>(x, K, w0, w1, c0, c1); break;
  }
}

// Input rows [0, min(32, rows)) of x x the unit's nt tiles -> c (c[2i + j]: input tile i, output tile j).
SGL_AVX512_VNNI_BF16 inline void qvec_unit_rows(const uint16_t* x, int64_t K, const uint16_t* w0, const uint16_t* w1,
                                                int nt, float (*c)[16][16], int64_t rows) {
  for (int64_t g = 0; g < std::min<int64_t>(32, rows); g += kQVecRowGroup) {
    const int64_t n = std::min<int64_t>(kQVecRowGroup, rows - g);
    float* c0 = c[2 * (g / 16)][g % 16];
    float* c1 = c[2 * (g / 16) + 1][g % 16];
    if (nt == 2) qvec_rows_n<2>(x + g * K, K, w0, w1, c0, c1, n);
    else qvec_rows_n<1>(x + g * K, K, w0, w1, c0, c1, n);
  }
}

// Output tiles [t0, t1) of y [M, N] from x [M, K] bf16 (K = nb * 32, no padding rows); the arguments and the gated
// form as quant_gemm_amx_dense's.
template <typename T, QDenseAct ACT = QDenseAct::kNone>
SGL_AVX512_VNNI_BF16 inline void quant_gemm_vec_dense(QDenseDequant dequant, const uint8_t* packed, int64_t tile_bytes,
                                                      int64_t nb, const uint16_t* x, int64_t M, T* y, int64_t N,
                                                      int64_t t0, int64_t t1, int64_t ldy = 0, int64_t ty = 0) {
  constexpr bool gated = ACT != QDenseAct::kNone;
  static_assert(!gated || std::is_same_v<T, uint16_t>, "the gated epilogue writes bf16");
  const int64_t up_tiles = gated ? N / 2 / kQTileRows : 0;  // gate tile t's up tile: t + up_tiles
  const int64_t step = gated ? 1 : 2;                        // output tiles a unit writes
  if (ldy == 0) ldy = gated ? N / 2 : N;
  const int64_t K = nb * kQBlock, tile_elems = nb * kQDenseBlockElems, rec_bytes = tile_bytes / nb;
  const int64_t units = (t1 - t0 + step - 1) / step;
  const bool blocked = M * K * 2 > kQVecPassBytes;
  const int64_t block = blocked ? std::max<int64_t>(1, kQVecBlockBytes / (2 * tile_elems * 2)) : 1;
  uint16_t* buf = static_cast<uint16_t*>(
      std::aligned_alloc(64, (size_t)2 * std::min(block, units) * tile_elems * sizeof(uint16_t)));
  alignas(64) float c[4][16][16];
  for (int64_t u0 = 0; u0 < units; u0 += block) {
    const int64_t u1 = std::min(units, u0 + block);
    for (int64_t u = u0; u < u1; ++u) {  // the block's records, each prefetching the next unit's
      const int64_t t = t0 + step * u;
      const int nt = gated ? 2 : (int)std::min<int64_t>(2, t1 - t);
      const int64_t p1 = gated ? t + up_tiles : t + nt - 1;
      uint16_t* w0 = buf + 2 * (u - u0) * tile_elems;
      for (int64_t b = 0; b < nb; ++b) {
        dequant(packed + t * tile_bytes + b * rec_bytes, w0 + b * kQDenseBlockElems, step * tile_bytes);
        if (nt == 2) dequant(packed + p1 * tile_bytes + b * rec_bytes, w0 + tile_elems + b * kQDenseBlockElems,
                             step * tile_bytes);
      }
    }
    for (int64_t m = 0; m < M; m += 32)
      for (int64_t u = u0; u < u1; ++u) {
        const int64_t t = t0 + step * u, rows = std::min<int64_t>(32, M - m);
        const int nt = gated ? 2 : (int)std::min<int64_t>(2, t1 - t);
        const uint16_t* w0 = buf + 2 * (u - u0) * tile_elems;
        qvec_unit_rows(x + m * K, K, w0, w0 + tile_elems, nt, c, rows);
        T* yt = y + (t - ty) * kQTileRows + m * ldy;
        if constexpr (gated) {
          if (rows > 16) quant_dense_store_gated<2, ACT>(c, yt, ldy, rows);
          else quant_dense_store_gated<1, ACT>(c, yt, ldy, rows);
        } else {
          const int64_t n = std::min<int64_t>(nt * kQTileRows, N - t * kQTileRows);
          if (rows > 16) quant_dense_store<2, 2, T>(c, yt, ldy, rows, n);
          else quant_dense_store<1, 2, T>(c, yt, ldy, rows, n);
        }
      }
  }
  std::free(buf);
}

}  // namespace sgl_cpu
