// fused_experts: the binding of the MoE kernel in moe.h (argument checks, workspace, threading over its tasks) and the
// packing of expert weights; included by bindings.cpp.
#pragma once
#include <torch/extension.h>

#include "parallel.h"

#include "moe.h"
#include "moe_quant.h"
#include "quant_linear.h"

namespace {

constexpr int64_t kMoeDimMultiple = 32;  // K and N: the packing transposes 16 x 32 pieces (gemm_bf16.h's kPackK)

// w [E, R, C] (R % 16 == 0, C % 32 == 0) -> each expert's [R, C] packed as moe.h reads it, same shape and bytes:
// gate_up (w13, R = 2N): gate block g and up block g interleaved line by line; else (w2) gemm_bf16.h's layout.
at::Tensor pack_moe_weight(const at::Tensor& w, bool gate_up) {
  TORCH_CHECK(w.device().is_cpu() && w.scalar_type() == at::kBFloat16, "pack_moe_weight: w must be a bf16 CPU tensor");
  TORCH_CHECK(w.dim() == 3 && w.size(1) % ((gate_up ? 2 : 1) * sgl_cpu::kPackRows) == 0 &&
                  w.size(2) % kMoeDimMultiple == 0,
              "pack_moe_weight: w must be [E, R, C] with R a multiple of ", (gate_up ? 2 : 1) * sgl_cpu::kPackRows,
              " and C of ", kMoeDimMultiple, ", got ", w.sizes());
  at::Tensor wc = w.contiguous();
  const int64_t E = wc.size(0), R = wc.size(1), C = wc.size(2), blocks = R / sgl_cpu::kPackRows;
  const int64_t per = gate_up ? blocks / 2 : sgl_cpu::pack_groups(blocks, sgl_cpu::kPackGroup);  // groups an expert
  at::Tensor packed = at::empty_like(wc);
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(wc.data_ptr<at::BFloat16>());
  uint16_t* pp = reinterpret_cast<uint16_t*>(packed.data_ptr<at::BFloat16>());
  sgl_cpu::parallel_for(0, E * per, 16, [&](int64_t g0, int64_t g1) {
    for (int64_t t = g0; t < g1; ++t) {
      const int64_t e = t / per, g = t % per;
      const uint16_t* we = wp + e * R * C;
      uint16_t* pe = pp + e * R * C;
      if (!gate_up) {
        sgl_cpu::pack_vnni_bf16(we, R, C, pe, g, g + 1);
        continue;
      }
      uint16_t* base = pe + g * 2 * sgl_cpu::kPackRows * C;
      sgl_cpu::pack_vnni_block(we + g * sgl_cpu::kPackRows * C, C, base, 64);                  // gate block g
      sgl_cpu::pack_vnni_block(we + (R / 2 + g * sgl_cpu::kPackRows) * C, C, base + 32, 64);  // up block g
    }
  });
  return packed;
}

int64_t moe_workspace_bytes(int64_t M, int64_t topk, int64_t E, int64_t N, int64_t K) {
  return sgl_cpu::moe_workspace_bytes(M, topk, E, N, K);
}

void check_routing(const at::Tensor& hidden, const at::Tensor& topk_weights, const at::Tensor& topk_ids) {
  TORCH_CHECK(hidden.device().is_cpu() && hidden.scalar_type() == at::kBFloat16 && hidden.dim() == 2 &&
                  hidden.stride(1) == 1, "fused_experts: hidden must be a bf16 CPU tensor [M, K] with unit column stride");
  const int64_t M = hidden.size(0);
  TORCH_CHECK(topk_weights.dim() == 2 && topk_ids.dim() == 2 && topk_weights.size(0) == M && topk_ids.size(0) == M &&
                  topk_weights.size(1) == topk_ids.size(1), "fused_experts: topk_weights ", topk_weights.sizes(),
              " and topk_ids ", topk_ids.sizes(), " must both be [M, k] for M = ", M);
  TORCH_CHECK(topk_weights.device().is_cpu() && topk_weights.scalar_type() == at::kFloat,
              "fused_experts: topk_weights must be float32");
  TORCH_CHECK(topk_ids.device().is_cpu() && (topk_ids.scalar_type() == at::kInt || topk_ids.scalar_type() == at::kLong),
              "fused_experts: topk_ids must be int32 or int64");
  TORCH_CHECK(M < (int64_t(1) << 31) / std::max<int64_t>(1, topk_ids.size(1)), "fused_experts: too many tokens");
}

void check_dims(int64_t N, int64_t K) {
  TORCH_CHECK(K % kMoeDimMultiple == 0 && N % kMoeDimMultiple == 0, "fused_experts: hidden size K = ", K,
              " and expert intermediate size N = ", N, " must be multiples of ", kMoeDimMultiple,
              " (use the torch path for other shapes)");
}

// The caller's workspace (checked) or a new one of `bytes`.
at::Tensor take_workspace(const c10::optional<at::Tensor>& workspace, int64_t bytes) {
  if (!workspace.has_value()) return at::empty({bytes}, at::TensorOptions().dtype(at::kByte));
  const at::Tensor& ws = *workspace;
  TORCH_CHECK(ws.device().is_cpu() && ws.scalar_type() == at::kByte && ws.is_contiguous() && ws.numel() >= bytes,
              "fused_experts: workspace must be a contiguous uint8 CPU tensor of at least ", bytes, " bytes, got ",
              ws.numel());
  return ws;
}

// Step 1 of moe.h into the workspace.
sgl_cpu::MoeWorkspace route(const at::Tensor& ws_tensor, const at::Tensor& topk_weights, const at::Tensor& topk_ids,
                            int64_t M, int64_t E, int64_t N) {
  const int64_t topk = topk_ids.size(1);
  const sgl_cpu::MoeWorkspace ws = sgl_cpu::moe_workspace(ws_tensor.data_ptr<uint8_t>(), M, topk, E, N);
  const float* wp = topk_weights.data_ptr<float>();
  const int64_t w_s0 = topk_weights.stride(0), w_s1 = topk_weights.stride(1);
  const int64_t i_s0 = topk_ids.stride(0), i_s1 = topk_ids.stride(1);
  if (topk_ids.scalar_type() == at::kInt)
    sgl_cpu::moe_route(topk_ids.data_ptr<int32_t>(), i_s0, i_s1, wp, w_s0, w_s1, M, topk, E, ws);
  else
    sgl_cpu::moe_route(topk_ids.data_ptr<int64_t>(), i_s0, i_s1, wp, w_s0, w_s1, M, topk, E, ws);
  return ws;
}

int64_t down_task_count(int64_t K) {
  return (K / sgl_cpu::kPackRows + sgl_cpu::kMoeDownBlocks - 1) / sgl_cpu::kMoeDownBlocks;
}

// hidden [M, K] bf16, w13 [E, 2N, K] and w2 [E, K, N] packed by pack_moe_weight, topk_weights [M, k] fp32,
// topk_ids [M, k] int32/int64 -> [M, K] bf16. workspace: uint8 of at least moe_workspace_bytes (allocated if absent).
at::Tensor fused_experts(const at::Tensor& hidden, const at::Tensor& w13, const at::Tensor& w2,
                         const at::Tensor& topk_weights, const at::Tensor& topk_ids,
                         const c10::optional<at::Tensor>& workspace) {
  check_routing(hidden, topk_weights, topk_ids);
  for (const at::Tensor* t : {&w13, &w2})
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kBFloat16 && t->dim() == 3 && t->is_contiguous(),
                "fused_experts: w13 [E, 2N, K] and w2 [E, K, N] must be contiguous bf16 CPU tensors (pack_moe_weight)");
  const int64_t M = hidden.size(0), K = hidden.size(1), E = w13.size(0), N = w13.size(1) / 2;
  TORCH_CHECK(w13.size(1) == 2 * N && w13.size(2) == K && w2.size(0) == E && w2.size(1) == K && w2.size(2) == N,
              "fused_experts: shapes do not match: hidden ", hidden.sizes(), ", w13 ", w13.sizes(), ", w2 ", w2.sizes());
  check_dims(N, K);
  at::Tensor ws_tensor = take_workspace(workspace, sgl_cpu::moe_workspace_bytes(M, topk_ids.size(1), E, N, K));
  at::Tensor out = at::empty({M, K}, hidden.options());
  if (M == 0) return out;
  const sgl_cpu::MoeWorkspace ws = route(ws_tensor, topk_weights, topk_ids, M, E, N);
  const uint16_t* xp = reinterpret_cast<const uint16_t*>(hidden.data_ptr<at::BFloat16>());
  const uint16_t* w13p = reinterpret_cast<const uint16_t*>(w13.data_ptr<at::BFloat16>());
  const uint16_t* w2p = reinterpret_cast<const uint16_t*>(w2.data_ptr<at::BFloat16>());
  uint16_t* op = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  // gate/up: (row block, column block) tasks in row-block-major order, so a thread's contiguous share streams each
  // routed expert's column blocks in memory order
  const int64_t gate_up_tasks = (int64_t)ws.block_start[E] * (N / sgl_cpu::kPackRows);
  const int64_t ldx = hidden.stride(0);
  sgl_cpu::parallel_for(0, gate_up_tasks, 1, [&](int64_t t0, int64_t t1) {
    sgl_cpu::moe_gate_up_tasks(xp, ldx, w13p, E, N, K, ws, t0, t1);
  });
  sgl_cpu::parallel_for(0, down_task_count(K), 1, [&](int64_t c0, int64_t c1) {
    sgl_cpu::moe_down_tasks(w2p, E, N, K, M, ws, op, c0, c1);
  });
  return out;
}

int64_t moe_quant_workspace_bytes(int64_t M, int64_t topk, int64_t E, int64_t N, int64_t K, int64_t bits13,
                                  int64_t bits2) {
  return sgl_cpu::moe_quant_workspace_bytes(M, topk, E, N, K, (int)bits13, (int)bits2);
}

// True when fused_experts_quant runs at the current ISA level (avx512_bf16 and above: its epilogues are moe.h's bf16).
bool moe_quant_supported() { return sgl_cpu::isa_at_least(sgl_cpu::CpuIsa::kAvx512Bf16); }

// The same on block-quantized experts: w13 uint8 [E, 2N/16, K/32, record(bits13)] and w2 uint8 [E, K/16, N/32,
// record(bits2)], each expert packed as quant_linear's weights (moe_quant.h).
at::Tensor fused_experts_quant(const at::Tensor& hidden, const at::Tensor& w13, const at::Tensor& w2, int64_t bits13,
                               int64_t bits2, const at::Tensor& topk_weights, const at::Tensor& topk_ids,
                               const c10::optional<at::Tensor>& workspace) {
  TORCH_CHECK(moe_quant_supported(), "fused_experts_quant: needs the ISA level avx512_bf16 or above, the current one is '",
              sgl_cpu::cpu_isa_name(sgl_cpu::current_isa()), "' (below it, run the experts on the torch path)");
  check_routing(hidden, topk_weights, topk_ids);
  TORCH_CHECK((bits13 == 4 || bits13 == 8) && (bits2 == 4 || bits2 == 8), "fused_experts_quant: bits must be 4 or 8");
  const int64_t M = hidden.size(0), K = hidden.size(1), E = w13.size(0), N = w13.size(1) * sgl_cpu::kQTileRows / 2;
  for (const at::Tensor* t : {&w13, &w2})
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kByte && t->dim() == 4 && t->is_contiguous(),
                "fused_experts_quant: w13 and w2 must be contiguous uint8 [E, tiles, blocks, record bytes]");
  check_dims(N, K);
  TORCH_CHECK(w13.size(1) == 2 * N / sgl_cpu::kQTileRows && w13.size(2) == K / sgl_cpu::kQBlock &&
                  w13.size(3) == sgl_cpu::quant_record_bytes((int)bits13) && w2.size(0) == E &&
                  w2.size(1) == K / sgl_cpu::kQTileRows && w2.size(2) == N / sgl_cpu::kQBlock &&
                  w2.size(3) == sgl_cpu::quant_record_bytes((int)bits2),
              "fused_experts_quant: shapes do not match: hidden ", hidden.sizes(), ", w13 ", w13.sizes(), " (", bits13,
              " bits), w2 ", w2.sizes(), " (", bits2, " bits)");
  const int64_t topk = topk_ids.size(1);
  at::Tensor ws_tensor =
      take_workspace(workspace, sgl_cpu::moe_quant_workspace_bytes(M, topk, E, N, K, (int)bits13, (int)bits2));
  at::Tensor out = at::empty({M, K}, hidden.options());
  if (M == 0) return out;
  const sgl_cpu::MoeWorkspace ws = route(ws_tensor, topk_weights, topk_ids, M, E, N);
  const sgl_cpu::MoeQuantActs q =
      sgl_cpu::moe_quant_acts(ws_tensor.data_ptr<uint8_t>(), M, topk, E, N, K, (int)bits13, (int)bits2);
  const uint16_t* xp = reinterpret_cast<const uint16_t*>(hidden.data_ptr<at::BFloat16>());
  const int64_t ldx = hidden.stride(0);
  sgl_cpu::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m)
      sgl_cpu::quantize_row_q8(xp + m * ldx, K, q.nb13, q.qx + m * q.lda13, q.dx + m * q.nb13, q.sx + m * q.nb13,
                               bits13 == 8 ? q.qx + m * q.lda13 + q.nb13 * sgl_cpu::kQBlock : nullptr);
  });
  const uint8_t* w13p = w13.data_ptr<uint8_t>();
  const uint8_t* w2p = w2.data_ptr<uint8_t>();
  const int64_t gate_up_tasks = (int64_t)ws.block_start[E] * (N / sgl_cpu::kQTileRows);
  sgl_cpu::parallel_for(0, gate_up_tasks, 1, [&](int64_t t0, int64_t t1) {
    if (bits13 == 4) sgl_cpu::moe_quant_gate_up_tasks<4>(w13p, E, N, ws, q, t0, t1);
    else sgl_cpu::moe_quant_gate_up_tasks<8>(w13p, E, N, ws, q, t0, t1);
  });
  const int64_t slots = ws.expert_start[E];
  sgl_cpu::parallel_for(0, slots, 16, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s)
      sgl_cpu::quantize_row_q8(ws.act + s * N, N, q.nb2, q.qh + s * q.lda2, q.dh + s * q.nb2, q.sh + s * q.nb2,
                               bits2 == 8 ? q.qh + s * q.lda2 + q.nb2 * sgl_cpu::kQBlock : nullptr);
  });
  uint16_t* op = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  sgl_cpu::parallel_for(0, down_task_count(K), 1, [&](int64_t c0, int64_t c1) {
    if (bits2 == 4) sgl_cpu::moe_quant_down_tasks<4>(w2p, E, K, M, ws, q, op, c0, c1);
    else sgl_cpu::moe_quant_down_tasks<8>(w2p, E, K, M, ws, q, op, c0, c1);
  });
  return out;
}

}  // namespace
