// Fused MoE experts in bf16 without AMX: out[m] = sum_j w[m, j] * (silu(x[m] G_e^T) * (x[m] U_e^T)) D_e^T, e = id[m, j],
// for every token m, with G_e / U_e rows [0, N) / [N, 2N) of w13[e] and D_e = w2[e].
//
// Weights: packed once at load into gemm_bf16.h's VNNI lines, expert by expert (same element count as the original):
//   w13[e] [2N, K] -> [N/16][K/2][2][16][2]   pair g: for each k-pair, the line of gate column block g (rows 16g..)
//                                             then the line of its up block (rows N + 16g..)
//   w2[e]  [K, N]  -> gemm_bf16.h's layout of a [K, N] weight: groups of 3 column blocks, [K/16/3][N/2][3][16][2]
// so every output column is one chain of VDPBF16PS over k-pairs (broadcast input pair x 16 packed columns), no
// horizontal sums, and what one task reads (a gate/up pair, a group of 3 down blocks) is one sequential run of memory.
//
// Three steps, all inside one call:
// 1. route (serial, O(M * k + E)): a counting sort of the (token, j) pairs by expert into "slots"; the slots of expert e
//    are [expert_start[e], expert_start[e + 1]), in ascending (token, j) order. Ids outside [0, E) take no slot (an
//    expert-parallel rank masks others' experts with -1).
// 2. gate/up: tasks (expert, block of up to kMoeRowBlock slots, column block j); a task computes the gate and up
//    columns [16j, 16j + 16) of its slots in one register tile (8 slots x 2 blocks), rounds them to bf16 as a torch
//    matmul would, and writes silu(gate) * up (activation.h's rounding) to act[slot]. Only the routed experts' weights
//    are touched: a task prefetches the blocks of the next task on its thread (a routed expert's), nothing else.
// 3. down: tasks = groups of kMoeDownBlocks output column blocks; a task walks every expert's slots (8 slots x 3 blocks
//    per register tile) and adds w * (act[slot] D_e^T) into the fp32 rows acc[token] of its columns, then writes them
//    to out in bf16. A task owns its columns for all tokens, so no two threads add to the same element and the sum
//    over a token's experts runs in ascending expert id: a token's output does not depend on the thread count or on
//    its batch mates.
//
// The workspace (moe_workspace_bytes) holds the routing, act [M * k, N] bf16 and acc [M, K] fp32; nothing else grows
// with M * k.
#pragma once

#include <algorithm>
#include <cstdint>

#include "activation.h"
#include "gemm_bf16.h"

namespace sgl_cpu {

constexpr int kMoeRowTile = 8;     // slots per register tile
constexpr int kMoeRowBlock = 64;   // slots per gate/up task (their weights' column block stays in L2)
constexpr int kMoeDownBlocks = 3;  // 16-column blocks per down task (8 x 3 accumulators)
static_assert(kMoeDownBlocks == kPackGroup, "a down task reads one packed group of w2");
constexpr int64_t kMoeAlign = 64;  // every workspace region starts on a cache line

inline int64_t moe_align(int64_t bytes) { return (bytes + kMoeAlign - 1) / kMoeAlign * kMoeAlign; }

// The workspace regions in order (all sizes rounded up to kMoeAlign bytes):
//   expert_start int32 [E + 1] | block_start int32 [E + 1] | slot_token int32 [M * k] | slot_weight fp32 [M * k] |
//   act bf16 [M * k, N] | acc fp32 [M, K]
struct MoeWorkspace {
  int32_t* expert_start;  // slots of expert e: [expert_start[e], expert_start[e + 1])
  int32_t* block_start;   // gate/up row blocks of expert e: [block_start[e], block_start[e + 1])
  int32_t* slot_token;    // the token of each slot
  float* slot_weight;     // its routing weight
  uint16_t* act;          // silu(gate) * up of each slot, N values
  float* acc;             // the weighted sum of a token's expert outputs, K values
};

inline int64_t moe_workspace_bytes(int64_t M, int64_t topk, int64_t E, int64_t N, int64_t K) {
  const int64_t slots = M * topk;
  return 2 * moe_align(4 * (E + 1)) + 2 * moe_align(4 * slots) + moe_align(2 * slots * N) + moe_align(4 * M * K);
}

inline MoeWorkspace moe_workspace(uint8_t* base, int64_t M, int64_t topk, int64_t E, int64_t N) {
  const int64_t slots = M * topk;
  MoeWorkspace ws;
  ws.expert_start = reinterpret_cast<int32_t*>(base);
  base += moe_align(4 * (E + 1));
  ws.block_start = reinterpret_cast<int32_t*>(base);
  base += moe_align(4 * (E + 1));
  ws.slot_token = reinterpret_cast<int32_t*>(base);
  base += moe_align(4 * slots);
  ws.slot_weight = reinterpret_cast<float*>(base);
  base += moe_align(4 * slots);
  ws.act = reinterpret_cast<uint16_t*>(base);
  base += moe_align(2 * slots * N);
  ws.acc = reinterpret_cast<float*>(base);
  return ws;
}

// Step 1: ids [M, k] (strides id_s0, id_s1), weights [M, k] (w_s0, w_s1) -> slots by expert; returns the slot count.
template <typename Id>
inline int64_t moe_route(const Id* ids, int64_t id_s0, int64_t id_s1, const float* weights, int64_t w_s0,
                         int64_t w_s1, int64_t M, int64_t topk, int64_t E, const MoeWorkspace& ws) {
  int32_t* start = ws.expert_start;
  int32_t* cursor = ws.block_start;  // reused as the fill cursor, then overwritten with the row blocks
  std::fill(start, start + E + 1, 0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t j = 0; j < topk; ++j) {
      const int64_t e = (int64_t)ids[m * id_s0 + j * id_s1];
      if (e >= 0 && e < E) ++start[e + 1];
    }
  for (int64_t e = 0; e < E; ++e) start[e + 1] += start[e];
  std::copy(start, start + E, cursor);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t j = 0; j < topk; ++j) {
      const int64_t e = (int64_t)ids[m * id_s0 + j * id_s1];
      if (e < 0 || e >= E) continue;
      const int32_t s = cursor[e]++;
      ws.slot_token[s] = (int32_t)m;
      ws.slot_weight[s] = weights[m * w_s0 + j * w_s1];
    }
  int32_t* blocks = ws.block_start;
  blocks[0] = 0;
  for (int64_t e = 0; e < E; ++e)
    blocks[e + 1] = blocks[e] + (start[e + 1] - start[e] + kMoeRowBlock - 1) / kMoeRowBlock;
  return start[E];
}

// acc[i][j] = sum over k-pairs p < pairs of rows[i][2p, 2p + 1] . block j's line p (16 columns); with next set, the
// lines of the NB blocks at next[j] are prefetched alongside (the following column blocks of the same expert).
// step: elements from one k-pair's line of a block to the next pair's (32 x the lines interleaved with it).
template <int MB, int NB>
SGL_AVX512_BF16 inline __attribute__((always_inline)) void moe_dot_tile(const uint16_t* const (&rows)[MB],
                                                                        const uint16_t* const (&blocks)[NB],
                                                                        int64_t pairs, int64_t step,
                                                                        const uint16_t* const* next,
                                                                        __m512 (&acc)[MB][NB]) {
#pragma GCC unroll 8
  for (int i = 0; i < MB; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    if (next != nullptr) {
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) _mm_prefetch(reinterpret_cast<const char*>(next[j] + step * p), _MM_HINT_T0);
    }
    __m512bh w[NB];
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) w[j] = (__m512bh)_mm512_loadu_si512(blocks[j] + step * p);
#pragma GCC unroll 8
    for (int i = 0; i < MB; ++i) {
      const __m512bh xb = (__m512bh)_mm512_set1_epi32(*reinterpret_cast<const int32_t*>(rows[i] + 2 * p));
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xb, w[j]);
    }
  }
}

// MB slots x gate/up column block (the pair's lines at gate and gate + 32): act[s, 16 columns] =
// bf16(silu(bf16(gate)) * bf16(up)); next: the gate and up lines of the pair to prefetch meanwhile, or null.
template <int MB>
SGL_AVX512_BF16 inline void moe_gate_up_tile(const uint16_t* x, int64_t ldx, const int32_t* tokens,
                                             const uint16_t* gate, const uint16_t* up, int64_t K,
                                             const uint16_t* const* next, uint16_t* act, int64_t N) {
  const uint16_t* rows[MB];
#pragma GCC unroll 8
  for (int i = 0; i < MB; ++i) rows[i] = x + (int64_t)tokens[i] * ldx;
  const uint16_t* const blocks[2] = {gate, up};
  __m512 acc[MB][2];
  moe_dot_tile<MB, 2>(rows, blocks, K / 2, 64, next, acc);
#pragma GCC unroll 8
  for (int i = 0; i < MB; ++i) {
    const __m512 s = round_bf16(silu_ps(round_bf16(acc[i][0])));
    store_bf16x16(act + i * N, _mm512_mul_ps(s, round_bf16(acc[i][1])));
  }
}

// MB consecutive slots (act rows ldx = N apart) x the NB down column blocks of the group at w2:
// acc[token, 16 NB columns] += w * result.
template <int MB, int NB>
SGL_AVX512_BF16 inline void moe_down_tile(const uint16_t* act, int64_t N, const uint16_t* w2, const int32_t* tokens,
                                          const float* weights, float* acc, int64_t K, const uint16_t* next) {
  const uint16_t* rows[MB];
#pragma GCC unroll 8
  for (int i = 0; i < MB; ++i) rows[i] = act + i * N;
  const uint16_t* blocks[NB];
  const uint16_t* nexts[NB];
#pragma GCC unroll 4
  for (int j = 0; j < NB; ++j) {
    blocks[j] = w2 + 32 * j;
    nexts[j] = next + 32 * j;
  }
  __m512 r[MB][NB];
  moe_dot_tile<MB, NB>(rows, blocks, N / 2, 32 * NB, next != nullptr ? nexts : nullptr, r);
#pragma GCC unroll 8
  for (int i = 0; i < MB; ++i) {
    const __m512 w = _mm512_set1_ps(weights[i]);
    float* a = acc + (int64_t)tokens[i] * K;
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) _mm512_storeu_ps(a + 16 * j, _mm512_fmadd_ps(w, r[i][j], _mm512_loadu_ps(a + 16 * j)));
  }
}

// The expert whose row blocks hold gate/up row block rb (the first e with block_start[e + 1] > rb).
inline int64_t moe_block_expert(const MoeWorkspace& ws, int64_t E, int64_t rb) {
  return std::upper_bound(ws.block_start, ws.block_start + E + 1, (int32_t)rb) - ws.block_start - 1;
}

// Step 2, tasks [t0, t1) of the (row block, column block) grid; G = N / 16 column blocks per row block.
// w13 [E][N/16][K/2][2][16][2], x [M, K] with row stride ldx.
SGL_AVX512_BF16 inline void moe_gate_up_tasks(const uint16_t* x, int64_t ldx, const uint16_t* w13, int64_t E,
                                              int64_t N, int64_t K, const MoeWorkspace& ws, int64_t t0, int64_t t1) {
  const int64_t G = N / kPackRows;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t rb = t / G, g = t % G;
    const int64_t e = moe_block_expert(ws, E, rb);
    const int64_t s0 = ws.expert_start[e] + (rb - ws.block_start[e]) * kMoeRowBlock;
    const int64_t s1 = std::min<int64_t>(s0 + kMoeRowBlock, ws.expert_start[e + 1]);
    const uint16_t* gate = w13 + e * 2 * N * K + g * 2 * kPackRows * K;
    const uint16_t* up = gate + 32;
    // the next task on this thread: its column block, of this expert or the next routed one, is prefetched meanwhile
    const uint16_t* next[2] = {nullptr, nullptr};
    if (t + 1 < t1) {
      const int64_t rb2 = (t + 1) / G, g2 = (t + 1) % G, e2 = rb2 == rb ? e : moe_block_expert(ws, E, rb2);
      next[0] = w13 + e2 * 2 * N * K + g2 * 2 * kPackRows * K;
      next[1] = next[0] + 32;
    }
    int64_t s = s0;
    for (; s + kMoeRowTile <= s1; s += kMoeRowTile)
      moe_gate_up_tile<kMoeRowTile>(x, ldx, ws.slot_token + s, gate, up, K, s == s0 && next[0] ? next : nullptr,
                                    ws.act + s * N + g * kPackRows, N);
    const uint16_t* const* pf = s == s0 && next[0] ? next : nullptr;
    const int32_t* tok = ws.slot_token + s;
    uint16_t* act = ws.act + s * N + g * kPackRows;
    switch (s1 - s) {
      case 7: moe_gate_up_tile<7>(x, ldx, tok, gate, up, K, pf, act, N); break;
      case 6: moe_gate_up_tile<6>(x, ldx, tok, gate, up, K, pf, act, N); break;
      case 5: moe_gate_up_tile<5>(x, ldx, tok, gate, up, K, pf, act, N); break;
      case 4: moe_gate_up_tile<4>(x, ldx, tok, gate, up, K, pf, act, N); break;
      case 3: moe_gate_up_tile<3>(x, ldx, tok, gate, up, K, pf, act, N); break;
      case 2: moe_gate_up_tile<2>(x, ldx, tok, gate, up, K, pf, act, N); break;
      case 1: moe_gate_up_tile<1>(x, ldx, tok, gate, up, K, pf, act, N); break;
      default: break;
    }
  }
}

template <int NB>
SGL_AVX512_BF16 inline void moe_down_rows(const MoeWorkspace& ws, int64_t s0, int64_t s1, const uint16_t* w2,
                                          int64_t N, float* acc, int64_t K, const uint16_t* next) {
  int64_t s = s0;
  for (; s + kMoeRowTile <= s1; s += kMoeRowTile)
    moe_down_tile<kMoeRowTile, NB>(ws.act + s * N, N, w2, ws.slot_token + s, ws.slot_weight + s, acc, K,
                                   s == s0 ? next : nullptr);
  const uint16_t* act = ws.act + s * N;
  const int32_t* tok = ws.slot_token + s;
  const float* w = ws.slot_weight + s;
  const uint16_t* pf = s == s0 ? next : nullptr;
  switch (s1 - s) {
    case 7: moe_down_tile<7, NB>(act, N, w2, tok, w, acc, K, pf); break;
    case 6: moe_down_tile<6, NB>(act, N, w2, tok, w, acc, K, pf); break;
    case 5: moe_down_tile<5, NB>(act, N, w2, tok, w, acc, K, pf); break;
    case 4: moe_down_tile<4, NB>(act, N, w2, tok, w, acc, K, pf); break;
    case 3: moe_down_tile<3, NB>(act, N, w2, tok, w, acc, K, pf); break;
    case 2: moe_down_tile<2, NB>(act, N, w2, tok, w, acc, K, pf); break;
    case 1: moe_down_tile<1, NB>(act, N, w2, tok, w, acc, K, pf); break;
    default: break;
  }
}

// Step 3, down tasks [c0, c1): task c owns output column blocks [3c, min(3c + 3, K/16)) for all M tokens, the
// packed group c of every expert's w2 (kMoeDownBlocks == kPackGroup). out [M, K] bf16.
SGL_AVX512_BF16 inline void moe_down_tasks(const uint16_t* w2, int64_t E, int64_t N, int64_t K, int64_t M,
                                           const MoeWorkspace& ws, uint16_t* out, int64_t c0, int64_t c1) {
  const int64_t blocks = K / kPackRows;
  for (int64_t c = c0; c < c1; ++c) {
    const int64_t b0 = c * kMoeDownBlocks, nb = std::min<int64_t>(kMoeDownBlocks, blocks - b0);
    const int64_t col0 = b0 * kPackRows, cols = nb * kPackRows;
    float* acc = ws.acc + col0;
    for (int64_t m = 0; m < M; ++m) std::fill(acc + m * K, acc + m * K + cols, 0.0f);
    for (int64_t e = 0; e < E; ++e) {
      const int64_t s0 = ws.expert_start[e], s1 = ws.expert_start[e + 1];
      if (s0 == s1) continue;
      const uint16_t* w = w2 + e * K * N + b0 * kPackRows * N;
      // prefetch the same columns of the next routed expert (the next weights this task reads)
      int64_t f = e + 1;
      while (f < E && ws.expert_start[f] == ws.expert_start[f + 1]) ++f;
      const uint16_t* next = f < E ? w2 + f * K * N + b0 * kPackRows * N : nullptr;
      switch (nb) {
        case 3: moe_down_rows<3>(ws, s0, s1, w, N, acc, K, next); break;
        case 2: moe_down_rows<2>(ws, s0, s1, w, N, acc, K, next); break;
        default: moe_down_rows<1>(ws, s0, s1, w, N, acc, K, next); break;
      }
    }
    for (int64_t m = 0; m < M; ++m)
      for (int64_t j = 0; j < nb; ++j)
        store_bf16x16(out + m * K + col0 + 16 * j, _mm512_loadu_ps(acc + m * K + 16 * j));
  }
}

}  // namespace sgl_cpu
