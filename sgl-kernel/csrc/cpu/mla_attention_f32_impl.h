// MLA attention (mla_attention.h's algorithm) over an fp32 latent pool, written once over a vector type V
// (vec_f32.h) and compiled per level: mla_attention_op.h includes this file inside the f32_avx512 and f32_avx2
// namespaces of kernels_f32.h (where V and f32_softmax_row are declared), with SGL_F32_TARGET set to that level's
// target attribute. No include guard on purpose.
//
//   q [hg, L] fp32, cache [slots, L] fp32 (V: its first kv columns), tokens [len], scratch mla_row_scratch_floats,
//   out [hg, kv] fp32 with kv a multiple of V::W.
// Score tile: kSH heads x 4 keys of FMA accumulators over L (the tail masked), one horizontal sum each; output:
// blocks of 32 keys, a tile of kOH heads x 2 registers of columns, each key's values loaded once for the tile's
// heads. 512-bit: 4 x 4 and 8 x 2 (16 accumulators of 32 registers); AVX2: 2 x 4 and 4 x 2 (8 of 16).

constexpr int kMlaSH = V::W == 16 ? 4 : 2;
constexpr int kMlaOH = V::W == 16 ? 8 : 4;

template <int HB>
SGL_F32_TARGET inline void mla_score_tile_f32(const float* q, int64_t L, const float* const* k, int nk, float scale,
                                              float* scores, int64_t ld, int64_t j0) {
  using reg = typename V::reg;
  constexpr int W = V::W;
  reg acc[HB][4];
#pragma GCC unroll 4
  for (int h = 0; h < HB; ++h)
#pragma GCC unroll 4
    for (int t = 0; t < 4; ++t) acc[h][t] = V::zero();
  const int64_t full = L / W * W;
  for (int64_t i = 0; i < full; i += W) {
    reg kv[4];
#pragma GCC unroll 4
    for (int t = 0; t < 4; ++t) kv[t] = V::load(k[t] + i);
#pragma GCC unroll 4
    for (int h = 0; h < HB; ++h) {
      const reg qv = V::load(q + h * L + i);
#pragma GCC unroll 4
      for (int t = 0; t < 4; ++t) acc[h][t] = V::fmadd(qv, kv[t], acc[h][t]);
    }
  }
  if (full < L) {
    const int n = (int)(L - full);
    reg kv[4];
#pragma GCC unroll 4
    for (int t = 0; t < 4; ++t) kv[t] = V::load_tail(k[t] + full, n);
#pragma GCC unroll 4
    for (int h = 0; h < HB; ++h) {
      const reg qv = V::load_tail(q + h * L + full, n);
#pragma GCC unroll 4
      for (int t = 0; t < 4; ++t) acc[h][t] = V::fmadd(qv, kv[t], acc[h][t]);
    }
  }
#pragma GCC unroll 4
  for (int h = 0; h < HB; ++h)
    for (int t = 0; t < nk; ++t) scores[h * ld + j0 + t] = V::hsum(acc[h][t]) * scale;
}

// acc rows += P . K[:, c0 .. c0 + NC * W) for HB heads over one block of len keys.
template <int HB, int NC>
SGL_F32_TARGET inline void mla_value_tile_f32(const float* cache, int64_t L, const int64_t* tokens, int64_t len,
                                              const float* p, int64_t ld, int64_t c0, float* acc_rows,
                                              int64_t ld_acc) {
  using reg = typename V::reg;
  constexpr int W = V::W;
  reg acc[HB][NC];
#pragma GCC unroll 8
  for (int h = 0; h < HB; ++h)
#pragma GCC unroll 2
    for (int n = 0; n < NC; ++n) acc[h][n] = V::load(acc_rows + h * ld_acc + c0 + W * n);
  for (int64_t j = 0; j < len; ++j) {
    const float* v = cache + tokens[j] * L + c0;
    reg vv[NC];
#pragma GCC unroll 2
    for (int n = 0; n < NC; ++n) vv[n] = V::load(v + W * n);
#pragma GCC unroll 8
    for (int h = 0; h < HB; ++h) {
      const reg pj = V::set1(p[h * ld + j]);
#pragma GCC unroll 2
      for (int n = 0; n < NC; ++n) acc[h][n] = V::fmadd(pj, vv[n], acc[h][n]);
    }
  }
#pragma GCC unroll 8
  for (int h = 0; h < HB; ++h)
#pragma GCC unroll 2
    for (int n = 0; n < NC; ++n) V::store(acc_rows + h * ld_acc + c0 + W * n, acc[h][n]);
}

template <int NC>
SGL_F32_TARGET inline void mla_value_heads_f32(const float* cache, int64_t L, const int64_t* tokens, int64_t len,
                                               const float* p, int64_t ld, int64_t hg, int64_t c0, float* acc_rows,
                                               int64_t kv) {
  for (int64_t h0 = 0; h0 < hg; h0 += kMlaOH) {
    const float* ph = p + h0 * ld;
    float* ah = acc_rows + h0 * kv;
    switch (std::min<int64_t>(kMlaOH, hg - h0)) {  // at most kMlaOH: the larger tiles run at 512 bits only
#define SGL_MLA_CASE(HB) \
  case HB: mla_value_tile_f32<HB, NC>(cache, L, tokens, len, ph, ld, c0, ah, kv); break;
      SGL_MLA_CASE(1) SGL_MLA_CASE(2) SGL_MLA_CASE(3) SGL_MLA_CASE(4)
      SGL_MLA_CASE(5) SGL_MLA_CASE(6) SGL_MLA_CASE(7) SGL_MLA_CASE(8)
#undef SGL_MLA_CASE
    }
  }
}

// hg query heads of hg / per_row consecutive rows over their latent rows (mla_attention.h's mla_attention_row, fp32;
// the same arguments and scratch layout).
SGL_F32_TARGET inline void mla_attention_row(const float* q, int64_t hg, const float* cache, int64_t L, int64_t kv,
                                             const int64_t* tokens, int64_t len, int64_t per_row, float scale,
                                             float* scratch, float* out) {
  constexpr int W = V::W;
  const int64_t ld = mla_scores_ld(len);
  float* scores = scratch;
  float* inv = scratch + hg * ld;
  float* acc = inv + hg;
  for (int64_t j0 = 0; j0 < len; j0 += 4) {
    const int nk = (int)std::min<int64_t>(4, len - j0);
    const float* k[4];
    for (int t = 0; t < 4; ++t) k[t] = cache + tokens[j0 + (t < nk ? t : 0)] * L;
    for (int64_t j = j0 + 8; j < std::min(len, j0 + 12); ++j)
      for (int64_t b = 0; b < L * 4; b += 64)
        _mm_prefetch(reinterpret_cast<const char*>(cache + tokens[j] * L) + b, _MM_HINT_T0);
    for (int64_t h0 = 0; h0 < hg; h0 += kMlaSH) {
      const float* qh = q + h0 * L;
      float* sh = scores + h0 * ld;
      switch (std::min<int64_t>(kMlaSH, hg - h0)) {
        case 1: mla_score_tile_f32<1>(qh, L, k, nk, scale, sh, ld, j0); break;
        case 2: mla_score_tile_f32<2>(qh, L, k, nk, scale, sh, ld, j0); break;
        case 3: mla_score_tile_f32<3>(qh, L, k, nk, scale, sh, ld, j0); break;
        default: mla_score_tile_f32<kMlaSH>(qh, L, k, nk, scale, sh, ld, j0); break;
      }
    }
  }
  for (int64_t h = 0; h < hg; ++h) {  // each head row over its own keys; the rest probability 0
    const int64_t n = len - (hg / per_row - 1 - h / per_row);
    inv[h] = f32_softmax_row(scores + h * ld, n, nullptr);
    std::fill(scores + h * ld + n, scores + h * ld + len, 0.0f);
  }
  std::fill(acc, acc + hg * kv, 0.0f);
  for (int64_t j0 = 0; j0 < len; j0 += kMlaValueKeys) {
    const int64_t nj = std::min(kMlaValueKeys, len - j0);
    int64_t c0 = 0;
    for (; c0 + 2 * W <= kv; c0 += 2 * W)
      mla_value_heads_f32<2>(cache, L, tokens + j0, nj, scores + j0, ld, hg, c0, acc, kv);
    if (c0 < kv) mla_value_heads_f32<1>(cache, L, tokens + j0, nj, scores + j0, ld, hg, c0, acc, kv);
  }
  for (int64_t h = 0; h < hg; ++h) {
    const typename V::reg vinv = V::set1(inv[h]);
    for (int64_t c = 0; c < kv; c += W) V::store(out + h * kv + c, V::mul(V::load(acc + h * kv + c), vinv));
  }
}
