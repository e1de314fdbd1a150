// Qwen3's attention prologue in one call, in place on the rows of the fused qkv projection: each q and k head is
// RMS-normalised over head_dim with its own weight (q_norm / k_norm), then rotated by RoPE at its token's position.
// It runs norm.h's rmsnorm_row and rope.h's rope_heads, the functions of the separate rmsnorm and rotary_embedding_
// kernels, on the same values in the same order, so the result is bit-identical to those two passes (the module path
// of Qwen3Attention); what it saves is the Python between them (two norms, two rotations, their reshapes: ~15 us a
// layer at batch 1).
#pragma once
#include <torch/extension.h>

#include "norm.h"
#include "parallel.h"
#include "rope.h"

namespace {

// qkv [N, >= (H + KV) * D] bf16 (unit column stride; heads [0, H) are q, [H, H + KV) k), positions int64 [N],
// q_weight / k_weight bf16 [D] (Qwen3), or both fp32 [D]: Gemma 3's fp32 scales 1 + w, applied before the one rounding
// (norm.h rmsnorm_row_f32_scale, the rmsnorm kernel's path for them); cos_sin_cache bf16 [P, rotary_dim] (cos halves,
// then sin halves)
void qk_norm_rope_(at::Tensor& qkv, const at::Tensor& positions, const at::Tensor& q_weight,
                   const at::Tensor& k_weight, double eps, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                   const at::Tensor& cos_sin_cache) {
  const at::Tensor& qkv_c = qkv;
  for (const at::Tensor* t : {&qkv_c, &cos_sin_cache})
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kBFloat16, "qk_norm_rope_: qkv and the cos/sin table "
                "must be bf16 CPU tensors");
  const bool f32_scale = q_weight.scalar_type() == at::kFloat;
  for (const at::Tensor* t : {&q_weight, &k_weight})
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == (f32_scale ? at::kFloat : at::kBFloat16),
                "qk_norm_rope_: the norm weights must be both bf16 or both fp32 CPU tensors");
  const int64_t heads = num_heads + num_kv_heads;
  TORCH_CHECK(qkv.dim() == 2 && qkv.stride(1) == 1 && qkv.size(1) >= heads * head_dim,
              "qk_norm_rope_: qkv must be [N, >= (H + KV) * D] with unit column stride, got ", qkv.sizes());
  TORCH_CHECK(q_weight.numel() == head_dim && k_weight.numel() == head_dim && q_weight.is_contiguous() &&
                  k_weight.is_contiguous(), "qk_norm_rope_: q/k norm weights must have ", head_dim, " elements");
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.dim() == 1 && positions.size(0) == qkv.size(0),
              "qk_norm_rope_: positions must be int64 [N]");
  TORCH_CHECK(cos_sin_cache.dim() == 2 && cos_sin_cache.is_contiguous() && cos_sin_cache.size(1) <= head_dim &&
                  cos_sin_cache.size(1) % 2 == 0, "qk_norm_rope_: cos_sin_cache must be [P, rotary_dim <= D]");
  const int64_t n = qkv.size(0), ld = qkv.stride(0), rd = cos_sin_cache.size(1), max_pos = cos_sin_cache.size(0);
  at::Tensor pos = positions.contiguous();
  const int64_t* pp = pos.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i)
    TORCH_CHECK(pp[i] >= 0 && pp[i] < max_pos, "qk_norm_rope_: position ", pp[i], " out of range");
  uint16_t* xp = reinterpret_cast<uint16_t*>(qkv.data_ptr<at::BFloat16>());
  const uint16_t* qw = f32_scale ? nullptr : reinterpret_cast<const uint16_t*>(q_weight.data_ptr<at::BFloat16>());
  const uint16_t* kw = f32_scale ? nullptr : reinterpret_cast<const uint16_t*>(k_weight.data_ptr<at::BFloat16>());
  const float* qs = f32_scale ? q_weight.data_ptr<float>() : nullptr;
  const float* ks = f32_scale ? k_weight.data_ptr<float>() : nullptr;
  const uint16_t* cp = reinterpret_cast<const uint16_t*>(cos_sin_cache.data_ptr<at::BFloat16>());
  const float feps = (float)eps;
  sgl_cpu::parallel_for(0, n, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      uint16_t* row = xp + r * ld;
      for (int64_t h = 0; h < heads; ++h) {
        uint16_t* x = row + h * head_dim;
        if (f32_scale)
          sgl_cpu::rmsnorm_row_f32_scale(x, nullptr, h < num_heads ? qs : ks, x, nullptr, head_dim, feps);
        else
          sgl_cpu::rmsnorm_row(x, nullptr, h < num_heads ? qw : kw, x, nullptr, head_dim, feps);
      }
      sgl_cpu::rope_heads(row, heads, head_dim, cp + pp[r] * rd, rd);
    }
  });
}

}  // namespace
