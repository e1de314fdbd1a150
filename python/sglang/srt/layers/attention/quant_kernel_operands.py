"""A quantized pool's operands for the CPU kernel module, one layer at a time (torch_native's kernel path).

extend_attention_quant reads, and kv_quant_write writes, the same per-layer views of the pool's buffers: the codes,
the scales (fp8: the fixed [KV] fp32 ones; the int formats: their per-row fields), the keys' turn R and int4's
multipliers w, the values' turn (R where they are stored turned: the write turns them, the kernel turns each output
row back by R^T) and the layer's ring. They are made once per layer and kept (a decode step otherwise rebuilds them
for every one of its 3 calls a layer: ~2% of a decode step of the default model, docs/kv_quantization.md); the pool's
buffers are fixed tensors (calibration writes them in place), and a change of the parts the pool stores plain
(a checkpoint's fp8 scales) makes them again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, FrozenSet, Optional

import torch

from sglang.srt.mem_cache import kv_quant_codec


@dataclass(frozen=True)
class QuantLayerOperands:
    k_codes: torch.Tensor
    v_codes: torch.Tensor
    k_scale: torch.Tensor  # fp8: [KV] fp32; int8 / int4: [rows, KV, 1 / 2] fp16; int2_hadamard [rows, KV, 1] uint8
    v_scale: torch.Tensor
    k_turn: Optional[torch.Tensor]  # R [D, D] where the keys are stored turned (int4's (k * w) @ R), else None
    k_smooth: Optional[torch.Tensor]  # int4's key multipliers w [KV, D], else None
    v_turn: Optional[torch.Tensor]  # R [Dv, Dv] where the values are stored turned, else None
    v_back: Optional[torch.Tensor]  # R^T of it, contiguous (what turns an output row back), else None
    ring_k: Optional[torch.Tensor]  # the layer's rings [ring rows, W + S, KV, D] bf16 (recent_window.py), or None
    ring_v: Optional[torch.Tensor]


def quant_layer_operands(pool, layer_id: int) -> QuantLayerOperands:
    scales = pool.fixed if pool.is_fp8 else pool.fields
    k_turn, k_smooth = pool.key_turn(layer_id)
    v_turn = pool.rotation("v")
    v_back = kv_quant_codec.rotation_t(pool.v_head_dim, pool.device) if v_turn is not None else None
    ring_k, ring_v = pool.window.rings(layer_id) if pool.window is not None else (None, None)
    return QuantLayerOperands(pool.fields["k"][layer_id], pool.fields["v"][layer_id], scales["k_scale"][layer_id],
                              scales["v_scale"][layer_id], k_turn, k_smooth, v_turn, v_back, ring_k, ring_v)


class QuantOperandCache:
    """layer id -> QuantLayerOperands of one pool, made on first use."""

    def __init__(self, pool):
        self.pool = pool
        self.by_layer: Dict[int, QuantLayerOperands] = {}
        self.plain: Optional[FrozenSet[str]] = None

    def __call__(self, layer_id: int) -> QuantLayerOperands:
        plain = frozenset(self.pool.plain_parts)
        if plain != self.plain:
            self.by_layer.clear()
            self.plain = plain
        ops = self.by_layer.get(layer_id)
        if ops is None:
            ops = self.by_layer[layer_id] = quant_layer_operands(self.pool, layer_id)
        return ops
