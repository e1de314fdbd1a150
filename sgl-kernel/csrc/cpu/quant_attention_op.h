// The extend_attention_quant binding (included by bindings.cpp only): attention over a quantized KV pool (int8,
// int4, int2_hadamard, fp8_e4m3, fp8_e5m2: decode_attention_quant.h), the codes read in place through req_to_token.
// One op for both forward modes, as extend_attention_op.h: row r of request b attends to the request's first
// prefix + i + 1 tokens; a decode step is an extend of one token per request (prefix_lens = seq_lens - 1,
// extend_lens = 1). The caller has written the new tokens' codes to the pool (the pool's own quantize on write, or
// kv_quant_write). A pool that stores its keys turned (k @ R) passes R as q_turn: each query row is turned in the
// task's fp32 scratch (quant_kv_write.h turn_rows), so q.k is the plain one and no turned copy of q exists outside the
// kernel. Given
// fresh_k / fresh_v (the batch's new K/V in the stored basis), a row attends its request's new tokens as those rows and
// only the cached prefix as codes: a forward's own tokens are attended exactly as computed, as every backend does.
#pragma once

#include <torch/extension.h>

#include <algorithm>
#include <string>
#include <vector>

#include "decode_attention_quant.h"
#include "extend_attention_op.h"
#include "quant_kv_write.h"

namespace sgl_cpu {

inline KvQuant kv_quant_from_name(const std::string& name) {
  if (name == "int8") return KvQuant::kInt8;
  if (name == "int4") return KvQuant::kInt4;
  if (name == "int2_hadamard") return KvQuant::kInt2;
  if (name == "fp8_e4m3") return KvQuant::kFp8E4m3;
  TORCH_CHECK(name == "fp8_e5m2",
              "extend_attention_quant: kv format int8, int4, int2_hadamard, fp8_e4m3 or fp8_e5m2, got ", name);
  return KvQuant::kFp8E5m2;
}

// `heads` rows of D between fp32 scratch and the model's dtype (rows_to_f32: quant_kv_write.h).
SGL_AVX512 inline void rows_from_f32(const float* src, int64_t n, at::BFloat16* dst) {
  for (int64_t i = 0; i < n; i += 16)
    store_bf16x16_soft(reinterpret_cast<uint16_t*>(dst) + i, _mm512_loadu_ps(src + i));
}
inline void rows_from_f32(const float* src, int64_t n, float* dst) { std::copy(src, src + n, dst); }

// One pass of format F over KV head kv_head's column (per-token scales: sr a row, of KvScale<F>).
template <KvQuant F>
inline void quant_pass(int64_t D, int64_t heads, const float* q, const at::Tensor& k_codes, const at::Tensor& v_codes,
                       const at::Tensor& k_scale, const at::Tensor& v_scale, int64_t kv_head, const int64_t* tokens,
                       int64_t len, float k_mul, float v_mul, float* scores, float* out, const FreshRows& fresh) {
  const int64_t KV = k_codes.size(1), kcb = k_codes.size(2), vcb = v_codes.size(2), sr = kv_quant_scales_per_row(F);
  const KvScale<F>* ks = nullptr;
  const KvScale<F>* vs = nullptr;
  if constexpr (kv_quant_per_token(F)) {
    ks = reinterpret_cast<const KvScale<F>*>(k_scale.data_ptr()) + kv_head * sr;
    vs = reinterpret_cast<const KvScale<F>*>(v_scale.data_ptr()) + kv_head * sr;
  }
  const QuantKv<F> c{reinterpret_cast<const uint8_t*>(k_codes.data_ptr()) + kv_head * kcb,
                     reinterpret_cast<const uint8_t*>(v_codes.data_ptr()) + kv_head * vcb, ks, vs, KV * kcb, KV * vcb,
                     KV * sr};
  quant_attention_pass<F>(D, heads, q, c, tokens, len, k_mul, v_mul, scores, out, fresh);
}

template <typename T>
at::Tensor extend_attention_quant_t(KvQuant fmt, const at::Tensor& q, const at::Tensor& k_codes,
                                    const at::Tensor& v_codes, const at::Tensor& k_scale, const at::Tensor& v_scale,
                                    const ExtendRows& e, double scale, const float* turn, const float* smooth,
                                    const float* out_turn, const float* fresh_k, const float* fresh_v,
                                    const uint16_t* ring_k, const uint16_t* ring_v, const int64_t* ring_rows,
                                    const int64_t* ring_counts, const int64_t* sink_counts, int64_t entries,
                                    int64_t window) {
  const int64_t N = q.size(0), H = q.size(1), D = q.size(2), KV = k_codes.size(1);
  const bool per_token = kv_quant_per_token(fmt);
  at::Tensor qc = q.contiguous();
  const T* qp = qc.data_ptr<T>();
  const float* khead = per_token ? nullptr : k_scale.data_ptr<float>();
  const float* vhead = per_token ? nullptr : v_scale.data_ptr<float>();
  const float unit = kv_quant_code_unit(fmt);
  at::Tensor out = at::empty({N, H * D}, q.options());
  T* op = out.data_ptr<T>();
  const int64_t group = H / KV;
  const int64_t max_len = e.max_len;
  parallel_tasks_by_cost(e.task_costs(KV), 4 * max_len + 9 * D, [&](int64_t t, float* scratch) {
    const int64_t r = t / KV, kv_head = t % KV, h0 = r * H + kv_head * group;
    float* scores = scratch;
    float* qf = scratch + 4 * max_len;
    float* of = qf + 4 * D;
    float* tmp = of + 4 * D;
    const float k_mul = (float)scale * (per_token ? 1.0f : khead[kv_head] * unit);
    const float v_mul = per_token ? 1.0f : vhead[kv_head] * unit;
    for (int64_t g0 = 0; g0 < group; g0 += kHeadsPerPass) {
      const int64_t heads = std::min<int64_t>(kHeadsPerPass, group - g0);
      rows_to_f32(qp + (h0 + g0) * D, heads * D, qf);
      if (smooth != nullptr) divide_rows(qf, heads, D, smooth + kv_head * D);  // int4 keys: q / w, then turned
      if (turn != nullptr) turn_rows(qf, heads, D, turn, tmp);
      const int64_t* tokens = e.tokens(r);
      const int64_t len = e.len(r);
      FreshRows fresh;  // the request's new tokens: q rows [q_start, ...) of fresh_k / fresh_v
      if (fresh_k != nullptr) {  // request b: sink_counts[b] sink rows, codes, ring_counts[b] ring rows, new rows
        const int64_t b = e.row_req[r], first = (e.q_start[b] * KV + kv_head) * D;
        const int64_t n_ring = ring_k != nullptr ? ring_counts[b] : 0;
        const int64_t n_sink = ring_k != nullptr && sink_counts != nullptr ? sink_counts[b] : 0;
        fresh = FreshRows{fresh_k + first, fresh_v + first, KV * D, e.pp[b] - n_ring, (float)scale};
        if (n_ring > 0 || n_sink > 0) {
          fresh.ring_k = ring_k + kv_head * D;
          fresh.ring_v = ring_v + kv_head * D;
          fresh.ring_base = ring_rows[b] * entries;
          fresh.window = window;
          fresh.n_ring = n_ring;
          fresh.sink_base = ring_rows[b] * entries + window;
          fresh.n_sink = n_sink;
        }
      }
      switch (fmt) {
#define SGL_PASS(F) \
  quant_pass<F>(D, heads, qf, k_codes, v_codes, k_scale, v_scale, kv_head, tokens, len, k_mul, v_mul, scores, of, fresh)
        case KvQuant::kInt8: SGL_PASS(KvQuant::kInt8); break;
        case KvQuant::kFp8E4m3: SGL_PASS(KvQuant::kFp8E4m3); break;
        case KvQuant::kFp8E5m2: SGL_PASS(KvQuant::kFp8E5m2); break;
        case KvQuant::kInt4: SGL_PASS(KvQuant::kInt4); break;
        case KvQuant::kInt2: SGL_PASS(KvQuant::kInt2); break;
#undef SGL_PASS
      }
      if (out_turn != nullptr) turn_rows(of, heads, D, out_turn, tmp);  // values stored turned: out @ R^T
      rows_from_f32(of, heads * D, op + (h0 + g0) * D);
    }
  });
  return out;
}

// fresh rows t [N, KV, D] fp32 -> bf16 ring entries entry[t] (flat over [ring rows, E]; < 0: not kept), K and V.
SGL_AVX512 inline void write_ring_rows(const char* op, const at::Tensor& entry, const float* fk, const float* fv,
                                       int64_t N, int64_t KV, int64_t D, const at::Tensor& ring_k,
                                       const at::Tensor& ring_v) {
  TORCH_CHECK(entry.scalar_type() == at::kLong && entry.is_contiguous() && entry.numel() == N && entry.device().is_cpu(),
              op, ": ring_write must be a contiguous int64 CPU [N] tensor");
  const int64_t* ep = entry.data_ptr<int64_t>();
  uint16_t* rk = reinterpret_cast<uint16_t*>(ring_k.data_ptr());
  uint16_t* rv = reinterpret_cast<uint16_t*>(ring_v.data_ptr());
  const int64_t ring_entries = ring_k.size(0) * ring_k.size(1);
  for (int64_t t = 0; t < N; ++t) {
    if (ep[t] < 0) continue;
    TORCH_CHECK(ep[t] < ring_entries, op, ": ring entry ", ep[t], " is outside the ring");
    for (int64_t j = 0; j < KV * D; j += 16) {
      store_bf16x16_soft(rk + ep[t] * KV * D + j, _mm512_loadu_ps(fk + t * KV * D + j));
      store_bf16x16_soft(rv + ep[t] * KV * D + j, _mm512_loadu_ps(fv + t * KV * D + j));
    }
  }
}

// An optional [rows, D] fp32 matrix argument's data, or null.
inline const float* optional_matrix(const char* op, const char* name, const c10::optional<at::Tensor>& m,
                                    int64_t rows, int64_t D) {
  if (!m.has_value() || !m->defined()) return nullptr;
  TORCH_CHECK(m->scalar_type() == at::kFloat && m->is_contiguous() && m->dim() == 2 && m->size(0) == rows &&
                  m->size(1) == D,
              op, ": ", name, " must be a contiguous float32 [", rows, ", ", D, "] matrix");
  return m->data_ptr<float>();
}

// q [N, H, D] bf16 or fp32 (the batch's new tokens, request after request) -> [N, H * D] in q's dtype.
//   k_codes, v_codes  [slots, KV, D] int8 (int8) or uint8 (fp8 bytes); int4: [slots, KV, D / 2] (two codes a byte);
//             int2_hadamard: keys [slots, KV, D / 4] (four a byte), values [slots, KV, ceil(D / 5)] (trits)
//   k_scale, v_scale  int8: [slots, KV(, 1)] fp16 per token; int4: [slots, KV, 2] fp16 (step, min); int2_hadamard:
//             [slots, KV(, 1)] uint8 log-scale codes; fp8: [KV] fp32
//   q_turn    R [D, D]: the keys are stored turned (q is turned in the scratch; int4 after dividing by q_smooth)
//   q_smooth  int4's key multipliers w [KV, D] of this layer (the keys are stored (k * w) @ R)
//   out_turn  R^T [D, D]: the values are stored turned (int4, int2_hadamard: each output row is turned back before
//             it is stored)
//   fresh_k, fresh_v  [N, KV, D] fp32, the batch's new K/V in the pool's stored basis (keys (k * w) @ R / k @ R as
//             stored, values @ R where turned): a request's new tokens are attended as these rows, its cached prefix
//             as codes (the codes of the new tokens, written by the caller for later forwards, are not read)
//   ring_k, ring_v  [ring rows, E, KV, D] bf16 (with fresh_k): the recent-window rings of this layer
//             (mem_cache/recent_window.py), in the stored basis, E entries a ring row; the ring rows are their own
//             count (the window's rows follow running requests: fewer than req_to_token's), request b's ring row is
//             ring_rows[b]: its last ring_counts[b] cached positions p are read from entry ring_rows[b] x E + p % W
//             instead of their codes (W = ring_window, 0: E); ring_write [N] int64, optional: after the attention,
//             new row t (fresh_k / fresh_v) goes to ring entry ring_write[t] (flat, row x E + entry; < 0: not kept),
//             in bf16 -- the reads above saw the entries it replaces
//   sink_counts, sink_write  (with a ring of E > W entries a row: its last E - W are the attention sinks) request b's
//             first sink_counts[b] positions p are read from entry ring_rows[b] x E + W + p instead of their codes;
//             sink_write [N] int64, optional: new row t also goes to entry sink_write[t] (< 0: none)
inline at::Tensor extend_attention_quant(const at::Tensor& q, const at::Tensor& k_codes, const at::Tensor& v_codes,
                                         const at::Tensor& k_scale, const at::Tensor& v_scale,
                                         const std::string& kv_format, const at::Tensor& req_to_token,
                                         const at::Tensor& req_pool_indices, const at::Tensor& prefix_lens,
                                         const at::Tensor& extend_lens, double scale,
                                         const c10::optional<at::Tensor>& q_turn,
                                         const c10::optional<at::Tensor>& q_smooth,
                                         const c10::optional<at::Tensor>& out_turn,
                                         const c10::optional<at::Tensor>& fresh_k,
                                         const c10::optional<at::Tensor>& fresh_v,
                                         const c10::optional<at::Tensor>& ring_k,
                                         const c10::optional<at::Tensor>& ring_v,
                                         const c10::optional<at::Tensor>& ring_rows,
                                         const c10::optional<at::Tensor>& ring_counts,
                                         const c10::optional<at::Tensor>& ring_write,
                                         const c10::optional<at::Tensor>& sink_counts,
                                         const c10::optional<at::Tensor>& sink_write, int64_t ring_window) {
  const char* op = "extend_attention_quant";
  const KvQuant fmt = kv_quant_from_name(kv_format);
  TORCH_CHECK(isa_at_least(CpuIsa::kAvx512Vnni), op, ": needs CPU level avx512_vnni, this module runs at ",
              cpu_isa_name(current_isa()));
  TORCH_CHECK(q.dim() == 3 && q.device().is_cpu() && (q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kFloat),
              op, ": q must be a CPU [tokens, heads, D] bfloat16 or float32 tensor");
  const int64_t N = q.size(0), H = q.size(1), D = q.size(2);
  TORCH_CHECK(k_codes.dim() == 3 && v_codes.dim() == 3 && k_codes.is_contiguous() && v_codes.is_contiguous() &&
                  v_codes.size(0) == k_codes.size(0) && v_codes.size(1) == k_codes.size(1) &&
                  k_codes.element_size() == 1 && v_codes.element_size() == 1 && k_codes.device().is_cpu() &&
                  v_codes.device().is_cpu(),
              op, ": codes must be contiguous one-byte CPU tensors [slots, KV, row bytes]");
  const int64_t slots = k_codes.size(0), KV = k_codes.size(1);
  const int64_t sr = kv_quant_scales_per_row(fmt);
  const std::vector<int64_t> dims = decode_attention_head_dims();
  TORCH_CHECK(k_codes.size(2) == kv_quant_row_bytes(fmt, D, false) &&
                  v_codes.size(2) == kv_quant_row_bytes(fmt, D, true) &&
                  std::find(dims.begin(), dims.end(), D) != dims.end() && H % KV == 0,
              op, ": head_dim ", D, " is not one of the compiled ", c10::IntArrayRef(dims),
              ", or does not match the codes, or heads ", H, " are not a multiple of kv heads ", KV);
  for (const at::Tensor* s : {&k_scale, &v_scale}) {
    TORCH_CHECK(s->device().is_cpu() && s->is_contiguous(), op, ": scales must be contiguous CPU tensors");
    if (fmt == KvQuant::kInt2) {
      TORCH_CHECK(s->scalar_type() == at::kByte && s->numel() == slots * KV && s->size(0) == slots, op,
                  ": int2_hadamard scales must be uint8 [slots, KV, 1]");
    } else if (kv_quant_per_token(fmt)) {
      TORCH_CHECK(s->scalar_type() == at::kHalf && s->numel() == slots * KV * sr && s->size(0) == slots, op,
                  ": int8 scales must be float16 [slots, KV, 1], int4's [slots, KV, 2]");
    } else {
      TORCH_CHECK(s->scalar_type() == at::kFloat && s->numel() == KV, op, ": fp8 scales must be float32 [KV]");
    }
  }
  const float* turn = optional_matrix(op, "q_turn", q_turn, D, D);
  const float* smooth = optional_matrix(op, "q_smooth", q_smooth, KV, D);
  const float* back = optional_matrix(op, "out_turn", out_turn, D, D);
  const bool has_fresh = fresh_k.has_value() && fresh_k->defined();
  TORCH_CHECK(has_fresh == (fresh_v.has_value() && fresh_v->defined()), op, ": fresh_k and fresh_v come together");
  const float* fk = nullptr;
  const float* fv = nullptr;
  if (has_fresh) {
    for (const at::Tensor* f : {&*fresh_k, &*fresh_v})
      TORCH_CHECK(f->scalar_type() == at::kFloat && f->is_contiguous() && f->device().is_cpu() && f->dim() == 3 &&
                      f->size(0) == N && f->size(1) == KV && f->size(2) == D,
                  op, ": fresh_k / fresh_v must be contiguous float32 CPU [", N, ", ", KV, ", ", D, "] tensors");
    fk = fresh_k->data_ptr<float>();
    fv = fresh_v->data_ptr<float>();
  }
  const ExtendRows e = extend_rows(op, N, slots, req_to_token, req_pool_indices, prefix_lens, extend_lens);
  const bool has_ring = ring_k.has_value() && ring_k->defined();
  TORCH_CHECK(!has_ring || (has_fresh && ring_v.has_value() && ring_rows.has_value() && ring_counts.has_value()), op,
              ": ring_k comes with ring_v, ring_rows, ring_counts and fresh_k / fresh_v");
  at::Tensor rr, rc, sc;
  const uint16_t* rk = nullptr;
  const uint16_t* rv = nullptr;
  int64_t entries = 1, window = 1;
  if (has_ring) {
    const int64_t B = (int64_t)e.q_start.size() - 1;
    for (const at::Tensor* t : {&*ring_k, &*ring_v})
      TORCH_CHECK(t->scalar_type() == at::kBFloat16 && t->is_contiguous() && t->device().is_cpu() && t->dim() == 4 &&
                      t->sizes() == ring_k->sizes() && t->size(0) >= 1 && t->size(1) >= 1 && t->size(2) == KV &&
                      t->size(3) == D,
                  op, ": ring_k / ring_v must be contiguous bfloat16 CPU [ring rows, entries, ", KV, ", ", D,
                  "] tensors");
    rr = ring_rows->contiguous();
    rc = ring_counts->contiguous();
    TORCH_CHECK(rr.scalar_type() == at::kLong && rc.scalar_type() == at::kLong && rr.numel() == B && rc.numel() == B &&
                    rr.device().is_cpu() && rc.device().is_cpu(),
                op, ": ring_rows / ring_counts must be int64 CPU tensors of one entry per request");
    const int64_t* rrp = rr.data_ptr<int64_t>();
    const int64_t* rcp = rc.data_ptr<int64_t>();
    const int64_t ring_count = ring_k->size(0);
    entries = ring_k->size(1);
    window = ring_window > 0 ? ring_window : entries;
    TORCH_CHECK(window <= entries, op, ": ring_window ", window, " exceeds the ring's ", entries, " entries a row");
    const bool has_sinks = sink_counts.has_value() && sink_counts->defined();
    TORCH_CHECK(!has_sinks || entries > window, op, ": sink_counts needs a ring with sink entries (ring_window < E)");
    if (has_sinks) {
      sc = sink_counts->contiguous();
      TORCH_CHECK(sc.scalar_type() == at::kLong && sc.numel() == B && sc.device().is_cpu(), op,
                  ": sink_counts must be an int64 CPU tensor of one entry per request");
    }
    const int64_t* scp = has_sinks ? sc.data_ptr<int64_t>() : nullptr;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t n_sink = scp != nullptr ? scp[b] : 0;
      TORCH_CHECK(rrp[b] >= 0 && rrp[b] < ring_count && rcp[b] >= 0 && rcp[b] <= std::min(window, e.pp[b]) &&
                      n_sink >= 0 && n_sink <= entries - window && n_sink + rcp[b] <= e.pp[b],
                  op, ": request ", b, "'s ring row or counts are out of range");
    }
    rk = reinterpret_cast<const uint16_t*>(ring_k->data_ptr());
    rv = reinterpret_cast<const uint16_t*>(ring_v->data_ptr());
  }
  const int64_t* rrp = has_ring ? rr.data_ptr<int64_t>() : nullptr;
  const int64_t* rcp = has_ring ? rc.data_ptr<int64_t>() : nullptr;
  const int64_t* scp = sc.defined() ? sc.data_ptr<int64_t>() : nullptr;
  at::Tensor out = q.scalar_type() == at::kBFloat16
      ? extend_attention_quant_t<at::BFloat16>(fmt, q, k_codes, v_codes, k_scale, v_scale, e, scale, turn, smooth,
                                               back, fk, fv, rk, rv, rrp, rcp, scp, entries, window)
      : extend_attention_quant_t<float>(fmt, q, k_codes, v_codes, k_scale, v_scale, e, scale, turn, smooth, back,
                                        fk, fv, rk, rv, rrp, rcp, scp, entries, window);
  if (has_ring) {  // after every read: the new rows into the ring (and the sinks)
    for (const c10::optional<at::Tensor>* w : {&ring_write, &sink_write})
      if (w->has_value() && (*w)->defined()) write_ring_rows(op, **w, fk, fv, N, KV, D, *ring_k, *ring_v);
  }
  return out;
}

}  // namespace sgl_cpu
