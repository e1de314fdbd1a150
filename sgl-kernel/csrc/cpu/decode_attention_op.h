// The decode_attention binding (included by bindings.cpp only): argument checks, the new K/V written to the pool,
// the tasks split over the threads; the kernel by the pool's dtype and the level the module dispatches on:
//   bf16 pool  decode_attention.h                      level avx512_bf16 and up
//   fp32 pool  decode_attention_f32_impl.h, 512-bit    level avx512_vnni and up
//              the same algorithm, 256-bit (AVX2)      level avx2
// Windowed layers (issue 41): sliding_window, sinks, logit_cap and the slot map loc_map (window_keys.h); the defaults
// (-1, none, 0, none) take exactly the path of a full-attention layer.
#pragma once

#include <torch/extension.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "decode_attention.h"
#include "isa.h"
#include "kernels_f32.h"
#include "parallel.h"
#include "task_split.h"
#include "window_keys.h"

namespace sgl_cpu {

// The bf16 kernel, and the current level's fp32 one: each (request, KV head) task's heads in place.
inline void decode_attention_task(const uint16_t* q, int64_t group, const uint16_t* kc, const uint16_t* vc,
                                  int64_t kv_heads, int64_t kv_head, int64_t d, const int64_t* tokens, int64_t len,
                                  float scale, const float* sinks, float logit_cap, float* scores, uint16_t* out) {
  decode_attention_group(q, group, kc, vc, kv_heads, kv_head, d, tokens, len, scale, sinks, logit_cap, scores, out);
}
inline void decode_attention_task(const float* q, int64_t group, const float* kc, const float* vc, int64_t kv_heads,
                                  int64_t kv_head, int64_t d, const int64_t* tokens, int64_t len, float scale,
                                  const float* sinks, float logit_cap, float* scores, float* out) {
  SGL_F32_CALL(decode_attention_group, q, group, kc, vc, kv_heads, kv_head, d, tokens, len, scale, sinks, logit_cap,
               scores, out);
}

template <typename T>
inline T* decode_ptr(const at::Tensor& t) {
  return reinterpret_cast<T*>(t.data_ptr());
}

// Writes the new k/v [B, KV, D] to the pool at out_cache_loc (through the map), then attends q [B, H, D] over each
// request's tokens req_to_token[req_pool_indices[b], first:seq_lens[b]] -> [B, H * D], first = kw.first(seq_lens[b]).
// T: uint16_t (bf16) or float.
template <typename T>
at::Tensor decode_attention_t(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& k_cache,
                              at::Tensor& v_cache, const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                              const at::Tensor& seq_lens, const at::Tensor& out_cache_loc, double scale,
                              const KeyWindow& kw, const float* sinks, float logit_cap) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, "decode_attention: q, k, v must be [B, heads, D]");
  TORCH_CHECK(k_cache.dim() == 3 && k_cache.is_contiguous() && v_cache.is_contiguous() &&
                  v_cache.sizes() == k_cache.sizes(), "decode_attention: caches must be contiguous [slots, KV, D]");
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2), KV = k_cache.size(1);
  TORCH_CHECK(k_cache.size(2) == D && k.size(1) == KV && v.size(1) == KV && k.size(2) == D && v.size(2) == D &&
                  k.size(0) == B && v.size(0) == B, "decode_attention: head shapes do not match");
  const std::vector<int64_t> dims = decode_attention_head_dims();
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
  const int64_t* table = req_to_token.data_ptr<int64_t>();
  const int64_t ld_table = req_to_token.stride(0);
  int64_t max_len = 0;
  std::vector<int64_t> write(B), lo(B), hi(lp, lp + B);
  std::vector<const int64_t*> rows(B);
  for (int64_t b = 0; b < B; ++b) {
    write[b] = mapped_slot(kw, locp[b], slots);
    TORCH_CHECK(rp[b] >= 0 && rp[b] < table_rows && lp[b] >= 1 && lp[b] <= table_len && write[b] >= 0,
                "decode_attention: index out of range for request ", b, kw.map ? " (out_cache_loc through loc_map)" : "");
    rows[b] = table + rp[b] * ld_table;
    lo[b] = kw.first(lp[b]);
    max_len = std::max(max_len, lp[b] - lo[b]);
  }
  // 1. the new tokens' K and V into the pool (heads contiguous within a token for k, v and the pool)
  T* kc = decode_ptr<T>(k_cache);
  T* vc = decode_ptr<T>(v_cache);
  TORCH_CHECK(k.stride(2) == 1 && v.stride(2) == 1 && k.stride(1) == D && v.stride(1) == D,
              "decode_attention: k/v heads must be contiguous");
  const T* kp = decode_ptr<T>(k);
  const T* vp = decode_ptr<T>(v);
  for (int64_t b = 0; b < B; ++b) {
    std::memcpy(kc + write[b] * KV * D, kp + b * k.stride(0), KV * D * sizeof(T));
    std::memcpy(vc + write[b] * KV * D, vp + b * v.stride(0), KV * D * sizeof(T));
  }
  // 2. every slot the requests will read (inside their windows, through the map) must lie inside the pool
  RequestKeys keys;
  const bool bad_slot = !request_keys(kw, rows, lo, hi, slots, &keys);
  // 3. attention
  at::Tensor qc = q.contiguous();
  const T* qp = decode_ptr<T>(qc);
  at::Tensor out = at::empty({B, H * D}, q.options());
  T* op = decode_ptr<T>(out);
  const int64_t group = H / KV;
  const float fscale = (float)scale;
  if (!bad_slot) {
    // a task per (request, KV head) serves the query heads of its group, split over the threads by key count
    const int64_t tasks = B * KV;
    std::vector<int64_t> cost(tasks);
    for (int64_t t = 0; t < tasks; ++t) cost[t] = hi[t / KV] - lo[t / KV] + kTaskOverheadKeys;
    parallel_tasks_by_cost(cost, 4 * max_len, [&](int64_t t, float* scores) {
      const int64_t b = t / KV, kv_head = t % KV, h0 = b * H + kv_head * group;
      decode_attention_task(qp + h0 * D, group, kc, vc, KV, kv_head, D, keys.slots(b, lo[b]), hi[b] - lo[b], fscale,
                            sinks ? sinks + kv_head * group : nullptr, logit_cap, scores, op + h0 * D);
    });
  }
  TORCH_CHECK(!bad_slot, "decode_attention: req_to_token holds a slot outside the KV pool",
              kw.map ? " (or outside loc_map, or loc_map maps it outside the pool)" : "");
  return out;
}

// All of q, k, v and both caches bf16 (level avx512_bf16 and up) or all fp32 (level avx2 and up).
inline at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& k_cache,
                                   at::Tensor& v_cache, const at::Tensor& req_to_token,
                                   const at::Tensor& req_pool_indices, const at::Tensor& seq_lens,
                                   const at::Tensor& out_cache_loc, double scale, int64_t sliding_window,
                                   const c10::optional<at::Tensor>& sinks, double logit_cap,
                                   const c10::optional<at::Tensor>& loc_map) {
  const KeyWindow kw = key_window("decode_attention", sliding_window, loc_map);
  const float* sink = sink_logits("decode_attention", sinks, q.dim() == 3 ? q.size(1) : -1);
  const float cap = checked_logit_cap("decode_attention", logit_cap);
  const auto dtype = q.scalar_type();
  for (const at::Tensor* t : {&q, &k, &v, (const at::Tensor*)&k_cache, (const at::Tensor*)&v_cache}) {
    TORCH_CHECK(t->device().is_cpu(), "decode_attention: q, k, v and the caches must be CPU tensors");
    TORCH_CHECK(t->scalar_type() == dtype, "decode_attention: q, k, v and the caches must have one dtype, got ",
                t->scalar_type(), " and ", dtype);
  }
  if (dtype == at::kBFloat16) {
    TORCH_CHECK(isa_at_least(CpuIsa::kAvx512Bf16), "decode_attention: bfloat16 needs CPU level avx512_bf16, this "
                "module runs at ", cpu_isa_name(current_isa()));
    return decode_attention_t<uint16_t>(q, k, v, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                                        out_cache_loc, scale, kw, sink, cap);
  }
  TORCH_CHECK(dtype == at::kFloat, "decode_attention: bfloat16 or float32 tensors, got ", dtype);
  TORCH_CHECK(f32_supported(), "decode_attention: float32 needs CPU level avx2, this module runs at ",
              cpu_isa_name(current_isa()));
  return decode_attention_t<float>(q, k, v, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, out_cache_loc,
                                   scale, kw, sink, cap);
}

}  // namespace sgl_cpu
