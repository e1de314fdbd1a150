// quant_linear: the binding of the quantized GEMM (argument checks, activation quantization, threading over 16-row
// tiles), dispatched on the current ISA level (isa.h): avx512_vnni and above run quant_gemm.h (bf16 outputs rounded by
// VCVTNEPS2BF16 from avx512_bf16 on, in software below), avx2 runs quant_gemm_avx2.h; at amx, quant_gemm_amx.h from 8
// rows; bf16 activations from kQDenseMinRows rows take the dense path: quant_gemm_amx_dense.h at amx,
// quant_gemm_vec_dense.h at avx512_bf16; included by bindings.cpp.
#pragma once
#include <torch/extension.h>

#include "parallel.h"

#include <algorithm>
#include <atomic>

#include "isa.h"
#include "quant_gemm.h"
#include "quant_gemm_avx2.h"
#include "quant_gemm_amx.h"
#include "quant_gemm_amx_dense.h"
#include "quant_gemm_vec_dense.h"

namespace {

// True when the current level has a quant_linear kernel (avx2 and above).
bool quant_supported() { return sgl_cpu::isa_at_least(sgl_cpu::CpuIsa::kAvx2); }

// One row of activations at `level` into its quant_act_row_bytes(bits, nb, one_pass) bytes at q: int8 per 32 values
// and for 8-bit weights the residual pass (AVX-512: a second int8 row; AVX2: both passes as one int16 row) unless
// one_pass (AVX-512 only), scales, sums, and the half-block sums sh where not null.
template <typename T>
void quantize_row_at(sgl_cpu::CpuIsa level, const T* x, int64_t K, int64_t nb, int8_t* q, float* da, float* sa,
                     float* sh, int bits, bool one_pass) {
  if (level >= sgl_cpu::CpuIsa::kAvx512Vnni)
    sgl_cpu::quantize_row_q8(x, K, nb, q, da, sa, bits == 8 && !one_pass ? q + nb * sgl_cpu::kQBlock : nullptr, sh);
  else
    sgl_cpu::quantize_row_q8_avx2(x, K, nb, q, da, sa, bits == 8, sh);
}

// True when quant_linear takes the AMX-INT8 tiles (quant_gemm_amx.h) for M input rows at `level`.
inline bool quant_uses_amx(sgl_cpu::CpuIsa level, int64_t M) {
  return level >= sgl_cpu::CpuIsa::kAmx && M >= sgl_cpu::kQAmxMinRows;
}

// True when a quantized lm_head's calls (quant_linear with head, quant_linear_argmax) take the VNNI kernel with one
// int8 pass of activations (quant_gemm.h's ONE_PASS) at every row count: an 8-bit table (the Q8_0 token_embd / output
// of a GGUF file) at the AVX-512 levels without AMX. Its block products are llama.cpp's Q8_0 x Q8_0 ones: half the
// byte dot products of the two passes, and no per-call dequantization as on the dense path; on the Gemma 3 270M's
// 262,144 x 640 table at 32 rows the fused argmax takes ~19 ms against the dense path's ~28 on one AMD EPYC core
// (bench_lm_head_decode.py). A row's logits are then the same at every batch size. At level amx the head keeps the
// layers' paths (AMX int8 tiles, the dense path from 32 rows).
inline bool quant_head_one_pass(sgl_cpu::CpuIsa level, int format) {
  return sgl_cpu::quant_format_bits(format) == 8 && level >= sgl_cpu::CpuIsa::kAvx512Vnni &&
         level < sgl_cpu::CpuIsa::kAmx;
}

// The fewest rows the dense path takes in this process: kQDenseMinRows, or kQDenseMinRowsPrefill while the model
// runner runs a forward that is not a decode batch (set_quant_dense_prefill).
inline std::atomic<int64_t> g_quant_dense_min_rows{sgl_cpu::kQDenseMinRows};

// True when quant_linear takes the dequantized bf16 weights (the dense path: quant_gemm_amx_dense.h at level amx,
// quant_gemm_vec_dense.h at avx512_bf16): bf16 activations whose K is whole blocks, M >= the current minimum
// (g_quant_dense_min_rows).
inline bool quant_uses_dense(sgl_cpu::CpuIsa level, int64_t M, bool bf16, int64_t K) {
  return level >= sgl_cpu::CpuIsa::kAvx512Bf16 && bf16 &&
         M >= g_quant_dense_min_rows.load(std::memory_order_relaxed) && K % sgl_cpu::kQBlock == 0;
}

// The dense path at `level` for output tiles [t0, t1) (the arguments of quant_gemm_amx_dense; x padded by
// quant_dense_rows).
template <typename T, sgl_cpu::QDenseAct ACT = sgl_cpu::QDenseAct::kNone>
void quant_gemm_dense(sgl_cpu::CpuIsa level, sgl_cpu::QDenseDequant dequant, const uint8_t* wp, int64_t tile_bytes,
                      int64_t nb, const uint16_t* x, int64_t M, T* y, int64_t N, int64_t t0, int64_t t1,
                      int64_t ldy = 0, int64_t ty = 0) {
  if (level >= sgl_cpu::CpuIsa::kAmx)
    sgl_cpu::quant_gemm_amx_dense<T, ACT>(dequant, wp, tile_bytes, nb, x, M, y, N, t0, t1, ldy, ty);
  else
    sgl_cpu::quant_gemm_vec_dense<T, ACT>(dequant, wp, tile_bytes, nb, x, M, y, N, t0, t1, ldy, ty);
}

// The dense path's activations: the AMX A tiles read 16 rows at a time, so at level amx a copy padded with zero rows
// when M is not a multiple of 16 (VDPBF16PS reads the rows there are).
inline at::Tensor quant_dense_rows(const at::Tensor& xc, sgl_cpu::CpuIsa level) {
  const int64_t M = xc.size(0), Mp = (M + 15) / 16 * 16;
  if (Mp == M || level < sgl_cpu::CpuIsa::kAmx) return xc;
  at::Tensor xp = at::zeros({Mp, xc.size(1)}, xc.options());
  xp.narrow(0, 0, M).copy_(xc);
  return xp;
}

// The dense path's dequantization of one record (16 rows x 32 k) for a format code.
inline sgl_cpu::QDenseDequant quant_dense_dequant(int format) {
  switch (format) {
    case 4: return &sgl_cpu::quant_dequant_record<4>;
    case 8: return &sgl_cpu::quant_dequant_record<8>;
    case 20: return &sgl_cpu::quant_dequant_record<20>;
    case 24: return &sgl_cpu::quant_dequant_record<24>;
    case 36: return &sgl_cpu::quant_dequant_record<36>;
    case 40: return &sgl_cpu::quant_dequant_record<40>;
    case 56: return &sgl_cpu::quant_dequant_record<56>;
    default: TORCH_CHECK(false, "quant_linear: unknown format ", format);
  }
  return nullptr;
}

// Tiles [t0, t1) of y at `level` (M rows; with AMX the activations are padded to a multiple of 16 rows); y rows ldy
// apart, tile t's columns at (t - ty) * 16 (quant_gemm.h). one_pass (activations quantized so): the VNNI kernel's
// ONE_PASS, where quant_head_one_pass holds.
template <int FMT, typename T>
void quant_gemm_at(sgl_cpu::CpuIsa level, const uint8_t* wp, int64_t nb, const int8_t* qp, const float* dap,
                   const float* sap, const float* shp, int64_t M, T* yp, int64_t N, int64_t t0, int64_t t1,
                   int64_t ldy, int64_t ty, bool one_pass) {
  if (one_pass) {
    TORCH_CHECK(quant_head_one_pass(level, FMT), "quant_linear: no one-pass kernel for format ", FMT, " at level ",
                sgl_cpu::cpu_isa_name(level));
    if (level >= sgl_cpu::CpuIsa::kAvx512Bf16)
      sgl_cpu::quant_gemm<FMT, T, true, true>(wp, nb, qp, dap, sap, shp, M, yp, N, t0, t1, ldy, ty);
    else
      sgl_cpu::quant_gemm<FMT, T, false, true>(wp, nb, qp, dap, sap, shp, M, yp, N, t0, t1, ldy, ty);
  } else if (quant_uses_amx(level, M))
    sgl_cpu::quant_gemm_amx<FMT, T>(wp, nb, qp, dap, sap, shp, M, yp, N, t0, t1, ldy, ty);
  else if (level >= sgl_cpu::CpuIsa::kAvx512Bf16)
    sgl_cpu::quant_gemm<FMT, T, true>(wp, nb, qp, dap, sap, shp, M, yp, N, t0, t1, ldy, ty);
  else if (level == sgl_cpu::CpuIsa::kAvx512Vnni)
    sgl_cpu::quant_gemm<FMT, T, false>(wp, nb, qp, dap, sap, shp, M, yp, N, t0, t1, ldy, ty);
  else
    sgl_cpu::quant_gemm_avx2<FMT, T>(wp, nb, qp, dap, sap, shp, M, yp, N, t0, t1, ldy, ty);
}

// The format code as a template argument (quant_layout.h's seven).
template <typename T>
void quant_gemm_format(int format, sgl_cpu::CpuIsa level, const uint8_t* wp, int64_t nb, const int8_t* qp,
                       const float* dap, const float* sap, const float* shp, int64_t M, T* yp, int64_t N, int64_t t0,
                       int64_t t1, int64_t ldy = 0, int64_t ty = 0, bool one_pass = false) {
  switch (format) {
    case 4: quant_gemm_at<4>(level, wp, nb, qp, dap, sap, shp, M, yp, N, t0, t1, ldy, ty, one_pass); break;
    case 8: quant_gemm_at<8>(level, wp, nb, qp, dap, sap, shp, M, yp, N, t0, t1, ldy, ty, one_pass); break;
    case 20: quant_gemm_at<20>(level, wp, nb, qp, dap, sap, shp, M, yp, N, t0, t1, ldy, ty, one_pass); break;
    case 24: quant_gemm_at<24>(level, wp, nb, qp, dap, sap, shp, M, yp, N, t0, t1, ldy, ty, one_pass); break;
    case 36: quant_gemm_at<36>(level, wp, nb, qp, dap, sap, shp, M, yp, N, t0, t1, ldy, ty, one_pass); break;
    case 40: quant_gemm_at<40>(level, wp, nb, qp, dap, sap, shp, M, yp, N, t0, t1, ldy, ty, one_pass); break;
    case 56: quant_gemm_at<56>(level, wp, nb, qp, dap, sap, shp, M, yp, N, t0, t1, ldy, ty, one_pass); break;
    default: TORCH_CHECK(false, "quant_linear: unknown format ", format);
  }
}

// The activations of the int8 paths, quantized once per call (quant_layout.h): int8 per 32 values (for 8-bit weights
// with the residual pass unless one_pass), the scales da, sums sa and for the halves formats the half-block sums sh;
// with AMX the rows are padded with zeros to a multiple of 16 (their outputs are never stored).
struct QuantActs {
  at::Tensor qa, ds;  // the storage
  int8_t* qp;
  float *dap, *sap, *shp;
};

inline QuantActs quant_activations(const at::Tensor& xc, sgl_cpu::CpuIsa level, int format, int64_t nb,
                                   bool one_pass = false) {
  const int bits = sgl_cpu::quant_format_bits(format);
  const int64_t M = xc.size(0), K = xc.size(1);
  const int64_t lda = sgl_cpu::quant_act_row_bytes(bits, nb, one_pass);
  const bool halves = sgl_cpu::quant_format_halves(format);
  const int64_t Mp = quant_uses_amx(level, M) ? (M + sgl_cpu::kQAmxRows - 1) / sgl_cpu::kQAmxRows * sgl_cpu::kQAmxRows
                                              : M;
  QuantActs a;
  a.qa = at::empty({Mp, lda}, xc.options().dtype(at::kChar));
  if (Mp > M) a.qa.narrow(0, M, Mp - M).zero_();
  a.ds = Mp > M ? at::zeros({halves ? 4 : 2, Mp, nb}, xc.options().dtype(at::kFloat))
                : at::empty({halves ? 4 : 2, M, nb}, xc.options().dtype(at::kFloat));  // da, sa (, sh [Mp, nb, 2])
  a.qp = a.qa.data_ptr<int8_t>();
  a.dap = a.ds.data_ptr<float>();
  a.sap = a.dap + Mp * nb;
  a.shp = halves ? a.sap + Mp * nb : nullptr;
  const bool is_bf16 = xc.scalar_type() == at::kBFloat16;
  int8_t* qp = a.qp;
  float *dap = a.dap, *sap = a.sap, *shp = a.shp;
  sgl_cpu::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      float* sh = halves ? shp + 2 * m * nb : nullptr;
      if (is_bf16)
        quantize_row_at(level, reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>()) + m * K, K, nb,
                        qp + m * lda, dap + m * nb, sap + m * nb, sh, bits, one_pass);
      else
        quantize_row_at(level, xc.data_ptr<float>() + m * K, K, nb, qp + m * lda, dap + m * nb, sap + m * nb, sh, bits,
                        one_pass);
    }
  });
  return a;
}

// quant_linear's argument checks (fn: the caller's name in the messages); returns the packed weight's blocks per row.
inline int64_t quant_check_args(const char* fn, const at::Tensor& x, const at::Tensor& packed, int64_t N,
                                int64_t format) {
  const sgl_cpu::CpuIsa level = sgl_cpu::current_isa();
  TORCH_CHECK(level >= sgl_cpu::CpuIsa::kAvx2, fn, ": no kernel at the ISA level '", sgl_cpu::cpu_isa_name(level),
              "' (needs avx2 or above; this CPU's native level is '", sgl_cpu::cpu_isa_name(sgl_cpu::native_isa()), "')");
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2, fn, ": x must be a 2-D CPU tensor");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat, fn, ": x must be bf16 or fp32");
  TORCH_CHECK(format >= 0 && format < 64 && sgl_cpu::quant_format_valid((int)format),
              fn, ": format must be bits (4 or 8) + 16 * header (0: fp16, 1: fp32, 2: fp32 halves; 3: Q6_K's, "
              "8 bits only), got ", format);
  const int64_t rec_bytes = sgl_cpu::quant_record_bytes((int)format);
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.dim() == 3 && packed.is_contiguous() &&
                  packed.size(2) == rec_bytes, fn, ": packed must be uint8 [tiles, blocks, ", rec_bytes, "]");
  const int64_t tiles = packed.size(0), nb = packed.size(1);
  TORCH_CHECK(tiles == (N + sgl_cpu::kQTileRows - 1) / sgl_cpu::kQTileRows, fn, ": ", tiles, " tiles for N = ", N);
  const int64_t K = x.size(1);
  TORCH_CHECK(K <= nb * sgl_cpu::kQBlock && K > (nb - 1) * sgl_cpu::kQBlock, fn, ": K = ", K, " does not match ",
              nb, " blocks");
  return nb;
}

// x [M, K] (bf16 or fp32) @ W^T with W packed (uint8 [tiles, nb, record bytes]) as quant_layout.h lays out -> [M, N]
// in x's dtype, or fp32 with out_fp32 (a bf16 lm_head's logits: the kernels' fp32 sums as they are, neither rounded to
// bf16 nor widened again by a second pass; the dense path's C tiles as they are).
// format: quant_layout.h's code, bits + 16 * header (4 and 8: the fp16 header). head: W is a quantized lm_head's
// table, whose paths follow quant_head_one_pass (quant_linear_argmax's, so its tokens are these logits' argmax).
at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& packed, int64_t N, int64_t format, bool out_fp32,
                        bool head) {
  const sgl_cpu::CpuIsa level = sgl_cpu::current_isa();
  const int64_t nb = quant_check_args("quant_linear", x, packed, N, format);
  const int64_t rec_bytes = sgl_cpu::quant_record_bytes((int)format);
  const int64_t tiles = packed.size(0), M = x.size(0), K = x.size(1);
  at::Tensor xc = x.contiguous();
  const bool one_pass = head && quant_head_one_pass(level, (int)format);
  if (!one_pass && quant_uses_dense(level, M, x.scalar_type() == at::kBFloat16, K)) {
    const at::Tensor xp = quant_dense_rows(xc, level);
    at::Tensor y = at::empty({M, N}, x.options().dtype(out_fp32 ? at::kFloat : at::kBFloat16));
    const uint8_t* wp = packed.data_ptr<uint8_t>();
    const uint16_t* xq = reinterpret_cast<const uint16_t*>(xp.data_ptr<at::BFloat16>());
    const sgl_cpu::QDenseDequant dequant = quant_dense_dequant((int)format);
    sgl_cpu::parallel_for(0, (tiles + 1) / 2, 1, [&](int64_t p0, int64_t p1) {
      const int64_t u0 = 2 * p0, u1 = std::min(2 * p1, tiles);
      if (out_fp32)
        quant_gemm_dense(level, dequant, wp, nb * rec_bytes, nb, xq, M, y.data_ptr<float>(), N, u0, u1);
      else
        quant_gemm_dense(level, dequant, wp, nb * rec_bytes, nb, xq, M,
                         reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>()), N, u0, u1);
    });
    return y;
  }
  const QuantActs a = quant_activations(xc, level, (int)format, nb, one_pass);
  const bool is_bf16 = x.scalar_type() == at::kBFloat16;
  const bool y_bf16 = is_bf16 && !out_fp32;
  at::Tensor y = at::empty({M, N}, x.options().dtype(y_bf16 ? at::kBFloat16 : at::kFloat));
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  sgl_cpu::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    if (y_bf16)
      quant_gemm_format((int)format, level, wp, nb, a.qp, a.dap, a.sap, a.shp, M,
                        reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>()), N, t0, t1, 0, 0, one_pass);
    else
      quant_gemm_format((int)format, level, wp, nb, a.qp, a.dap, a.sap, a.shp, M, y.data_ptr<float>(), N, t0, t1, 0, 0,
                        one_pass);
  });
  return y;
}

}  // namespace
