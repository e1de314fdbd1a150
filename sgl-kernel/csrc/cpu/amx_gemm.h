// Mid-size decode GEMM with AMX tiles: y[m, n] = sum_k x[m, k] * W[n, k] for up to 64 input rows.
//
// The plain nn.Linear layout is used as is: 16 rows of W x 32 k values are exactly one AMX "A" tile (16 rows of
// 64 bytes, row stride K * 2 bytes), so no weight repacking and no second copy of the weights. The few input rows are
// packed per call into the "B" tile layout (pairs of k for each of 16 rows: [K/32][16][64 rows][2]); each
// TDPBF16PS then does 16 x 16 x 32 multiply-adds into one of up to four C tiles (16 input rows each), so the loop
// streams the weights once at memory speed for any M <= 64, where VDPBF16PS (gemv.h) becomes compute-bound past
// ~8 rows. Tiles: tmm0-3 C, tmm4 A (weights), tmm5-7 B (separate tiles, so the products do not wait on one another;
// the fourth C tile reuses tmm5).
#pragma once

#include <cstring>

#include "isa.h"  // amx_request_permission
#include "vec.h"

#define SGL_AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))

namespace sgl_cpu {

constexpr int kAmxMaxRows = 64;

struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// tmm0-3: C (16 weight rows x 16 input rows, fp32); tmm4: A (weights); tmm5-7: B (16 k-pairs x 16 input rows)
SGL_AMX inline void amx_configure() {
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  // GCC may treat the stores above as dead (ldtilecfg's memory read is not modelled): force them out first.
  __asm__ __volatile__("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
}

SGL_AMX inline void amx_release() { _tile_release(); }

// x [M, K] -> packed [K/32][16 k-pairs][64 rows][2]; packed holds K * 64 bf16. Viewed as 32-bit pairs this is a
// transpose of x [M, K/2] into [K/2, 64], done in 16 x 16 blocks in registers. Rows from M up to the next multiple
// of 16 are zero; rows past that are never read.
SGL_AMX inline void amx_pack_rows(const uint16_t* x, int64_t M, int64_t K, uint16_t* packed) {
  const int64_t pairs = K / 2;  // a multiple of 16
  uint32_t* dst = reinterpret_cast<uint32_t*>(packed);
  for (int64_t m0 = 0; m0 < M; m0 += 16) {
    for (int64_t j0 = 0; j0 < pairs; j0 += 16) {
      __m512 r[16];
      for (int i = 0; i < 16; ++i)
        r[i] = m0 + i < M ? _mm512_loadu_ps(reinterpret_cast<const float*>(x + (m0 + i) * K) + j0) : _mm512_setzero_ps();
      transpose_16x16(r);
      for (int j = 0; j < 16; ++j) _mm512_storeu_ps(reinterpret_cast<float*>(dst + (j0 + j) * kAmxMaxRows + m0), r[j]);
    }
  }
}

// One block of 16 weight rows against NC * 16 input rows; NC is a template parameter because tile numbers are
// immediates.
template <int NC>
SGL_AMX inline void amx_block(const uint16_t* packed, const uint16_t* w, int64_t K, float (*c)[16][16]) {
  constexpr int64_t ld_b = kAmxMaxRows * 4;  // bytes per packed k-pair row
  _tile_zero(0);
  if (NC > 1) _tile_zero(1);
  if (NC > 2) _tile_zero(2);
  if (NC > 3) _tile_zero(3);
  for (int64_t k = 0; k < K; k += 32) {
    _tile_loadd(4, w + k, K * 2);
    const uint16_t* b = packed + (k / 32) * 16 * kAmxMaxRows * 2;
    _tile_loadd(5, b, ld_b);
    if (NC > 1) _tile_loadd(6, b + 32, ld_b);
    if (NC > 2) _tile_loadd(7, b + 64, ld_b);
    _tile_dpbf16ps(0, 4, 5);
    if (NC > 1) _tile_dpbf16ps(1, 4, 6);
    if (NC > 2) _tile_dpbf16ps(2, 4, 7);
    if (NC > 3) {
      _tile_loadd(5, b + 96, ld_b);  // tmm5 is free again once C0's product has read it
      _tile_dpbf16ps(3, 4, 5);
    }
  }
  _tile_stored(0, c[0], 64);
  if (NC > 1) _tile_stored(1, c[1], 64);
  if (NC > 2) _tile_stored(2, c[2], 64);
  if (NC > 3) _tile_stored(3, c[3], 64);
}

// Output columns [n0, n1) of y [M, N]; n1 - n0 a multiple of 16. The caller configured the tiles on this thread.
SGL_AMX inline void amx_gemm_bf16(const uint16_t* packed, int64_t M, const uint16_t* W, int64_t N, int64_t K,
                                  uint16_t* y, int64_t n0, int64_t n1) {
  alignas(64) float c[4][16][16];
  const int nc = (int)((M + 15) / 16);
  for (int64_t n = n0; n < n1; n += 16) {
    const uint16_t* w = W + n * K;
    switch (nc) {
      case 1: amx_block<1>(packed, w, K, c); break;
      case 2: amx_block<2>(packed, w, K, c); break;
      case 3: amx_block<3>(packed, w, K, c); break;
      default: amx_block<4>(packed, w, K, c); break;
    }
    // C tile t holds [16 weight rows][16 input rows]: transpose it so each input row's 16 outputs are one vector
    for (int t = 0; t < nc; ++t) {
      __m512 r[16];
      for (int i = 0; i < 16; ++i) r[i] = _mm512_load_ps(c[t][i]);
      transpose_16x16(r);
      const int64_t rows = std::min<int64_t>(16, M - 16 * t);
      for (int64_t j = 0; j < rows; ++j) store_bf16x16(y + (16 * t + j) * N + n, r[j]);
    }
  }
}

}  // namespace sgl_cpu
