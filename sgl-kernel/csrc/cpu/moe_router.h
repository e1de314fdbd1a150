// MoE routing in one call: router logits [M, E] (bf16 or fp32) -> top-k expert weights fp32 [M, k] and ids int32
// [M, k], the computation of layers/moe/router.py's torch path:
//   p = softmax(logits in fp32)      max, e_i = exp(x_i - max), p_i = e_i * (1 / sum e)   (torch's lastdim softmax)
//   the k largest p, in decreasing order; equal probabilities: the lower expert id first
//   renormalize: w_j = p_j / (p_0 + ... + p_{k-1})
// exp is the C library's expf: the weights agree with torch's within a few fp32 ulps (torch uses its own vector exp).
// NaN counts as larger than any number (as torch.topk), so a row with a NaN logit, whose softmax is all NaN, picks
// ids 0..k-1 with NaN weights; a row of -inf logits is all NaN too (x - max = -inf - -inf), as in torch.
// Rows are independent: a token's routing does not depend on its batch mates or the thread count.
#pragma once
#include <torch/extension.h>

#include <cmath>
#include <vector>

#include "parallel.h"

namespace sgl_cpu {

inline bool router_greater(float a, float b) { return (std::isnan(a) && !std::isnan(b)) || a > b; }

// One row: x [E] fp32 -> w [k], ids [k]; p [E] is scratch.
inline void topk_softmax_row(const float* x, int64_t E, int64_t k, bool renormalize, float* p, float* w,
                             int32_t* ids) {
  float mx = x[0];
  for (int64_t i = 1; i < E; ++i)
    if (router_greater(x[i], mx)) mx = x[i];
  float sum = 0.0f;
  for (int64_t i = 0; i < E; ++i) {
    p[i] = std::exp(x[i] - mx);
    sum += p[i];
  }
  const float inv = 1.0f / sum;
  int64_t n = 0;  // w[0, n) holds the largest so far, in decreasing order (ties: earlier id first)
  for (int64_t i = 0; i < E; ++i) {
    const float v = p[i] * inv;
    if (n == k && !router_greater(v, w[k - 1])) continue;
    int64_t j = n < k ? n++ : k - 1;  // the slot the new value takes before it moves up
    for (; j > 0 && router_greater(v, w[j - 1]); --j) {
      w[j] = w[j - 1];
      ids[j] = ids[j - 1];
    }
    w[j] = v;
    ids[j] = (int32_t)i;
  }
  if (renormalize) {
    float s = 0.0f;
    for (int64_t j = 0; j < k; ++j) s += w[j];
    for (int64_t j = 0; j < k; ++j) w[j] = w[j] / s;
  }
}

}  // namespace sgl_cpu

namespace {

// router_logits [M, E] bf16 / fp32 -> (topk_weights fp32 [M, k], topk_ids int32 [M, k])
std::tuple<at::Tensor, at::Tensor> topk_softmax(const at::Tensor& logits, int64_t top_k, bool renormalize) {
  TORCH_CHECK(logits.device().is_cpu() && logits.dim() == 2 &&
                  (logits.scalar_type() == at::kBFloat16 || logits.scalar_type() == at::kFloat),
              "topk_softmax: router logits must be a bf16 or fp32 CPU tensor [M, E], got ", logits.scalar_type(), " ",
              logits.sizes());
  const int64_t M = logits.size(0), E = logits.size(1);
  TORCH_CHECK(top_k >= 1 && top_k <= E, "topk_softmax: top_k = ", top_k, " must be in [1, ", E, "]");
  at::Tensor x = logits.contiguous();
  at::Tensor w = at::empty({M, top_k}, logits.options().dtype(at::kFloat));
  at::Tensor ids = at::empty({M, top_k}, logits.options().dtype(at::kInt));
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  const void* xp = x.data_ptr();
  float* wp = w.data_ptr<float>();
  int32_t* ip = ids.data_ptr<int32_t>();
  // rows of 64 experts take ~0.3 us each: share only batches worth a region (prefill chunks)
  sgl_cpu::parallel_for(0, M, 256, [&](int64_t m0, int64_t m1) {
    std::vector<float> buf(2 * E);
    float* row = buf.data();
    for (int64_t m = m0; m < m1; ++m) {
      const float* r;
      if (bf16) {
        const uint16_t* src = static_cast<const uint16_t*>(xp) + m * E;
        for (int64_t i = 0; i < E; ++i) {
          const uint32_t u = (uint32_t)src[i] << 16;
          __builtin_memcpy(row + i, &u, 4);
        }
        r = row;
      } else {
        r = static_cast<const float*>(xp) + m * E;
      }
      sgl_cpu::topk_softmax_row(r, E, top_k, renormalize, row + E, wp + m * top_k, ip + m * top_k);
    }
  });
  return {w, ids};
}

}  // namespace
