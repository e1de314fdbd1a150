"""Attention-backend buffer declarations: the one place their sizes are written down.

Each backend lists its persistent buffers as a function of (request slots R, CUDA-graph batch size G) and its
model shape. The planner charges WorkspaceSpec = linear fit of those buffers (exact: every size is linear in R and
G); the backend allocates the very same list (allocate.py), so plan and allocation cannot disagree.

  AITER (ROCm, non-MLA): fp32 partial outputs [R, H_q, P, d] + max logits and exp sums [R, H_q, P] with
      P = ceil(context_len / 256) -> per slot H_q * P * (4 * d + 8) bytes. MLA allocates none of it.
  FlashInfer: one uint8 workspace (384 MiB; 512 MiB for Qwen2/Qwen3/MiMo architectures) + int32 graph
      kv-index buffers [G * context_len] per wrapper.
  Triton: split-KV decode logits fp32 [B, H_q, splits, d_v] + lse [B, H_q, splits], for eager decode at B = R
      and for graphs at B = G, + int64 graph kv indices [G * context_len].
  torch_native: nothing persistent.
Each also keeps small int32 indptr buffers of R + 1 entries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sglang.srt.mem_plan.specs import WorkspaceSpec
from sglang.srt.mem_plan.units import MiB

DTYPE_BYTES = {"float32": 4, "int32": 4, "int64": 8, "uint8": 1, "bfloat16": 2, "float16": 2}

AITER_PARTITION_TOKENS = 256  # hard-wired in the AITER paged-attention kernel
FLASHINFER_WORKSPACE_BYTES = 384 * MiB
FLASHINFER_WORKSPACE_LARGE_BYTES = 512 * MiB  # upstream forces this for these architecture families
FLASHINFER_LARGE_WORKSPACE_ARCH_PREFIXES = ("Qwen2", "Qwen3", "MiMo")
TRITON_DEFAULT_KV_SPLITS = 8
ATTENTION_BACKENDS = ("torch_native", "triton", "flashinfer", "aiter")


@dataclass(frozen=True)
class BufferDecl:
    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def num_bytes(self) -> int:
        return math.prod(self.shape) * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class AttentionShape:
    """What a backend needs to know about the model on this rank."""

    num_q_heads: int  # per rank
    head_dim: int
    context_len: int
    v_head_dim: int | None = None
    is_mla: bool = False
    architectures: tuple[str, ...] = ()
    num_kv_splits: int = TRITON_DEFAULT_KV_SPLITS
    num_wrappers: int = 1  # FlashInfer: 2 with sliding-window or cross attention

    @property
    def v_dim(self) -> int:
        return self.head_dim if self.v_head_dim is None else self.v_head_dim


def _indptr_buffers(num_reqs: int, count: int = 2) -> list[BufferDecl]:
    return [BufferDecl(f"indptr_{i}", (num_reqs + 1,), "int32") for i in range(count)]


def aiter_num_partitions(context_len: int) -> int:
    return -(-context_len // AITER_PARTITION_TOKENS)


def aiter_decode_workspace_per_req_bytes(num_q_heads: int, head_dim: int, context_len: int) -> int:
    """H_q * ceil(ctx / 256) * (4 * head_dim + 8): fp32 partial output plus fp32 (max logit, exp sum)."""
    return num_q_heads * aiter_num_partitions(context_len) * (4 * head_dim + 8)


def aiter_buffers(shape: AttentionShape, num_reqs: int, cuda_graph_bs: int = 0) -> list[BufferDecl]:
    bufs = _indptr_buffers(num_reqs, 3)  # kv_indptr, qo_indptr, kv_last_page_len
    if shape.is_mla:
        return bufs
    parts = aiter_num_partitions(shape.context_len)
    return bufs + [
        BufferDecl("partial_out", (num_reqs, shape.num_q_heads, parts, shape.head_dim), "float32"),
        BufferDecl("max_logits", (num_reqs, shape.num_q_heads, parts), "float32"),
        BufferDecl("exp_sums", (num_reqs, shape.num_q_heads, parts), "float32"),
    ]


def flashinfer_workspace_bytes(architectures: tuple[str, ...] = ()) -> int:
    if any(a.startswith(FLASHINFER_LARGE_WORKSPACE_ARCH_PREFIXES) for a in architectures):
        return FLASHINFER_WORKSPACE_LARGE_BYTES
    return FLASHINFER_WORKSPACE_BYTES


def flashinfer_buffers(shape: AttentionShape, num_reqs: int, cuda_graph_bs: int = 0) -> list[BufferDecl]:
    bufs = [BufferDecl("workspace", (flashinfer_workspace_bytes(shape.architectures),), "uint8")]
    for w in range(shape.num_wrappers):
        bufs.append(BufferDecl(f"kv_indptr_{w}", (num_reqs + 1,), "int32"))
        bufs.append(BufferDecl(f"cuda_graph_kv_indices_{w}", (cuda_graph_bs * shape.context_len,), "int32"))
    bufs.append(BufferDecl("qo_indptr", (num_reqs + 1,), "int32"))
    bufs.append(BufferDecl("kv_last_page_len", (num_reqs + 1,), "int32"))
    return bufs


def triton_buffers(shape: AttentionShape, num_reqs: int, cuda_graph_bs: int = 0) -> list[BufferDecl]:
    h, s, dv = shape.num_q_heads, shape.num_kv_splits, shape.v_dim
    return _indptr_buffers(num_reqs, 3) + [
        BufferDecl("attn_logits", (num_reqs, h, s, dv), "float32"),
        BufferDecl("attn_lse", (num_reqs, h, s), "float32"),
        BufferDecl("cuda_graph_attn_logits", (cuda_graph_bs, h, s, dv), "float32"),
        BufferDecl("cuda_graph_attn_lse", (cuda_graph_bs, h, s), "float32"),
        BufferDecl("cuda_graph_num_kv_splits", (cuda_graph_bs,), "int32"),
        BufferDecl("cuda_graph_kv_indices", (cuda_graph_bs * shape.context_len,), "int64"),
    ]


def torch_native_buffers(shape: AttentionShape, num_reqs: int, cuda_graph_bs: int = 0) -> list[BufferDecl]:
    return []


BUFFER_DECLARATIONS = {
    "aiter": aiter_buffers,
    "flashinfer": flashinfer_buffers,
    "triton": triton_buffers,
    "torch_native": torch_native_buffers,
}


def buffers_bytes(buffers: list[BufferDecl]) -> int:
    return sum(b.num_bytes for b in buffers)


def workspace_spec(backend: str, shape: AttentionShape) -> WorkspaceSpec:
    """The backend's buffers as fixed + per_req * R + per_graph_bs * G (exact: every size is linear in R and G)."""
    declare = BUFFER_DECLARATIONS[backend]
    base = buffers_bytes(declare(shape, 0, 0))
    per_req = buffers_bytes(declare(shape, 1, 0)) - base
    per_graph_bs = buffers_bytes(declare(shape, 0, 1)) - base
    return WorkspaceSpec(base, per_req, per_graph_bs, name=backend)


def attention_shape_from_model_config(model_config, tp_size: int = 1,
                                      num_kv_splits: int = TRITON_DEFAULT_KV_SPLITS) -> AttentionShape:
    """AttentionShape from the runtime ModelConfig (duck-typed: num_attention_heads, head_dim, context_len,
    architecture; optional kv_lora_rank / qk_rope_head_dim for MLA)."""
    kv_lora_rank = getattr(model_config, "kv_lora_rank", 0) or 0
    num_q_heads = -(-model_config.num_attention_heads // tp_size)
    arch = getattr(model_config, "architecture", None)
    archs = (arch,) if arch else tuple(getattr(model_config, "architectures", ()) or ())
    if kv_lora_rank:
        rope = getattr(model_config, "qk_rope_head_dim", 0) or 0
        return AttentionShape(num_q_heads, kv_lora_rank + rope, model_config.context_len, v_head_dim=kv_lora_rank,
                              is_mla=True, architectures=archs, num_kv_splits=num_kv_splits)
    return AttentionShape(num_q_heads, model_config.head_dim, model_config.context_len,
                          v_head_dim=getattr(model_config, "v_head_dim", None), architectures=archs,
                          num_kv_splits=num_kv_splits)
