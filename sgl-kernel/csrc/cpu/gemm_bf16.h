// bf16 GEMM without AMX: y[m, n] = sum_k x[m, k] * W[n, k] for any number of rows, from weights packed once at
// load into the VNNI layout VDPBF16PS wants.
//
// Packed layout (same element count as W, so it replaces W in place when N % 16 == 0 and K % 32 == 0): the output
// columns in blocks of 16, the blocks in groups of kPackGroup (3; the last group of N/16 % 3 blocks may be shorter):
//   group g (blocks 3g .. 3g + nb - 1, nb = min(3, N/16 - 3g)) starts at element 3g * 16 * K and holds [K/2][nb][16][2]:
//   for each k-pair (2k, 2k+1), nb cache lines of 64 bytes, line j holding that pair of block 3g + j's 16 columns.
// One VDPBF16PS multiplies a broadcast k-pair of one input row with a line and adds the two products into 16 fp32
// column sums: no horizontal reductions (the nn.Linear layout needs one per output), and a register tile of 8 rows x 3
// column blocks (24 accumulators) loads 3 weight lines and 8 broadcasts per 24 instructions. The lines a tile reads
// for consecutive k-pairs are consecutive in memory, and so are the groups: a thread's share of the columns is one
// sequential stream (with the three blocks of a group 32 * K bytes apart instead, decode at one row streamed ~15%
// slower on a 2-core EPYC: three streams per thread).
// On a 2-core AVX-512 BF16 Xeon without AMX this runs at the VDPBF16PS throughput bound from 16 rows up (single
// core, SmolLM2-135M projections: 64 rows 173 ms vs torch.mm 197 ms; 256 rows 679 vs F.linear 697).
//
// Every output element is the same chain of VDPBF16PS over k-pairs in ascending order from zero, rounded once to
// bf16, whatever M, the tile a row falls in, or the thread split: a row's result never depends on its batch mates
// (nor on whether it is decoded or prefilled).
#pragma once

#include <algorithm>

#include "vec.h"

namespace sgl_cpu {

constexpr int kPackRows = 16;  // output columns per packed block (N must be a multiple)
constexpr int kPackK = 32;     // K must be a multiple (one 16 x 16 transpose of 32-bit pairs)
constexpr int kPackGroup = 3;  // blocks whose lines are interleaved (a register tile's column blocks)
constexpr int kGemmRowTile = 8;
constexpr int kPackAheadBytes = 1024;  // software prefetch distance within the stream (first row tile)

inline int64_t pack_groups(int64_t blocks, int64_t group) { return (blocks + group - 1) / group; }
inline int64_t pack_group_size(int64_t blocks, int64_t group, int64_t g) {
  return std::min<int64_t>(group, blocks - g * group);
}

// Rows [0, 16) of w (row stride K) -> block lines at dst, dst + stride, ... (stride: elements between the lines of
// consecutive k-pairs, 32 * nb). Each 16 rows x 32 k piece is 16 x 16 k-pairs: one in-register transpose.
SGL_AVX512_BF16 inline void pack_vnni_block(const uint16_t* w, int64_t K, uint16_t* dst, int64_t stride) {
  for (int64_t j0 = 0; j0 < K / 2; j0 += 16) {
    __m512 r[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(reinterpret_cast<const float*>(w + i * K) + j0);
    transpose_16x16(r);  // r[j] = pair j0 + j of the 16 rows
    for (int j = 0; j < 16; ++j) _mm512_storeu_ps(reinterpret_cast<float*>(dst + (j0 + j) * stride), r[j]);
  }
}

// W [N, K] (nn.Linear layout) -> P as above, groups [g0, g1).
SGL_AVX512_BF16 inline void pack_vnni_bf16(const uint16_t* W, int64_t N, int64_t K, uint16_t* P, int64_t g0,
                                           int64_t g1) {
  const int64_t blocks = N / kPackRows;
  for (int64_t g = g0; g < g1; ++g) {
    const int64_t nb = pack_group_size(blocks, kPackGroup, g);
    uint16_t* base = P + g * kPackGroup * kPackRows * K;
    for (int64_t j = 0; j < nb; ++j)
      pack_vnni_block(W + (g * kPackGroup + j) * kPackRows * K, K, base + 32 * j, 32 * nb);
  }
}

// MB rows of x (row stride ldx) x the NB column blocks of the group at P -> y (row stride ldy).
// prefetch: pull the stream kPackAheadBytes ahead into cache as the tile walks it (first row tile only).
template <int MB, int NB>
SGL_AVX512_BF16 inline void gemm_vnni_tile(const uint16_t* x, int64_t ldx, const uint16_t* P, int64_t K, uint16_t* y,
                                           int64_t ldy, bool prefetch) {
  __m512 acc[MB][NB];
#pragma GCC unroll 8
  for (int i = 0; i < MB; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t kp = 0; kp < K / 2; ++kp) {
    const uint16_t* line = P + kp * 32 * NB;
    if (prefetch) {
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) _mm_prefetch(reinterpret_cast<const char*>(line + 32 * j) + kPackAheadBytes, _MM_HINT_T0);
    }
    __m512bh w[NB];
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) w[j] = (__m512bh)_mm512_loadu_si512(line + 32 * j);
#pragma GCC unroll 8
    for (int i = 0; i < MB; ++i) {
      const __m512bh xb = (__m512bh)_mm512_set1_epi32(*reinterpret_cast<const int32_t*>(x + i * ldx + 2 * kp));
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xb, w[j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MB; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) store_bf16x16(y + i * ldy + 16 * j, acc[i][j]);
}

template <int NB>
SGL_AVX512_BF16 inline void gemm_vnni_rows(const uint16_t* x, int64_t M, const uint16_t* P, int64_t K, uint16_t* y,
                                           int64_t ldy, bool prefetch) {
  int64_t m = 0;
  for (; m + kGemmRowTile <= M; m += kGemmRowTile)
    gemm_vnni_tile<kGemmRowTile, NB>(x + m * K, K, P, K, y + m * ldy, ldy, prefetch && m == 0);
  const bool pf = prefetch && m == 0;
  const uint16_t* xm = x + m * K;
  uint16_t* ym = y + m * ldy;
  switch (M - m) {
    case 7: gemm_vnni_tile<7, NB>(xm, K, P, K, ym, ldy, pf); break;
    case 6: gemm_vnni_tile<6, NB>(xm, K, P, K, ym, ldy, pf); break;
    case 5: gemm_vnni_tile<5, NB>(xm, K, P, K, ym, ldy, pf); break;
    case 4: gemm_vnni_tile<4, NB>(xm, K, P, K, ym, ldy, pf); break;
    case 3: gemm_vnni_tile<3, NB>(xm, K, P, K, ym, ldy, pf); break;
    case 2: gemm_vnni_tile<2, NB>(xm, K, P, K, ym, ldy, pf); break;
    case 1: gemm_vnni_tile<1, NB>(xm, K, P, K, ym, ldy, pf); break;
    default: break;
  }
}

// Column groups [g0, g1) of y [M, N] (ldy = N) for x [M, K] and packed P of W [N, K].
SGL_AVX512_BF16 inline void gemm_vnni_bf16(const uint16_t* x, int64_t M, const uint16_t* P, int64_t N, int64_t K,
                                           uint16_t* y, int64_t g0, int64_t g1) {
  const int64_t blocks = N / kPackRows;
  for (int64_t g = g0; g < g1; ++g) {
    const uint16_t* p = P + g * kPackGroup * kPackRows * K;
    uint16_t* yg = y + g * kPackGroup * kPackRows;
    switch (pack_group_size(blocks, kPackGroup, g)) {  // (a prefetch past the end of P is harmless)
      case 3: gemm_vnni_rows<3>(x, M, p, K, yg, N, true); break;
      case 2: gemm_vnni_rows<2>(x, M, p, K, yg, N, true); break;
      default: gemm_vnni_rows<1>(x, M, p, K, yg, N, true); break;
    }
  }
}

}  // namespace sgl_cpu
