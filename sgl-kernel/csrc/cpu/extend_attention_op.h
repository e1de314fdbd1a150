// The extend_attention binding (included by bindings.cpp only): causal attention of a prefill's new tokens over the
// paged KV pool, prefix and new tokens alike read in place through req_to_token (the new tokens' K/V are in the pool
// already: the caller writes them first, as the extend path does for every backend).
//
// Query token i of request b (sequence position prefix_lens[b] + i) attends to the request's tokens [0, prefix + i].
// That is the decode kernel's problem with seq_len = prefix + i + 1, so each (request, new token, KV head) task runs
// decode_attention_task (decode_attention_op.h): the same code and rounding for the prompt as for the tokens decoded
// after it, one pass over the keys per task (a request's keys stay in L1/L2 across its tokens), no gathered copy,
// no mask, nothing padded. Tasks are split over the threads by key count, as for decode.
// A sliding window W (issue 41) keeps that shape: row i reads positions [max(0, prefix + i + 1 - W), prefix + i],
// a shorter key list, and nothing below it (window_keys.h); sinks, logit_cap and loc_map as decode_attention_op.h.
#pragma once

#include <torch/extension.h>

#include <algorithm>
#include <vector>

#include "decode_attention_op.h"

namespace sgl_cpu {

// The rows of an extend batch: request b's new tokens are q rows [q_start[b], q_start[b + 1]); row r of request b
// (sequence position prefix + r - q_start[b]) attends to the first len(r) slots of the request's req_to_token row.
// Built with every index checked (a request's slots inside the pool, within the window and through the map where
// given): the fp/bf16 and the quantized-pool bindings (the latter with neither: first(r) is 0, keys(r) tokens(r)).
struct ExtendRows {
  at::Tensor rpi, pre, ext;  // contiguous int64 copies of req_pool_indices, prefix_lens, extend_lens
  const int64_t* rp = nullptr;
  const int64_t* pp = nullptr;
  const int64_t* table = nullptr;
  int64_t ld_table = 0, max_len = 0;  // max_len: the most keys a row reads
  std::vector<int64_t> q_start, row_req;
  KeyWindow kw;
  RequestKeys req_keys;

  const int64_t* tokens(int64_t r) const { return table + rp[row_req[r]] * ld_table; }
  int64_t len(int64_t r) const { return pp[row_req[r]] + (r - q_start[row_req[r]]) + 1; }
  // row r reads positions [first(r), len(r)), their slots at keys(r)
  int64_t first(int64_t r) const { return kw.first(len(r)); }
  const int64_t* keys(int64_t r) const { return req_keys.slots(row_req[r], first(r)); }
  // one task per (row, KV head), in q's row order; its cost is the keys it reads (+ a per-task overhead)
  std::vector<int64_t> task_costs(int64_t kv_heads) const {
    std::vector<int64_t> cost(row_req.size() * kv_heads);
    for (int64_t t = 0; t < (int64_t)cost.size(); ++t) {
      const int64_t r = t / kv_heads;
      cost[t] = len(r) - first(r) + kTaskOverheadKeys;
    }
    return cost;
  }
};

inline ExtendRows extend_rows(const char* op, int64_t rows, int64_t slots, const at::Tensor& req_to_token,
                              const at::Tensor& req_pool_indices, const at::Tensor& prefix_lens,
                              const at::Tensor& extend_lens, const KeyWindow& kw = KeyWindow()) {
  for (auto* t : {&req_to_token, &req_pool_indices, &prefix_lens, &extend_lens})
    TORCH_CHECK(t->scalar_type() == at::kLong && t->device().is_cpu(), op, ": index tensors must be int64 on the CPU");
  TORCH_CHECK(req_to_token.dim() == 2 && req_to_token.stride(1) == 1, op, ": bad req_to_token");
  const int64_t B = req_pool_indices.numel();
  TORCH_CHECK(prefix_lens.numel() == B && extend_lens.numel() == B, op, ": one prefix and extend length per request");
  ExtendRows e;
  e.rpi = req_pool_indices.contiguous();
  e.pre = prefix_lens.contiguous();
  e.ext = extend_lens.contiguous();
  e.rp = e.rpi.data_ptr<int64_t>();
  e.pp = e.pre.data_ptr<int64_t>();
  const int64_t* ep = e.ext.data_ptr<int64_t>();
  e.table = req_to_token.data_ptr<int64_t>();
  e.ld_table = req_to_token.stride(0);
  const int64_t table_rows = req_to_token.size(0), table_len = req_to_token.size(1);
  e.kw = kw;
  e.q_start.assign(B + 1, 0);
  std::vector<int64_t> lo(B), hi(B);
  std::vector<const int64_t*> req_rows(B);
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(e.rp[b] >= 0 && e.rp[b] < table_rows && e.pp[b] >= 0 && ep[b] >= 0 && e.pp[b] + ep[b] <= table_len,
                op, ": index out of range for request ", b);
    e.q_start[b + 1] = e.q_start[b] + ep[b];
    req_rows[b] = e.table + e.rp[b] * e.ld_table;
    hi[b] = e.pp[b] + ep[b];
    lo[b] = std::min(kw.first(e.pp[b] + 1), hi[b]);  // the request's first row reads its earliest key
    e.max_len = std::max(e.max_len, kw.window > 0 ? std::min(kw.window, hi[b]) : hi[b]);  // its longest row's keys
  }
  TORCH_CHECK(e.q_start[B] == rows, op, ": the extend lengths sum to ", e.q_start[B], ", q has ", rows, " rows");
  TORCH_CHECK(request_keys(kw, req_rows, lo, hi, slots, &e.req_keys), op,
              ": req_to_token holds a slot outside the KV pool",
              kw.map ? " (or outside loc_map, or loc_map maps it outside the pool)" : "");
  e.row_req.resize(rows);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t r = e.q_start[b]; r < e.q_start[b + 1]; ++r) e.row_req[r] = b;
  return e;
}

// q [N, H, D] (the batch's new tokens, request after request) -> [N, H * D]. T: uint16_t (bf16) or float.
template <typename T>
at::Tensor extend_attention_t(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                              const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                              const at::Tensor& prefix_lens, const at::Tensor& extend_lens, double scale,
                              const KeyWindow& kw, const float* sinks, float logit_cap) {
  TORCH_CHECK(q.dim() == 3, "extend_attention: q must be [tokens, heads, D]");
  TORCH_CHECK(k_cache.dim() == 3 && k_cache.is_contiguous() && v_cache.is_contiguous() &&
                  v_cache.sizes() == k_cache.sizes(), "extend_attention: caches must be contiguous [slots, KV, D]");
  const int64_t N = q.size(0), H = q.size(1), D = q.size(2), KV = k_cache.size(1);
  const std::vector<int64_t> dims = decode_attention_head_dims();
  TORCH_CHECK(k_cache.size(2) == D && std::find(dims.begin(), dims.end(), D) != dims.end() && H % KV == 0,
              "extend_attention: head_dim ", D, " is not one of the compiled ", c10::IntArrayRef(dims),
              ", or does not match the cache, or heads ", H, " are not a multiple of kv heads ", KV);
  const ExtendRows e = extend_rows("extend_attention", N, k_cache.size(0), req_to_token, req_pool_indices,
                                   prefix_lens, extend_lens, kw);
  at::Tensor qc = q.contiguous();
  const T* qp = decode_ptr<T>(qc);
  const T* kc = decode_ptr<T>(k_cache);
  const T* vc = decode_ptr<T>(v_cache);
  at::Tensor out = at::empty({N, H * D}, q.options());
  T* op = decode_ptr<T>(out);
  const int64_t group = H / KV;
  const float fscale = (float)scale;
  parallel_tasks_by_cost(e.task_costs(KV), 4 * e.max_len, [&](int64_t t, float* scores) {
    const int64_t r = t / KV, kv_head = t % KV, h0 = r * H + kv_head * group;
    decode_attention_task(qp + h0 * D, group, kc, vc, KV, kv_head, D, e.keys(r), e.len(r) - e.first(r), fscale,
                          sinks ? sinks + kv_head * group : nullptr, logit_cap, scores, op + h0 * D);
  });
  return out;
}

// q and both caches bf16 (level avx512_bf16 and up) or all fp32 (level avx2 and up).
inline at::Tensor extend_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                   const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                                   const at::Tensor& prefix_lens, const at::Tensor& extend_lens, double scale,
                                   int64_t sliding_window, const c10::optional<at::Tensor>& sinks, double logit_cap,
                                   const c10::optional<at::Tensor>& loc_map) {
  const KeyWindow kw = key_window("extend_attention", sliding_window, loc_map);
  const float* sink = sink_logits("extend_attention", sinks, q.dim() == 3 ? q.size(1) : -1);
  const float cap = checked_logit_cap("extend_attention", logit_cap);
  const auto dtype = q.scalar_type();
  for (const at::Tensor* t : {&q, &k_cache, &v_cache}) {
    TORCH_CHECK(t->device().is_cpu(), "extend_attention: q and the caches must be CPU tensors");
    TORCH_CHECK(t->scalar_type() == dtype, "extend_attention: q and the caches must have one dtype, got ",
                t->scalar_type(), " and ", dtype);
  }
  if (dtype == at::kBFloat16) {
    TORCH_CHECK(isa_at_least(CpuIsa::kAvx512Bf16), "extend_attention: bfloat16 needs CPU level avx512_bf16, this "
                "module runs at ", cpu_isa_name(current_isa()));
    return extend_attention_t<uint16_t>(q, k_cache, v_cache, req_to_token, req_pool_indices, prefix_lens,
                                        extend_lens, scale, kw, sink, cap);
  }
  TORCH_CHECK(dtype == at::kFloat, "extend_attention: bfloat16 or float32 tensors, got ", dtype);
  TORCH_CHECK(f32_supported(), "extend_attention: float32 needs CPU level avx2, this module runs at ",
              cpu_isa_name(current_isa()));
  return extend_attention_t<float>(q, k_cache, v_cache, req_to_token, req_pool_indices, prefix_lens, extend_lens,
                                   scale, kw, sink, cap);
}

}  // namespace sgl_cpu
