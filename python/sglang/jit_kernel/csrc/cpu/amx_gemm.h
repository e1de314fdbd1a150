// Mid-size decode GEMM with AMX tiles: y[m, n] = sum_k x[m, k] * W[n, k] for up to 32 input rows.
//
// The plain nn.Linear layout is used as is: 16 rows of W x 32 k values are exactly one AMX "A" tile (16 rows of
// 64 bytes, row stride K * 2 bytes), so no weight repacking and no second copy of the weights. The few input rows are
// packed per call into the "B" tile layout (pairs of k for each of 16 rows: [K/32][16][32 rows][2]); each
// TDPBF16PS then does 16 x 16 x 32 multiply-adds, so the loop streams the weights once at memory speed for any
// M <= 32, where VDPBF16PS (gemv.h) becomes compute-bound past ~8 rows.
#pragma once

#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

#include "vec.h"

#define SGL_AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))

namespace sgl_cpu {

constexpr int kAmxMaxRows = 32;

// Linux hands out the AMX tile state only to processes that ask for it (once per process).
inline bool amx_request_permission() {
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// tmm0, tmm1: C (16 weight rows x 16 input rows, fp32); tmm2: A (weights); tmm3, tmm4: B (input rows 0-15, 16-31)
SGL_AMX inline void amx_configure() {
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.palette_id = 1;
  for (int t = 0; t < 5; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  // GCC may treat the stores above as dead (ldtilecfg's memory read is not modelled): force them out first.
  __asm__ __volatile__("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
}

SGL_AMX inline void amx_release() { _tile_release(); }

// x [M, K] -> packed [K/32][16 k-pairs][32 rows][2] (rows >= M are zero); packed holds K * 32 bf16. Viewed as
// 32-bit pairs this is a transpose of x [M, K/2] into [K/2, 32].
inline void amx_pack_rows(const uint16_t* x, int64_t M, int64_t K, uint16_t* packed) {
  const int64_t pairs = K / 2;
  uint32_t* dst = reinterpret_cast<uint32_t*>(packed);
  for (int64_t m = 0; m < M; ++m) {
    const uint32_t* src = reinterpret_cast<const uint32_t*>(x + m * K);
    for (int64_t j = 0; j < pairs; ++j) dst[j * kAmxMaxRows + m] = src[j];
  }
  if (M < kAmxMaxRows)
    for (int64_t j = 0; j < pairs; ++j) std::memset(dst + j * kAmxMaxRows + M, 0, 4 * (kAmxMaxRows - M));
}

// Output columns [n0, n1) of y [M, N]; n1 - n0 a multiple of 16. The caller configured the tiles on this thread.
SGL_AMX inline void amx_gemm_bf16(const uint16_t* packed, int64_t M, const uint16_t* W, int64_t N, int64_t K,
                                  uint16_t* y, int64_t n0, int64_t n1) {
  alignas(64) float c[16][16];
  const bool two = M > 16;
  for (int64_t n = n0; n < n1; n += 16) {
    _tile_zero(0);
    _tile_zero(1);
    const uint16_t* w = W + n * K;
    for (int64_t k = 0; k < K; k += 32) {
      _tile_loadd(2, w + k, K * 2);
      const uint16_t* b = packed + (k / 32) * 16 * kAmxMaxRows * 2;
      _tile_loadd(3, b, kAmxMaxRows * 4);
      _tile_dpbf16ps(0, 2, 3);
      if (two) {
        _tile_loadd(4, b + 32, kAmxMaxRows * 4);
        _tile_dpbf16ps(1, 2, 4);
      }
    }
    for (int half = 0; half < (two ? 2 : 1); ++half) {
      if (half == 0)
        _tile_stored(0, c, 64);
      else
        _tile_stored(1, c, 64);
      const int64_t m_end = std::min<int64_t>(M, 16 * (half + 1));
      for (int64_t m = 16 * half; m < m_end; ++m)
        for (int i = 0; i < 16; ++i) y[m * N + n + i] = float_to_bf16(c[i][m - 16 * half]);
    }
  }
}

}  // namespace sgl_cpu
