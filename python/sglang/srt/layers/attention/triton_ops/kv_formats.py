"""What the Triton attention kernels are handed for one layer of the KV pool: the pool's own code and scale tensors
(views, never copies) and the format id kv_dequant.py decodes them with.

    kv_operands(pool, layer_id) -> KVOperands   a plain pool (MHATokenToKVPool) or a quantized one
                                                (mem_cache/quantized_kv_pool.py: pool.fields / pool.fixed)
    plain_operands(k, v)        -> KVOperands   K/V tensors of a float dtype [S, KV, D] (the kernel tests)
    ring_operands(pool, layer_id, tail) -> RingOperands | None   the pool's recent window for one forward
                                                (mem_cache/recent_window.py), None without one

A format without per-token scales gets its own code tensor in the scale slots (never read: the kernels only load
what KV_FORMAT names), so every launch has the same argument list and a CUDA graph captures the pool's buffers
themselves: a later write or a recalibration of the fp8 scales is seen by every replay.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang.srt.layers.attention.triton_ops.tiles import dot_tile

FORMAT_IDS = {"": 0, "fp8_e4m3": 1, "fp8_e5m2": 2, "int8": 3, "int4": 4, "int2_hadamard": 5}  # kv_dequant.FMT_*
FP8_IDS = (FORMAT_IDS["fp8_e4m3"], FORMAT_IDS["fp8_e5m2"])


@dataclass(frozen=True)
class KVOperands:
    k: torch.Tensor  # [S, KV, elems] codes (or values of a plain pool)
    v: torch.Tensor
    k_scale: torch.Tensor  # [S, KV, n] per-token scales (int formats), else a stand-in never read
    v_scale: torch.Tensor
    k_head_scale: torch.Tensor  # fp32 [KV] per-(layer, KV head) scales (fp8), else a stand-in never read
    v_head_scale: torch.Tensor
    format_id: int
    head_dim: int
    v_dim: int
    kv_format: str = ""

    @property
    def num_kv_heads(self) -> int:
        return self.k.shape[1]

    @property
    def quantized(self) -> bool:
        return self.format_id != FORMAT_IDS[""]

    @property
    def head_scales(self) -> bool:
        return self.format_id in FP8_IDS

    def strides(self) -> tuple:
        """(k token, k head, v token, v head, k-scale token, k-scale head, v-scale token, v-scale head)."""
        return (self.k.stride(0), self.k.stride(1), self.v.stride(0), self.v.stride(1), self.k_scale.stride(0),
                self.k_scale.stride(1), self.v_scale.stride(0), self.v_scale.stride(1))

    def tensors(self) -> tuple:
        return (self.k, self.v, self.k_scale, self.v_scale, self.k_head_scale, self.v_head_scale)


@dataclass(frozen=True)
class RingOperands:
    """One layer of a recent window (mem_cache/recent_window.py): bf16 rows of k / v, in the pool's stored basis (as
    the fresh K/V are given), E = entries per ring row: W = window recent entries, then S = entries - window sink
    entries. Request b (ring row rows[b], P_b cached positions) reads
      [0, sinks[b])                      from its sink entries    rows[b] * E + W + position,
      [P_b - counts[b], P_b)             from its recent entries  rows[b] * E + position % W,
      [sinks[b], P_b - counts[b])        through the codes (P_b - counts[b] >= sinks[b])."""

    k: torch.Tensor  # [ring rows x entries, KV, D]
    v: torch.Tensor  # [ring rows x entries, KV, Dv]
    rows: torch.Tensor  # int64 [B] each request's ring (its req_to_token row)
    counts: torch.Tensor  # int64 [B] the newest cached positions read from the ring (<= window)
    sinks: torch.Tensor  # int64 [B] the first cached positions read from the sink entries (<= entries - window)
    window: int  # W
    entries: int  # E = W + S, the ring row stride

    @property
    def sink_tokens(self) -> int:
        """S: the sink entries per ring row (0: no sinks, the kernels' SINKS=0 path)."""
        return self.entries - self.window

    def strides(self) -> tuple:
        assert self.k.stride(2) == 1 and self.v.stride(2) == 1
        return (self.k.stride(0), self.k.stride(1), self.v.stride(0), self.v.stride(1))


def ring_operands(pool, layer_id: int, tail):
    """The kernels' view of the pool's ring for this forward (tail: its RecentWindow.tail), or None."""
    if tail is None:
        return None
    k, v = pool.window.ring(layer_id)
    return RingOperands(k, v, tail.ring_rows, tail.counts, tail.sink_counts, pool.window.window,
                        pool.window.entries)


def ring_args(ring, stand_in: torch.Tensor, index_stand_in: torch.Tensor) -> tuple:
    """(k, v, rows, counts, sinks, 4 strides) for a launch; without a ring, stand-ins never read (RING=0)."""
    if ring is None:
        return (stand_in, stand_in, index_stand_in, index_stand_in, index_stand_in, 0, 0, 0, 0)
    return (ring.k, ring.v, ring.rows, ring.counts, ring.sinks, *ring.strides())


def ring_constexprs(ring) -> dict:
    """The kernels' compile-time ring shape: RING, WINDOW (W), ENTRIES (E), SINKS (S), RING_N (a key block holding
    W entries) and SINK_N (one holding S); without a ring, placeholders never used (RING=0, SINKS=0)."""
    window, sinks = (ring.window, ring.sink_tokens) if ring is not None else (1, 0)
    return dict(RING=int(ring is not None), WINDOW=window, ENTRIES=window + sinks, SINKS=sinks,
                RING_N=dot_tile(window), SINK_N=dot_tile(max(sinks, 1)))


def plain_operands(k: torch.Tensor, v: torch.Tensor) -> KVOperands:
    assert k.stride(2) == 1 and v.stride(2) == 1
    return KVOperands(k, v, k, v, k, v, FORMAT_IDS[""], k.shape[2], v.shape[2])


def kv_operands(pool, layer_id: int) -> KVOperands:
    """One layer of `pool` as kernel operands: views of the pool's buffers."""
    fmt = getattr(pool, "kv_format", "")
    if not hasattr(pool, "fields"):  # a plain pool (MHATokenToKVPool)
        return plain_operands(pool.get_key_buffer(layer_id), pool.get_value_buffer(layer_id))
    if fmt not in FORMAT_IDS or fmt == "":
        raise ValueError(f"--attention-backend triton: no kernel reads --kv-cache-dtype {fmt}")
    f = {name: buf[layer_id] for name, buf in pool.fields.items()}
    k, v = f["k"], f["v"]
    k_scale, v_scale = f.get("k_scale", k), f.get("v_scale", v)
    if fmt in ("fp8_e4m3", "fp8_e5m2"):
        k_head, v_head = pool.fixed["k_scale"][layer_id], pool.fixed["v_scale"][layer_id]
    else:
        k_head, v_head = k, v
    for t in (k, v, k_scale, v_scale):
        assert t.stride(2) == 1, "pool fields must be contiguous per (token, head)"
    return KVOperands(k, v, k_scale, v_scale, k_head, v_head, FORMAT_IDS[fmt], pool.head_dim, pool.v_head_dim, fmt)


def turn(x: torch.Tensor, r) -> torch.Tensor:
    """x [..., D] @ r [D, D] (fp32 product, back in x's dtype); r None: x itself. The rotated formats are attended
    in their rotated basis: the query (and a forward's fresh K/V) turn by R in, the output by R^T out."""
    return x if r is None else (x.float() @ r).to(x.dtype)


def value_mean(pool, layer_id: int):
    """A format's fixed per-(layer, KV head) V channel mean [KV, Dv] fp32 (unrotated) that its codes store V less
    (pool.fixed["v_mean"]), or None. A K mean needs nothing: q . mean is one constant per query row, which the
    softmax ignores."""
    means = getattr(pool, "fixed", {}).get("v_mean")
    return None if means is None else means[layer_id]


def key_smooth(pool, layer_id: int):
    """int4's per-(layer, KV head) key channel multiplier w [KV, D] fp32 (pool.fixed["k_smooth"]), or None: its key
    codes store (k * w) @ R, so the query is attended as (q / w) @ R (q . k is unchanged)."""
    w = getattr(pool, "fixed", {}).get("k_smooth")
    return None if w is None else w[layer_id]


def smooth_query(q: torch.Tensor, w) -> torch.Tensor:
    """q [N, H_q, D] / w of each query head's KV head (w [KV, D]), in fp32; w None: q in fp32."""
    q = q.float()
    if w is None:
        return q
    n, h, d = q.shape
    kv = w.shape[0]
    return (q.view(n, kv, h // kv, d) / w[None, :, None, :]).view(n, h, d)


def into_basis(q, k, v, r_k, r_v, v_mean, k_smooth=None):
    """q, and a forward's fresh k / v, in the basis the pool's codes are attended in: keys times int4's multiplier
    (the query divided by it), turned by the rotations, V less its mean (so the output, turned back, takes the mean
    once: out_of_basis). In fp32, rounded to the input dtype once."""
    if v is not None and v_mean is not None:
        v = (v.float() - v_mean[None]).to(v.dtype)
    if k_smooth is not None:
        qf = smooth_query(q, k_smooth)
        q = (qf if r_k is None else qf @ r_k).to(q.dtype)
        if k is not None:
            kf = k.float() * k_smooth[None]
            k = (kf if r_k is None else kf @ r_k).to(k.dtype)
        return q, k, (None if v is None else turn(v, r_v))
    return turn(q, r_k), (None if k is None else turn(k, r_k)), (None if v is None else turn(v, r_v))


def out_of_basis(o: torch.Tensor, r_v, v_mean) -> torch.Tensor:
    """o [N, H_q, Dv] from the kernel -> the attention output: turned back by R_v^T, plus the V mean of each query
    head's KV head (the probabilities sum to 1)."""
    o = turn(o, None if r_v is None else r_v.T)
    if v_mean is None:
        return o
    n, h, dv = o.shape
    kv = v_mean.shape[0]
    return (o.float().view(n, kv, h // kv, dv) + v_mean[None, :, None, :]).to(o.dtype).view(n, h, dv)
