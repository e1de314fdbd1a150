// The quantized GEMM for batches of bf16 rows on AMX-BF16 tiles (level amx, bf16 activations, from kQDenseMinRows
// rows): each tile of 16 output rows is dequantized once per call into bf16 "B" tiles and multiplied with the
// activations as they are (bf16, no int8 quantization) by TDPBF16PS, the sums staying in the C tiles over the whole K.
//
// Why: the int8 paths (quant_gemm.h, quant_gemm_amx.h) scale every 32-value block's integer sums in fp32 per input
// row and output row, about 10 vector operations per 16 x 16 x 32 block against one TDPBSUD (and a second one for the
// 8-bit formats' residual pass); from a decode batch of 16 rows that epilogue, not the dot products, is the GEMM's
// time. Here the scales are applied once per weight, at dequantization, and the per-row cost is the tile products.
// On the Gemma 3 270M layers at 2 threads (bench_quant_prefill.py): 16 rows about even, 32 rows 1.6x, 128 rows 3x;
// its Q8_0 lm_head (bench_lm_head_decode.py, one thread): 16 rows 35 ms against 27-30, 32 rows 44 against 50. Those
// were measured before the dequantization ran beside the tile products (quant_dense_block's fresh records); since,
// the fused argmax at 32 rows takes 25 ms against the int8 path's 50, and the minimum has not been measured again.
//
// Values: each weight is the GGUF formula's d * u + c rounded once to fp32 (one FMA), then to bf16 (round to nearest
// even): the weights as a bf16 checkpoint of the file holds them (2^-9 of each weight at most, against a 4-6 bit
// quantization step of d), times the bf16 activations as they are (their products exact in fp32), summed in fp32.
// The int8 paths instead round each activation to int8 per block (up to da / 2; da / 508 with the 8-bit formats'
// residual pass) and keep the weights exact. Not the int8 paths' bits: a row's result depends on whether its batch
// has kQDenseMinRows rows (both within test_kquant_kernels' bound of the fp64 GGUF formula).
//
// Layout of the dequantized tile (per 32-value block b): 16 k-pair rows x 16 output rows x 2 bf16, 1 KiB, the B tile
// TDPBF16PS reads (row p: for each output row n, (w[n][2p], w[n][2p + 1])); block b of tile j at
// buf + (j * nb + b) * 512 (uint16 units).
// Tiles: tmm0-3 C (input tile i x output tile j at 2i + j), tmm4-5 A (activations, 16 rows x 32 bf16), tmm6-7 B.
#pragma once

#include <cstdlib>
#include <cstring>

#include "amx_gemm.h"  // TileConfig
#include "quant_dense_common.h"

#define SGL_AMX_QDENSE \
  __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16,f16c,fma")))

namespace sgl_cpu {


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


// What quant_dense_block dequantizes as it multiplies: dequant, one record's bytes, the packed tiles of its output
// tiles (p1 unused with one), ring: 0 to write block b's B tile at b (later input tiles read them again), else
// the B tiles cycle through `ring` slots (a call of one input tile pair: the slots stay in L1 beside the activations),
// and ahead: bytes from a record to the same record of the next unit's tile (quant_dequant_record's prefetch).
struct QDenseFresh {
  QDenseDequant dequant;
  int64_t rec_bytes;
  const uint8_t* p0;
  const uint8_t* p1;
  int64_t ring;
  int64_t ahead;
};

// Slots of the ring of B tiles (kQDenseRing x 1 KiB per output tile).
constexpr int64_t kQDenseRing = 4;

// MT input tiles (16 rows each, x rows K apart) x NT output tiles (their B tiles at w0, w1), all nb blocks, into
// c[2i + j] (fp32 16 x 16). With fresh, the B tiles are dequantized here, block b + 1's records right after block b's
// tile products are issued: the dequantization's vector work runs while the AMX unit multiplies, where dequantizing a
// whole tile first left the unit idle meanwhile.
struct QDenseNoop {
  void operator()() const {}
};

template <int MT, int NT, typename F = QDenseNoop>
SGL_AMX_QDENSE inline void quant_dense_block(const uint16_t* x, int64_t K, uint16_t* w0, uint16_t* w1, int64_t nb,
                                             float (*c)[16][16], const QDenseFresh* fresh,
                                             const F& after_first = F{}) {
  const int64_t lda = K * 2;
  const int64_t ring = fresh != nullptr ? fresh->ring : 0;
  auto slot = [ring](int64_t b) { return (ring > 0 ? b % ring : b) * kQDenseBlockElems; };
  auto dequant = [&](int64_t b) {
    fresh->dequant(fresh->p0 + b * fresh->rec_bytes, w0 + slot(b), fresh->ahead);
    if (NT > 1) fresh->dequant(fresh->p1 + b * fresh->rec_bytes, w1 + slot(b), fresh->ahead);
  };
  _tile_zero(0);
  if (NT > 1) _tile_zero(1);
  if (MT > 1) _tile_zero(2);
  if (MT > 1 && NT > 1) _tile_zero(3);
  if (fresh != nullptr) dequant(0);
  for (int64_t b = 0; b < nb; ++b) {
    _tile_loadd(4, x + b * 32, lda);
    if (MT > 1) _tile_loadd(5, x + 16 * K + b * 32, lda);
    _tile_loadd(6, w0 + slot(b), 64);
    if (NT > 1) _tile_loadd(7, w1 + slot(b), 64);
    _tile_dpbf16ps(0, 4, 6);
    if (NT > 1) _tile_dpbf16ps(1, 4, 7);
    if (MT > 1) _tile_dpbf16ps(2, 5, 6);
    if (MT > 1 && NT > 1) _tile_dpbf16ps(3, 5, 7);
    if (b == 0) after_first();  // vector work beside the tile products (the previous unit's gated epilogue)
    if (fresh != nullptr && b + 1 < nb) dequant(b + 1);
  }
  _tile_stored(0, c[0], 64);
  if (NT > 1) _tile_stored(1, c[1], 64);
  if (MT > 1) _tile_stored(2, c[2], 64);
  if (MT > 1 && NT > 1) _tile_stored(3, c[3], 64);
}


template <int MT, int NT, typename T>
SGL_AMX_QDENSE inline void quant_dense_tiles(const uint16_t* x, int64_t K, uint16_t* w0, uint16_t* w1, int64_t nb,
                                             float (*c)[16][16], const QDenseFresh* fresh, T* y, int64_t ldy,
                                             int64_t rows, int64_t n) {
  quant_dense_block<MT, NT>(x, K, w0, w1, nb, c, fresh);
  quant_dense_store<MT, NT, T>(c, y, ldy, rows, n);
}

// A gated unit's epilogue, run once the next unit's first tile products are issued (its activation, an exp and a
// division per value, would otherwise leave the AMX unit idle): the sums in c (MT input tiles) -> y, `rows` rows.
template <QDenseAct ACT>
struct QDenseGatedPending {
  mutable float (*c)[16][16] = nullptr;  // null: nothing pending (operator() is const: quant_dense_block's argument)
  uint16_t* y = nullptr;
  int64_t ldy = 0, rows = 0;
  int mt = 0;
  SGL_AMX_QDENSE void operator()() const {
    if (c == nullptr) return;
    if (mt == 2) quant_dense_store_gated<2, ACT>(c, y, ldy, rows);
    else quant_dense_store_gated<1, ACT>(c, y, ldy, rows);
    c = nullptr;
  }
};

// A call whose activations exceed kQDensePassBytes (rows x K bf16) walks its output tiles in blocks whose dequantized
// B tiles take at most kQDenseBlockBytes, and each block input tile pair by input tile pair: a pair's activations
// (32 rows x K) stay in L1 / L2 while every tile of the block multiplies them, the block's B tiles (written by the
// first input tiles) in L2. Smaller calls walk output tile pair by pair, each pair's B tiles (reused by every input
// tile) dequantized into one buffer. Both orders sum every output in the same order: the same bits.
// At 2,048 rows on the Gemma 3 270M's layers (one thread, the same weights in cache), walking a block's tiles before
// the next input rows (where input rows in L2-sized passes went under each output tile pair) took its gate_up
// (640 -> 4,096) from ~960 to ~1,140 GFLOP/s: the results are written 32 rows at a time, and the pair-by-pair walk
// wrote each pass's rows once per output tile pair.
constexpr int64_t kQDensePassBytes = 512 * 1024;
constexpr int64_t kQDenseBlockBytes = 1024 * 1024;

// Output tiles [t0, t1) of y [M, N] from x [Mp, K] bf16 (Mp: M rounded up to 16, the padding rows zero; K = nb * 32);
// tile_bytes: one packed tile's bytes; y: fp32 or bf16 (uint16_t), rows ldy apart (0: N), tile t's columns at
// (t - ty) * 16 (as the int8 paths' quant_gemm).
// Gated (ACT not kNone, bf16 y): the packed rows are a merged [gate | up] projection of N rows whose halves are whole
// tiles (N / 2 a multiple of 16); [t0, t1) are gate tiles, each multiplied beside its up tile t + N / 32, and y
// [M, N / 2] (ldy 0: N / 2) gets act(gate) * up in the gate tile's 16 columns (quant_dense_store_gated).
template <typename T, QDenseAct ACT = QDenseAct::kNone>
SGL_AMX_QDENSE inline void quant_gemm_amx_dense(QDenseDequant dequant, const uint8_t* packed, int64_t tile_bytes,
                                                int64_t nb, const uint16_t* x, int64_t M, T* y, int64_t N, int64_t t0,
                                                int64_t t1, int64_t ldy = 0, int64_t ty = 0) {
  constexpr bool gated = ACT != QDenseAct::kNone;
  static_assert(!gated || std::is_same_v<T, uint16_t>, "the gated epilogue writes bf16");
  const int64_t up_tiles = gated ? N / 2 / kQTileRows : 0;  // gate tile t's up tile: t + up_tiles
  const int64_t step = gated ? 1 : 2;                        // output tiles a unit writes: a pair, or one gated tile
  if (ldy == 0) ldy = gated ? N / 2 : N;
  const int64_t K = nb * kQBlock, tile_elems = nb * kQDenseBlockElems;
  const bool ring = M <= 32;  // one input tile pair: each B tile is read once
  const bool blocked = !ring && M * K * 2 > kQDensePassBytes;
  // units (each two B tiles) per block
  const int64_t block = blocked ? std::max<int64_t>(1, kQDenseBlockBytes / (2 * tile_elems * 2)) : 1;
  const int64_t slot_elems = ring ? kQDenseRing * kQDenseBlockElems : tile_elems;
  const int64_t units = (t1 - t0 + step - 1) / step;
  uint16_t* buf = static_cast<uint16_t*>(
      std::aligned_alloc(64, (size_t)2 * std::min(block, units) * slot_elems * sizeof(uint16_t)));
  alignas(64) float c[2][4][16][16];  // gated: the unit's sums and the previous unit's, whose epilogue is pending
  int cur = 0;
  QDenseGatedPending<ACT> pending;
  quant_dense_configure();
  // unit u (output tiles t0 + step * u ...; its B tiles in slots 2k, 2k + 1) x input rows [m, m + 32)
  auto run = [&](int64_t u, int64_t k, int64_t m, bool fresh_tiles) {
    const int64_t t = t0 + step * u;
    const int nt = gated ? 2 : (int)std::min<int64_t>(2, t1 - t);
    const int64_t p1 = gated ? t + up_tiles : t + nt - 1;  // the second B tile's packed tile
    uint16_t* w0 = buf + 2 * k * slot_elems;
    uint16_t* w1 = nt == 2 ? w0 + slot_elems : w0;
    const QDenseFresh fresh{dequant, tile_bytes / nb, packed + t * tile_bytes, packed + p1 * tile_bytes,
                            ring ? kQDenseRing : 0, step * tile_bytes};
    const QDenseFresh* f = fresh_tiles ? &fresh : nullptr;
    T* yt = y + (t - ty) * kQTileRows + m * ldy;
    const uint16_t* xm = x + m * K;
    const int mt = m + 16 < M ? 2 : 1;  // two input tiles (the second may be partly padding), or one
    if constexpr (gated) {
      if (mt == 2) quant_dense_block<2, 2>(xm, K, w0, w1, nb, c[cur], f, pending);
      else quant_dense_block<1, 2>(xm, K, w0, w1, nb, c[cur], f, pending);
      pending.c = c[cur], pending.y = yt, pending.ldy = ldy, pending.rows = M - m, pending.mt = mt;
      cur ^= 1;
      return;
    }
    const int64_t n = std::min<int64_t>(nt * kQTileRows, N - t * kQTileRows);
    if (mt == 2) {
      if (nt == 2) quant_dense_tiles<2, 2, T>(xm, K, w0, w1, nb, c[0], f, yt, ldy, M - m, n);
      else quant_dense_tiles<2, 1, T>(xm, K, w0, w1, nb, c[0], f, yt, ldy, M - m, n);
    } else {
      if (nt == 2) quant_dense_tiles<1, 2, T>(xm, K, w0, w1, nb, c[0], f, yt, ldy, M - m, n);
      else quant_dense_tiles<1, 1, T>(xm, K, w0, w1, nb, c[0], f, yt, ldy, M - m, n);
    }
  };
  if (blocked) {
    for (int64_t u0 = 0; u0 < units; u0 += block)
      for (int64_t m = 0; m < M; m += 32)  // the first input tiles dequantize the block's records as they multiply
        for (int64_t u = u0; u < std::min(units, u0 + block); ++u) run(u, u - u0, m, m == 0);
  } else {
    for (int64_t u = 0; u < units; ++u)
      for (int64_t m = 0; m < M; m += 32) run(u, 0, m, m == 0);
  }
  pending();  // the last unit's
  _tile_release();
  std::free(buf);
}

}  // namespace sgl_cpu
