// Fused MoE experts on block-quantized expert weights (GGUF Q4_0 / Q4_1 / Q8_0, int8): moe.h's routing and task grid
// with quant_gemm.h's records and integer dot products. Compiled for AVX-512 VNNI + BF16 (its epilogues round to bf16
// as moe.h's do): fused_experts_quant refuses levels below avx512_bf16.
//
// Weights: each expert packed as quant_gemm.h lays out a linear weight (layers/quantization/packing.py's pack):
//   w13[e]: [2N/16 tiles][K/32 records]   (gate tile g is tile g, its up tile is tile N/16 + g)
//   w2[e]:  [K/16 tiles][N/32 records]
// one record = 16 output rows x 32 k values, fp16 d and c per row, u in 4 or 8 bits; w13 and w2 may differ in bits.
// Activations are quantized to int8 per 32 values as in quant_linear (with the residual pass for 8-bit weights):
// hidden once per token before the gate/up tasks, silu(gate) * up (bf16, as in moe.h) once per slot before the down
// tasks. A block's dot product is d * da * sum(u * qa) + c * da * sum(qa), quant_tile's arithmetic (for 8-bit weights
// quant_tile adds the residual pass's sum / 254 to the main one before scaling; here each pass is scaled on its own);
// here the input rows of a register tile are gathered through pointers (a gate/up tile's slots belong to scattered
// tokens).
// Prefetches stop at the end of the expert's weights: a decode step touches only its routed experts.
#pragma once

#include "moe.h"
#include "quant_gemm.h"

namespace sgl_cpu {

constexpr int kMoeQuantPrefetchRecords = 4;  // records ahead (quant_tile's distance)

// The activation regions that follow moe_workspace's in the workspace of the quantized kernel:
//   qx int8 [M, lda13] | dx fp32 [M, nb13] | sx fp32 [M, nb13] | qh int8 [M * k, lda2] | dh fp32 [M * k, nb2] |
//   sh fp32 [M * k, nb2]   with nb13 = K / 32, nb2 = N / 32, lda = quant_act_row_bytes(bits, nb)
struct MoeQuantActs {
  int8_t* qx;
  float* dx;
  float* sx;
  int8_t* qh;
  float* dh;
  float* sh;
  int64_t lda13, nb13, lda2, nb2;
};

inline int64_t moe_quant_act_bytes(int64_t M, int64_t topk, int64_t N, int64_t K, int bits13, int bits2) {
  const int64_t slots = M * topk, nb13 = K / kQBlock, nb2 = N / kQBlock;
  return moe_align(M * quant_act_row_bytes(bits13, nb13)) + 2 * moe_align(4 * M * nb13) +
         moe_align(slots * quant_act_row_bytes(bits2, nb2)) + 2 * moe_align(4 * slots * nb2);
}

inline int64_t moe_quant_workspace_bytes(int64_t M, int64_t topk, int64_t E, int64_t N, int64_t K, int bits13,
                                         int bits2) {
  return moe_workspace_bytes(M, topk, E, N, K) + moe_quant_act_bytes(M, topk, N, K, bits13, bits2);
}

inline MoeQuantActs moe_quant_acts(uint8_t* base, int64_t M, int64_t topk, int64_t E, int64_t N, int64_t K, int bits13,
                                   int bits2) {
  const int64_t slots = M * topk;
  MoeQuantActs a;
  a.nb13 = K / kQBlock;
  a.nb2 = N / kQBlock;
  a.lda13 = quant_act_row_bytes(bits13, a.nb13);
  a.lda2 = quant_act_row_bytes(bits2, a.nb2);
  base += moe_workspace_bytes(M, topk, E, N, K);
  a.qx = reinterpret_cast<int8_t*>(base);
  base += moe_align(M * a.lda13);
  a.dx = reinterpret_cast<float*>(base);
  base += moe_align(4 * M * a.nb13);
  a.sx = reinterpret_cast<float*>(base);
  base += moe_align(4 * M * a.nb13);
  a.qh = reinterpret_cast<int8_t*>(base);
  base += moe_align(slots * a.lda2);
  a.dh = reinterpret_cast<float*>(base);
  base += moe_align(4 * slots * a.nb2);
  a.sh = reinterpret_cast<float*>(base);
  return a;
}

// acc[i] (16 output rows of one tile) = the dot products of input row i (qa[i], da[i], sa[i]) with the tile's nb
// records. Prefetches: the records kMoeQuantPrefetchRecords ahead while below `limit` (the expert's end), and with
// `next` set the whole next tile the caller will read (record b of it alongside record b of this one).
template <int BITS, int MB>
SGL_AVX512_VNNI inline __attribute__((always_inline)) void moe_quant_dot(const uint8_t* tile, int64_t nb,
                                                                         const int8_t* const (&qa)[MB],
                                                                         const float* const (&da)[MB],
                                                                         const float* const (&sa)[MB],
                                                                         const uint8_t* limit, const uint8_t* next,
                                                                         __m512 (&acc)[MB]) {
  constexpr int64_t rec_bytes = BITS == 4 ? kQ4RecordBytes : kQ8RecordBytes;
  const int64_t residual = nb * kQBlock / 4;  // int32 offset of the residual pass (8-bit weights)
#pragma GCC unroll 8
  for (int i = 0; i < MB; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* rec = tile + b * rec_bytes;
    const uint8_t* ahead = rec + kMoeQuantPrefetchRecords * rec_bytes;
    if (ahead + rec_bytes <= limit) {
      _mm_prefetch((const char*)ahead, _MM_HINT_T0);
      _mm_prefetch((const char*)(ahead + 64), _MM_HINT_T0);
    }
    if (next != nullptr) {
#pragma GCC unroll 9
      for (int64_t l = 0; l < rec_bytes; l += 64) _mm_prefetch((const char*)(next + b * rec_bytes + l), _MM_HINT_T0);
    }
    __m512i wv[8];
    load_record_u8<BITS>(rec, wv);
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)rec));
    const __m512 cw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(rec + 32)));
#pragma GCC unroll 8
    for (int i = 0; i < MB; ++i) {
      const int32_t* a = (const int32_t*)(qa[i] + b * kQBlock);
      __m512i s = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int g = 0; g < 8; ++g) s = _mm512_dpbusd_epi32(s, wv[g], _mm512_set1_epi32(a[g]));
      const __m512 dwa = _mm512_mul_ps(dw, _mm512_set1_ps(da[i][b]));
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), dwa, acc[i]);
      if constexpr (BITS == 8) {
        const int32_t* a2 = a + residual;
        __m512i s2 = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int g = 0; g < 8; ++g) s2 = _mm512_dpbusd_epi32(s2, wv[g], _mm512_set1_epi32(a2[g]));
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s2), _mm512_mul_ps(dwa, _mm512_set1_ps(1.0f / kResidualScale)), acc[i]);
      }
      acc[i] = _mm512_fmadd_ps(cw, _mm512_set1_ps(sa[i][b]), acc[i]);
    }
  }
}

// MB slots x one gate/up tile pair -> act[s, 16 columns] = bf16(silu(bf16(gate)) * bf16(up)) (moe.h's epilogue).
// next_gate / next_up: the tiles to prefetch meanwhile (or null).
template <int BITS, int MB>
SGL_AVX512_VNNI_BF16 inline void moe_quant_gate_up_tile(const MoeQuantActs& q, const int32_t* tokens,
                                                        const uint8_t* gate, const uint8_t* up, const uint8_t* limit,
                                                        const uint8_t* next_gate, const uint8_t* next_up,
                                                        uint16_t* act, int64_t N) {
  const int8_t* qa[MB];
  const float* da[MB];
  const float* sa[MB];
#pragma GCC unroll 8
  for (int i = 0; i < MB; ++i) {
    qa[i] = q.qx + (int64_t)tokens[i] * q.lda13;
    da[i] = q.dx + (int64_t)tokens[i] * q.nb13;
    sa[i] = q.sx + (int64_t)tokens[i] * q.nb13;
  }
  __m512 g[MB], u[MB];
  moe_quant_dot<BITS, MB>(gate, q.nb13, qa, da, sa, limit, next_gate, g);
  moe_quant_dot<BITS, MB>(up, q.nb13, qa, da, sa, limit, next_up, u);
#pragma GCC unroll 8
  for (int i = 0; i < MB; ++i) {
    const __m512 s = round_bf16(silu_ps(round_bf16(g[i])));
    store_bf16x16(act + i * N, _mm512_mul_ps(s, round_bf16(u[i])));
  }
}

// MB consecutive slots x one down tile (16 output columns at acc): acc[token] += w * result; next: as moe_quant_dot.
template <int BITS, int MB>
SGL_AVX512_VNNI_BF16 inline void moe_quant_down_tile(const MoeQuantActs& q, int64_t s, const int32_t* tokens,
                                                     const float* weights, const uint8_t* tile, const uint8_t* limit,
                                                     const uint8_t* next, float* acc, int64_t K) {
  const int8_t* qa[MB];
  const float* da[MB];
  const float* sa[MB];
#pragma GCC unroll 8
  for (int i = 0; i < MB; ++i) {
    qa[i] = q.qh + (s + i) * q.lda2;
    da[i] = q.dh + (s + i) * q.nb2;
    sa[i] = q.sh + (s + i) * q.nb2;
  }
  __m512 r[MB];
  moe_quant_dot<BITS, MB>(tile, q.nb2, qa, da, sa, limit, next, r);
#pragma GCC unroll 8
  for (int i = 0; i < MB; ++i) {
    float* a = acc + (int64_t)tokens[i] * K;
    _mm512_storeu_ps(a, _mm512_fmadd_ps(_mm512_set1_ps(weights[i]), r[i], _mm512_loadu_ps(a)));
  }
}

// Step 2 (quantized), tasks [t0, t1) of moe.h's (row block, column block) grid. w13: E x 2N/16 tiles of nb13 records.
template <int BITS>
SGL_AVX512_VNNI_BF16 inline void moe_quant_gate_up_tasks(const uint8_t* w13, int64_t E, int64_t N,
                                                         const MoeWorkspace& ws, const MoeQuantActs& q, int64_t t0,
                                                         int64_t t1) {
  constexpr int64_t rec_bytes = BITS == 4 ? kQ4RecordBytes : kQ8RecordBytes;
  const int64_t G = N / kQTileRows, tile_bytes = q.nb13 * rec_bytes, expert_bytes = 2 * G * tile_bytes;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t rb = t / G, g = t % G;
    const int64_t e = moe_block_expert(ws, E, rb);
    const int64_t s0 = ws.expert_start[e] + (rb - ws.block_start[e]) * kMoeRowBlock;
    const int64_t s1 = std::min<int64_t>(s0 + kMoeRowBlock, ws.expert_start[e + 1]);
    const uint8_t* gate = w13 + e * expert_bytes + g * tile_bytes;
    const uint8_t* up = gate + G * tile_bytes;
    const uint8_t* limit = w13 + (e + 1) * expert_bytes;
    // the next task on this thread: its tiles, of this expert or the next routed one, are prefetched meanwhile
    const uint8_t* next_gate = nullptr;
    if (t + 1 < t1) {
      const int64_t rb2 = (t + 1) / G, g2 = (t + 1) % G, e2 = rb2 == rb ? e : moe_block_expert(ws, E, rb2);
      next_gate = w13 + e2 * expert_bytes + g2 * tile_bytes;
    }
    for (int64_t s = s0; s < s1; s += kMoeRowTile) {
      const int32_t* tok = ws.slot_token + s;
      uint16_t* act = ws.act + s * N + g * kQTileRows;
      const uint8_t* ng = s == s0 ? next_gate : nullptr;
      const uint8_t* nu = ng != nullptr ? ng + G * tile_bytes : nullptr;
      switch (std::min<int64_t>(kMoeRowTile, s1 - s)) {
        case 8: moe_quant_gate_up_tile<BITS, 8>(q, tok, gate, up, limit, ng, nu, act, N); break;
        case 7: moe_quant_gate_up_tile<BITS, 7>(q, tok, gate, up, limit, ng, nu, act, N); break;
        case 6: moe_quant_gate_up_tile<BITS, 6>(q, tok, gate, up, limit, ng, nu, act, N); break;
        case 5: moe_quant_gate_up_tile<BITS, 5>(q, tok, gate, up, limit, ng, nu, act, N); break;
        case 4: moe_quant_gate_up_tile<BITS, 4>(q, tok, gate, up, limit, ng, nu, act, N); break;
        case 3: moe_quant_gate_up_tile<BITS, 3>(q, tok, gate, up, limit, ng, nu, act, N); break;
        case 2: moe_quant_gate_up_tile<BITS, 2>(q, tok, gate, up, limit, ng, nu, act, N); break;
        default: moe_quant_gate_up_tile<BITS, 1>(q, tok, gate, up, limit, ng, nu, act, N); break;
      }
    }
  }
}

// Step 3 (quantized), down tasks [c0, c1): task c owns the kMoeDownBlocks output tiles [3c, 3c + 3) for all tokens,
// as in moe_down_tasks. w2: E x K/16 tiles of nb2 records.
template <int BITS>
SGL_AVX512_VNNI_BF16 inline void moe_quant_down_tasks(const uint8_t* w2, int64_t E, int64_t K, int64_t M,
                                                      const MoeWorkspace& ws, const MoeQuantActs& q, uint16_t* out,
                                                      int64_t c0, int64_t c1) {
  constexpr int64_t rec_bytes = BITS == 4 ? kQ4RecordBytes : kQ8RecordBytes;
  const int64_t tiles = K / kQTileRows, tile_bytes = q.nb2 * rec_bytes, expert_bytes = tiles * tile_bytes;
  for (int64_t c = c0; c < c1; ++c) {
    const int64_t b0 = c * kMoeDownBlocks, nb = std::min<int64_t>(kMoeDownBlocks, tiles - b0);
    const int64_t col0 = b0 * kQTileRows, cols = nb * kQTileRows;
    for (int64_t m = 0; m < M; ++m) std::fill(ws.acc + m * K + col0, ws.acc + m * K + col0 + cols, 0.0f);
    for (int64_t e = 0; e < E; ++e) {
      const int64_t s0 = ws.expert_start[e], s1 = ws.expert_start[e + 1];
      if (s0 == s1) continue;
      const uint8_t* limit = w2 + (e + 1) * expert_bytes;
      // prefetch the same tiles of the next routed expert (the next weights this task reads)
      int64_t f = e + 1;
      while (f < E && ws.expert_start[f] == ws.expert_start[f + 1]) ++f;
      for (int64_t s = s0; s < s1; s += kMoeRowTile) {
        const int32_t* tok = ws.slot_token + s;
        const float* w = ws.slot_weight + s;
        for (int64_t j = 0; j < nb; ++j) {
          const uint8_t* tile = w2 + e * expert_bytes + (b0 + j) * tile_bytes;
          const uint8_t* next = f < E && s == s0 ? w2 + f * expert_bytes + (b0 + j) * tile_bytes : nullptr;
          float* acc = ws.acc + col0 + j * kQTileRows;
          switch (std::min<int64_t>(kMoeRowTile, s1 - s)) {
            case 8: moe_quant_down_tile<BITS, 8>(q, s, tok, w, tile, limit, next, acc, K); break;
            case 7: moe_quant_down_tile<BITS, 7>(q, s, tok, w, tile, limit, next, acc, K); break;
            case 6: moe_quant_down_tile<BITS, 6>(q, s, tok, w, tile, limit, next, acc, K); break;
            case 5: moe_quant_down_tile<BITS, 5>(q, s, tok, w, tile, limit, next, acc, K); break;
            case 4: moe_quant_down_tile<BITS, 4>(q, s, tok, w, tile, limit, next, acc, K); break;
            case 3: moe_quant_down_tile<BITS, 3>(q, s, tok, w, tile, limit, next, acc, K); break;
            case 2: moe_quant_down_tile<BITS, 2>(q, s, tok, w, tile, limit, next, acc, K); break;
            default: moe_quant_down_tile<BITS, 1>(q, s, tok, w, tile, limit, next, acc, K); break;
          }
        }
      }
    }
    for (int64_t m = 0; m < M; ++m)
      for (int64_t j = 0; j < nb; ++j)
        store_bf16x16(out + m * K + col0 + 16 * j, _mm512_loadu_ps(ws.acc + m * K + col0 + 16 * j));
  }
}

}  // namespace sgl_cpu
