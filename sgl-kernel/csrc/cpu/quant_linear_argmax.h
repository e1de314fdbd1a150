// quant_linear_argmax: a quantized lm_head's greedy token without its logits. x [M, K] @ W^T is computed a slice of
// the vocabulary at a time into a small per-thread fp32 buffer (the int8 paths' kernels, the same fp32 sums
// quant_linear(..., out_fp32) gives), each slice's first maximum per row is kept, and the slices' results are merged in
// vocabulary order: int64 [M], each row's argmax_rows (logits.h) of those logits -- the first maximum, a NaN counting
// as the maximum and the first NaN winning.
//
// Why: at a decode batch of 32 on a 262k vocabulary the logits are 33 MB of fp32 written, then read again by the
// greedy argmax; that traffic cost as much as the lm_head's own products on a 2-core machine (~10 of ~30 ms).
// A batch the dense path takes (bf16 activations, from kQDenseMinRows rows) has its slices computed by that path
// (quant_gemm_amx_dense.h, quant_gemm_vec_dense.h) into the same buffer, and an 8-bit table without AMX takes the
// one-pass VNNI kernel at every row count (quant_head_one_pass): each output's fp32 sum is the same whichever range of
// tiles a call covers, so here too the token is argmax_rows of quant_linear(..., out_fp32, head)'s logits, bit for
// bit.
#pragma once

#include <vector>

#include "logits.h"  // argmax_row
#include "quant_linear.h"

namespace {

constexpr int64_t kArgmaxSliceTiles = 64;  // output tiles per slice: 1,024 logits per row in the thread's buffer

// argmax_row's rule without AVX-512 (the avx2 and avx512_vnni levels run this GEMM too).
inline int64_t argmax_row_scalar(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t j = 0; j < n; ++j) {
    if (std::isnan(x[j])) return j;
    if (x[j] > x[best]) best = j;
  }
  return best;
}

// A row's best (value, index) so far, replaced by a later slice's only where argmax_rows' rule prefers it.
inline void argmax_merge(float& best, int64_t& best_i, float v, int64_t i) {
  if (std::isnan(best)) return;
  if (std::isnan(v) || v > best) {
    best = v;
    best_i = i;
  }
}

at::Tensor quant_linear_argmax(const at::Tensor& x, const at::Tensor& packed, int64_t N, int64_t format) {
  const sgl_cpu::CpuIsa level = sgl_cpu::current_isa();
  const int64_t nb = quant_check_args("quant_linear_argmax", x, packed, N, format);
  const int64_t tiles = packed.size(0), M = x.size(0), K = x.size(1);
  TORCH_CHECK(M > 0 && N > 0, "quant_linear_argmax: needs rows and a vocabulary, got [", M, ", ", K, "] x ", N);
  at::Tensor xc = x.contiguous();
  const bool one_pass = quant_head_one_pass(level, (int)format);
  const bool dense = !one_pass && quant_uses_dense(level, M, x.scalar_type() == at::kBFloat16, K);
  const at::Tensor xp = dense ? quant_dense_rows(xc, level) : at::Tensor();
  const QuantActs a = dense ? QuantActs{} : quant_activations(xc, level, (int)format, nb, one_pass);
  const sgl_cpu::QDenseDequant dequant = dense ? quant_dense_dequant((int)format) : nullptr;
  const uint16_t* xq = dense ? reinterpret_cast<const uint16_t*>(xp.data_ptr<at::BFloat16>()) : nullptr;
  const int64_t tile_bytes = nb * sgl_cpu::quant_record_bytes((int)format);
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  const int64_t slices = (tiles + kArgmaxSliceTiles - 1) / kArgmaxSliceTiles, ld = kArgmaxSliceTiles * sgl_cpu::kQTileRows;
  std::vector<float> val((size_t)(slices * M));
  std::vector<int64_t> idx((size_t)(slices * M));
  sgl_cpu::parallel_for(0, slices, 1, [&](int64_t s0, int64_t s1) {
    std::vector<float> buf((size_t)(M * ld));
    for (int64_t s = s0; s < s1; ++s) {
      const int64_t t0 = s * kArgmaxSliceTiles, t1 = std::min(tiles, t0 + kArgmaxSliceTiles);
      const int64_t c0 = t0 * sgl_cpu::kQTileRows, cols = std::min(N, t1 * sgl_cpu::kQTileRows) - c0;
      if (dense)
        quant_gemm_dense(level, dequant, wp, tile_bytes, nb, xq, M, buf.data(), N, t0, t1, ld, t0);
      else
        quant_gemm_format((int)format, level, wp, nb, a.qp, a.dap, a.sap, a.shp, M, buf.data(), N, t0, t1, ld, t0,
                          one_pass);
      for (int64_t m = 0; m < M; ++m) {
        const float* row = buf.data() + m * ld;
        const int64_t j = level >= sgl_cpu::CpuIsa::kAvx512Bf16 ? sgl_cpu::argmax_row(row, cols) : argmax_row_scalar(row, cols);
        val[s * M + m] = buf[m * ld + j];
        idx[s * M + m] = c0 + j;
      }
    }
  });
  at::Tensor out = at::empty({M}, x.options().dtype(at::kLong));
  int64_t* o = out.data_ptr<int64_t>();
  for (int64_t m = 0; m < M; ++m) {
    float best = val[m];
    int64_t best_i = idx[m];
    for (int64_t s = 1; s < slices; ++s) argmax_merge(best, best_i, val[s * M + m], idx[s * M + m]);
    o[m] = best_i;
  }
  return out;
}

}  // namespace
