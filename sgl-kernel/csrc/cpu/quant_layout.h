// The packed layout of block-quantized weights (GGUF Q4_0 / Q4_1 / Q8_0 and int8 weight-only) that every level's
// quantized GEMM reads (quant_gemm.h: AVX-512 VNNI; quant_gemm_avx2.h: AVX2), and the activation quantization they share.
//
// Every supported type is written as w = d * u + c per block of 32 weights of one row, with u an unsigned integer
// (4-bit for Q4_0/Q4_1, 8-bit for Q8_0/int8 stored with +128) and d, c one fp16 pair per block:
//   Q4_0: u = q, c = -8 d;  Q4_1: u = q, c = m;  Q8_0 / int8: u = q + 128, c = -128 d (int8: a fitted c).
// Activations are quantized to int8 per block of 32 values (a = da * qa, as llama.cpp does for its integer dot
// products), so one block's dot product is  d * da * sum(u * qa) + c * da * sum(qa):  the integer sum comes from
// the level's byte dot product, the rest is two fp32 FMAs per block.
//
// Packed layout (pack in layers/quantization/packing.py writes it once at load): output rows in tiles of 16,
// each tile a run of records, one per 32-wide block of K:
//   [16 x fp16 d][16 x fp16 c][u: 8 groups of 4 k values, each group one 64-byte register: lane r = row r's 4 bytes]
// Q4 records hold the 8 groups in 4 registers (group g in the low nibbles, group g + 4 in the high nibbles):
// 320 bytes per 16 x 32 weights (0.625 B/weight); Q8 records 576 bytes (1.125 B/weight). A tile's records are
// contiguous, so each thread streams one range of memory. One int32 lane per output row: no horizontal sums (AVX2
// reads each 64-byte group as two 32-byte halves: rows 0-7 and rows 8-15).
#pragma once

#include <cstdint>

namespace sgl_cpu {

constexpr int kQBlock = 32;        // weights (and activations) per scale
constexpr int kQTileRows = 16;     // output rows per tile (one fp32 / int32 lane each)
constexpr int64_t kQ4RecordBytes = 64 + 4 * 64;
constexpr int64_t kQ8RecordBytes = 64 + 8 * 64;

inline int64_t quant_record_bytes(int bits) { return bits == 4 ? kQ4RecordBytes : kQ8RecordBytes; }
// bytes of one quantized activation row: the int8 values, then for 8-bit weights their residual pass
inline int64_t quant_act_row_bytes(int bits, int64_t nb) { return (bits == 8 ? 2 : 1) * nb * kQBlock; }

// Activation quantization (quantize_row_q8 at each level; both levels give the same bytes and scales): one row of
// K values (float or bf16) -> int8 per block of 32 (K padded with zeros to nb * 32), round to nearest even with scale
// da[b] = max|x| / 127, and sa[b] = da[b] * the sum of the block's int8 values.
// With q2 (not null) the rounding residual is quantized again, to int8 of scale da / kResidualScale, into q2 (and its
// sum added to sa): the two int8 passes carry about 15 bits of each activation (used with 8-bit weights, where one
// pass's error would dominate the weights').
constexpr float kResidualScale = 254.0f;

}  // namespace sgl_cpu
