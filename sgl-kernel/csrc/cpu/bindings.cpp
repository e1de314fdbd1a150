// Python bindings of the CPU kernels (AVX-512 BF16; quant_linear from AVX2 up): argument checks, threading with
// sgl_cpu::parallel_for (parallel.h), run-time CPU checks and the ISA level the kernels dispatch on (isa.h). The kernels
// themselves live in the headers next to this file, one concept each.
#include <torch/extension.h>

#include "parallel.h"

#include <cstring>
#include <string>
#include <vector>

#include "activation.h"
#include "amx_gemm.h"
#include "decode_attention_op.h"
#include "extend_attention_op.h"
#include "fused_moe.h"
#include "gemm_bf16.h"
#include "gemv.h"
#include "isa.h"
#include "kernels_f32.h"
#include "logits.h"
#include "mla_attention_op.h"
#include "moe_router.h"
#include "norm.h"
#include "quant_attention_op.h"
#include "qk_norm_rope.h"
#include "quant_embedding.h"
#include "quant_linear_gated.h"  // and quant_linear.h, quant_linear_argmax.h
#include "rope.h"

namespace {

using sgl_cpu::kGemvK;

inline uint16_t* bf16_ptr(const at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>()); }

void check_bf16_cpu(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
  TORCH_CHECK(t.scalar_type() == at::kBFloat16, name, " must be bfloat16, got ", t.scalar_type());
}

inline float* f32_ptr(const at::Tensor& t) { return t.data_ptr<float>(); }

// The elementwise kernels take bf16 (level avx512_bf16 and up) or fp32 (level avx2 and up) tensors, all of one dtype;
// true for fp32.
bool check_kernel_dtype(const char* op, std::initializer_list<const at::Tensor*> ts) {
  const auto dtype = (*ts.begin())->scalar_type();
  for (const at::Tensor* t : ts) {
    TORCH_CHECK(t->device().is_cpu(), op, ": tensors must be on the CPU");
    TORCH_CHECK(t->scalar_type() == dtype, op, ": tensors must have one dtype, got ", t->scalar_type(), " and ", dtype);
  }
  TORCH_CHECK(dtype == at::kBFloat16 || dtype == at::kFloat, op, ": bfloat16 or float32 tensors, got ", dtype);
  const bool f32 = dtype == at::kFloat;
  TORCH_CHECK(f32 ? sgl_cpu::f32_supported() : sgl_cpu::isa_at_least(sgl_cpu::CpuIsa::kAvx512Bf16), op, ": ", dtype,
              " needs CPU level ", f32 ? "avx2" : "avx512_bf16", ", this module runs at ",
              sgl_cpu::cpu_isa_name(sgl_cpu::current_isa()));
  return f32;
}

// The pool's contract under churn: `iters` back-to-back regions over [0, n) (chunks of `grain`), each index run
// exactly once per region; returns the number of indices run twice or never (0 when correct). For the pool's test.
int64_t pool_stress(int64_t iters, int64_t n, int64_t grain) {
  int64_t bad = 0;
  for (int64_t it = 0; it < iters; ++it) {
    std::vector<std::atomic<int>> hits(n);
    for (auto& h : hits) h.store(0, std::memory_order_relaxed);
    sgl_cpu::parallel_for(0, n, grain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) hits[i].fetch_add(1, std::memory_order_relaxed);
    });
    for (auto& h : hits) bad += h.load(std::memory_order_relaxed) != 1;
  }
  return bad;
}

bool cpu_supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
}

// x [M, K] @ weight [N, K]^T -> [M, N]
at::Tensor gemv(const at::Tensor& x, const at::Tensor& weight) {
  check_bf16_cpu(x, "x");
  check_bf16_cpu(weight, "weight");
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), "gemv: shapes ", x.sizes(), " and ",
              weight.sizes(), " do not match");
  TORCH_CHECK(x.size(1) % kGemvK == 0, "gemv: K must be a multiple of ", kGemvK);
  at::Tensor xc = x.contiguous();
  at::Tensor wc = weight.contiguous();
  const int64_t M = xc.size(0), K = xc.size(1), N = wc.size(0);
  at::Tensor y = at::empty({M, N}, x.options());
  const uint16_t* xp = bf16_ptr(xc);
  const uint16_t* wp = bf16_ptr(wc);
  uint16_t* yp = bf16_ptr(y);
  // work unit: 4 weight rows; a thread's share is contiguous so its stream is one range of memory
  const int64_t blocks = (N + 3) / 4;
  sgl_cpu::parallel_for(0, blocks, 16, [&](int64_t b0, int64_t b1) {
    sgl_cpu::gemv_bf16(xp, M, wp, N, K, yp, b0 * 4, std::min(N, b1 * 4));
  });
  return y;
}

void set_cpu_isa(const std::string& name) {
  sgl_cpu::CpuIsa isa;
  std::string names;
  for (const char* n : sgl_cpu::kCpuIsaNames) names += std::string(names.empty() ? "" : ", ") + n;
  TORCH_CHECK_VALUE(sgl_cpu::cpu_isa_from_name(name, &isa), "set_cpu_isa: unknown ISA level '", name, "' (one of ",
                    names, ")");
  TORCH_CHECK_VALUE(sgl_cpu::set_current_isa(isa), "set_cpu_isa: '", name, "' is above this CPU's native level '",
                    sgl_cpu::cpu_isa_name(sgl_cpu::native_isa()), "'");
}

bool amx_supported() {
  static const bool ok = cpu_supported() && sgl_cpu::amx_request_permission();
  return ok;
}

// x [M, K] @ weight [N, K]^T -> [M, N] with AMX tiles, M <= 64
at::Tensor amx_linear(const at::Tensor& x, const at::Tensor& weight) {
  check_bf16_cpu(x, "x");
  check_bf16_cpu(weight, "weight");
  TORCH_CHECK(amx_supported(), "amx_linear: AMX is not available in this process");
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), "amx_linear: shapes ", x.sizes(),
              " and ", weight.sizes(), " do not match");
  TORCH_CHECK(x.size(1) % kGemvK == 0, "amx_linear: K must be a multiple of ", kGemvK);
  TORCH_CHECK(x.size(0) >= 1 && x.size(0) <= sgl_cpu::kAmxMaxRows, "amx_linear: at most ", sgl_cpu::kAmxMaxRows,
              " rows");
  at::Tensor xc = x.contiguous();
  at::Tensor wc = weight.contiguous();
  const int64_t M = xc.size(0), K = xc.size(1), N = wc.size(0);
  at::Tensor y = at::empty({M, N}, x.options());
  at::Tensor packed = at::empty({K * sgl_cpu::kAmxMaxRows}, x.options());
  const uint16_t* xp = bf16_ptr(xc);
  const uint16_t* wp = bf16_ptr(wc);
  uint16_t* yp = bf16_ptr(y);
  uint16_t* pp = bf16_ptr(packed);
  sgl_cpu::amx_pack_rows(xp, M, K, pp);
  const int64_t full = N / 16;
  sgl_cpu::parallel_for(0, full, 4, [&](int64_t b0, int64_t b1) {
    sgl_cpu::amx_configure();
    sgl_cpu::amx_gemm_bf16(pp, M, wp, N, K, yp, b0 * 16, b1 * 16);
    sgl_cpu::amx_release();
  });
  if (full * 16 < N) sgl_cpu::gemv_bf16(xp, M, wp, N, K, yp, full * 16, N);  // the last N % 16 weight rows
  return y;
}

// W [N, K] -> the same weights in the VNNI layout of gemm_bf16.h (same shape and element count: it replaces W)
at::Tensor pack_linear_weight(const at::Tensor& weight) {
  check_bf16_cpu(weight, "weight");
  TORCH_CHECK(weight.dim() == 2 && weight.size(0) % sgl_cpu::kPackRows == 0 && weight.size(1) % sgl_cpu::kPackK == 0,
              "pack_linear_weight: weight must be [N, K] with N a multiple of ", sgl_cpu::kPackRows, " and K of ",
              sgl_cpu::kPackK, ", got ", weight.sizes());
  at::Tensor wc = weight.contiguous();
  const int64_t N = wc.size(0), K = wc.size(1);
  at::Tensor packed = at::empty_like(wc);
  const uint16_t* wp = bf16_ptr(wc);
  uint16_t* pp = bf16_ptr(packed);
  sgl_cpu::parallel_for(0, sgl_cpu::pack_groups(N / sgl_cpu::kPackRows, sgl_cpu::kPackGroup), 8,
                        [&](int64_t g0, int64_t g1) { sgl_cpu::pack_vnni_bf16(wp, N, K, pp, g0, g1); });
  return packed;
}

// x [M, K] @ W^T with W given packed (pack_linear_weight) -> [M, N], any M
at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& packed) {
  check_bf16_cpu(x, "x");
  check_bf16_cpu(packed, "packed");
  TORCH_CHECK(x.dim() == 2 && packed.dim() == 2 && x.size(1) == packed.size(1) && packed.is_contiguous() &&
                  packed.size(0) % sgl_cpu::kPackRows == 0 && packed.size(1) % sgl_cpu::kPackK == 0,
              "packed_linear: shapes ", x.sizes(), " and ", packed.sizes(), " do not match");
  at::Tensor xc = x.contiguous();
  const int64_t M = xc.size(0), K = xc.size(1), N = packed.size(0);
  at::Tensor y = at::empty({M, N}, x.options());
  const uint16_t* xp = bf16_ptr(xc);
  const uint16_t* pp = bf16_ptr(packed);
  uint16_t* yp = bf16_ptr(y);
  // work unit: one group of 48 output columns; a thread's share is contiguous so its stream is one range of memory
  sgl_cpu::parallel_for(0, sgl_cpu::pack_groups(N / sgl_cpu::kPackRows, sgl_cpu::kPackGroup), 2,
                        [&](int64_t g0, int64_t g1) { sgl_cpu::gemm_vnni_bf16(xp, M, pp, N, K, yp, g0, g1); });
  return y;
}

// returns (out, residual_out); residual_out is x + residual (or undefined without a residual)
std::tuple<at::Tensor, at::Tensor> rmsnorm(const at::Tensor& x, const c10::optional<at::Tensor>& residual,
                                           const at::Tensor& weight, double eps) {
  // bf16 rows with a float32 weight: Gemma's norm, the fp32 scale (1 + w) applied before the one rounding
  const bool f32_scale = x.scalar_type() == at::kBFloat16 && weight.scalar_type() == at::kFloat;
  const bool f32 = residual.has_value() ? check_kernel_dtype("rmsnorm", {&x, f32_scale ? &x : &weight, &*residual})
                                        : check_kernel_dtype("rmsnorm", {&x, f32_scale ? &x : &weight});
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "rmsnorm: x must be a contiguous [rows, hidden] tensor");
  const int64_t rows = x.size(0), hidden = x.size(1);
  TORCH_CHECK(weight.numel() == hidden && weight.is_contiguous(), "rmsnorm: weight must have ", hidden, " elements");
  at::Tensor out = at::empty_like(x);
  at::Tensor res_out;
  if (residual.has_value()) {
    TORCH_CHECK(residual->sizes() == x.sizes() && residual->is_contiguous(), "rmsnorm: residual must match x");
    res_out = at::empty_like(x);
  }
  const bool has_res = residual.has_value();
  const float feps = (float)eps;
  sgl_cpu::parallel_for(0, rows, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t o = r * hidden;
      if (f32)
        SGL_F32_CALL(rmsnorm_row, f32_ptr(x) + o, has_res ? f32_ptr(*residual) + o : nullptr, f32_ptr(weight),
                     f32_ptr(out) + o, has_res ? f32_ptr(res_out) + o : nullptr, hidden, feps);
      else if (f32_scale)
        sgl_cpu::rmsnorm_row_f32_scale(bf16_ptr(x) + o, has_res ? bf16_ptr(*residual) + o : nullptr, f32_ptr(weight),
                                       bf16_ptr(out) + o, has_res ? bf16_ptr(res_out) + o : nullptr, hidden, feps);
      else
        sgl_cpu::rmsnorm_row(bf16_ptr(x) + o, has_res ? bf16_ptr(*residual) + o : nullptr, bf16_ptr(weight),
                             bf16_ptr(out) + o, has_res ? bf16_ptr(res_out) + o : nullptr, hidden, feps);
    }
  });
  return {out, res_out};
}

// Gemma's post- and next pre-norm in one region: (norm2(norm1(x) + residual), norm1(x) + residual), bf16, fp32 scales;
// each row runs rmsnorm's two row calls via a row buffer: the bits of rmsnorm(x, None, s1), rmsnorm(., residual, s2)
std::tuple<at::Tensor, at::Tensor> rmsnorm_pair(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& s1,
                                                const at::Tensor& s2, double eps1, double eps2) {
  check_kernel_dtype("rmsnorm_pair", {&x, &residual});
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && s1.scalar_type() == at::kFloat && s2.scalar_type() == at::kFloat,
              "rmsnorm_pair: bfloat16 rows and float32 scales");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && residual.sizes() == x.sizes() && residual.is_contiguous(),
              "rmsnorm_pair: x and residual must be contiguous [rows, hidden] tensors of one shape");
  const int64_t hidden = x.size(1);
  TORCH_CHECK(s1.numel() == hidden && s2.numel() == hidden && s1.is_contiguous() && s2.is_contiguous(),
              "rmsnorm_pair: scales must have ", hidden, " elements");
  at::Tensor out = at::empty_like(x), res_out = at::empty_like(x);
  sgl_cpu::parallel_for(0, x.size(0), 8, [&](int64_t r0, int64_t r1) {
    std::vector<uint16_t> mid((size_t)hidden);
    for (int64_t o = r0 * hidden; o < r1 * hidden; o += hidden) {
      sgl_cpu::rmsnorm_row_f32_scale(bf16_ptr(x) + o, nullptr, f32_ptr(s1), mid.data(), nullptr, hidden, (float)eps1);
      sgl_cpu::rmsnorm_row_f32_scale(mid.data(), bf16_ptr(residual) + o, f32_ptr(s2), bf16_ptr(out) + o,
                                     bf16_ptr(res_out) + o, hidden, (float)eps2);
    }
  });
  return {out, res_out};
}

// [rows, 2I] -> [rows, I]
at::Tensor silu_and_mul(const at::Tensor& x) {
  const bool f32 = check_kernel_dtype("silu_and_mul", {&x});
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.size(1) % 2 == 0, "silu_and_mul: x must be contiguous [rows, 2I]");
  const int64_t rows = x.size(0), inter = x.size(1) / 2;
  at::Tensor out = at::empty({rows, inter}, x.options());
  if (!f32) {
    sgl_cpu::act_and_mul_rows<false>(bf16_ptr(x), bf16_ptr(out), rows, inter);
    return out;
  }
  sgl_cpu::parallel_for(0, rows, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      SGL_F32_CALL(silu_and_mul_row, f32_ptr(x) + r * 2 * inter, f32_ptr(out) + r * inter, inter);
  });
  return out;
}

// [rows, 2I] -> [rows, I], bf16 only (Gemma's MLP; fp32 models take torch's gelu)
at::Tensor gelu_tanh_and_mul(const at::Tensor& x) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && !check_kernel_dtype("gelu_tanh_and_mul", {&x}),
              "gelu_tanh_and_mul: bfloat16 only");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.size(1) % 2 == 0,
              "gelu_tanh_and_mul: x must be contiguous [rows, 2I]");
  const int64_t rows = x.size(0), inter = x.size(1) / 2;
  at::Tensor out = at::empty({rows, inter}, x.options());
  sgl_cpu::act_and_mul_rows<true>(bf16_ptr(x), bf16_ptr(out), rows, inter);
  return out;
}

// In place: the first num_heads heads of each row of x [N, >= num_heads * head_size] (row stride free, heads
// contiguous) are rotated by cos_sin_cache[positions[n]].
void rotary_embedding_(const at::Tensor& positions, at::Tensor& x, int64_t num_heads, int64_t head_size,
                       const at::Tensor& cos_sin_cache) {
  const bool f32 = check_kernel_dtype("rotary_embedding_", {&x, &cos_sin_cache});
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.dim() == 1, "rotary: positions must be int64 [N]");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && x.size(1) >= num_heads * head_size, "rotary: bad x layout");
  TORCH_CHECK(cos_sin_cache.dim() == 2 && cos_sin_cache.is_contiguous(), "rotary: cos_sin_cache must be [P, rd]");
  const int64_t n = x.size(0), rd = cos_sin_cache.size(1);
  TORCH_CHECK(positions.size(0) == n && rd <= head_size && rd % 2 == 0, "rotary: shapes do not match");
  at::Tensor pos = positions.contiguous();
  const int64_t* pp = pos.data_ptr<int64_t>();
  const int64_t max_pos = cos_sin_cache.size(0);
  for (int64_t i = 0; i < n; ++i) TORCH_CHECK(pp[i] >= 0 && pp[i] < max_pos, "rotary: position ", pp[i], " out of range");
  const int64_t ld = x.stride(0);
  sgl_cpu::parallel_for(0, n, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      if (f32)
        SGL_F32_CALL(rope_heads, f32_ptr(x) + r * ld, num_heads, head_size, f32_ptr(cos_sin_cache) + pp[r] * rd, rd);
      else
        sgl_cpu::rope_heads(bf16_ptr(x) + r * ld, num_heads, head_size, bf16_ptr(cos_sin_cache) + pp[r] * rd, rd);
    }
  });
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "SGLang CPU kernels (AVX-512 BF16)";
  m.def("set_num_threads", [](int64_t n) { sgl_cpu::ThreadPool::instance().set_num_threads((int)n); },
        "Threads the kernels' regions use, the calling thread included");
  m.def("get_num_threads", [] { return (int64_t)sgl_cpu::ThreadPool::instance().num_threads(); },
        "Threads the kernels' regions use");
  m.def("set_spin_us", [](int64_t us) { sgl_cpu::ThreadPool::instance().set_spin_us(us); },
        "Microseconds an idle kernel thread spins before it sleeps (0: sleep at once)");
  m.def("get_spin_us", [] { return sgl_cpu::ThreadPool::instance().spin_us(); },
        "Microseconds an idle kernel thread spins before it sleeps");
  m.def("cpu_supported", &cpu_supported, "True when this CPU has the AVX-512 BF16 instructions the kernels use");
  m.def("gemv", &gemv, "x [M, K] @ weight [N, K]^T in bf16 with fp32 accumulation (few-row decode GEMM)");
  m.def("amx_supported", &amx_supported, "True when AMX tiles can be used in this process (CPU and OS permission)");
  m.def("amx_linear", &amx_linear, "x [M <= 64, K] @ weight [N, K]^T in bf16 with AMX tiles, weights in place");
  m.def("pack_linear_weight", &pack_linear_weight, "weight [N, K] -> the same weights in gemm_bf16.h's VNNI layout");
  m.def("packed_linear", &packed_linear, "x [M, K] @ W^T from a packed weight (AVX-512 BF16, no AMX), any M");
  m.def("rmsnorm", &rmsnorm, "RMSNorm, optionally fused with the preceding residual add; a float32 weight on bfloat16 "
        "rows is applied in fp32 before the one rounding (Gemma's 1 + w)");
  m.def("rmsnorm_pair", &rmsnorm_pair, "norm2(norm1(x) + residual), residual_out: Gemma's post- and pre-norms in one");
  m.def("silu_and_mul", &silu_and_mul, "silu(gate) * up on a merged [gate | up] tensor");
  m.def("gelu_tanh_and_mul", &gelu_tanh_and_mul, "gelu_tanh(gate) * up on a merged [gate | up] bf16 tensor");
  m.def("rotary_embedding_", &rotary_embedding_, "In-place neox rotary embedding of the first heads of each row");
  m.def("pool_stress", &pool_stress, "regions run back to back: indices run twice or never (0 when the pool is correct)");
  m.def("decode_attention_head_dims", &sgl_cpu::decode_attention_head_dims, "head_dim values decode_attention supports");
  m.def("cpu_isa_native", [] { return std::string(sgl_cpu::cpu_isa_name(sgl_cpu::native_isa())); },
        "The best ISA level of this CPU and OS: scalar < avx2 < avx512_vnni < avx512_bf16 < amx");
  m.def("set_cpu_isa", &set_cpu_isa, "Set the ISA level the kernels dispatch on (at most cpu_isa_native())");
  m.def("get_cpu_isa", [] { return std::string(sgl_cpu::cpu_isa_name(sgl_cpu::current_isa())); },
        "The ISA level the kernels dispatch on (default: cpu_isa_native())");
  m.def("f32_supported", &sgl_cpu::f32_supported,
        "True when the fp32 rmsnorm / silu_and_mul / rotary_embedding_ / decode_attention run at the current level (>= avx2)");
  register_quant_linear_ops(m);  // quant_supported, quant_path, set_quant_dense_prefill, quant_linear*
  m.def("quant_embedding", &quant_embedding,
        "[len(ids), cols]: rows ids of a packed [rows, cols] vocabulary table (format 4 or 8), each d * u + c in fp32 "
        "as packing.unpack_dequantize computes it, then bf16 (or fp32 with out_fp32)",
        py::arg("ids"), py::arg("packed"), py::arg("rows"), py::arg("cols"), py::arg("format"),
        py::arg("out_fp32") = false);
  m.def("pack_moe_weight", &pack_moe_weight, "expert weights [E, R, C], gate_up (w13) -> each expert packed as moe.h reads it");
  m.def("moe_workspace_bytes", &moe_workspace_bytes, "bytes of fused_experts' workspace for (M, k, E, N, K)");
  m.def("fused_experts", &fused_experts, "fused MoE experts on packed bf16 weights: [M, K] -> [M, K]",
        py::arg("hidden"), py::arg("w13"), py::arg("w2"), py::arg("topk_weights"), py::arg("topk_ids"),
        py::arg("workspace") = py::none());
  m.def("moe_quant_workspace_bytes", &moe_quant_workspace_bytes,
        "bytes of fused_experts_quant's workspace for (M, k, E, N, K, bits13, bits2)");
  m.def("moe_quant_supported", &moe_quant_supported, "True when fused_experts_quant runs at the current ISA level");
  m.def("fused_experts_quant", &fused_experts_quant,
        "fused MoE experts on block-quantized packed weights (Q4_0/Q4_1/Q8_0/int8): [M, K] bf16 -> [M, K]",
        py::arg("hidden"), py::arg("w13"), py::arg("w2"), py::arg("bits13"), py::arg("bits2"), py::arg("topk_weights"),
        py::arg("topk_ids"), py::arg("workspace") = py::none());
  m.def("topk_softmax", &topk_softmax, "MoE routing: router logits [M, E] -> top-k softmax weights fp32, ids int32");
  m.def("logits_to_float", &logits_to_float, "bf16 logits [B, V_pad] -> fp32 [B, vocab] (the first vocab columns)");
  m.def("qk_norm_rope_", &qk_norm_rope_, "Qwen3 q/k head RMSNorm then RoPE, in place on the qkv projection's rows");
  m.def("argmax_rows", &argmax_rows, "fp32 [B, V] -> int64 [B]: each row's first maximum (NaN counts as the maximum)");
  m.def("decode_attention", &sgl_cpu::decode_attention,
        "Write new K/V to the pool and attend over each request's tokens (bf16 from avx512_bf16, fp32 from avx2); "
        "sliding_window W >= 1: a query at position p reads keys p - W + 1 .. p only; sinks: fp32 [H] logits joining "
        "each head's softmax denominator; logit_cap > 0: scores soft-capped; loc_map: int32 token-pool slot -> "
        "buffer slot, for every req_to_token read and the write at out_cache_loc",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("k_cache"), py::arg("v_cache"), py::arg("req_to_token"),
        py::arg("req_pool_indices"), py::arg("seq_lens"), py::arg("out_cache_loc"), py::arg("scale"),
        py::arg("sliding_window") = -1, py::arg("sinks") = py::none(), py::arg("logit_cap") = 0.0,
        py::arg("loc_map") = py::none());
  m.def("extend_attention", &sgl_cpu::extend_attention,
        "Causal attention of a prefill's new tokens over the pool, prefix included (bf16 from avx512_bf16, fp32 from "
        "avx2); sliding_window, sinks, logit_cap and loc_map as decode_attention",
        py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("req_to_token"), py::arg("req_pool_indices"),
        py::arg("prefix_lens"), py::arg("extend_lens"), py::arg("scale"), py::arg("sliding_window") = -1,
        py::arg("sinks") = py::none(), py::arg("logit_cap") = 0.0, py::arg("loc_map") = py::none());
  m.def("mla_decode", &sgl_cpu::mla_decode,
        "MLA decode in the absorbed form (bf16 from avx512_bf16, fp32 from avx2): the new latent rows k_new [B, 1, L] "
        "written at out_cache_loc, then q [B, H, L] attends over each request's rows of the latent pool [slots, 1, L], "
        "V = their first kv_lora_rank columns -> [B, H * kv_lora_rank]",
        py::arg("q"), py::arg("k_new"), py::arg("kv_cache"), py::arg("kv_lora_rank"), py::arg("req_to_token"),
        py::arg("req_pool_indices"), py::arg("seq_lens"), py::arg("out_cache_loc"), py::arg("scale"));
  m.def("mla_extend", &sgl_cpu::mla_extend,
        "MLA extend (causal, cached prefix included) over the latent pool, as mla_decode; k_new / out_cache_loc: "
        "the new rows, written first where given",
        py::arg("q"), py::arg("kv_cache"), py::arg("kv_lora_rank"), py::arg("req_to_token"),
        py::arg("req_pool_indices"), py::arg("prefix_lens"), py::arg("extend_lens"), py::arg("scale"),
        py::arg("k_new") = py::none(), py::arg("out_cache_loc") = py::none());
  m.def("extend_attention_quant", &sgl_cpu::extend_attention_quant,
        "extend (or decode: extend_lens 1) attention over a quantized KV pool (int8, int4, int2_hadamard, fp8_e4m3, "
        "fp8_e5m2), codes read "
        "in place through req_to_token: q [N, H, D] -> [N, H * D]; q_turn: R [D, D] where the keys are stored turned; "
        "fresh_k / fresh_v: the new tokens' K/V [N, KV, D] fp32 in the stored basis, attended instead of their codes; "
        "ring_k / ring_v: the recent-window rings [ring rows, entries, KV, D] bf16, request b's at row ring_rows[b]",
        py::arg("q"), py::arg("k_codes"), py::arg("v_codes"), py::arg("k_scale"), py::arg("v_scale"),
        py::arg("kv_format"), py::arg("req_to_token"), py::arg("req_pool_indices"), py::arg("prefix_lens"),
        py::arg("extend_lens"), py::arg("scale"), py::arg("q_turn") = py::none(), py::arg("q_smooth") = py::none(),
        py::arg("out_turn") = py::none(), py::arg("fresh_k") = py::none(), py::arg("fresh_v") = py::none(),
        py::arg("ring_k") = py::none(), py::arg("ring_v") = py::none(), py::arg("ring_rows") = py::none(),
        py::arg("ring_counts") = py::none(), py::arg("ring_write") = py::none(), py::arg("sink_counts") = py::none(),
        py::arg("sink_write") = py::none(), py::arg("ring_window") = 0);
  m.def("kv_quant_write", &sgl_cpu::kv_quant_write,
        "new K or V rows [N, KV, D] -> an int8 / int4 / int2_hadamard / fp8 pool's codes at the slots loc (the codec's "
        "rule; int8 and int4 write their per-row fp16 scales, int2_hadamard its log-scale bytes, fp8 reads the per-head "
        "fp32 ones), times smooth then turned by R first "
        "where given", py::arg("x"), py::arg("codes"), py::arg("scales"), py::arg("loc"), py::arg("kv_format"),
        py::arg("turn") = py::none(), py::arg("smooth") = py::none(), py::arg("turned_out") = py::none());
}
