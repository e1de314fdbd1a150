// The two small passes over the vocabulary after the lm_head, on the kernels' own threads: torch's operators run them
// as OpenMP regions, whose threads the server makes sleep when idle (OMP_WAIT_POLICY=PASSIVE), so each such pass over
// one row of logits cost a thread wake-up (~70-100 us) for ~10 us of work.
//   logits_to_float  bf16 [B, V_pad] -> fp32 [B, V], the first V columns (exact: bf16 is the top half of an fp32)
//   argmax_rows      fp32 [B, V] -> int64 [B], the first maximum of each row, torch.max(dim=-1).indices' rule: a NaN
//                    counts as the maximum and the first NaN wins; among equal values the lowest index wins (-0.0
//                    and 0.0 are equal)
#pragma once
#include <torch/extension.h>

#include <cmath>

#include "parallel.h"
#include "vec.h"

namespace sgl_cpu {

SGL_AVX512_BF16 inline void bf16_row_to_float(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load_bf16x16(src + i));
  if (i < n) {
    const int r = (int)(n - i);
    _mm512_mask_storeu_ps(dst + i, (__mmask16)((1u << r) - 1u), load_bf16x16_tail(src + i, r));
  }
}

SGL_AVX512_BF16 inline int64_t argmax_row(const float* x, int64_t n) {
  // pass 1: the maximum, and whether any NaN is present
  __m512 mx = _mm512_set1_ps(-INFINITY);
  __mmask16 nan = 0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    mx = _mm512_max_ps(mx, v);
  }
  float best = _mm512_reduce_max_ps(mx);
  for (int64_t j = i; j < n; ++j) {
    if (std::isnan(x[j])) nan = 1;
    best = x[j] > best ? x[j] : best;
  }
  if (nan) {  // the first NaN
    for (int64_t j = 0; j < n; ++j)
      if (std::isnan(x[j])) return j;
  }
  // pass 2: the first element equal to it (a row of -inf: index 0)
  const __m512 b = _mm512_set1_ps(best);
  for (i = 0; i + 16 <= n; i += 16) {
    const __mmask16 eq = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), b, _CMP_EQ_OQ);
    if (eq) return i + __builtin_ctz((unsigned)eq);
  }
  for (; i < n; ++i)
    if (x[i] == best) return i;
  return 0;
}

}  // namespace sgl_cpu

namespace {

constexpr int64_t kLogitsGrainElems = 1 << 17;  // elements per thread's share below which one thread does it all

at::Tensor logits_to_float(const at::Tensor& logits, int64_t vocab) {
  TORCH_CHECK(logits.device().is_cpu() && logits.scalar_type() == at::kBFloat16 && logits.dim() == 2 &&
                  logits.stride(1) == 1, "logits_to_float: logits must be a bf16 CPU tensor [B, V] with unit column "
              "stride, got ", logits.scalar_type(), " ", logits.sizes());
  TORCH_CHECK(vocab >= 0 && vocab <= logits.size(1), "logits_to_float: vocab ", vocab, " exceeds ", logits.size(1),
              " columns");
  const int64_t B = logits.size(0), ld = logits.stride(0);
  at::Tensor out = at::empty({B, vocab}, logits.options().dtype(at::kFloat));
  const uint16_t* src = reinterpret_cast<const uint16_t*>(logits.data_ptr<at::BFloat16>());
  float* dst = out.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, kLogitsGrainElems / std::max<int64_t>(1, vocab));
  sgl_cpu::parallel_for(0, B, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) sgl_cpu::bf16_row_to_float(src + b * ld, dst + b * vocab, vocab);
  });
  return out;
}

at::Tensor argmax_rows(const at::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2 && x.size(1) > 0 &&
                  x.stride(1) == 1, "argmax_rows: x must be a float32 CPU tensor [B, V > 0] with unit column stride, "
              "got ", x.scalar_type(), " ", x.sizes());
  const int64_t B = x.size(0), V = x.size(1), ld = x.stride(0);
  at::Tensor out = at::empty({B}, x.options().dtype(at::kLong));
  const float* xp = x.data_ptr<float>();
  int64_t* op = out.data_ptr<int64_t>();
  const int64_t grain = std::max<int64_t>(1, kLogitsGrainElems / V);
  sgl_cpu::parallel_for(0, B, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) op[b] = sgl_cpu::argmax_row(xp + b * ld, V);
  });
  return out;
}

}  // namespace
