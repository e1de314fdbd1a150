// The mla_decode / mla_extend bindings (included by bindings.cpp only): multi-head latent attention in the absorbed
// form (docs/cpu_kernels.md, "MLA"), over a latent pool of one row [c_kv | k_pe] of width L per token, whose first
// kv_lora columns are V. The kernel by the pool's dtype and the level the module dispatches on:
//   bf16 pool  mla_attention.h                               level avx512_bf16 and up
//   fp32 pool  mla_attention_f32_impl.h, 512-bit / 256-bit    level avx512_vnni and up / avx2
// Decode is extend with one new token per request (prefix seq_len - 1): the same rows, tasks and arithmetic, so a
// prompt's row i equals the decode of that token bit for bit. New latent rows, where given, are written to the pool
// at out_cache_loc first. Tasks (mla_tasks): a block of a request's consecutive rows with every head, or one row with
// a group of heads; split over the threads by keys x rows x heads.
#pragma once

#include <torch/extension.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "extend_attention_op.h"  // ExtendRows, decode_ptr
#include "kernels_f32.h"
#include "mla_attention.h"

namespace sgl_cpu {

namespace f32_avx512 {
#define SGL_F32_TARGET SGL_AVX512
#include "mla_attention_f32_impl.h"
#undef SGL_F32_TARGET
}  // namespace f32_avx512

namespace f32_avx2 {
#define SGL_F32_TARGET SGL_AVX2
#include "mla_attention_f32_impl.h"
#undef SGL_F32_TARGET
}  // namespace f32_avx2

// A task's scores stay below this many floats (8 MiB) unless a single head needs more: long contexts split the heads.
constexpr int64_t kMlaScratchFloats = int64_t(1) << 21;

inline void mla_row_task(const uint16_t* q, int64_t hg, const uint16_t* cache, int64_t L, int64_t kv,
                         const int64_t* tokens, int64_t len, int64_t per_row, float scale, float* scratch,
                         uint16_t* out) {
  mla_attention_row(q, hg, cache, L, kv, tokens, len, per_row, scale, scratch, out);
}
inline void mla_row_task(const float* q, int64_t hg, const float* cache, int64_t L, int64_t kv, const int64_t* tokens,
                         int64_t len, int64_t per_row, float scale, float* scratch, float* out) {
  SGL_F32_CALL(mla_attention_row, q, hg, cache, L, kv, tokens, len, per_row, scale, scratch, out);
}

// A task: query rows [r0, r0 + rows) of one request and their heads [h0, h0 + heads) (rows > 1: all heads).
struct MlaTask {
  int64_t r0, rows, h0, heads;
};

// The tasks of a batch. Heads per task: all H, or fewer where rows alone give under 2 tasks per thread or one row's
// scores would pass the cap (a multiple of the output tile's 8 heads, 4 for 4-8 heads). With all heads, a request's
// consecutive new rows are blocked (up to 16, within the cap, at least 2 blocks per thread): every key row is read
// once for the block, the causal keys past a row's own getting probability 0.
inline std::vector<MlaTask> mla_tasks(const ExtendRows& e, int64_t N, int64_t H, int64_t kv, int64_t* scratch_floats) {
  const int64_t threads = ThreadPool::instance().num_threads();
  const int64_t per_head = mla_scores_ld(e.max_len) + 1 + kv;  // a head's scratch at the longest row
  int64_t hg = H;
  if (N < 2 * threads) {
    const int64_t parts = (2 * threads + N - 1) / std::max<int64_t>(N, 1);
    hg = (H + parts - 1) / parts;
  }
  hg = std::min(hg, std::max<int64_t>(1, kMlaScratchFloats / per_head));
  const int64_t unit = hg > 8 ? 8 : 4;
  hg = std::min(H, std::max<int64_t>(unit, (hg + unit - 1) / unit * unit));
  int64_t block = 1;
  if (hg == H)
    block = std::max<int64_t>(1, std::min({int64_t(16), kMlaScratchFloats / (H * per_head), N / (2 * threads)}));
  std::vector<MlaTask> tasks;
  const int64_t B = (int64_t)e.q_start.size() - 1;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t r = e.q_start[b]; r < e.q_start[b + 1]; r += block) {
      const int64_t rows = std::min(block, e.q_start[b + 1] - r);
      for (int64_t h0 = 0; h0 < H; h0 += hg) tasks.push_back({r, rows, h0, std::min(hg, H - h0)});
    }
  *scratch_floats = std::max(hg, block * H) * per_head;
  return tasks;
}

// q [N, H, L]; the latent pool as [slots, L] (from [slots, 1, L]); k_new [N, 1, L] and loc [N] or both absent.
template <typename T>
at::Tensor mla_attention_t(const char* op, const at::Tensor& q, at::Tensor& kv_cache, int64_t kv,
                           const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                           const at::Tensor& prefix_lens, const at::Tensor& extend_lens, double scale,
                           const c10::optional<at::Tensor>& k_new, const c10::optional<at::Tensor>& loc) {
  TORCH_CHECK(q.dim() == 3, op, ": q must be [tokens, heads, L], got ", q.sizes());
  TORCH_CHECK(kv_cache.is_contiguous() && (kv_cache.dim() == 2 || (kv_cache.dim() == 3 && kv_cache.size(1) == 1)),
              op, ": kv_cache must be a contiguous latent pool [slots, 1, L] (one row per token), got ",
              kv_cache.sizes());
  const int64_t N = q.size(0), H = q.size(1), L = q.size(2), slots = kv_cache.size(0);
  TORCH_CHECK(kv_cache.size(kv_cache.dim() - 1) == L, op, ": q rows have L = ", L, " values, the pool's rows ",
              kv_cache.size(kv_cache.dim() - 1));
  TORCH_CHECK(kv >= 16 && kv % 16 == 0 && kv < L, op, ": kv_lora_rank ", kv,
              " must be a multiple of 16 below the row width L = ", L, " (the rope part follows it)");
  TORCH_CHECK(H >= 1, op, ": q has no heads");
  T* cache = decode_ptr<T>(kv_cache);
  if (k_new.has_value()) {
    TORCH_CHECK(loc.has_value() && loc->scalar_type() == at::kLong && loc->dim() == 1 && loc->numel() == N, op,
                ": out_cache_loc must be int64 [", N, "] beside the new rows");
    TORCH_CHECK(k_new->scalar_type() == q.scalar_type() && k_new->device().is_cpu(), op,
                ": the new rows must have q's dtype, got ", k_new->scalar_type());
    TORCH_CHECK(k_new->numel() == N * L && k_new->size(0) == N && k_new->stride(-1) == 1 &&
                    k_new->size(k_new->dim() - 1) == L && (k_new->dim() == 2 || k_new->size(1) == 1),
                op, ": the new rows must be [", N, ", 1, ", L, "] with contiguous rows, got ", k_new->sizes());
    at::Tensor lc = loc->contiguous();
    const int64_t* lp = lc.data_ptr<int64_t>();
    for (int64_t i = 0; i < N; ++i)
      TORCH_CHECK(lp[i] >= 0 && lp[i] < slots, op, ": out_cache_loc[", i, "] = ", lp[i], " is outside the pool of ",
                  slots, " slots");
    const T* kp = decode_ptr<T>(*k_new);
    for (int64_t i = 0; i < N; ++i) std::memcpy(cache + lp[i] * L, kp + i * k_new->stride(0), L * sizeof(T));
  }
  const ExtendRows e = extend_rows(op, N, slots, req_to_token, req_pool_indices, prefix_lens, extend_lens);
  at::Tensor qc = q.contiguous();
  const T* qp = decode_ptr<T>(qc);
  at::Tensor out = at::empty({N, H * kv}, q.options());
  T* outp = decode_ptr<T>(out);
  int64_t scratch_floats = 0;
  const std::vector<MlaTask> tasks = mla_tasks(e, N, H, kv, &scratch_floats);
  std::vector<int64_t> cost(tasks.size());
  for (size_t t = 0; t < tasks.size(); ++t)
    cost[t] = (e.len(tasks[t].r0 + tasks[t].rows - 1) + kTaskOverheadKeys) * tasks[t].rows * tasks[t].heads;
  const float fscale = (float)scale;
  parallel_tasks_by_cost(cost, scratch_floats, [&](int64_t i, float* scratch) {
    const MlaTask& t = tasks[i];
    const int64_t last = t.r0 + t.rows - 1;  // the block's rows share their request's keys: the last reads them all
    mla_row_task(qp + (t.r0 * H + t.h0) * L, t.rows * t.heads, cache, L, kv, e.keys(t.r0), e.len(last), t.heads,
                 fscale, scratch, outp + (t.r0 * H + t.h0) * kv);
  });
  return out;
}

inline at::Tensor mla_dispatch(const char* op, const at::Tensor& q, at::Tensor& kv_cache, int64_t kv,
                               const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                               const at::Tensor& prefix_lens, const at::Tensor& extend_lens, double scale,
                               const c10::optional<at::Tensor>& k_new, const c10::optional<at::Tensor>& loc) {
  const auto dtype = q.scalar_type();
  TORCH_CHECK(q.device().is_cpu() && kv_cache.device().is_cpu(), op, ": q and kv_cache must be CPU tensors");
  TORCH_CHECK(kv_cache.scalar_type() == dtype, op, ": q and kv_cache must have one dtype, got ", dtype, " and ",
              kv_cache.scalar_type());
  if (dtype == at::kBFloat16) {
    TORCH_CHECK(isa_at_least(CpuIsa::kAvx512Bf16), op, ": bfloat16 needs CPU level avx512_bf16, this module runs at ",
                cpu_isa_name(current_isa()));
    return mla_attention_t<uint16_t>(op, q, kv_cache, kv, req_to_token, req_pool_indices, prefix_lens, extend_lens,
                                     scale, k_new, loc);
  }
  TORCH_CHECK(dtype == at::kFloat, op, ": bfloat16 or float32 tensors, got ", dtype);
  TORCH_CHECK(f32_supported(), op, ": float32 needs CPU level avx2, this module runs at ", cpu_isa_name(current_isa()));
  return mla_attention_t<float>(op, q, kv_cache, kv, req_to_token, req_pool_indices, prefix_lens, extend_lens, scale,
                                k_new, loc);
}

// Causal attention of a prefill's new tokens (q [N, H, L], request after request) over their requests' latent rows,
// prefix included; k_new / out_cache_loc (optional): the new rows, written to the pool first. -> [N, H * kv_lora].
inline at::Tensor mla_extend(const at::Tensor& q, at::Tensor& kv_cache, int64_t kv_lora_rank,
                             const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                             const at::Tensor& prefix_lens, const at::Tensor& extend_lens, double scale,
                             const c10::optional<at::Tensor>& k_new, const c10::optional<at::Tensor>& out_cache_loc) {
  TORCH_CHECK(k_new.has_value() == out_cache_loc.has_value(), "mla_extend: k_new and out_cache_loc go together");
  return mla_dispatch("mla_extend", q, kv_cache, kv_lora_rank, req_to_token, req_pool_indices, prefix_lens,
                      extend_lens, scale, k_new, out_cache_loc);
}

// One new token per request: its row k_new [B, 1, L] written at out_cache_loc, then q [B, H, L] attends over the
// request's first seq_lens[b] rows. -> [B, H * kv_lora].
inline at::Tensor mla_decode(const at::Tensor& q, const at::Tensor& k_new, at::Tensor& kv_cache, int64_t kv_lora_rank,
                             const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                             const at::Tensor& seq_lens, const at::Tensor& out_cache_loc, double scale) {
  TORCH_CHECK(seq_lens.scalar_type() == at::kLong && seq_lens.dim() == 1 && q.dim() == 3 &&
                  seq_lens.numel() == q.size(0), "mla_decode: seq_lens must be int64 [B], one per q row");
  TORCH_CHECK(seq_lens.numel() == 0 || seq_lens.min().item<int64_t>() >= 1, "mla_decode: seq_lens must be >= 1");
  return mla_dispatch("mla_decode", q, kv_cache, kv_lora_rank, req_to_token, req_pool_indices, seq_lens - 1,
                      at::ones_like(seq_lens), scale, k_new, out_cache_loc);
}

}  // namespace sgl_cpu
