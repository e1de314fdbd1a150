"""FlashInferAttnBackend: the FlashInfer attention backend (CUDA).

Memory contract: every persistent buffer of this backend is declared once in sglang.srt.mem_plan.backends
(flashinfer_buffers). The planner charges `declare_workspace(...)` to the budget before sizing the KV pool, and `__init__`
allocates exactly `declared_buffers(...)` -- the same list -- so the plan and the allocation cannot disagree.
FlashInfer shares one uint8 workspace (384 MiB; 512 MiB for Qwen2/Qwen3/MiMo) and keeps CUDA-graph
kv-index buffers of cuda_graph_max_bs * context_len int32 per wrapper.

The kernel library (flashinfer) is imported only inside `__init__`: importing this module, planning with it, and
running the CPU test suite never need it.
"""

from __future__ import annotations

from typing import Any

from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang.srt.mem_plan.allocate import allocate_declared_buffers
from sglang.srt.mem_plan.backends import (
    AttentionShape,
    BufferDecl,
    attention_shape_from_model_config,
    flashinfer_buffers,
    workspace_spec,
)
from sglang.srt.mem_plan.specs import WorkspaceSpec

BACKEND_NAME = "flashinfer"


def declare_workspace(num_q_heads: int, head_dim: int, context_len: int, *, v_head_dim: int | None = None,
                      is_mla: bool = False, architectures: tuple[str, ...] = (), num_kv_splits: int = 8,
                      num_wrappers: int = 1) -> WorkspaceSpec:
    """This backend's buffers as fixed + per_req * request_slots + per_graph_bs * cuda_graph_max_bs bytes.

    num_q_heads is per TP rank; context_len is the model's full context (buffers are sized for it).
    """
    shape = AttentionShape(num_q_heads, head_dim, context_len, v_head_dim=v_head_dim, is_mla=is_mla,
                           architectures=architectures, num_kv_splits=num_kv_splits, num_wrappers=num_wrappers)
    return workspace_spec(BACKEND_NAME, shape)


def declared_buffers(shape: AttentionShape, num_reqs: int, cuda_graph_bs: int = 0) -> list[BufferDecl]:
    return flashinfer_buffers(shape, num_reqs, cuda_graph_bs)


class FlashInferAttnBackend(AttentionBackend):
    def __init__(self, *, model_config: Any, req_to_token_pool: Any, token_to_kv_pool: Any, device: str,
                 tp_size: int = 1, cuda_graph_max_bs: int = 0, num_kv_splits: int = 8):
        import flashinfer  # CUDA kernels; heavy, GPU-only
        super().__init__(model_config=model_config, req_to_token_pool=req_to_token_pool,
                         token_to_kv_pool=token_to_kv_pool, device=device)
        self.kernels = flashinfer
        self.shape = attention_shape_from_model_config(model_config, tp_size, num_kv_splits)
        self.max_num_reqs = req_to_token_pool.size
        self.cuda_graph_max_bs = min(cuda_graph_max_bs, self.max_num_reqs)
        # exactly the declared buffers: the planner charged declare_workspace() for these
        self.buffers = allocate_declared_buffers(
            declared_buffers(self.shape, self.max_num_reqs, self.cuda_graph_max_bs), device)

    def init_forward_metadata(self, forward_batch) -> None:
        raise NotImplementedError(
            "FlashInferAttnBackend: the FlashInfer kernel path is not wired yet in this fork; its buffers are allocated and planned. "
            "Use --attention-backend torch_native.")

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True):
        raise NotImplementedError("FlashInferAttnBackend.forward_extend: kernel path not wired yet")

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True):
        raise NotImplementedError("FlashInferAttnBackend.forward_decode: kernel path not wired yet")
