"""What the Triton attention kernels are handed for one layer of the KV pool: the pool's own code and scale tensors
(views, never copies) and the format id kv_dequant.py decodes them with.

    kv_operands(pool, layer_id) -> KVOperands   a plain pool (MHATokenToKVPool) or a quantized one
                                                (mem_cache/quantized_kv_pool.py: pool.fields / pool.fixed)
    plain_operands(k, v)        -> KVOperands   K/V tensors of a float dtype [S, KV, D] (the kernel tests)

A format without per-token scales gets its own code tensor in the scale slots (never read: the kernels only load
what KV_FORMAT names), so every launch has the same argument list and a CUDA graph captures the pool's buffers
themselves: a later write or a recalibration of the fp8 scales is seen by every replay.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

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
    def head_scales(self) -> bool:
        return self.format_id in FP8_IDS

    def strides(self) -> tuple:
        """(k token, k head, v token, v head, k-scale token, k-scale head, v-scale token, v-scale head)."""
        return (self.k.stride(0), self.k.stride(1), self.v.stride(0), self.v.stride(1), self.k_scale.stride(0),
                self.k_scale.stride(1), self.v_scale.stride(0), self.v_scale.stride(1))

    def tensors(self) -> tuple:
        return (self.k, self.v, self.k_scale, self.v_scale, self.k_head_scale, self.v_head_scale)


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
    in their rotated basis: the query (and a prefill's fresh K/V) turn by R in, the output by R^T out."""
    return x if r is None else (x.float() @ r).to(x.dtype)
