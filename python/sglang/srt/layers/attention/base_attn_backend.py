"""AttentionBackend: the interface every attention kernel backend implements.

Per forward, the model runner calls `init_forward_metadata(forward_batch)` once (index tensors, masks, kernel
plans shared by all layers); then each attention layer calls `forward(q, k, v, layer, forward_batch)`.
Tensors: q [N, H, D], k/v [N, KV, D] (new tokens only); output [N, H * Dv].

Memory contract: a backend's buffers are `declare(inputs)` (mem_plan/backends.py), the same declaration the memory
plan charges. `__init__` allocates exactly the persistent ones (`allocate_buffers`) and asserts byte-for-byte
equality; transient ones are scratch bounds the backend stays within per forward.

Import layering (no cycles): forward_batch_info <- base_attn_backend <- radix_attention; a layer is described to
backends by the AttentionLayer protocol below, so this module does not import radix_attention.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Protocol

import torch

from sglang.srt.mem_plan.backends import BackendInputs, BufferDecl, buffers_bytes, declare, persistent

if TYPE_CHECKING:
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch


class AttentionLayer(Protocol):
    """What a backend reads from an attention layer (RadixAttention implements it)."""

    layer_id: int
    scaling: float
    v_head_dim: int


class AttentionBackend:
    backend_name: str = ""

    def __init__(self, *, model_config: Any, req_to_token_pool: Any, token_to_kv_pool: Any, device: str,
                 inputs: Optional[BackendInputs] = None):
        self.model_config = model_config
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool = token_to_kv_pool
        self.device = device
        self.inputs = inputs
        self.declared = declare(self.backend_name, inputs) if inputs is not None else []
        self.buffers = self.allocate_buffers(self.declared, device)
        assert self.allocated_bytes() == self.declared_persistent_bytes(), (
            f"{self.backend_name}: allocated {self.allocated_bytes()} B != declared {self.declared_persistent_bytes()} B")

    @staticmethod
    def allocate_buffers(declared: list[BufferDecl], device) -> dict:
        """One torch.empty per persistent declaration, exactly its shape and dtype (device may be 'meta')."""
        return {b.name: torch.empty(b.shape, dtype=getattr(torch, b.dtype), device=device) for b in persistent(declared)}

    def allocated_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.buffers.values())

    def declared_persistent_bytes(self) -> int:
        return buffers_bytes(persistent(self.declared))

    def init_forward_metadata(self, forward_batch: "ForwardBatch") -> None:
        raise NotImplementedError

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: AttentionLayer,
                forward_batch: "ForwardBatch", save_kv_cache: bool = True) -> torch.Tensor:
        if forward_batch.forward_mode.is_decode():
            return self.forward_decode(q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache)
        return self.forward_extend(q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True) -> torch.Tensor:
        raise NotImplementedError

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True) -> torch.Tensor:
        raise NotImplementedError
