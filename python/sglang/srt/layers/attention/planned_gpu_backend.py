"""Shared shell of the GPU attention backends (AITER, FlashInfer, Triton): their memory contract.

Every persistent buffer of a GPU backend is declared once in sglang.srt.mem_plan.backends. The planner charges
`declare_workspace(...)` to the budget before the KV pool is sized, and `__init__` allocates exactly
`declared_buffers(...)` -- the same list -- so the plan and the allocation cannot disagree.

The kernel library is imported only inside `__init__`: importing a backend module, planning with it (`sglang plan`)
and running the CPU test suite never need it. The kernel calls themselves are not wired in this fork yet: a backend
fails at its first forward with a message naming the backend that works (torch_native).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang.srt.mem_plan.allocate import allocate_declared_buffers
from sglang.srt.mem_plan.backends import (
    BUFFER_DECLARATIONS,
    AttentionShape,
    BufferDecl,
    attention_shape_from_model_config,
    workspace_spec,
)
from sglang.srt.mem_plan.specs import WorkspaceSpec


def make_declarations(backend: str) -> tuple[Callable[..., WorkspaceSpec], Callable[..., list[BufferDecl]]]:
    """(declare_workspace, declared_buffers) of one backend, both reading mem_plan.backends."""

    def declare_workspace(num_q_heads: int, head_dim: int, context_len: int, *, v_head_dim: int | None = None,
                          is_mla: bool = False, architectures: tuple[str, ...] = (), num_kv_splits: int = 8,
                          num_wrappers: int = 1) -> WorkspaceSpec:
        """The backend's buffers as fixed + per_req * request_slots + per_graph_bs * cuda_graph_max_bs bytes.

        num_q_heads is per TP rank; context_len is the model's full context (buffers are sized for it)."""
        shape = AttentionShape(num_q_heads, head_dim, context_len, v_head_dim=v_head_dim, is_mla=is_mla,
                               architectures=architectures, num_kv_splits=num_kv_splits, num_wrappers=num_wrappers)
        return workspace_spec(backend, shape)

    def declared_buffers(shape: AttentionShape, num_reqs: int, cuda_graph_bs: int = 0) -> list[BufferDecl]:
        return BUFFER_DECLARATIONS[backend](shape, num_reqs, cuda_graph_bs)

    return declare_workspace, declared_buffers


class PlannedGpuAttnBackend(AttentionBackend):
    backend_name: str = ""
    kernel_module: str = ""  # imported in __init__ only

    def __init__(self, *, model_config: Any, req_to_token_pool: Any, token_to_kv_pool: Any, device: str,
                 tp_size: int = 1, cuda_graph_max_bs: int = 0, num_kv_splits: int = 8):
        self.kernels = importlib.import_module(self.kernel_module)  # ImportError on machines without the library
        super().__init__(model_config=model_config, req_to_token_pool=req_to_token_pool,
                         token_to_kv_pool=token_to_kv_pool, device=device)
        self.shape = attention_shape_from_model_config(model_config, tp_size, num_kv_splits)
        self.max_num_reqs = req_to_token_pool.size
        self.cuda_graph_max_bs = min(cuda_graph_max_bs, self.max_num_reqs)
        # exactly the declared buffers: the planner charged declare_workspace() for these
        buffers = BUFFER_DECLARATIONS[self.backend_name](self.shape, self.max_num_reqs, self.cuda_graph_max_bs)
        self.buffers = allocate_declared_buffers(buffers, device)

    def _not_wired(self):
        return NotImplementedError(
            f"--attention-backend {self.backend_name}: the kernel path is not wired in this fork yet (its buffers are "
            "planned and allocated). Use --attention-backend torch_native."
        )

    def init_forward_metadata(self, forward_batch) -> None:
        raise self._not_wired()

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True):
        raise self._not_wired()

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True):
        raise self._not_wired()
