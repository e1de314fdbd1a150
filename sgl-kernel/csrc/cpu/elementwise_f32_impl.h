// RMSNorm (with the residual add before it), SiluAndMul and the neox rotary embedding on fp32 rows, written once
// over a vector type V (vec_f32.h) and compiled per level: kernels_f32.h includes this file once per level, inside
// that level's namespace, with SGL_F32_TARGET and V set. No include guard on purpose.
// The torch path computes these in fp32 too; the results agree within fp32 rounding (sums in another order, FMAs,
// exp_ps's ~1e-7 relative error in silu).

// x, residual (may be null), out, residual_out (used when residual != null): rows of `hidden` elements.
// out = (x + residual) * rsqrt(mean((x + residual)^2) + eps) * weight
SGL_F32_TARGET inline void rmsnorm_row(const float* x, const float* residual, const float* weight, float* out,
                                       float* residual_out, int64_t hidden, float eps) {
  constexpr int W = V::W;
  const float* src = x;
  if (residual != nullptr) {
    int64_t i = 0;
    for (; i + W <= hidden; i += W) V::store(residual_out + i, V::add(V::load(x + i), V::load(residual + i)));
    if (i < hidden) {
      const int n = (int)(hidden - i);
      V::store_tail(residual_out + i, V::add(V::load_tail(x + i, n), V::load_tail(residual + i, n)), n);
    }
    src = residual_out;
  }
  typename V::reg ss = V::zero();
  int64_t i = 0;
  for (; i + W <= hidden; i += W) {
    const typename V::reg v = V::load(src + i);
    ss = V::fmadd(v, v, ss);
  }
  if (i < hidden) {
    const typename V::reg v = V::load_tail(src + i, (int)(hidden - i));
    ss = V::fmadd(v, v, ss);
  }
  const typename V::reg vinv = V::set1(1.0f / std::sqrt(V::hsum(ss) / (float)hidden + eps));
  for (i = 0; i + W <= hidden; i += W)
    V::store(out + i, V::mul(V::mul(V::load(src + i), vinv), V::load(weight + i)));
  if (i < hidden) {
    const int n = (int)(hidden - i);
    V::store_tail(out + i, V::mul(V::mul(V::load_tail(src + i, n), vinv), V::load_tail(weight + i, n)), n);
  }
}

// gate_up: [2 * inter] (gate then up) -> out: [inter], silu(gate) * up
SGL_F32_TARGET inline void silu_and_mul_row(const float* gate_up, float* out, int64_t inter) {
  constexpr int W = V::W;
  const float* up = gate_up + inter;
  const typename V::reg one = V::set1(1.0f);
  for (int64_t i = 0; i < inter; i += W) {
    const int n = (int)(inter - i < W ? inter - i : W);
    const typename V::reg g = V::load_tail(gate_up + i, n);
    const typename V::reg s = V::div(g, V::add(one, V::exp(V::sub(V::zero(), g))));
    V::store_tail(out + i, V::mul(s, V::load_tail(up + i, n)), n);
  }
}

// In place on the heads of one token; cos_sin: the token's row of the [max_position, rotary_dim] cache (cos halves,
// then sin halves). x1' = x1 c - x2 s, x2' = x2 c + x1 s.
SGL_F32_TARGET inline void rope_heads(float* x, int64_t num_heads, int64_t head_size, const float* cos_sin,
                                      int64_t rotary_dim) {
  constexpr int W = V::W;
  const int64_t half = rotary_dim / 2;
  const float* cs = cos_sin;
  const float* sn = cos_sin + half;
  for (int64_t h = 0; h < num_heads; ++h) {
    float* x1p = x + h * head_size;
    float* x2p = x1p + half;
    for (int64_t i = 0; i < half; i += W) {
      const int n = (int)(half - i < W ? half - i : W);
      const typename V::reg x1 = V::load_tail(x1p + i, n), x2 = V::load_tail(x2p + i, n);
      const typename V::reg c = V::load_tail(cs + i, n), s = V::load_tail(sn + i, n);
      V::store_tail(x1p + i, V::sub(V::mul(x1, c), V::mul(x2, s)), n);
      V::store_tail(x2p + i, V::add(V::mul(x2, c), V::mul(x1, s)), n);
    }
  }
}
