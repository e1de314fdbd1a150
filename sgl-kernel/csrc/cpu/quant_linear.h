// quant_linear: the binding of the quantized GEMM in quant_gemm.h (argument checks, activation quantization,
// threading over 16-row tiles); included by bindings.cpp.
#pragma once
#include <torch/extension.h>

#include "parallel.h"

#include <algorithm>

#include "quant_gemm.h"

namespace {

bool quant_supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16") &&
         __builtin_cpu_supports("avx512vnni");
}

// x [M, K] (bf16 or fp32) @ W^T with W packed (uint8 [tiles, nb, record bytes]) as quant_gemm.h lays out -> [M, N]
at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& packed, int64_t N, int64_t bits) {
  TORCH_CHECK(quant_supported(), "quant_linear: this CPU lacks AVX-512 VNNI/BF16");
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2, "quant_linear: x must be a 2-D CPU tensor");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat, "quant_linear: x must be bf16 or fp32");
  TORCH_CHECK(bits == 4 || bits == 8, "quant_linear: bits must be 4 or 8");
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.dim() == 3 && packed.is_contiguous() &&
                  packed.size(2) == sgl_cpu::quant_record_bytes((int)bits), "quant_linear: packed must be uint8 [tiles, blocks, ",
              sgl_cpu::quant_record_bytes((int)bits), "]");
  const int64_t tiles = packed.size(0), nb = packed.size(1);
  TORCH_CHECK(tiles == (N + sgl_cpu::kQTileRows - 1) / sgl_cpu::kQTileRows, "quant_linear: ", tiles, " tiles for N = ", N);
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(K <= nb * sgl_cpu::kQBlock && K > (nb - 1) * sgl_cpu::kQBlock, "quant_linear: K = ", K, " does not match ",
              nb, " blocks");
  at::Tensor xc = x.contiguous();
  const int64_t lda = sgl_cpu::quant_act_row_bytes((int)bits, nb);
  at::Tensor qa = at::empty({M, lda}, x.options().dtype(at::kChar));
  at::Tensor ds = at::empty({2, M, nb}, x.options().dtype(at::kFloat));
  int8_t* qp = qa.data_ptr<int8_t>();
  float* dap = ds.data_ptr<float>();
  float* sap = dap + M * nb;
  const bool is_bf16 = x.scalar_type() == at::kBFloat16;
  // one row of activations: int8 per 32 values (and for 8-bit weights the residual pass), its scales and sums
  sgl_cpu::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      if (is_bf16)
        sgl_cpu::quantize_row_q8(reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>()) + m * K, K, nb,
                                 qp + m * lda, dap + m * nb, sap + m * nb, bits == 8 ? qp + m * lda + nb * 32 : nullptr);
      else
        sgl_cpu::quantize_row_q8(xc.data_ptr<float>() + m * K, K, nb, qp + m * lda, dap + m * nb, sap + m * nb,
                                 bits == 8 ? qp + m * lda + nb * 32 : nullptr);
    }
  });
  at::Tensor y = at::empty({M, N}, x.options());
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  sgl_cpu::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    if (is_bf16) {
      uint16_t* yp = reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>());
      if (bits == 4) sgl_cpu::quant_gemm<4>(wp, nb, qp, dap, sap, M, yp, N, t0, t1);
      else sgl_cpu::quant_gemm<8>(wp, nb, qp, dap, sap, M, yp, N, t0, t1);
    } else {
      float* yp = y.data_ptr<float>();
      if (bits == 4) sgl_cpu::quant_gemm<4>(wp, nb, qp, dap, sap, M, yp, N, t0, t1);
      else sgl_cpu::quant_gemm<8>(wp, nb, qp, dap, sap, M, yp, N, t0, t1);
    }
  });
  return y;
}

}  // namespace
