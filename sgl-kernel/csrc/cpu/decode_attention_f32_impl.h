// Decode attention over an fp32 KV pool, written once over a vector type V (vec_f32.h) and compiled per level:
// kernels_f32.h includes this file once per level, inside that level's namespace, with SGL_F32_TARGET set to its
// target attribute and V to its vector type. No include guard on purpose.
//
// The algorithm of decode_attention.h (one task per (request, KV head), the G <= 4 query heads of its group served
// together so that each key and value row is read once for all of them, keys and values read in place through
// req_to_token, fp32 softmax), on fp32 rows: q . k with FMAs and one horizontal sum per (key, head), scores kept per
// head ([G][seq_len]) so the softmax runs on contiguous rows, each value row loaded once per pass and multiply-added
// for every head. Output fp32.
//
//   q        [group, D] fp32   the query heads of one KV head
//   k_cache  [slots, kv_heads, D] fp32, v_cache likewise
//   tokens   [seq_len] int64   KV slots of the request's tokens, oldest first
//   scores   [4 * seq_len] fp32 scratch
//   sinks    [group] fp32 or null: a learned logit per head joining its softmax denominator; logit_cap > 0: soft-capping
// (both as decode_attention.h).

template <int D>
SGL_F32_TARGET inline void f32_prefetch_row(const float* p) {
#pragma GCC unroll 16
  for (int i = 0; i < D * 4; i += 64) _mm_prefetch(reinterpret_cast<const char*>(p) + i, _MM_HINT_T0);
}

// row[0, n) <- exp(row - m), m = max(row, *sink); returns 1 / (their sum + e^{*sink - m}) (sink null: no term).
SGL_F32_TARGET inline float f32_softmax_row(float* row, int64_t n, const float* sink) {
  constexpr int W = V::W;
  typename V::reg vmax = V::set1(-INFINITY);
  int64_t i = 0;
  for (; i + W <= n; i += W) vmax = V::max(vmax, V::load(row + i));
  if (i < n) vmax = V::max(vmax, V::load_tail_or(row + i, (int)(n - i), -INFINITY));
  const float fm = sink ? std::max(V::hmax(vmax), *sink) : V::hmax(vmax);
  const typename V::reg m = V::set1(fm);
  typename V::reg vsum = V::zero();
  for (i = 0; i + W <= n; i += W) {
    const typename V::reg p = V::exp(V::sub(V::load(row + i), m));
    V::store(row + i, p);
    vsum = V::add(vsum, p);
  }
  if (i < n) {
    const int t = (int)(n - i);
    V::store_tail(row + i, V::exp(V::sub(V::load_tail(row + i, t), m)), t);
    vsum = V::add(vsum, V::load_tail(row + i, t));  // the stored lanes only
  }
  return 1.0f / (sink ? V::hsum(vsum) + std::exp(*sink - fm) : V::hsum(vsum));
}

// row[0, n) <- cap * tanh(row / cap), tanh(x) = 1 - 2 / (e^{2x} + 1) (V::exp saturates: +-1 at the ends).
SGL_F32_TARGET inline void f32_soft_cap_row(float* row, int64_t n, float cap) {
  constexpr int W = V::W;
  const typename V::reg two_over_cap = V::set1(2.0f / cap), vcap = V::set1(cap), one = V::set1(1.0f),
                        two = V::set1(2.0f);
  for (int64_t i = 0; i < n; i += W) {
    const int t = (int)std::min<int64_t>(W, n - i);
    const typename V::reg x = t == W ? V::load(row + i) : V::load_tail(row + i, t);
    const typename V::reg y = V::mul(V::sub(one, V::div(two, V::add(V::exp(V::mul(x, two_over_cap)), one))), vcap);
    if (t == W)
      V::store(row + i, y);
    else
      V::store_tail(row + i, y, t);
  }
}

// G (<= 4) query heads of head_dim D against one KV head.
template <int D, int G>
SGL_F32_TARGET inline void f32_attention_heads(const float* q, const float* k_cache, const float* v_cache, int64_t row,
                                               const int64_t* tokens, int64_t seq_len, float scale,
                                               const float* sinks, float logit_cap, float* scores, float* out) {
  using reg = typename V::reg;
  constexpr int W = V::W;
  constexpr int kQ = D / W;  // registers per head row
  static_assert(D % W == 0 && G >= 1 && G <= 4, "head_dim: a multiple of the vector width");
  // 1. scores[g][j] = scale * q_g . k_j
  for (int64_t j = 0; j < seq_len; ++j) {
    const float* k = k_cache + tokens[j] * row;
    if (j + 8 < seq_len) f32_prefetch_row<D>(k_cache + tokens[j + 8] * row);
    reg acc[G];
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) acc[g] = V::zero();
#pragma GCC unroll 16
    for (int i = 0; i < kQ; ++i) {
      const reg kv = V::load(k + W * i);
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) acc[g] = V::fmadd(V::load(q + g * D + W * i), kv, acc[g]);
    }
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) scores[g * seq_len + j] = V::hsum(acc[g]) * scale;
  }
  float inv[G];
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
    if (logit_cap > 0.0f) f32_soft_cap_row(scores + g * seq_len, seq_len, logit_cap);
    inv[g] = f32_softmax_row(scores + g * seq_len, seq_len, sinks ? sinks + g : nullptr);
  }
  // 2. out_g = sum_j p[g][j] v_j / sum_g, kVChunk registers of each head at a time
  constexpr int kC = V::kVChunk;
#pragma GCC unroll 1
  for (int c = 0; c < kQ; c += kC) {
    reg acc[G][kC];
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g)
#pragma GCC unroll 4
      for (int d = 0; d < kC; ++d) acc[g][d] = V::zero();
    for (int64_t j = 0; j < seq_len; ++j) {
      const float* v = v_cache + tokens[j] * row + W * c;
      if (j + 8 < seq_len) f32_prefetch_row<kC * W>(v_cache + tokens[j + 8] * row + W * c);
      reg vv[kC];
#pragma GCC unroll 4
      for (int d = 0; d < kC; ++d) vv[d] = c + d < kQ ? V::load(v + W * d) : V::zero();
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) {
        const reg p = V::set1(scores[g * seq_len + j]);
#pragma GCC unroll 4
        for (int d = 0; d < kC; ++d) acc[g][d] = V::fmadd(p, vv[d], acc[g][d]);
      }
    }
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      const reg vinv = V::set1(inv[g]);
#pragma GCC unroll 4
      for (int d = 0; d < kC; ++d)
        if (c + d < kQ) V::store(out + g * D + W * (c + d), V::mul(acc[g][d], vinv));
    }
  }
}

// The query heads [0, group) of one KV head, 4 per pass over the keys.
template <int D>
SGL_F32_TARGET inline void f32_attention_group_d(const float* q, int64_t group, const float* k_cache,
                                                 const float* v_cache, int64_t kv_heads, int64_t kv_head,
                                                 const int64_t* tokens, int64_t seq_len, float scale,
                                                 const float* sinks, float logit_cap, float* scores, float* out) {
  const int64_t row = kv_heads * D;
  const float* kc = k_cache + kv_head * D;
  const float* vc = v_cache + kv_head * D;
  for (int64_t g0 = 0; g0 < group; g0 += 4) {
    const float* qg = q + g0 * D;
    float* og = out + g0 * D;
    const float* sg = sinks ? sinks + g0 : nullptr;
    switch (std::min<int64_t>(4, group - g0)) {
      case 1: f32_attention_heads<D, 1>(qg, kc, vc, row, tokens, seq_len, scale, sg, logit_cap, scores, og); break;
      case 2: f32_attention_heads<D, 2>(qg, kc, vc, row, tokens, seq_len, scale, sg, logit_cap, scores, og); break;
      case 3: f32_attention_heads<D, 3>(qg, kc, vc, row, tokens, seq_len, scale, sg, logit_cap, scores, og); break;
      default: f32_attention_heads<D, 4>(qg, kc, vc, row, tokens, seq_len, scale, sg, logit_cap, scores, og); break;
    }
  }
}

// head_dim: one of SGL_DECODE_HEAD_DIMS (decode_attention.h); false otherwise.
inline bool decode_attention_group(const float* q, int64_t group, const float* k_cache, const float* v_cache,
                                   int64_t kv_heads, int64_t kv_head, int64_t head_dim, const int64_t* tokens,
                                   int64_t seq_len, float scale, const float* sinks, float logit_cap, float* scores,
                                   float* out) {
  switch (head_dim) {
#define SGL_CASE(D)                                                                                                 \
  case D:                                                                                                           \
    f32_attention_group_d<D>(q, group, k_cache, v_cache, kv_heads, kv_head, tokens, seq_len, scale, sinks,          \
                             logit_cap, scores, out);                                                               \
    return true;
    SGL_DECODE_HEAD_DIMS(SGL_CASE)
#undef SGL_CASE
    default:
      return false;
  }
}
