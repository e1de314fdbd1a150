// quant_embedding: the embedding lookup of a packed vocabulary table (layers/quantization/vocab_method.py: a GGUF
// table tied to the lm_head, kept only in quant_layout.h's packed records). out[i, :] is row ids[i] dequantized, each
// value d * u + c in fp32, then cast to the output dtype (bf16: round to nearest even, as torch casts; or fp32).
//
// Why a kernel: the torch form (vocab_method.dequantize_rows) gathers the rows' bytes and runs ~10 small operators a
// pass of a few dozen tokens; a 32-token decode step cost 0.25-1 ms of them and a 4,800-token prefill ~32 ms.
// Exactness: u <= 255 (8 bits) times an fp16 d (11 significant bits) is exact in fp32, so the one rounding is the
// add's, whether or not the compiler fuses the multiply into it: the value equals torch's u.float() * d + c bit for
// bit, on every ISA level. The loops are plain C++: a row's bytes are 4 of every 64 of its tile's records, so reading
// them, not the arithmetic, sets the time (Gemma 3's 640-wide rows, 4,800 ids: 4-bit tables 1.4-2.3x faster).
// Formats: what a vocabulary table is packed as, 4 or 8 bits with the fp16 header (format codes 4: Q4_0 / Q4_1;
// 8: Q5_0 / Q5_1 / Q8_0). Row r of a tile keeps, in each record, d at byte 2r, c at 32 + 2r and its u in lane r of
// each 64-byte group (bytes 64 + 64g + 4r .. +3: 8-bit k = 4g + j; 4-bit k = 4g + j in the low nibble, k + 16 high).
#pragma once
#include <torch/extension.h>

#include "parallel.h"

#include <algorithm>
#include <cstring>

#include "quant_layout.h"

namespace {

constexpr int64_t kEmbedGrainValues = 32768;  // output values per thread chunk: fewer run on the calling thread
constexpr int64_t kQGroupBytes = 4 * sgl_cpu::kQTileRows;  // one group: 4 bytes of each of a record's 16 rows

inline float fp16_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, sizeof(bits));
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

// Row r (0-15) of the tile whose records start at `tile` (nb records of rec_bytes) -> out[0, cols).
template <typename T>
void dequantize_packed_row(const uint8_t* tile, int64_t nb, int64_t rec_bytes, int bits, int r, int64_t cols,
                           T* out) {
  const int64_t head = sgl_cpu::quant_header_bytes(sgl_cpu::kQHeadF16);
  float w[sgl_cpu::kQBlock];
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* rec = tile + b * rec_bytes;
    const float d = fp16_at(rec + 2 * r), c = fp16_at(rec + 2 * sgl_cpu::kQTileRows + 2 * r);
    const uint8_t* u = rec + head + 4 * r;
    if (bits == 8) {
      for (int g = 0; g < 8; ++g)
        for (int j = 0; j < 4; ++j) w[4 * g + j] = static_cast<float>(u[g * kQGroupBytes + j]) * d + c;
    } else {
      for (int g = 0; g < 4; ++g)
        for (int j = 0; j < 4; ++j) {
          const uint8_t byte = u[g * kQGroupBytes + j];
          w[4 * g + j] = static_cast<float>(byte & 15) * d + c;
          w[sgl_cpu::kQHalf + 4 * g + j] = static_cast<float>(byte >> 4) * d + c;
        }
    }
    const int64_t k0 = b * sgl_cpu::kQBlock, n = std::min<int64_t>(sgl_cpu::kQBlock, cols - k0);
    for (int64_t k = 0; k < n; ++k) out[k0 + k] = static_cast<T>(w[k]);  // c10::BFloat16(float): nearest even
  }
}

// ids int64 / int32 [N] of a packed [rows, cols] table (uint8 [tiles, nb, record bytes], format 4 or 8) -> [N, cols]
// bf16, or fp32 with out_fp32.
at::Tensor quant_embedding(const at::Tensor& ids, const at::Tensor& packed, int64_t rows, int64_t cols,
                           int64_t format, bool out_fp32) {
  TORCH_CHECK(format == 4 || format == 8, "quant_embedding: a vocabulary table is packed 4- or 8-bit with the fp16 "
              "header (format 4: Q4_0 / Q4_1; 8: Q5_0 / Q5_1 / Q8_0), got format ", format,
              " (K-quant and Q6_K tables stay dense)");
  TORCH_CHECK(ids.device().is_cpu() && ids.dim() == 1 && (ids.scalar_type() == at::kLong ||
              ids.scalar_type() == at::kInt), "quant_embedding: ids must be a 1-D int64 or int32 CPU tensor");
  const int64_t rec_bytes = sgl_cpu::quant_record_bytes((int)format);
  TORCH_CHECK(packed.device().is_cpu() && packed.scalar_type() == at::kByte && packed.dim() == 3 &&
              packed.is_contiguous() && packed.size(2) == rec_bytes,
              "quant_embedding: packed must be a contiguous uint8 CPU tensor [tiles, blocks, ", rec_bytes, "]");
  const int64_t nb = packed.size(1);
  TORCH_CHECK(packed.size(0) == (rows + sgl_cpu::kQTileRows - 1) / sgl_cpu::kQTileRows, "quant_embedding: ",
              packed.size(0), " tiles for ", rows, " rows");
  TORCH_CHECK(cols <= nb * sgl_cpu::kQBlock && cols > (nb - 1) * sgl_cpu::kQBlock, "quant_embedding: ", cols,
              " columns do not match ", nb, " blocks");
  const at::Tensor idx = ids.to(at::kLong).contiguous();
  const int64_t* ip = idx.data_ptr<int64_t>();
  const int64_t n = idx.size(0);
  for (int64_t i = 0; i < n; ++i)  // all checked before any thread reads a record
    TORCH_CHECK(ip[i] >= 0 && ip[i] < rows, "quant_embedding: id ", ip[i], " (at ", i, ") out of range [0, ", rows,
                ")");
  at::Tensor out = at::empty({n, cols}, packed.options().dtype(out_fp32 ? at::kFloat : at::kBFloat16));
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  const int64_t tile_bytes = nb * rec_bytes;
  const int bits = (int)format;
  auto run = [&](auto* op) {
    sgl_cpu::parallel_for(0, n, std::max<int64_t>(1, kEmbedGrainValues / cols), [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i)
        dequantize_packed_row(wp + ip[i] / sgl_cpu::kQTileRows * tile_bytes, nb, rec_bytes, bits,
                              (int)(ip[i] % sgl_cpu::kQTileRows), cols, op + i * cols);
    });
  };
  if (out_fp32)
    run(out.data_ptr<float>());
  else
    run(out.data_ptr<at::BFloat16>());
  return out;
}

}  // namespace
