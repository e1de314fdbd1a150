// Attention tasks over the kernel thread pool, split by cost: decode, extend and their quantized-pool forms run one
// task per (query row, KV head) whose cost is the keys it reads, and mixed lengths would leave a thread idle with an
// even split by count. One helper for all of them (decode_attention_op.h, extend_attention_op.h,
// quant_attention_op.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "parallel.h"

namespace sgl_cpu {

// A task's fixed overhead, in key equivalents (added to its key count as its cost).
constexpr int64_t kTaskOverheadKeys = 16;

// Tasks [0, n) with costs, split over `parts` contiguous ranges of about equal total cost: part p gets
// [first[p], first[p + 1]).
inline std::vector<int64_t> split_by_cost(const std::vector<int64_t>& cost, int64_t parts) {
  std::vector<int64_t> first(parts + 1, (int64_t)cost.size());
  int64_t total = 0;
  for (int64_t c : cost) total += c;
  int64_t acc = 0, p = 0;
  first[0] = 0;
  for (int64_t t = 0; t < (int64_t)cost.size() && p + 1 < parts; ++t) {
    acc += cost[t];
    while (p + 1 < parts && acc * parts >= total * (p + 1)) first[++p] = t + 1;
  }
  return first;
}

// run(task, scratch) for every task, the tasks split by cost over about kChunksPerThread ranges per kernel thread;
// each range's thread gets `scratch_floats` floats of scratch (reused across the tasks it runs).
template <typename F>
inline void parallel_tasks_by_cost(const std::vector<int64_t>& cost, int64_t scratch_floats, const F& run) {
  const int64_t tasks = (int64_t)cost.size();
  if (tasks == 0) return;
  const int64_t parts = std::max<int64_t>(
      1, std::min<int64_t>(ThreadPool::instance().num_threads() * ThreadPool::kChunksPerThread, tasks));
  const std::vector<int64_t> first = split_by_cost(cost, parts);
  parallel_for(0, parts, 1, [&](int64_t p0, int64_t p1) {
    std::vector<float> scratch(scratch_floats);
    for (int64_t p = p0; p < p1; ++p)
      for (int64_t t = first[p]; t < first[p + 1]; ++t) run(t, scratch.data());
  });
}

}  // namespace sgl_cpu
