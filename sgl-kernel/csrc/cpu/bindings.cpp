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
#include "decode_attention.h"
#include "fused_moe.h"
#include "gemm_bf16.h"
#include "gemv.h"
#include "isa.h"
#include "logits.h"
#include "moe_router.h"
#include "norm.h"
#include "qk_norm_rope.h"
#include "quant_linear.h"
#include "rope.h"

namespace {

using sgl_cpu::kGemvK;

inline uint16_t* bf16_ptr(const at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>()); }

void check_bf16_cpu(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
  TORCH_CHECK(t.scalar_type() == at::kBFloat16, name, " must be bfloat16, got ", t.scalar_type());
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
  check_bf16_cpu(x, "x");
  check_bf16_cpu(weight, "weight");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "rmsnorm: x must be a contiguous [rows, hidden] tensor");
  const int64_t rows = x.size(0), hidden = x.size(1);
  TORCH_CHECK(weight.numel() == hidden && weight.is_contiguous(), "rmsnorm: weight must have ", hidden, " elements");
  at::Tensor out = at::empty_like(x);
  at::Tensor res_out;
  const uint16_t* rp = nullptr;
  uint16_t* rop = nullptr;
  if (residual.has_value()) {
    check_bf16_cpu(*residual, "residual");
    TORCH_CHECK(residual->sizes() == x.sizes() && residual->is_contiguous(), "rmsnorm: residual must match x");
    res_out = at::empty_like(x);
    rp = bf16_ptr(*residual);
    rop = bf16_ptr(res_out);
  }
  const uint16_t* xp = bf16_ptr(x);
  const uint16_t* wp = bf16_ptr(weight);
  uint16_t* op = bf16_ptr(out);
  const float feps = (float)eps;
  sgl_cpu::parallel_for(0, rows, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      sgl_cpu::rmsnorm_row(xp + r * hidden, rp ? rp + r * hidden : nullptr, wp, op + r * hidden,
                           rop ? rop + r * hidden : nullptr, hidden, feps);
  });
  return {out, res_out};
}

// [rows, 2I] -> [rows, I]
at::Tensor silu_and_mul(const at::Tensor& x) {
  check_bf16_cpu(x, "x");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.size(1) % 2 == 0, "silu_and_mul: x must be contiguous [rows, 2I]");
  const int64_t rows = x.size(0), inter = x.size(1) / 2;
  at::Tensor out = at::empty({rows, inter}, x.options());
  const uint16_t* xp = bf16_ptr(x);
  uint16_t* op = bf16_ptr(out);
  sgl_cpu::parallel_for(0, rows, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) sgl_cpu::silu_and_mul_row(xp + r * 2 * inter, op + r * inter, inter);
  });
  return out;
}

// In place: the first num_heads heads of each row of x [N, >= num_heads * head_size] (row stride free, heads
// contiguous) are rotated by cos_sin_cache[positions[n]].
void rotary_embedding_(const at::Tensor& positions, at::Tensor& x, int64_t num_heads, int64_t head_size,
                       const at::Tensor& cos_sin_cache) {
  check_bf16_cpu(x, "x");
  check_bf16_cpu(cos_sin_cache, "cos_sin_cache");
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.dim() == 1, "rotary: positions must be int64 [N]");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && x.size(1) >= num_heads * head_size, "rotary: bad x layout");
  TORCH_CHECK(cos_sin_cache.dim() == 2 && cos_sin_cache.is_contiguous(), "rotary: cos_sin_cache must be [P, rd]");
  const int64_t n = x.size(0), rd = cos_sin_cache.size(1);
  TORCH_CHECK(positions.size(0) == n && rd <= head_size && rd % 2 == 0, "rotary: shapes do not match");
  at::Tensor pos = positions.contiguous();
  const int64_t* pp = pos.data_ptr<int64_t>();
  const int64_t max_pos = cos_sin_cache.size(0);
  for (int64_t i = 0; i < n; ++i) TORCH_CHECK(pp[i] >= 0 && pp[i] < max_pos, "rotary: position ", pp[i], " out of range");
  uint16_t* xp = bf16_ptr(x);
  const uint16_t* cp = bf16_ptr(cos_sin_cache);
  const int64_t ld = x.stride(0);
  sgl_cpu::parallel_for(0, n, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) sgl_cpu::rope_heads(xp + r * ld, num_heads, head_size, cp + pp[r] * rd, rd);
  });
}

// Writes the new k/v [B, KV, D] to the pool at out_cache_loc, then attends q [B, H, D] over each request's tokens
// req_to_token[req_pool_indices[b], :seq_lens[b]] -> [B, H * D].
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& k_cache,
                            at::Tensor& v_cache, const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                            const at::Tensor& seq_lens, const at::Tensor& out_cache_loc, double scale) {
  for (auto* t : {&q, &k, &v}) check_bf16_cpu(*t, "q/k/v");
  check_bf16_cpu(k_cache, "k_cache");
  check_bf16_cpu(v_cache, "v_cache");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, "decode_attention: q, k, v must be [B, heads, D]");
  TORCH_CHECK(k_cache.dim() == 3 && k_cache.is_contiguous() && v_cache.is_contiguous() &&
                  v_cache.sizes() == k_cache.sizes(), "decode_attention: caches must be contiguous [slots, KV, D]");
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2), KV = k_cache.size(1);
  TORCH_CHECK(k_cache.size(2) == D && k.size(1) == KV && v.size(1) == KV && k.size(2) == D && v.size(2) == D &&
                  k.size(0) == B && v.size(0) == B, "decode_attention: head shapes do not match");
  const std::vector<int64_t> dims = sgl_cpu::decode_attention_head_dims();
  TORCH_CHECK(std::find(dims.begin(), dims.end(), D) != dims.end() && H % KV == 0, "decode_attention: head_dim ", D,
              " is not one of the compiled ", c10::IntArrayRef(dims), ", or heads ", H, " are not a multiple of kv heads ", KV);
  for (auto* t : {&req_to_token, &req_pool_indices, &seq_lens, &out_cache_loc})
    TORCH_CHECK(t->scalar_type() == at::kLong, "decode_attention: index tensors must be int64");
  TORCH_CHECK(req_to_token.dim() == 2 && req_to_token.stride(1) == 1, "decode_attention: bad req_to_token");
  at::Tensor rpi = req_pool_indices.contiguous(), lens = seq_lens.contiguous(), loc = out_cache_loc.contiguous();
  const int64_t* rp = rpi.data_ptr<int64_t>();
  const int64_t* lp = lens.data_ptr<int64_t>();
  const int64_t* locp = loc.data_ptr<int64_t>();
  const int64_t slots = k_cache.size(0), table_rows = req_to_token.size(0), table_len = req_to_token.size(1);
  int64_t max_len = 0;
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(rp[b] >= 0 && rp[b] < table_rows && lp[b] >= 1 && lp[b] <= table_len && locp[b] >= 0 &&
                    locp[b] < slots, "decode_attention: index out of range for request ", b);
    max_len = std::max(max_len, lp[b]);
  }
  // 1. the new tokens' K and V into the pool (heads contiguous within a token for k, v and the pool)
  uint16_t* kc = bf16_ptr(k_cache);
  uint16_t* vc = bf16_ptr(v_cache);
  TORCH_CHECK(k.stride(2) == 1 && v.stride(2) == 1 && k.stride(1) == D && v.stride(1) == D,
              "decode_attention: k/v heads must be contiguous");
  const uint16_t* kp = bf16_ptr(k);
  const uint16_t* vp = bf16_ptr(v);
  for (int64_t b = 0; b < B; ++b) {
    std::memcpy(kc + locp[b] * KV * D, kp + b * k.stride(0), KV * D * sizeof(uint16_t));
    std::memcpy(vc + locp[b] * KV * D, vp + b * v.stride(0), KV * D * sizeof(uint16_t));
  }
  // 2. every slot the requests will read must lie inside the pool
  const int64_t* table = req_to_token.data_ptr<int64_t>();
  const int64_t ld_table = req_to_token.stride(0);
  bool bad_slot = false;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t* tokens = table + rp[b] * ld_table;
    for (int64_t j = 0; j < lp[b]; ++j) bad_slot |= tokens[j] < 0 || tokens[j] >= slots;
  }
  // 3. attention
  at::Tensor qc = q.contiguous();
  const uint16_t* qp = bf16_ptr(qc);
  at::Tensor out = at::empty({B, H * D}, q.options());
  uint16_t* op = bf16_ptr(out);
  const int64_t group = H / KV;
  const float fscale = (float)scale;
  if (!bad_slot) {
    // a task per (request, KV head) serves the query heads of its group; tasks are split over the threads by their
    // key counts (mixed lengths would leave one thread idle with an even split by count)
    const int64_t tasks = B * KV;
    std::vector<int64_t> cost(tasks);
    for (int64_t t = 0; t < tasks; ++t) cost[t] = lp[t / KV] + 16;  // + a per-task overhead in key equivalents
    const int64_t parts = std::max<int64_t>(
        1, std::min<int64_t>(sgl_cpu::ThreadPool::instance().num_threads() * sgl_cpu::ThreadPool::kChunksPerThread, tasks));
    const std::vector<int64_t> first = sgl_cpu::split_by_cost(cost, parts);
    sgl_cpu::parallel_for(0, parts, 1, [&](int64_t p0, int64_t p1) {
      std::vector<float> scores(4 * max_len);
      for (int64_t p = p0; p < p1; ++p)
        for (int64_t t = first[p]; t < first[p + 1]; ++t) {
          const int64_t b = t / KV, kv_head = t % KV, h0 = b * H + kv_head * group;
          sgl_cpu::decode_attention_group(qp + h0 * D, group, kc, vc, KV, kv_head, D, table + rp[b] * ld_table, lp[b],
                                          fscale, scores.data(), op + h0 * D);
        }
    });
  }
  TORCH_CHECK(!bad_slot, "decode_attention: req_to_token holds a slot outside the KV pool");
  return out;
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
  m.def("rmsnorm", &rmsnorm, "RMSNorm, optionally fused with the preceding residual add");
  m.def("silu_and_mul", &silu_and_mul, "silu(gate) * up on a merged [gate | up] tensor");
  m.def("rotary_embedding_", &rotary_embedding_, "In-place neox rotary embedding of the first heads of each row");
  m.def("decode_attention_head_dims", &sgl_cpu::decode_attention_head_dims, "head_dim values decode_attention supports");
  m.def("cpu_isa_native", [] { return std::string(sgl_cpu::cpu_isa_name(sgl_cpu::native_isa())); },
        "The best ISA level of this CPU and OS: scalar < avx2 < avx512_vnni < avx512_bf16 < amx");
  m.def("set_cpu_isa", &set_cpu_isa, "Set the ISA level the kernels dispatch on (at most cpu_isa_native())");
  m.def("get_cpu_isa", [] { return std::string(sgl_cpu::cpu_isa_name(sgl_cpu::current_isa())); },
        "The ISA level the kernels dispatch on (default: cpu_isa_native())");
  m.def("quant_supported", &quant_supported, "True when quant_linear has a kernel at the current ISA level (>= avx2)");
  m.def("quant_linear", &quant_linear,
        "x [M, K] (bf16/fp32) @ W^T, W block-quantized and packed (quant_gemm.h); activations int8 per 32 values");
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
  m.def("decode_attention", &decode_attention, "Write new K/V to the pool and attend over each request's tokens");
}
