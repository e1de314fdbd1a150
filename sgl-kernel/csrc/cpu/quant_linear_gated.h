// quant_linear_gated: a merged [gate | up] quantized projection and the gated MLP's activation in one call,
// act(x @ W_gate^T) * (x @ W_up^T), with act silu or gelu (tanh). Its bits are those of quant_linear (bf16 out)
// followed by silu_and_mul / gelu_tanh_and_mul: where quant_linear takes the dense path and each half of W is whole
// 16-row tiles, the activation runs on each gate tile and up tile's sums in the GEMM's epilogue (quant_gemm_amx_dense.h
// and quant_gemm_vec_dense.h, gated walk); otherwise the two calls' code runs in sequence here.
// Why: the [M, 2I] product is not written and read back, the activation's vector work runs beside the tile products
// of the next output tile, and a decode step makes one call a layer where it made two. On the Gemma 3 270M's gate_up
// (640 -> 2 x 2,048, `bench_quant_prefill.py --gated`, one thread): 2,048 rows 14.0 -> 10.8 ms, 32 rows 0.43 -> 0.36
// ms; two threads: 7.6 -> 5.5 ms and 0.37 -> 0.33 ms.
// register_quant_linear_ops: the Python definitions of the quantized GEMM family (bindings.cpp).
#pragma once

#include <string>

#include "activation.h"
#include "quant_linear.h"
#include "quant_linear_argmax.h"

namespace {

// act: "silu" or "gelu_tanh" -> the dense path's epilogue, with the row function of the unfused path.
inline sgl_cpu::QDenseAct quant_gated_act(const std::string& act) {
  if (act == "silu") return sgl_cpu::QDenseAct::kSilu;
  TORCH_CHECK(act == "gelu_tanh", "quant_linear_gated: act must be 'silu' or 'gelu_tanh', got '", act, "'");
  return sgl_cpu::QDenseAct::kGeluTanh;
}

// x [M, K] bf16, packed: a [gate | up] weight of N rows (N even) -> [M, N / 2] bf16.
at::Tensor quant_linear_gated(const at::Tensor& x, const at::Tensor& packed, int64_t N, int64_t format,
                              const std::string& act) {
  const sgl_cpu::QDenseAct kind = quant_gated_act(act);
  TORCH_CHECK(sgl_cpu::isa_at_least(sgl_cpu::CpuIsa::kAvx512Bf16), "quant_linear_gated: needs CPU level avx512_bf16 "
              "(the activation's kernels), this module runs at ", sgl_cpu::cpu_isa_name(sgl_cpu::current_isa()));
  TORCH_CHECK(x.scalar_type() == at::kBFloat16, "quant_linear_gated: x must be bf16");
  TORCH_CHECK(N % 2 == 0, "quant_linear_gated: N = ", N, " rows cannot be a [gate | up] pair");
  const int64_t nb = quant_check_args("quant_linear_gated", x, packed, N, format);
  const int64_t M = x.size(0), K = x.size(1), inter = N / 2, tiles = packed.size(0);
  at::Tensor xc = x.contiguous();
  const sgl_cpu::CpuIsa level = sgl_cpu::current_isa();
  if (!quant_uses_dense(level, M, true, K) || inter % sgl_cpu::kQTileRows != 0) {
    const at::Tensor y = quant_linear(xc, packed, N, format, false, false);  // [M, N]: then the activation by rows
    at::Tensor out = at::empty({M, inter}, x.options());
    const uint16_t* yp = reinterpret_cast<const uint16_t*>(y.data_ptr<at::BFloat16>());
    uint16_t* op = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
    if (kind == sgl_cpu::QDenseAct::kSilu) sgl_cpu::act_and_mul_rows<false>(yp, op, M, inter);
    else sgl_cpu::act_and_mul_rows<true>(yp, op, M, inter);
    return out;
  }
  const at::Tensor xp = quant_dense_rows(xc, level);
  at::Tensor out = at::empty({M, inter}, x.options());
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  const uint16_t* xq = reinterpret_cast<const uint16_t*>(xp.data_ptr<at::BFloat16>());
  uint16_t* op = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  const sgl_cpu::QDenseDequant dequant = quant_dense_dequant((int)format);
  const int64_t tile_bytes = nb * sgl_cpu::quant_record_bytes((int)format);
  sgl_cpu::parallel_for(0, tiles / 2, 1, [&](int64_t g0, int64_t g1) {  // gate tiles, each beside its up tile
    if (kind == sgl_cpu::QDenseAct::kSilu)
      quant_gemm_dense<uint16_t, sgl_cpu::QDenseAct::kSilu>(level, dequant, wp, tile_bytes, nb, xq, M, op, N, g0, g1);
    else
      quant_gemm_dense<uint16_t, sgl_cpu::QDenseAct::kGeluTanh>(level, dequant, wp, tile_bytes, nb, xq, M, op, N, g0,
                                                               g1);
  });
  return out;
}

inline void register_quant_linear_ops(py::module_& m) {
  m.def("quant_supported", &quant_supported, "True when quant_linear has a kernel at the current ISA level (>= avx2)");
  m.def("quant_path", [](int64_t M, bool head) {
          const sgl_cpu::CpuIsa level = sgl_cpu::current_isa();
          if (head && quant_head_one_pass(level, 8)) return std::string("avx512_vnni_one_pass");
          const bool dense = quant_uses_dense(level, M, true, sgl_cpu::kQBlock);
          return std::string(dense && level >= sgl_cpu::CpuIsa::kAmx ? "amx_bf16_dense"
                             : dense ? "avx512_bf16_dense"
                             : quant_uses_amx(level, M) ? "amx_int8"
                             : sgl_cpu::isa_at_least(sgl_cpu::CpuIsa::kAvx512Vnni) ? "avx512_vnni" : "avx2"); },
        "The kernel quant_linear runs for M input rows of bf16 activations (K whole blocks) at the current level: "
        "amx_bf16_dense (quant_gemm_amx_dense.h), avx512_bf16_dense (quant_gemm_vec_dense.h), amx_int8 "
        "(quant_gemm_amx.h), avx512_vnni or avx2; with head, for an 8-bit lm_head table (quant_linear's head, "
        "quant_linear_argmax): avx512_vnni_one_pass where quant_head_one_pass holds, else the same",
        py::arg("M"), py::arg("head") = false);
  m.def("set_quant_dense_prefill", [](bool prefill) {
          const int64_t before = g_quant_dense_min_rows.exchange(prefill ? sgl_cpu::kQDenseMinRowsPrefill
                                                                         : sgl_cpu::kQDenseMinRows);
          return before == sgl_cpu::kQDenseMinRowsPrefill; },
        "The dense path's row minimum for this process: 256 rows with prefill=True (the model runner's forwards "
        "other than decode batches), else 32 (the default); returns whether it was the prefill one",
        py::arg("prefill"));
  m.def("quant_linear", &quant_linear,
        "x [M, K] (bf16/fp32) @ W^T, W block-quantized and packed (quant_gemm.h) in a format code (quant_layout.h: "
        "bits + 16 * header); activations int8 per 32 values (from level avx512_bf16, from 32 bf16 rows, 256 under "
        "set_quant_dense_prefill: as they are, times the weights rounded to bf16); the result in x's dtype, or fp32 "
        "with out_fp32; head: an lm_head's table (8-bit without AMX: one int8 pass of activations at every row count)",
        py::arg("x"), py::arg("packed"), py::arg("N"), py::arg("format"), py::arg("out_fp32") = false,
        py::arg("head") = false);
  m.def("quant_linear_argmax", &quant_linear_argmax,
        "int64 [M]: argmax_rows of quant_linear(x, packed, N, format, out_fp32=True, head=True) without the logits (a "
        "greedy decode's token from a quantized lm_head)");
  m.def("quant_linear_gated", &quant_linear_gated,
        "x [M, K] bf16, W a packed [gate | up] projection of N rows -> [M, N / 2] bf16: act(gate) * up with act 'silu' "
        "or 'gelu_tanh', the bits of quant_linear then silu_and_mul / gelu_tanh_and_mul",
        py::arg("x"), py::arg("packed"), py::arg("N"), py::arg("format"), py::arg("act"));
}

}  // namespace
