// The extend_attention binding (included by bindings.cpp only): causal attention of a prefill's new tokens over the
// paged KV pool, prefix and new tokens alike read in place through req_to_token (the new tokens' K/V are in the pool
// already: the caller writes them first, as the extend path does for every backend).
//
// Query token i of request b (sequence position prefix_lens[b] + i) attends to the request's tokens [0, prefix + i].
// That is the decode kernel's problem with seq_len = prefix + i + 1, so each (request, new token, KV head) task runs
// decode_attention_task (decode_attention_op.h): the same code and rounding for the prompt as for the tokens decoded
// after it, one pass over the keys per task (a request's keys stay in L1/L2 across its tokens), no gathered copy,
// no mask, nothing padded. Tasks are split over the threads by key count, as for decode.
#pragma once

#include <torch/extension.h>

#include <algorithm>
#include <vector>

#include "decode_attention_op.h"

namespace sgl_cpu {

// q [N, H, D] (the batch's new tokens, request after request) -> [N, H * D]. T: uint16_t (bf16) or float.
template <typename T>
at::Tensor extend_attention_t(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                              const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                              const at::Tensor& prefix_lens, const at::Tensor& extend_lens, double scale) {
  TORCH_CHECK(q.dim() == 3, "extend_attention: q must be [tokens, heads, D]");
  TORCH_CHECK(k_cache.dim() == 3 && k_cache.is_contiguous() && v_cache.is_contiguous() &&
                  v_cache.sizes() == k_cache.sizes(), "extend_attention: caches must be contiguous [slots, KV, D]");
  const int64_t N = q.size(0), H = q.size(1), D = q.size(2), KV = k_cache.size(1);
  const std::vector<int64_t> dims = decode_attention_head_dims();
  TORCH_CHECK(k_cache.size(2) == D && std::find(dims.begin(), dims.end(), D) != dims.end() && H % KV == 0,
              "extend_attention: head_dim ", D, " is not one of the compiled ", c10::IntArrayRef(dims),
              ", or does not match the cache, or heads ", H, " are not a multiple of kv heads ", KV);
  for (auto* t : {&req_to_token, &req_pool_indices, &prefix_lens, &extend_lens})
    TORCH_CHECK(t->scalar_type() == at::kLong, "extend_attention: index tensors must be int64");
  TORCH_CHECK(req_to_token.dim() == 2 && req_to_token.stride(1) == 1, "extend_attention: bad req_to_token");
  const int64_t B = req_pool_indices.numel();
  TORCH_CHECK(prefix_lens.numel() == B && extend_lens.numel() == B, "extend_attention: one prefix and extend length "
              "per request");
  at::Tensor rpi = req_pool_indices.contiguous(), pre = prefix_lens.contiguous(), ext = extend_lens.contiguous();
  const int64_t* rp = rpi.data_ptr<int64_t>();
  const int64_t* pp = pre.data_ptr<int64_t>();
  const int64_t* ep = ext.data_ptr<int64_t>();
  const int64_t slots = k_cache.size(0), table_rows = req_to_token.size(0), table_len = req_to_token.size(1);
  const int64_t* table = req_to_token.data_ptr<int64_t>();
  const int64_t ld_table = req_to_token.stride(0);
  // the first q row of each request; every slot a request reads must lie inside the pool
  std::vector<int64_t> q_start(B + 1, 0);
  int64_t max_len = 0;
  bool bad_slot = false;
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(rp[b] >= 0 && rp[b] < table_rows && pp[b] >= 0 && ep[b] >= 0 && pp[b] + ep[b] <= table_len,
                "extend_attention: index out of range for request ", b);
    q_start[b + 1] = q_start[b] + ep[b];
    max_len = std::max(max_len, pp[b] + ep[b]);
    const int64_t* tokens = table + rp[b] * ld_table;
    for (int64_t j = 0; j < pp[b] + ep[b]; ++j) bad_slot |= tokens[j] < 0 || tokens[j] >= slots;
  }
  TORCH_CHECK(q_start[B] == N, "extend_attention: the extend lengths sum to ", q_start[B], ", q has ", N, " rows");
  TORCH_CHECK(!bad_slot, "extend_attention: req_to_token holds a slot outside the KV pool");
  at::Tensor qc = q.contiguous();
  const T* qp = decode_ptr<T>(qc);
  const T* kc = decode_ptr<T>(k_cache);
  const T* vc = decode_ptr<T>(v_cache);
  at::Tensor out = at::empty({N, H * D}, q.options());
  T* op = decode_ptr<T>(out);
  const int64_t group = H / KV;
  const float fscale = (float)scale;
  // a task per (new token, KV head), in q's row order; its cost is the keys it reads (+ a per-task overhead)
  const int64_t tasks = N * KV;
  std::vector<int64_t> row_req(N), cost(tasks);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t r = q_start[b]; r < q_start[b + 1]; ++r) row_req[r] = b;
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t r = t / KV, b = row_req[r];
    cost[t] = pp[b] + (r - q_start[b]) + 1 + 16;
  }
  const int64_t parts = std::max<int64_t>(
      1, std::min<int64_t>(ThreadPool::instance().num_threads() * ThreadPool::kChunksPerThread, tasks));
  const std::vector<int64_t> first = split_by_cost(cost, parts);
  parallel_for(0, parts, 1, [&](int64_t p0, int64_t p1) {
    std::vector<float> scores(4 * max_len);
    for (int64_t p = p0; p < p1; ++p)
      for (int64_t t = first[p]; t < first[p + 1]; ++t) {
        const int64_t r = t / KV, kv_head = t % KV, b = row_req[r], h0 = r * H + kv_head * group;
        const int64_t len = pp[b] + (r - q_start[b]) + 1;
        decode_attention_task(qp + h0 * D, group, kc, vc, KV, kv_head, D, table + rp[b] * ld_table, len, fscale,
                              scores.data(), op + h0 * D);
      }
  });
  return out;
}

// q and both caches bf16 (level avx512_bf16 and up) or all fp32 (level avx2 and up).
inline at::Tensor extend_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                   const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                                   const at::Tensor& prefix_lens, const at::Tensor& extend_lens, double scale) {
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
                                        extend_lens, scale);
  }
  TORCH_CHECK(dtype == at::kFloat, "extend_attention: bfloat16 or float32 tensors, got ", dtype);
  TORCH_CHECK(f32_supported(), "extend_attention: float32 needs CPU level avx2, this module runs at ",
              cpu_isa_name(current_isa()));
  return extend_attention_t<float>(q, k_cache, v_cache, req_to_token, req_pool_indices, prefix_lens, extend_lens,
                                   scale);
}

}  // namespace sgl_cpu
