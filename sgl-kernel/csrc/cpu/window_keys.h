// Which key slots a decode / extend attention row reads, under a sliding window and a token-pool -> buffer slot map
// (the windowed KV pool of issue 41, docs/architecture.md). Shared by decode_attention_op.h and extend_attention_op.h.
//
// A window W >= 1: the query at position q sees keys q - W + 1 .. q (W keys with itself, HF transformers' sliding
// mask). A row of a request whose sequence so far is len tokens long (query position len - 1) therefore reads exactly
// positions [max(0, len - W), len): no mask, no key outside the window is touched. That matters: the runtime frees
// the windowed pages below the window, so the req_to_token entries there may be stale and their map entries 0 (the
// dummy page); only positions a row reads are checked, and only they are translated.
//
// The map (int32, indexed by token-pool slot) names the slot of the buffer the layer reads; req_to_token holds
// token-pool slots for every layer. Without a map the kernels read req_to_token's row in place (the path of every
// full-attention model, unchanged); with one, each request's visible slots are translated once per call into one
// int64 array before the threads start, and every (row, KV head) task reads its part of it.
#pragma once

#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace sgl_cpu {

struct KeyWindow {
  int64_t window = -1;             // -1: every key up to the query; else W >= 1
  const int32_t* map = nullptr;    // token-pool slot -> buffer slot; null: the identity
  int64_t map_len = 0;             // entries of map

  // The first position a query at position len - 1 reads.
  int64_t first(int64_t len) const { return window > 0 ? std::max<int64_t>(0, len - window) : 0; }
};

// The window and map arguments of the bindings, checked: window -1 or >= 1, map a contiguous int32 CPU vector.
inline KeyWindow key_window(const char* op, int64_t sliding_window, const c10::optional<at::Tensor>& loc_map) {
  TORCH_CHECK(sliding_window == -1 || sliding_window >= 1, op, ": sliding_window must be -1 (no window) or >= 1 keys, got ",
              sliding_window);
  KeyWindow kw;
  kw.window = sliding_window;
  if (loc_map.has_value()) {
    TORCH_CHECK(loc_map->device().is_cpu() && loc_map->scalar_type() == at::kInt && loc_map->dim() == 1 &&
                    loc_map->is_contiguous(),
                op, ": loc_map must be a contiguous int32 CPU vector (token-pool slot -> buffer slot), got ",
                loc_map->scalar_type(), " ", loc_map->sizes());
    kw.map = loc_map->data_ptr<int32_t>();
    kw.map_len = loc_map->numel();
  }
  return kw;
}

// Per request b: the slots of positions [lo[b], hi[b]) as the kernels read them. slots(b, a) points at position a's
// (lo[b] <= a): the table row itself without a map, else the request's translated copy.
struct RequestKeys {
  std::vector<int64_t> lo, offset;  // offset: where request b's translated slots start in `mapped` (map only)
  std::vector<int64_t> mapped;
  std::vector<const int64_t*> row;  // req_to_token's row of request b
  bool has_map = false;

  const int64_t* slots(int64_t b, int64_t a) const {
    return has_map ? mapped.data() + offset[b] + (a - lo[b]) : row[b] + a;
  }
};

// rows[b]: request b's req_to_token row; [lo[b], hi[b]) the positions its rows read. False when a read slot (after
// the map) lies outside [0, slots) or a token-pool slot outside the map.
inline bool request_keys(const KeyWindow& kw, const std::vector<const int64_t*>& rows, const std::vector<int64_t>& lo,
                         const std::vector<int64_t>& hi, int64_t slots, RequestKeys* out) {
  const int64_t B = (int64_t)rows.size();
  out->lo = lo;
  out->row = rows;
  out->has_map = kw.map != nullptr;
  bool bad = false;
  if (!out->has_map) {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = lo[b]; j < hi[b]; ++j) bad |= rows[b][j] < 0 || rows[b][j] >= slots;
    return !bad;
  }
  out->offset.assign(B, 0);
  int64_t total = 0;
  for (int64_t b = 0; b < B; ++b) {
    out->offset[b] = total;
    total += std::max<int64_t>(0, hi[b] - lo[b]);
  }
  out->mapped.resize(total);
  for (int64_t b = 0; b < B; ++b) {
    int64_t* dst = out->mapped.data() + out->offset[b];
    for (int64_t j = lo[b]; j < hi[b]; ++j) {
      const int64_t t = rows[b][j];
      const bool in_map = t >= 0 && t < kw.map_len;
      const int64_t s = in_map ? (int64_t)kw.map[t] : -1;
      bad |= s < 0 || s >= slots;
      dst[j - lo[b]] = s;
    }
  }
  return !bad;
}

// The buffer slot a token-pool slot writes to; -1 when it (or its map entry) is out of range.
inline int64_t mapped_slot(const KeyWindow& kw, int64_t slot, int64_t slots) {
  if (kw.map != nullptr) slot = slot >= 0 && slot < kw.map_len ? (int64_t)kw.map[slot] : -1;
  return slot >= 0 && slot < slots ? slot : -1;
}

// The sinks argument: one fp32 logit per query head (or none).
inline const float* sink_logits(const char* op, const c10::optional<at::Tensor>& sinks, int64_t heads) {
  if (!sinks.has_value()) return nullptr;
  TORCH_CHECK(sinks->device().is_cpu() && sinks->scalar_type() == at::kFloat && sinks->is_contiguous() &&
                  sinks->numel() == heads,
              op, ": sinks must be a contiguous fp32 CPU tensor of one logit per query head (", heads, "), got ",
              sinks->scalar_type(), " ", sinks->sizes());
  return sinks->data_ptr<float>();
}

inline float checked_logit_cap(const char* op, double logit_cap) {
  TORCH_CHECK(logit_cap >= 0.0, op, ": logit_cap must be 0 (none) or positive, got ", logit_cap);
  return (float)logit_cap;
}

}  // namespace sgl_cpu
