// The packed layout of block-quantized weights (GGUF Q4_0 / Q4_1 / Q5_0 / Q8_0 / Q4_K / Q5_K / Q6_K and int8
// weight-only) that every level's quantized GEMM reads (quant_gemm.h: AVX-512 VNNI; quant_gemm_avx2.h: AVX2), and the
// activation quantization they share.
//
// Every supported type is written as w = d * u + c per block of 32 weights of one row, with u an unsigned integer
// (4 or 8 bits) and d, c per block in one of three headers, the smallest that holds the type's values exactly:
//   kQHeadF16    fp16 d, c per 32:   Q4_0: u = q, c = -8 d;  Q4_1: u = q, c = m;  Q5_0: u = q, c = -16 d;
//                                     Q8_0 / int8: u = q + 128, c = -128 d (int8: a fitted c)
//   kQHeadF32    fp32 d, c per 32:   Q4_K / Q5_K: d = d_super * sc, c = -dmin * m (6-bit sc, m: 17-bit products,
//                                     exact in fp32, not in fp16)
//   kQHeadHalves fp32 d, c per 16:   any of these merged with Q6_K (a q/k/v or gate/up of mixed types)
//   kQHeadQ6     fp16 d, int8 sc per 16:  Q6_K alone: d = d_super * sc per half block (exact in fp32), c = -32 d
// Activations are quantized to int8 per block of 32 (a = da * qa, as llama.cpp does for its integer dot products), so
// one block's dot product is  d * da * sum(u * qa) + c * da * sum(qa):  the integer sum comes from the level's byte
// dot product, the rest is two fp32 FMAs per block (kQHeadHalves: per half block, with the halves' activation sums).
//
// Packed layout (pack in layers/quantization/packing.py writes it once at load): output rows in tiles of 16,
// each tile a run of records, one per 32-wide block of K:
//   [header][u: 8 groups of 4 k values, each group one 64-byte register: lane r = row r's 4 bytes]
//   header kQHeadF16: [16 x fp16 d][16 x fp16 c]; kQHeadF32: [16 x fp32 d][16 x fp32 c];
//          kQHeadHalves: [16 x fp32 d of k 0-15][16 x fp32 d of k 16-31][16 x fp32 c of k 0-15][16 x c of k 16-31]
//          kQHeadQ6: [16 x fp16 d][16 x int8 sc of k 0-15][16 x int8 sc of k 16-31] (64 bytes, as the fp16 header)
// Groups 0-3 are k 0-15 (the first half), groups 4-7 k 16-31. 4-bit records hold the 8 groups in 4 registers (group g
// in the low nibbles, group g + 4 in the high nibbles): with the fp16 header 320 bytes per 16 x 32 weights
// (0.625 B/weight); 8-bit records 576 bytes (1.125 B/weight); the fp32 headers add 64 or 192 bytes. A tile's records
// are contiguous, so each thread streams one range of memory. One int32 lane per output row: no horizontal sums (AVX2
// reads each 64-byte group as two 32-byte halves: rows 0-7 and rows 8-15).
//
// A format code names bits and header: bits + 16 * header (4, 8: the fp16 header; 20, 24: fp32; 36, 40: halves;
// 56: Q6_K's, 8-bit only).
#pragma once

#include <cstdint>

namespace sgl_cpu {

constexpr int kQBlock = 32;        // weights (and activations) per scale
constexpr int kQTileRows = 16;     // output rows per tile (one fp32 / int32 lane each)
constexpr int64_t kQ4RecordBytes = 64 + 4 * 64;
constexpr int64_t kQ8RecordBytes = 64 + 8 * 64;
constexpr int kQHeadF16 = 0, kQHeadF32 = 1, kQHeadHalves = 2, kQHeadQ6 = 3;
constexpr float kQ6Offset = 32.0f;  // Q6_K's levels are q - 32
constexpr int kQHalf = 16;  // k values per half block (kQHeadHalves' scale)

constexpr int quant_format_bits(int format) { return format & 15; }
constexpr int quant_format_head(int format) { return format >> 4; }
constexpr bool quant_format_valid(int format) {
  return (quant_format_bits(format) == 4 || quant_format_bits(format) == 8) &&
         (quant_format_head(format) <= kQHeadHalves || (quant_format_head(format) == kQHeadQ6 && quant_format_bits(format) == 8));
}
constexpr bool quant_format_halves(int format) { return quant_format_head(format) >= kQHeadHalves; }
constexpr int64_t quant_header_bytes(int head) {
  return head == kQHeadF32 ? 128 : head == kQHeadHalves ? 256 : 64;
}
// bytes of one packed record of a format code (4 and 8: the fp16 header, kQ4RecordBytes / kQ8RecordBytes)
constexpr int64_t quant_record_bytes(int format) {
  return quant_header_bytes(quant_format_head(format)) + quant_format_bits(format) * 64;
}
// bytes of one quantized activation row: the int8 values, then for 8-bit weights their residual pass (not with
// one_pass: the lm_head's calls without AMX, quant_head_one_pass in quant_linear.h)
inline int64_t quant_act_row_bytes(int bits, int64_t nb, bool one_pass = false) {
  return (bits == 8 && !one_pass ? 2 : 1) * nb * kQBlock;
}

// Activation quantization (quantize_row_q8 at each level; both levels give the same bytes and scales): one row of
// K values (float or bf16) -> int8 per block of 32 (K padded with zeros to nb * 32), round to nearest even with scale
// da[b] = max|x| / 127, and sa[b] = da[b] * the sum of the block's int8 values.
// With q2 (not null) the rounding residual is quantized again, to int8 of scale da / kResidualScale, into q2 (and its
// sum added to sa): the two int8 passes carry about 15 bits of each activation (used with 8-bit weights, where one
// pass's error would dominate the weights'). With sh (not null) the block's two halves' sums are written as well:
// sh[2b] and sh[2b + 1] = da * the sum over k 0-15 and 16-31 (with the residual's, as sa), for kQHeadHalves.
constexpr float kResidualScale = 254.0f;

}  // namespace sgl_cpu
